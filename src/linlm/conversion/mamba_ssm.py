"""The mamba-ssm layout: the checkpoints of mamba_ssm's own ``MambaLMHeadModel`` (state-spaces/mamba-130m ...
mamba-2.8b) into linlm Mamba.

config.json holds d_model, n_layer, vocab_size, ssm_cfg (the Mamba block's d_state, d_conv, expand, dt_rank,
conv_bias, bias), rms_norm, residual_in_fp32, fused_add_norm, pad_vocab_size_multiple and tie_embeddings. The
weights are ``backbone.embedding.weight``, ``backbone.layers.N.norm.*``, ``backbone.layers.N.mixer.*`` (the names
transformers' Mamba uses too), ``backbone.norm_f.*`` and ``lm_head.weight``. mamba_ssm pads the vocabulary up to a
multiple of pad_vocab_size_multiple, so the embeddings have more rows than vocab_size: the linlm model keeps the
padded size (the extra rows are never a tokenizer's ids). Its norm epsilon is fixed at 1e-5; rms_norm=False means
LayerNorm (with a bias), which linlm builds as norm_type "layer". residual_in_fp32 and fused_add_norm change only
rounding. Hybrid checkpoints (attention layers, d_intermediate > 0) and Mamba-2 blocks are refused.
"""

from __future__ import annotations

import math

from linlm.conversion.hf_mamba import mamba_blocks
from linlm.conversion.layout import Layout, build, fill
from linlm.conversion.source import Tensors
from linlm.errors import CheckpointError
from linlm.models.lm import CausalLM

NORM_EPS = 1e-5  # mamba_ssm's MixerModel default; its config has no key for it
KEYS = ("d_model", "n_layer", "vocab_size")


def padded_vocab(vocab: int, multiple: int) -> int:
    return vocab if multiple <= 1 else -(-vocab // multiple) * multiple


def _refuse(config: dict) -> None:
    ssm = config.get("ssm_cfg") or {}
    if ssm.get("layer", "Mamba1") != "Mamba1":
        raise CheckpointError(f"ssm_cfg.layer: {ssm['layer']!r} blocks are not supported; linlm converts Mamba-1")
    for key in ("attn_layer_idx", "attn_cfg"):
        if config.get(key):
            raise CheckpointError(f"{key}: hybrid checkpoints with attention layers are not supported")
    if config.get("d_intermediate", 0):
        raise CheckpointError("d_intermediate: checkpoints with an MLP after each Mamba block are not supported")
    if ssm.get("bias", False):
        raise CheckpointError("ssm_cfg.bias: in_proj/out_proj biases are not supported")


def _to_linlm(config: dict, sd: Tensors) -> CausalLM:
    missing = [k for k in KEYS if k not in config]
    if missing:
        raise CheckpointError(f"config.json: lacks {', '.join(missing)}; a mamba_ssm config has {', '.join(KEYS)}")
    _refuse(config)
    ssm = config.get("ssm_cfg") or {}
    d = int(config["d_model"])
    rank = ssm.get("dt_rank", "auto")
    vocab = padded_vocab(int(config["vocab_size"]), int(config.get("pad_vocab_size_multiple", 8)))
    rows = sd["backbone.embedding.weight"].shape[0]
    if rows != vocab:
        raise CheckpointError(f"{sd.where}: the embeddings have {rows} rows; config.json's vocab_size "
                              f"{config['vocab_size']} padded to a multiple of "
                              f"{config.get('pad_vocab_size_multiple', 8)} is {vocab}: the weights are another size")
    tied = bool(config.get("tie_embeddings", True))
    cfg = build(dict(arch="mamba", vocab_size=vocab, d_model=d, n_layers=int(config["n_layer"]),
                     options=dict(d_state=int(ssm.get("d_state", 16)), d_conv=int(ssm.get("d_conv", 4)),
                                  expand=int(ssm.get("expand", 2)),
                                  dt_rank=math.ceil(d / 16) if rank == "auto" else int(rank)),
                     norm_eps=NORM_EPS, norm_type="rms" if config.get("rms_norm", True) else "layer",
                     tie_embeddings=tied), "config.json")
    ours = {"embed.weight": sd["backbone.embedding.weight"],
            **mamba_blocks(cfg, sd, "backbone.layers.", bool(ssm.get("conv_bias", True)))}
    for name in ("weight", "bias") if cfg.norm_type == "layer" else ("weight",):
        ours["norm." + name] = sd["backbone.norm_f." + name]
    if not tied:
        ours["head.weight"] = sd["lm_head.weight"]
    sd.check_used({"lm_head.weight"})
    return fill(cfg, ours, sd.where)


def matches(config: dict) -> bool:
    return "model_type" not in config and all(k in config for k in KEYS) and "format" not in config


LAYOUT = Layout("mamba-ssm", "mamba_ssm's MambaLMHeadModel (the state-spaces mamba-130m ... mamba-2.8b checkpoints)",
                "mamba", matches=matches, to_linlm=_to_linlm)
