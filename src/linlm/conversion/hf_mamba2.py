"""The hf-mamba2 layout: Mamba-2 both ways between linlm and transformers' ``Mamba2ForCausalLM`` (the layout of the
state-spaces ``mamba2-*`` checkpoints converted to transformers, and of mamba_ssm's own, whose tensor names are
the same: ``backbone.layers.i.mixer.{in_proj, conv1d, dt_bias, A_log, D, norm, out_proj}``).

Both compute x + mixer(RMSNorm(x)) with the same SSD layer (layers/mamba2.py): the fused in_proj rows
[z; x; B; C; dt], the conv over x, B and C, the gated RMSNorm over n_groups groups. Conversion re-arranges the conv
weight [C, 1, K] to [C, K]. A checkpoint without conv biases converts with zero biases (the same output). Settings
linlm cannot compute are a CheckpointError naming the field: in_proj/out_proj biases (use_bias), an activation
other than SiLU (hidden_act), a clamp of dt (time_step_limit other than [0, inf)), and num_heads * head_dim other
than expand * hidden_size.
"""

from __future__ import annotations

import math

import torch

from linlm.conversion.layout import Layout, build, conv_weight, fill, load_into, refuse_model_type, require_transformers
from linlm.conversion.hf_mamba import backbone_tensors
from linlm.conversion.source import Tensors
from linlm.errors import CheckpointError, ConfigError
from linlm.layers.mamba2 import mamba2_dims
from linlm.models.lm import CausalLM
from linlm.models.model_config import ModelConfig

# One block's mixer tensors, the same name in both layouts (the conv weight apart).
MIXER_NAMES = ("in_proj.weight", "conv1d.bias", "dt_bias", "A_log", "D", "norm.weight", "out_proj.weight")


def _number(value):
    """A number of a config.json: JSON's Infinity is read as inf already; transformers writes a non-finite float as
    {"__float__": "Infinity"}."""
    if isinstance(value, dict) and "__float__" in value:
        return float(value["__float__"])
    return float(value) if isinstance(value, str) else value


def _check(config: dict) -> None:
    """Refuse, naming the field, what linlm's Mamba-2 cannot compute."""
    if config.get("use_bias"):
        raise CheckpointError("use_bias: Mamba-2 checkpoints with in_proj/out_proj biases are not supported")
    if config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise CheckpointError(f"hidden_act: {config['hidden_act']!r} is not supported; linlm's Mamba-2 uses silu")
    low, high = (list(map(_number, config.get("time_step_limit") or (0.0, math.inf))) + [None, None])[:2]
    if low not in (0, 0.0) or high != math.inf:
        raise CheckpointError(f"time_step_limit: ({low}, {high}) clamps dt, which linlm's Mamba-2 does not; only "
                              "(0.0, inf) converts")
    inner = config["hidden_size"] * config.get("expand", 2)
    if config["num_heads"] * config["head_dim"] != inner:
        raise CheckpointError(f"num_heads: {config['num_heads']} heads of head_dim={config['head_dim']} do not fill "
                              f"the inner width expand * hidden_size = {inner}")


def config_from_hf(config: dict) -> ModelConfig:
    """linlm's Mamba-2 config of a transformers ``Mamba2Config`` (as a dict)."""
    refuse_model_type(config, "mamba2", "from_hf_mamba2", "the transformers config")
    _check(config)
    heads = config["num_heads"]
    if heads % config["n_groups"]:
        raise CheckpointError(f"n_groups: {config['n_groups']} does not divide num_heads={heads}")
    return build(dict(arch="mamba2", vocab_size=config["vocab_size"], d_model=config["hidden_size"],
                      n_layers=config["num_hidden_layers"], n_heads=1, norm_eps=config["layer_norm_epsilon"],
                      options=dict(d_state=config["state_size"], d_conv=config["conv_kernel"],
                                   expand=config["expand"], head_dim=config["head_dim"],
                                   n_groups=config["n_groups"]),
                      tie_embeddings=bool(config.get("tie_word_embeddings", False))), "Mamba2Config")


