"""The fla-gla layout: flash-linear-attention's ``GLAForCausalLM`` (the fla-hub gla-* checkpoints) into linlm GLA,
and back for models converted from it.

linlm's GLA (layers/gla.py) uses fla's names and choices: q scaled by K^-1/2, the gate logsigmoid(x W_1 W_2 + b) / tau
(``gk_proj.0``, ``gk_proj.1``; tau = gate_logit_normalizer), an RMSNorm per head with a weight times silu(x W_g)
before o_proj (``g_norm_swish_gate``, or ``g_norm`` when fla does not fuse them), RMSNorm blocks, a SwiGLU of width
intermediate_size or 2/3 of hidden_size * hidden_ratio rounded up to 256. Checkpoints fla computes otherwise are a
CheckpointError naming the field: short convolutions (use_short_conv), grouped key/value heads (num_kv_heads), a
clamped gate (clamp_min), a feature map, no output gate, no gate on k (use_gk) or one on v (use_gv), a gate
activation other than swish, softmax-attention layers (attn). elementwise_affine false converts with unit weights.
"""

from __future__ import annotations

import torch

from linlm.conversion.fla_hgrn2 import mlp_width
from linlm.conversion.layout import Layout, build, fill, glu_from_hf, glu_to_hf, refuse_model_type
from linlm.conversion.source import Tensors
from linlm.errors import CheckpointError, ConfigError
from linlm.models.lm import CausalLM

# fla's GLAConfig defaults, for keys a config.json leaves out.
DEFAULTS = dict(hidden_size=2048, expand_k=0.5, expand_v=1, hidden_ratio=4, intermediate_size=None,
                num_hidden_layers=24, num_heads=4, num_kv_heads=None, feature_map=None, attn_mode="chunk",
                use_short_conv=False, conv_size=4, use_output_gate=True, clamp_min=None, hidden_act="swish",
                max_position_embeddings=2048, elementwise_affine=True, norm_eps=1e-6, use_gk=True, use_gv=False,
                attn=None, tie_word_embeddings=False, vocab_size=32000, gate_fn="swish", gate_low_rank_dim=16,
                gate_logit_normalizer=16)
# Settings linlm's GLA cannot compute: (field, the value it can, what else means).
REFUSED = (("use_short_conv", False, "short convolutions on q, k and v"),
           ("feature_map", None, "a feature map on q and k"),
           ("clamp_min", None, "a clamped forget gate"),
           ("use_output_gate", True, "no output gate"),
           ("use_gk", True, "no forget gate on the keys"),
           ("use_gv", False, "a forget gate on the values"),
           ("attn", None, "hybrid softmax-attention layers"))


def config_values(config: dict) -> dict:
    """linlm's ModelConfig values for an fla GLA config.json."""
    c = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None or k in ("num_kv_heads",)}}
    for field, ok, what in REFUSED:
        if c.get(field) != ok and not (field == "attn" and not c.get(field)):
            raise CheckpointError(f"{field}: {c.get(field)!r} ({what}) is not supported by linlm's GLA")
    if c["num_kv_heads"] not in (None, c["num_heads"]):
        raise CheckpointError(f"num_kv_heads: {c['num_kv_heads']} grouped key/value heads are not supported by "
                              f"linlm's GLA (num_heads={c['num_heads']})")
    for field in ("hidden_act", "gate_fn"):
        if c[field] not in ("swish", "silu"):
            raise CheckpointError(f"{field}: {c[field]!r} is not supported; linlm's GLA uses swish")
    d = int(c["hidden_size"])
    return dict(arch="gla", vocab_size=int(c["vocab_size"]), d_model=d, n_layers=int(c["num_hidden_layers"]),
                n_heads=int(c["num_heads"]), glu_dim=mlp_width(d, c["hidden_ratio"], c["intermediate_size"]),
                norm_eps=float(c["norm_eps"]), norm_type="rms", tie_embeddings=bool(c["tie_word_embeddings"]),
                options=dict(expand_k=float(c["expand_k"]), expand_v=float(c["expand_v"]),
                             gate_rank=int(c["gate_low_rank_dim"]), gate_tau=float(c["gate_logit_normalizer"])))


