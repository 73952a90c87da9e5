"""The fla-hgrn2 layout: flash-linear-attention's ``HGRN2ForCausalLM`` (the fla-hub hgrn2-* checkpoints) both ways
with linlm HGRN2.

fla's model is HGRN2 with other choices than the paper's, each of which is an option of linlm's HGRN2
(models/archs/hgrn2.py), set by the conversion:

- RMSNorm with a weight before each block and at the end (norm_type "rms"), and on the mixer's output when
  elementwise_affine is true (options.out_norm_weight);
- q multiplied by head_dim^-1/2 (the default scale of fla's GLA kernels: options.q_scale);
- SwiGLU channel mixers of width intermediate_size, or hidden_size * hidden_ratio * 2/3 rounded up to a multiple of
  256 (options.mlp_act "silu", glu_dim);
- use_lower_bound (options.lower_bound) and use_short_conv / conv_size (options.short_conv);
- an untied head unless tie_word_embeddings.

Heads: num_heads = hidden_size // expand_ratio (expand_ratio = hidden_size // num_heads when only num_heads is
given); linlm needs the forget width num_heads * expand_ratio to be hidden_size. attn_mode, fuse_norm, fuse_swiglu
and the loss settings change only how it is computed. Hybrid checkpoints (``attn``: softmax-attention layers), the
shared convolution of early fla versions (share_conv_kernel) and activations other than swish are refused.
"""

from __future__ import annotations

import torch

from linlm.conversion.layout import Layout, build, conv_weight, fill, glu_from_hf, glu_to_hf, refuse_model_type
from linlm.conversion.source import Tensors
from linlm.errors import CheckpointError, ConfigError
from linlm.layers.hgrn2 import CONV_STREAMS
from linlm.models.lm import CausalLM

# fla's HGRN2Config defaults, for keys a config.json leaves out.
DEFAULTS = dict(hidden_size=2048, num_hidden_layers=24, num_heads=None, expand_ratio=128, use_short_conv=False,
                conv_size=4, use_lower_bound=True, hidden_ratio=4, intermediate_size=None, hidden_act="swish",
                max_position_embeddings=2048, elementwise_affine=True, norm_eps=1e-6, attn=None,
                tie_word_embeddings=False, vocab_size=32000)
FLA_CONV = {"q": "q_conv1d", "f": "f_conv1d", "v": "i_conv1d"}


def mlp_width(hidden: int, ratio, intermediate) -> int:
    """fla GatedMLP's width: intermediate_size, or 2/3 of hidden * ratio rounded up to a multiple of 256."""
    if intermediate is not None:
        return int(intermediate)
    width = int(hidden * (4 if ratio is None else ratio) * 2 / 3)
    return 256 * ((width + 255) // 256)


def fla_stack(cfg, sd: Tensors) -> dict:
    """The tensors every fla ``*ForCausalLM`` stack shares, under linlm's names: the embeddings, the final norm, an
    untied head, and each layer's two norms, output projection (``attn.o_proj``) and SwiGLU MLP."""
    ours = {"embed.weight": sd["model.embeddings.weight"], "norm.weight": sd["model.norm.weight"]}
    if not cfg.tie_embeddings:
        ours["head.weight"] = sd["lm_head.weight"]
    for i in range(cfg.n_layers):
        p, o = f"model.layers.{i}.", f"layers.{i}."
        ours.update({o + "norm1.weight": sd[p + "attn_norm.weight"], o + "mixer.out.weight": sd[p + "attn.o_proj.weight"],
                     o + "norm2.weight": sd[p + "mlp_norm.weight"], **glu_from_hf(sd, p, o)})
    return ours


def heads(c: dict) -> tuple[int, int]:
    """(num_heads, expand_ratio) as fla's HGRN2Attention resolves them."""
    d, ratio = int(c["hidden_size"]), c["expand_ratio"]
    if ratio is None:
        if c["num_heads"] is None:
            raise CheckpointError("config.json: neither expand_ratio nor num_heads is set; fla needs one of them")
        ratio = d // int(c["num_heads"])
    ratio = int(ratio)
    if ratio <= 0 or d % ratio:
        raise CheckpointError(f"expand_ratio: {ratio} does not divide hidden_size={d}; linlm's HGRN2 needs the forget "
                              f"width num_heads * expand_ratio to equal hidden_size")
    return d // ratio, ratio


def config_values(config: dict, names: set) -> dict:
    """linlm's ModelConfig values for an fla HGRN2 config.json (``names``: the checkpoint's tensor names)."""
    c = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None or k in ("num_heads", "expand_ratio")}}
    if c["attn"]:
        raise CheckpointError("attn: hybrid checkpoints with softmax-attention layers are not supported")
    if c["hidden_act"] not in ("swish", "silu"):
        raise CheckpointError(f"hidden_act: {c['hidden_act']!r} is not supported; fla's HGRN2 MLP uses swish")
    if c["use_short_conv"] and ("share_conv_kernel" in config or any(".h_conv1d." in n for n in names)):
        raise CheckpointError("share_conv_kernel: the convolutions of early fla versions (shared, or followed by "
                              "SiLU) are not supported; convert a checkpoint of fla >= 0.2")
    n_heads, _ = heads(c)
    d = int(c["hidden_size"])
    return dict(arch="hgrn2", vocab_size=int(c["vocab_size"]), d_model=d, n_layers=int(c["num_hidden_layers"]),
                n_heads=n_heads, glu_dim=mlp_width(d, c["hidden_ratio"], c["intermediate_size"]),
                norm_eps=float(c["norm_eps"]), norm_type="rms", tie_embeddings=bool(c["tie_word_embeddings"]),
                options=dict(lower_bound=bool(c["use_lower_bound"]), q_scale=True,
                             out_norm_weight=bool(c["elementwise_affine"]),
                             short_conv=int(c["conv_size"]) if c["use_short_conv"] else 0, mlp_act="silu"))


