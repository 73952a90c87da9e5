"""The fla-deltanet and fla-gated-deltanet layouts: flash-linear-attention's ``DeltaNetForCausalLM`` and
``GatedDeltaNetForCausalLM`` (config.json model_type "delta_net" / "gated_deltanet") into linlm's deltanet and
gated_deltanet.

Both are fla's usual stack: RMSNorm with a weight before each block and at the end, SwiGLU channel mixers of width
intermediate_size (or hidden_size * hidden_ratio * 2/3 rounded up to a multiple of 256), an untied head unless
tie_word_embeddings. The mixers' tensors map one to one onto linlm's (layers/deltanet.py,
layers/gated_deltanet.py): q_proj, k_proj, v_proj (then g_proj, a_proj for Gated DeltaNet) and b_proj stacked
into the fused projection, the three depthwise q/k/v convolutions [C, 1, kernel] into the one ShortConv [C, kernel],
o_norm's weight as the per-head norm, o_proj as the output; A_log and dt_bias as they are.

What linlm computes: DeltaNet with keys and values of width hidden_size / num_heads (expand_k = expand_v = 1),
SiLU on q, k, v, L2-normalised q and k, beta = sigmoid(x W_b) (2 sigmoid with allow_neg_eigval), the per-head
output norm without a gate; Gated DeltaNet with head_dim and expand_v as given, the output gate on, and num_v_heads
value heads (grouped values: a multiple of num_heads, value head h reading q and k head h // (num_v_heads /
num_heads), as fla repeats them) as linlm's options.v_heads. Any other setting (use_beta false, use_gate,
qk_activation / qk_norm other than silu / l2, expand_k or expand_v other than 1 for DeltaNet, conv_bias, num_v_heads
below num_heads or not a multiple of it, use_output_norm false, an ``attn`` hybrid, an activation other than swish)
is a CheckpointError naming the field.
"""

from __future__ import annotations

import torch

from linlm.conversion.fla_hgrn2 import fla_stack, mlp_width
from linlm.conversion.layout import Layout, build, conv_weight, fill, refuse_model_type
from linlm.conversion.source import Tensors
from linlm.errors import CheckpointError
from linlm.models.lm import CausalLM

# fla's config defaults (DeltaNetConfig, GatedDeltaNetConfig), for keys a config.json leaves out.
COMMON = dict(use_short_conv=True, conv_size=4, conv_bias=False, allow_neg_eigval=False, hidden_ratio=4,
              intermediate_size=None, hidden_act="swish", norm_eps=1e-6, attn=None, tie_word_embeddings=False,
              vocab_size=32000, max_position_embeddings=2048)
DELTANET = dict(COMMON, hidden_size=2048, num_hidden_layers=24, num_heads=16, expand_k=1.0, expand_v=1.0,
                use_gate=False, use_beta=True, use_output_norm=True, qk_norm="l2", qk_activation="silu")
GATED = dict(COMMON, hidden_size=2048, num_hidden_layers=21, num_heads=6, head_dim=256, expand_v=2.0,
             num_v_heads=None, use_gate=True)
# (field, the value linlm computes) for every setting linlm has one way only.
DELTANET_FIXED = (("use_beta", True), ("use_gate", False), ("use_output_norm", True), ("qk_norm", "l2"),
                  ("qk_activation", "silu"), ("expand_k", 1.0), ("expand_v", 1.0), ("conv_bias", False),
                  ("attn", None))
GATED_FIXED = (("use_gate", True), ("conv_bias", False), ("attn", None))


def _resolved(config: dict, defaults: dict, fixed) -> dict:
    c = {**defaults, **{k: v for k, v in config.items() if v is not None}}
    for name, want in fixed:
        if c.get(name) != want and not (isinstance(want, float) and c.get(name) == int(want)):
            raise CheckpointError(f"{name}: {c.get(name)!r} is not supported; linlm's layer computes {name}="
                                  f"{want!r} (fla's default)")
    if c["hidden_act"] not in ("swish", "silu"):
        raise CheckpointError(f"hidden_act: {c['hidden_act']!r} is not supported; fla's MLP uses swish")
    return c


