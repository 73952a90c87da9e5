"""flash-linear-attention's DeltaNetForCausalLM and GatedDeltaNetForCausalLM, written out from their equations for
the tests (fla runs only on GPUs): the checkpoint layout (tensor names and shapes of fla/models/delta_net,
fla/models/gated_deltanet and their layers) and the forward pass in the recurrent form, one token at a time, in
float64, on a state dict of that layout. Independent of linlm's code."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fla_reference import _conv, _rms, mlp_width


def resolved(config: dict) -> dict:
    gated = config["model_type"] == "gated_deltanet"
    c = {**dict(use_short_conv=True, conv_size=4, allow_neg_eigval=False, hidden_ratio=4, intermediate_size=None,
                norm_eps=1e-6, tie_word_embeddings=False), **config}
    d, H = c["hidden_size"], c["num_heads"]
    c["gated"] = gated
    c["k_dim"] = c.get("head_dim", 256) if gated else d // H
    c["v_dim"] = int(c["k_dim"] * c.get("expand_v", 2.0)) if gated else d // H
    c["v_heads"] = (c.get("num_v_heads") or H) if gated else H  # fla's grouped values: num_v_heads
    c["intermediate_size"] = mlp_width(c)
    return c


def random_state(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under fla's names and shapes."""
    c = resolved(config)
    g = torch.Generator().manual_seed(seed)
    d, V, I, K = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["conv_size"]
    H, Dk, Dv, Hv = c["num_heads"], c["k_dim"], c["v_dim"], c["v_heads"]

    def rnd(*shape, scale=0.2, base=0.0):
        return base + scale * torch.randn(*shape, generator=g)

    sd = {"model.embeddings.weight": rnd(V, d, scale=0.3), "model.norm.weight": rnd(d, base=1.0)}
    if not c["tie_word_embeddings"]:
        sd["lm_head.weight"] = rnd(V, d)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "attn."
        sd.update({p + "attn_norm.weight": rnd(d, base=1.0), p + "mlp_norm.weight": rnd(d, base=1.0),
                   a + "q_proj.weight": rnd(H * Dk, d, scale=0.4), a + "k_proj.weight": rnd(H * Dk, d, scale=0.4),
                   a + "v_proj.weight": rnd(Hv * Dv, d, scale=0.4), a + "b_proj.weight": rnd(Hv, d, scale=0.5),
                   a + "o_norm.weight": rnd(Dv, base=1.0), a + "o_proj.weight": rnd(d, Hv * Dv),
                   p + "mlp.gate_proj.weight": rnd(I, d), p + "mlp.up_proj.weight": rnd(I, d),
                   p + "mlp.down_proj.weight": rnd(d, I)})
        if c["use_short_conv"]:
            for n, width in (("q", H * Dk), ("k", H * Dk), ("v", Hv * Dv)):
                sd[a + f"{n}_conv1d.weight"] = rnd(width, 1, K, scale=0.5)
        if c["gated"]:
            sd.update({a + "a_proj.weight": rnd(Hv, d, scale=0.5), a + "g_proj.weight": rnd(Hv * Dv, d, scale=0.4),
                       a + "A_log": torch.empty(Hv).uniform_(0, 16, generator=g).log(),
                       a + "dt_bias": rnd(Hv, scale=1.0, base=-3.0)})
    return sd


def _l2(x):
    return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def forward(config: dict, sd: dict, ids: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] (float64 throughout): per head S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T in
    fla's key-by-value layout, o_t = S_t^T q_t with q and k L2-normalised and q times Dk^-1/2. With num_v_heads =
    g num_heads value heads, each q/k head serves g consecutive value heads (fla repeats them '(h g)')."""
    c = resolved(config)
    sd = {k: v.double() for k, v in sd.items()}
    eps, Hk, Dk, Dv, H = c["norm_eps"], c["num_heads"], c["k_dim"], c["v_dim"], c["v_heads"]
    B, T = ids.shape
    x = sd["model.embeddings.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "attn."
        h = _rms(x, sd[p + "attn_norm.weight"], eps)
        q, k, v = (h @ sd[a + f"{n}_proj.weight"].T for n in "qkv")
        if c["use_short_conv"]:
            q, k, v = (_conv(t, sd[a + f"{n}_conv1d.weight"]) for t, n in zip((q, k, v), "qkv"))
        q, k, v = F.silu(q), F.silu(k), F.silu(v)
        q = (_l2(q.view(B, T, Hk, Dk)) * Dk ** -0.5).repeat_interleave(H // Hk, dim=2)
        k = _l2(k.view(B, T, Hk, Dk)).repeat_interleave(H // Hk, dim=2)
        v = v.view(B, T, H, Dv)
        beta = torch.sigmoid(h @ sd[a + "b_proj.weight"].T) * (2.0 if c["allow_neg_eigval"] else 1.0)
        if c["gated"]:
            gate = torch.exp(-torch.exp(sd[a + "A_log"]) * F.softplus(h @ sd[a + "a_proj.weight"].T + sd[a + "dt_bias"]))
        else:
            gate = torch.ones_like(beta)
        S = torch.zeros(B, H, Dk, Dv, dtype=torch.float64)
        eye = torch.eye(Dk, dtype=torch.float64)
        outs = []
        for t in range(T):
            kt, bt = k[:, t], beta[:, t, :, None, None]
            transition = gate[:, t, :, None, None] * (eye - bt * kt[..., :, None] * kt[..., None, :])
            S = transition @ S + bt * kt[..., :, None] * v[:, t, :, None, :]
            outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
        o = _rms(torch.stack(outs, 1), sd[a + "o_norm.weight"], eps)
        if c["gated"]:
            o = o * F.silu((h @ sd[a + "g_proj.weight"].T).view(B, T, H, Dv))
        x = x + o.reshape(B, T, H * Dv) @ sd[a + "o_proj.weight"].T
        h = _rms(x, sd[p + "mlp_norm.weight"], eps)
        m = F.silu(h @ sd[p + "mlp.gate_proj.weight"].T) * (h @ sd[p + "mlp.up_proj.weight"].T)
        x = x + m @ sd[p + "mlp.down_proj.weight"].T
    x = _rms(x, sd["model.norm.weight"], eps)
    head = sd["model.embeddings.weight"] if c["tie_word_embeddings"] else sd["lm_head.weight"]
    return x @ head.T