def from_state(cfg: ModelConfig, sd: Tensors, conv_bias: bool = True) -> CausalLM:
    ours = {"embed.weight": sd["backbone.embeddings.weight"], "norm.weight": sd["backbone.norm_f.weight"]}
    conv_dim = mamba2_dims(cfg)[0] + 2 * cfg.options.n_groups * cfg.options.d_state
    for i in range(cfg.n_layers):
        p, o = f"backbone.layers.{i}.", f"layers.{i}."
        for name in MIXER_NAMES:
            if name == "conv1d.bias" and not conv_bias:
                ours[o + "mixer.conv1d.bias"] = torch.zeros(conv_dim)
                continue
            ours[o + "mixer." + name] = sd[p + "mixer." + name]
        ours[o + "mixer.conv1d.weight"] = conv_weight(sd[p + "mixer.conv1d.weight"])
        ours[o + "norm1.weight"] = sd[p + "norm.weight"]
    if not cfg.tie_embeddings:
        ours["head.weight"] = sd["lm_head.weight"]
    sd.check_used({"lm_head.weight"})
    return fill(cfg, ours, sd.where)


def from_hf_mamba2(hf_model) -> CausalLM:
    """A linlm Mamba-2 with the weights of a transformers ``Mamba2ForCausalLM``."""
    config = hf_model.config.to_dict()
    return from_state(config_from_hf(config), Tensors(hf_model.state_dict(), type(hf_model).__name__),
                      bool(config.get("use_conv_bias", True)))


def hf_config_from(cfg: ModelConfig):
    require_transformers("Mamba-2")
    from transformers import Mamba2Config

    if cfg.arch != "mamba2":
        raise ConfigError(f"arch: only 'mamba2' models convert to Mamba2ForCausalLM, got {cfg.arch!r}")
    if cfg.norm_type not in ("auto", "rms"):
        raise ConfigError(f"norm_type: Mamba2ForCausalLM uses RMSNorm, got norm_type={cfg.norm_type!r}")
    if cfg.attention_layers:
        raise ConfigError(f"attn_layers: Mamba2ForCausalLM has no attention layers; this hybrid has them at "
                          f"{list(cfg.attention_layers)}")
    o = cfg.options
    _, heads, head_dim, groups, n = mamba2_dims(cfg)
    return Mamba2Config(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, state_size=n,
                        num_hidden_layers=cfg.n_layers, layer_norm_epsilon=cfg.norm_eps, expand=o.expand,
                        conv_kernel=o.d_conv, n_groups=groups, num_heads=heads, head_dim=head_dim, use_bias=False,
                        use_conv_bias=True, hidden_act="silu", time_step_limit=(0.0, math.inf),
                        tie_word_embeddings=cfg.tie_embeddings)


def hf_state(model: CausalLM) -> dict:
    """The tensors of ``model`` under Mamba2ForCausalLM's names (no lm_head.weight when tied)."""
    sd = backbone_tensors(model)
    for i, layer in enumerate(model.layers):
        p, m = f"backbone.layers.{i}.", layer.mixer
        sd[p + "norm.weight"] = layer.norm1.weight
        for name in MIXER_NAMES:
            sd[p + "mixer." + name] = m.get_parameter(name)
        sd[p + "mixer.conv1d.weight"] = m.conv1d.weight.unsqueeze(1)
    return {k: v.detach().clone().contiguous() for k, v in sd.items()}


def to_hf_mamba2(model: CausalLM):
    """A transformers ``Mamba2ForCausalLM`` with the weights of a linlm Mamba-2."""
    require_transformers("Mamba-2")
    from transformers import Mamba2ForCausalLM

    return load_into(Mamba2ForCausalLM(hf_config_from(model.config)), hf_state(model),
                     tied=model.head is None).eval()


def _to_linlm(config: dict, sd: Tensors) -> CausalLM:
    return from_state(config_from_hf(config), sd, bool(config.get("use_conv_bias", True)))


def _from_linlm(model: CausalLM):
    return hf_config_from(model.config).to_dict(), hf_state(model)


LAYOUT = Layout("hf-mamba2", "transformers' Mamba2ForCausalLM (and mamba_ssm's Mamba-2, the same tensor names)",
                "mamba2", matches=lambda c: c.get("model_type") == "mamba2", to_linlm=_to_linlm,
                from_linlm=_from_linlm)