def _to_linlm(config: dict, sd: Tensors) -> CausalLM:
    refuse_model_type(config, "hgrn2", "fla-hgrn2")
    cfg = build(config_values(config, set(sd)), "config.json")
    opts = cfg.options
    ours = fla_stack(cfg, sd)
    if opts.lower_bound:
        ours["shared.table"] = sd["model.lower_bounds"]
    for i in range(cfg.n_layers):
        a, o = f"model.layers.{i}.attn.", f"layers.{i}."
        ours[o + "mixer.proj.weight"] = torch.cat([sd[a + f"{n}_proj.weight"] for n in "qfi"], dim=0)
        if opts.out_norm_weight:
            ours[o + "mixer.norm.weight"] = sd[a + "g_norm.weight"]
        for s in CONV_STREAMS if opts.short_conv else ():
            ours[o + f"mixer.conv.{s}.weight"] = conv_weight(sd[a + FLA_CONV[s] + ".weight"])
    sd.check_used({"lm_head.weight"})
    return fill(cfg, ours, sd.where)


def _from_linlm(model: CausalLM):
    cfg, opts = model.config, model.config.options
    if cfg.arch != "hgrn2":
        raise ConfigError(f"arch: only 'hgrn2' models convert to fla's HGRN2ForCausalLM, got {cfg.arch!r}")
    differ = [name for name, ok in (("norm_type='rms'", cfg.norm_type == "rms"), ("options.q_scale=true", opts.q_scale),
                                    ("options.mlp_act='silu'", opts.mlp_act == "silu")) if not ok]
    if differ:
        raise ConfigError(f"this HGRN2 computes what fla's HGRN2ForCausalLM cannot: it needs {', '.join(differ)} "
                          f"(a model converted from fla has them; the paper's HGRN2 does not convert to fla)")
    config = dict(model_type="hgrn2", architectures=["HGRN2ForCausalLM"], hidden_size=cfg.d_model,
                  num_hidden_layers=cfg.n_layers, num_heads=cfg.n_heads, expand_ratio=cfg.head_dim,
                  attn_mode="chunk", use_short_conv=bool(opts.short_conv), conv_size=opts.short_conv or 4,
                  use_lower_bound=opts.lower_bound, hidden_ratio=4, intermediate_size=cfg.glu_hidden,
                  hidden_act="swish", max_position_embeddings=cfg.max_seq_len,
                  elementwise_affine=opts.out_norm_weight, norm_eps=cfg.norm_eps, attn=None,
                  tie_word_embeddings=cfg.tie_embeddings, vocab_size=cfg.vocab_size, fuse_norm=True)
    sd = {"model.embeddings.weight": model.embed.weight, "model.norm.weight": model.norm.weight}
    if opts.lower_bound:
        sd["model.lower_bounds"] = model.shared.table
    if model.head is not None:
        sd["lm_head.weight"] = model.head.weight
    for i, layer in enumerate(model.layers):
        p, m = f"model.layers.{i}.", layer.mixer
        a = p + "attn."
        q, f, v = m.proj.weight.chunk(3, dim=0)
        sd.update({p + "attn_norm.weight": layer.norm1.weight, a + "q_proj.weight": q, a + "f_proj.weight": f,
                   a + "i_proj.weight": v, a + "o_proj.weight": m.out.weight, p + "mlp_norm.weight": layer.norm2.weight,
                   **glu_to_hf(layer.mlp, p)})
        if opts.out_norm_weight:
            sd[a + "g_norm.weight"] = m.norm.weight
        for s in CONV_STREAMS if opts.short_conv else ():
            sd[a + FLA_CONV[s] + ".weight"] = m.conv[s].weight.unsqueeze(1)
    return config, {k: v.detach().clone().contiguous() for k, v in sd.items()}


LAYOUT = Layout("fla-hgrn2", "flash-linear-attention's HGRN2ForCausalLM (the fla-hub hgrn2-* checkpoints)", "hgrn2",
                matches=lambda c: c.get("model_type") == "hgrn2", to_linlm=_to_linlm, from_linlm=_from_linlm)
