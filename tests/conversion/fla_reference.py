"""flash-linear-attention's HGRN2ForCausalLM, written out from its equations for the tests (fla runs only on
GPUs): its checkpoint layout (tensor names and shapes of fla/models/hgrn2 and fla/layers/hgrn2.py) and its forward
pass in the recurrent form, one token at a time, on a state dict of that layout. Independent of linlm's code."""

from __future__ import annotations

import json
import math

import torch
import torch.nn.functional as F
from safetensors.torch import save_file


def write_fla(directory, config: dict, sd: dict):
    """An fla checkpoint directory: config.json and model.safetensors."""
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    save_file(sd, str(directory / "model.safetensors"))
    return directory


def save_like_pretrained(model, directory):
    """What ``model.save_pretrained(directory)`` writes for an fla model (config.json from its config class, the
    weights as model.safetensors without a tied head), written by hand: fla 0.5's list of tied-weight keys breaks
    the save_pretrained of some transformers versions."""
    directory.mkdir()
    model.config.to_json_file(directory / "config.json")
    sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    save_file(sd, str(directory / "model.safetensors"))
    return directory


def mlp_width(c: dict) -> int:
    """fla GatedMLP's width: intermediate_size, or 2/3 of hidden_size * hidden_ratio rounded up to 256."""
    if c["intermediate_size"] is not None:
        return c["intermediate_size"]
    return 256 * math.ceil(int(c["hidden_size"] * c["hidden_ratio"] * 2 / 3) / 256)


def resolved(config: dict) -> dict:
    """The config with fla's defaults and its head and MLP-width rules applied."""
    c = {**dict(use_short_conv=False, conv_size=4, use_lower_bound=True, hidden_ratio=4, intermediate_size=None,
                elementwise_affine=True, norm_eps=1e-6, tie_word_embeddings=False), **config}
    d = c["hidden_size"]
    c["expand_ratio"] = c.get("expand_ratio") or d // c["num_heads"]
    c["num_heads"] = d // c["expand_ratio"]
    c["intermediate_size"] = mlp_width(c)
    return c


def random_state(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under fla's names and shapes; norms around 1, projections small, lower bounds of order 1."""
    c = resolved(config)
    g = torch.Generator().manual_seed(seed)
    d, V, I, K = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["conv_size"]

    def rnd(*shape, scale=0.2, base=0.0):
        return base + scale * torch.randn(*shape, generator=g)

    sd = {"model.embeddings.weight": rnd(V, d, scale=0.3), "model.norm.weight": rnd(d, base=1.0)}
    if c["use_lower_bound"]:
        sd["model.lower_bounds"] = rnd(c["num_hidden_layers"], d, scale=1.0)
    if not c["tie_word_embeddings"]:
        sd["lm_head.weight"] = rnd(V, d)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd.update({p + "attn_norm.weight": rnd(d, base=1.0), p + "mlp_norm.weight": rnd(d, base=1.0),
                   p + "attn.o_proj.weight": rnd(d, d), p + "mlp.gate_proj.weight": rnd(I, d),
                   p + "mlp.up_proj.weight": rnd(I, d), p + "mlp.down_proj.weight": rnd(d, I)})
        for name in ("q", "f", "i"):
            sd[p + f"attn.{name}_proj.weight"] = rnd(d, d, scale=0.4)
            if c["use_short_conv"]:
                sd[p + f"attn.{name}_conv1d.weight"] = rnd(d, 1, K, scale=0.5)
        if c["elementwise_affine"]:
            sd[p + "attn.g_norm.weight"] = rnd(d, base=1.0)
    return sd


def _rms(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def _conv(x, w):
    """Causal depthwise conv1d (fla's ShortConvolution without bias or activation): x [B, T, C], w [C, 1, K]."""
    T, K = x.shape[1], w.shape[-1]
    return F.conv1d(x.transpose(1, 2), w, padding=K - 1, groups=x.shape[-1])[..., :T].transpose(1, 2)


def forward(config: dict, sd: dict, ids: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of fla's HGRN2ForCausalLM (float64 throughout)."""
    c = resolved(config)
    sd = {k: v.double() for k, v in sd.items()}
    eps, H, Kd = c["norm_eps"], c["num_heads"], c["expand_ratio"]
    B, T = ids.shape
    x = sd["model.embeddings.weight"][ids]
    if c["use_lower_bound"]:
        sm = sd["model.lower_bounds"].softmax(0)
        lbs = sm.cumsum(0) - sm[0]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms(x, sd[p + "attn_norm.weight"], eps)
        q, f, v = (h @ sd[p + f"attn.{n}_proj.weight"].T for n in ("q", "f", "i"))
        if c["use_short_conv"]:
            q, f, v = (_conv(t, sd[p + f"attn.{n}_conv1d.weight"]) for t, n in zip((q, f, v), "qfi"))
        q = F.silu(q) * Kd ** -0.5
        forget = torch.sigmoid(f)
        if c["use_lower_bound"] and i > 0:
            forget = lbs[i] + (1 - lbs[i]) * forget
        k = 1 - forget
        q, k, forget, v = (t.view(B, T, H, -1) for t in (q, k, forget, v))
        S = torch.zeros(B, H, Kd, v.shape[-1], dtype=torch.float64)
        outs = []
        for t in range(T):
            S = forget[:, t, :, :, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
            outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
        o = torch.stack(outs, 1).reshape(B, T, -1)
        o = _rms(o, sd.get(p + "attn.g_norm.weight"), eps) @ sd[p + "attn.o_proj.weight"].T
        x = mlp_block(sd, p, x + o, eps)
    return head_logits(c, sd, x, eps)


def mlp_block(sd: dict, p: str, x: torch.Tensor, eps: float) -> torch.Tensor:
    """x plus fla's GatedMLP (SwiGLU) of block ``p`` on RMSNorm(x)."""
    h = _rms(x, sd[p + "mlp_norm.weight"], eps)
    m = F.silu(h @ sd[p + "mlp.gate_proj.weight"].T) * (h @ sd[p + "mlp.up_proj.weight"].T)
    return x + m @ sd[p + "mlp.down_proj.weight"].T


def head_logits(c: dict, sd: dict, x: torch.Tensor, eps: float) -> torch.Tensor:
    """The final RMSNorm and the (tied or own) head of an fla model."""
    x = _rms(x, sd["model.norm.weight"], eps)
    head = sd["model.embeddings.weight"] if c["tie_word_embeddings"] else sd["lm_head.weight"]
    return x @ head.T