def _common_values(c: dict, arch: str) -> dict:
    d = int(c["hidden_size"])
    return dict(arch=arch, vocab_size=int(c["vocab_size"]), d_model=d, n_layers=int(c["num_hidden_layers"]),
                n_heads=int(c["num_heads"]), glu_dim=mlp_width(d, c["hidden_ratio"], c["intermediate_size"]),
                norm_eps=float(c["norm_eps"]), norm_type="rms", tie_embeddings=bool(c["tie_word_embeddings"]))


def deltanet_values(config: dict) -> dict:
    c = _resolved(config, DELTANET, DELTANET_FIXED)
    if int(c["hidden_size"]) % int(c["num_heads"]):
        raise CheckpointError(f"num_heads: {c['num_heads']} does not divide hidden_size={c['hidden_size']}")
    return dict(_common_values(c, "deltanet"), options=dict(
        short_conv=int(c["conv_size"]) if c["use_short_conv"] else 0, neg_eigval=bool(c["allow_neg_eigval"])))


def gated_values(config: dict) -> dict:
    c = _resolved(config, GATED, GATED_FIXED)
    heads, v_heads = int(c["num_heads"]), int(c["num_v_heads"] or c["num_heads"])
    if v_heads < heads or v_heads % heads:
        raise CheckpointError(f"num_v_heads: {v_heads} value heads over num_heads={heads} query/key heads is not "
                              f"supported; fla repeats each query/key head num_v_heads / num_heads times, so "
                              f"num_v_heads must be a multiple of num_heads")
    return dict(_common_values(c, "gated_deltanet"), options=dict(
        head_k_dim=int(c["head_dim"]), expand_v=float(c["expand_v"]), v_heads=0 if v_heads == heads else v_heads,
        short_conv=int(c["conv_size"]) if c["use_short_conv"] else 0, neg_eigval=bool(c["allow_neg_eigval"])))


def _to_linlm(config: dict, sd: Tensors, model_type: str, values, extra: tuple[str, ...]) -> CausalLM:
    """``extra``: the projections after q, k, v in linlm's fused projection, in its order (b last)."""
    refuse_model_type(config, model_type, LAYOUTS[model_type].name)
    cfg = build(values(config), "config.json")
    ours = fla_stack(cfg, sd)
    for i in range(cfg.n_layers):
        a, o = f"model.layers.{i}.attn.", f"layers.{i}."
        ours[o + "mixer.proj.weight"] = torch.cat([sd[a + f"{n}_proj.weight"] for n in ("q", "k", "v", *extra)], 0)
        ours[o + "mixer.norm.weight"] = sd[a + "o_norm.weight"]
        if cfg.options.short_conv:
            ours[o + "mixer.conv.weight"] = torch.cat([conv_weight(sd[a + f"{n}_conv1d.weight"]) for n in "qkv"], 0)
        if cfg.arch == "gated_deltanet":
            ours[o + "mixer.A_log"] = sd[a + "A_log"]
            ours[o + "mixer.dt_bias"] = sd[a + "dt_bias"]
    sd.check_used({"lm_head.weight"})
    return fill(cfg, ours, sd.where)


LAYOUTS = {
    "delta_net": Layout("fla-deltanet", "flash-linear-attention's DeltaNetForCausalLM", "deltanet",
                        matches=lambda c: c.get("model_type") == "delta_net",
                        to_linlm=lambda c, sd: _to_linlm(c, sd, "delta_net", deltanet_values, ("b",))),
    "gated_deltanet": Layout("fla-gated-deltanet", "flash-linear-attention's GatedDeltaNetForCausalLM",
                             "gated_deltanet", matches=lambda c: c.get("model_type") == "gated_deltanet",
                             to_linlm=lambda c, sd: _to_linlm(c, sd, "gated_deltanet", gated_values,
                                                              ("g", "a", "b"))),
}