def _to_linlm(config: dict, sd: Tensors) -> CausalLM:
    refuse_model_type(config, "gla", "fla-gla")
    cfg = build(config_values(config), "config.json")
    ours = {"embed.weight": sd["model.embeddings.weight"], "norm.weight": sd["model.norm.weight"]}
    if not cfg.tie_embeddings:
        ours["head.weight"] = sd["lm_head.weight"]
    v_dim = int(cfg.d_model * cfg.options.expand_v) // cfg.n_heads
    for i in range(cfg.n_layers):
        p, o = f"model.layers.{i}.", f"layers.{i}."
        a, m = p + "attn.", o + "mixer."
        ours.update({o + "norm1.weight": sd[p + "attn_norm.weight"], o + "norm2.weight": sd[p + "mlp_norm.weight"],
                     m + "gk_proj.down.weight": sd[a + "gk_proj.0.weight"],
                     m + "gk_proj.up.weight": sd[a + "gk_proj.1.weight"],
                     m + "gk_proj.up.bias": sd[a + "gk_proj.1.bias"], **glu_from_hf(sd, p, o)})
        for name in ("q_proj", "k_proj", "v_proj", "g_proj", "o_proj"):
            ours[m + name + ".weight"] = sd[a + name + ".weight"]
        norm = next((n for n in ("g_norm_swish_gate.weight", "g_norm.weight") if a + n in sd), None)
        ours[m + "g_norm.weight"] = sd[a + norm] if norm else torch.ones(v_dim)
    sd.check_used({"lm_head.weight"})
    return fill(cfg, ours, sd.where)


def _from_linlm(model: CausalLM):
    cfg, o = model.config, model.config.options
    if cfg.arch != "gla":
        raise ConfigError(f"arch: only 'gla' models convert to fla's GLAForCausalLM, got {cfg.arch!r}")
    if cfg.norm_type not in ("auto", "rms") or cfg.attention_layers:
        raise ConfigError("this GLA computes what fla's GLAForCausalLM cannot (norm_type other than rms, or "
                          "attention layers)")
    config = dict(model_type="gla", architectures=["GLAForCausalLM"], hidden_size=cfg.d_model,
                  num_hidden_layers=cfg.n_layers, num_heads=cfg.n_heads, expand_k=o.expand_k, expand_v=o.expand_v,
                  intermediate_size=cfg.glu_hidden, hidden_act="swish", gate_fn="swish", attn_mode="chunk",
                  gate_low_rank_dim=o.gate_rank, gate_logit_normalizer=o.gate_tau, use_short_conv=False,
                  use_output_gate=True, elementwise_affine=True, norm_eps=cfg.norm_eps, fuse_norm=True,
                  tie_word_embeddings=cfg.tie_embeddings, vocab_size=cfg.vocab_size,
                  max_position_embeddings=cfg.max_seq_len)
    sd = {"model.embeddings.weight": model.embed.weight, "model.norm.weight": model.norm.weight}
    if model.head is not None:
        sd["lm_head.weight"] = model.head.weight
    for i, layer in enumerate(model.layers):
        p, m = f"model.layers.{i}.", layer.mixer
        a = p + "attn."
        sd.update({p + "attn_norm.weight": layer.norm1.weight, p + "mlp_norm.weight": layer.norm2.weight,
                   a + "gk_proj.0.weight": m.gk_proj.down.weight, a + "gk_proj.1.weight": m.gk_proj.up.weight,
                   a + "gk_proj.1.bias": m.gk_proj.up.bias, a + "g_norm_swish_gate.weight": m.g_norm.weight,
                   **glu_to_hf(layer.mlp, p)})
        for name in ("q_proj", "k_proj", "v_proj", "g_proj", "o_proj"):
            sd[a + name + ".weight"] = getattr(m, name).weight
    return config, {k: v.detach().clone().contiguous() for k, v in sd.items()}


LAYOUT = Layout("fla-gla", "flash-linear-attention's GLAForCausalLM (the fla-hub gla-* checkpoints)", "gla",
                matches=lambda c: c.get("model_type") == "gla", to_linlm=_to_linlm, from_linlm=_from_linlm)
