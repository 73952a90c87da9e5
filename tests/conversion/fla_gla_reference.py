"""flash-linear-attention's GLAForCausalLM, written out from its equations for the tests (fla runs only on GPUs):
its checkpoint layout (tensor names and shapes of fla/models/gla and fla/layers/gla.py) and its forward pass in the
recurrent form, one token at a time, float64, on a state dict of that layout. Independent of linlm's code."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fla_reference import head_logits, mlp_block


def resolved(config: dict) -> dict:
    c = {**dict(expand_k=0.5, expand_v=1, hidden_ratio=4, intermediate_size=None, norm_eps=1e-6,
                gate_low_rank_dim=16, gate_logit_normalizer=16, tie_word_embeddings=False, fuse_norm=True),
         **config}
    if c["intermediate_size"] is None:
        c["intermediate_size"] = 256 * math.ceil(int(c["hidden_size"] * c["hidden_ratio"] * 2 / 3) / 256)
    return c


def random_state(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under fla's names and shapes; norms around 1, gates spread over (0, 1)."""
    c = resolved(config)
    g = torch.Generator().manual_seed(seed)
    d, V, I, r = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["gate_low_rank_dim"]
    kd, vd = int(d * c["expand_k"]), int(d * c["expand_v"])

    def rnd(*shape, scale=0.2, base=0.0):
        return base + scale * torch.randn(*shape, generator=g)

    sd = {"model.embeddings.weight": rnd(V, d, scale=0.3), "model.norm.weight": rnd(d, base=1.0)}
    if not c["tie_word_embeddings"]:
        sd["lm_head.weight"] = rnd(V, d)
    norm = "g_norm_swish_gate" if c["fuse_norm"] else "g_norm"
    for i in range(c["num_hidden_layers"]):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.attn."
        sd.update({p + "attn_norm.weight": rnd(d, base=1.0), p + "mlp_norm.weight": rnd(d, base=1.0),
                   a + "q_proj.weight": rnd(kd, d, scale=0.4), a + "k_proj.weight": rnd(kd, d, scale=0.4),
                   a + "v_proj.weight": rnd(vd, d), a + "g_proj.weight": rnd(vd, d), a + "o_proj.weight": rnd(d, vd),
                   a + "gk_proj.0.weight": rnd(r, d, scale=0.5), a + "gk_proj.1.weight": rnd(kd, r, scale=0.5),
                   a + "gk_proj.1.bias": rnd(kd, scale=3.0), a + f"{norm}.weight": rnd(vd // c["num_heads"], base=1.0),
                   p + "mlp.gate_proj.weight": rnd(I, d), p + "mlp.up_proj.weight": rnd(I, d),
                   p + "mlp.down_proj.weight": rnd(d, I)})
    return sd


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def forward(config: dict, sd: dict, ids: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of fla's GLAForCausalLM (float64 throughout):
    S_t = Diag(sigmoid(x W_1 W_2 + b)^(1/normalizer)) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t K^-1/2,
    out = W_o (RMSNorm_head(o) * silu(x W_g))."""
    c = resolved(config)
    sd = {k: v.double() for k, v in sd.items()}
    eps, H = c["norm_eps"], c["num_heads"]
    B, T = ids.shape
    x = sd["model.embeddings.weight"][ids]
    norm = "g_norm_swish_gate" if c["fuse_norm"] else "g_norm"
    for i in range(c["num_hidden_layers"]):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.attn."
        h = _rms(x, sd[p + "attn_norm.weight"], eps)
        q, k, v, g = (h @ sd[a + f"{n}_proj.weight"].T for n in "qkvg")
        alpha = torch.sigmoid(h @ sd[a + "gk_proj.0.weight"].T @ sd[a + "gk_proj.1.weight"].T
                              + sd[a + "gk_proj.1.bias"]) ** (1 / c["gate_logit_normalizer"])
        q, k, v, alpha = (t.view(B, T, H, -1) for t in (q, k, v, alpha))
        K = q.shape[-1]
        S = torch.zeros(B, H, K, v.shape[-1], dtype=torch.float64)
        outs = []
        for t in range(T):
            S = alpha[:, t, :, :, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
            outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * K ** -0.5, S))
        o = _rms(torch.stack(outs, 1), sd[a + f"{norm}.weight"], eps) * F.silu(g).view(B, T, H, -1)
        x = mlp_block(sd, p, x + o.reshape(B, T, -1) @ sd[a + "o_proj.weight"].T, eps)
    return head_logits(c, sd, x, eps)
