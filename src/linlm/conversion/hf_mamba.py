"""The hf-mamba layout: Mamba-1 both ways between linlm and transformers' ``MambaForCausalLM`` (the layout of the
state-spaces ``mamba-*-hf`` checkpoints).

Both compute the same block, x + mixer(RMSNorm(x)), with the same selective scan; conversion re-arranges tensors:
the conv weight [Din, 1, K] becomes [Din, K], ``dt_proj`` becomes ``dt_weight`` / ``dt_bias``. A checkpoint without
conv biases (use_conv_bias=False) converts with zero biases, which compute the same. Biases on in_proj / out_proj
(use_bias=True) and activations other than SiLU are refused with a CheckpointError naming the field.
"""

from __future__ import annotations

import torch

from linlm.conversion.layout import Layout, build, conv_weight, fill, load_into, refuse_model_type, require_transformers
from linlm.conversion.source import Tensors
from linlm.errors import CheckpointError, ConfigError
from linlm.layers.mamba import dt_rank, inner_dim
from linlm.models.lm import CausalLM
from linlm.models.model_config import ModelConfig

# linlm's names of one block's mixer tensors and the names both Mamba layouts (transformers', mamba_ssm's) give them.
MIXER_NAMES = {"in_proj.weight": "in_proj.weight", "x_proj.weight": "x_proj.weight",
               "out_proj.weight": "out_proj.weight", "A_log": "A_log", "D": "D",
               "dt_weight": "dt_proj.weight", "dt_bias": "dt_proj.bias", "conv.bias": "conv1d.bias"}


def mamba_blocks(cfg: ModelConfig, sd, prefix: str, conv_bias: bool) -> dict:
    """linlm's tensors of every block from a Mamba checkpoint whose block i is ``{prefix}{i}.`` (norm, mixer.*)."""
    ours = {}
    for i in range(cfg.n_layers):
        p, o = f"{prefix}{i}.", f"layers.{i}."
        for mine, theirs in MIXER_NAMES.items():
            if mine == "conv.bias" and not conv_bias:
                ours[o + "mixer.conv.bias"] = torch.zeros(inner_dim(cfg))
                continue
            ours[o + "mixer." + mine] = sd[p + "mixer." + theirs]
        ours[o + "mixer.conv.weight"] = conv_weight(sd[p + "mixer.conv1d.weight"])
        for name in ("weight", "bias") if cfg.norm_type == "layer" else ("weight",):
            ours[o + "norm1." + name] = sd[p + "norm." + name]
    return ours


def config_from_hf(hf_config) -> ModelConfig:
    """linlm's Mamba config of a transformers ``MambaConfig``."""
    config = hf_config.to_dict()
    refuse_model_type(config, "mamba", "from_hf_mamba", "the transformers config")
    if config.get("use_bias"):
        raise CheckpointError("use_bias: Mamba checkpoints with in_proj/out_proj biases are not supported")
    if config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise CheckpointError(f"hidden_act: {config['hidden_act']!r} is not supported; linlm's Mamba uses silu")
    return build(dict(arch="mamba", vocab_size=hf_config.vocab_size, d_model=hf_config.hidden_size,
                      n_layers=hf_config.num_hidden_layers, norm_eps=hf_config.layer_norm_epsilon,
                      options=dict(d_state=hf_config.state_size, d_conv=hf_config.conv_kernel,
                                   expand=hf_config.expand, dt_rank=hf_config.time_step_rank),
                      tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True))), "MambaConfig")


def from_state(cfg: ModelConfig, sd: Tensors, conv_bias: bool = True) -> CausalLM:
    ours = {"embed.weight": sd["backbone.embeddings.weight"], "norm.weight": sd["backbone.norm_f.weight"],
            **mamba_blocks(cfg, sd, "backbone.layers.", conv_bias)}
    if not cfg.tie_embeddings:
        ours["head.weight"] = sd["lm_head.weight"]
    sd.check_used({"lm_head.weight"})
    return fill(cfg, ours, sd.where)


def from_hf_mamba(hf_model) -> CausalLM:
    """A linlm Mamba with the weights of a transformers ``MambaForCausalLM``."""
    cfg = config_from_hf(hf_model.config)
    return from_state(cfg, Tensors(hf_model.state_dict(), type(hf_model).__name__),
                      bool(getattr(hf_model.config, "use_conv_bias", True)))


def hf_config_from(cfg: ModelConfig):
    require_transformers("Mamba")
    from transformers import MambaConfig

    if cfg.arch != "mamba":
        raise ConfigError(f"arch: only 'mamba' models convert to MambaForCausalLM, got {cfg.arch!r}")
    if cfg.norm_type not in ("auto", "rms"):
        raise ConfigError(f"norm_type: MambaForCausalLM uses RMSNorm, got norm_type={cfg.norm_type!r}")

    o = cfg.options
    return MambaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, state_size=o.d_state,
                       num_hidden_layers=cfg.n_layers, layer_norm_epsilon=cfg.norm_eps, expand=o.expand,
                       conv_kernel=o.d_conv, use_bias=False, use_conv_bias=True, hidden_act="silu",
                       time_step_rank=dt_rank(cfg), tie_word_embeddings=cfg.tie_embeddings)


def backbone_tensors(model: CausalLM) -> dict:
    """The embeddings, final norm and (untied) head of ``model`` under the names transformers' Mamba and Mamba-2
    models give them."""
    sd = {"backbone.embeddings.weight": model.embed.weight, "backbone.norm_f.weight": model.norm.weight}
    if model.head is not None:
        sd["lm_head.weight"] = model.head.weight
    return sd


def hf_state(model: CausalLM) -> dict:
    """The tensors of ``model`` under transformers' MambaForCausalLM names (no lm_head.weight when tied)."""
    sd = backbone_tensors(model)
    for i, layer in enumerate(model.layers):
        p, m = f"backbone.layers.{i}.", layer.mixer
        sd[p + "norm.weight"] = layer.norm1.weight
        for mine, theirs in MIXER_NAMES.items():
            sd[p + "mixer." + theirs] = m.get_parameter(mine)
        sd[p + "mixer.conv1d.weight"] = m.conv.weight.unsqueeze(1)
    return {k: v.detach().clone().contiguous() for k, v in sd.items()}


def to_hf_mamba(model: CausalLM):
    """A transformers ``MambaForCausalLM`` with the weights of a linlm Mamba."""
    require_transformers("Mamba")
    from transformers import MambaForCausalLM

    return load_into(MambaForCausalLM(hf_config_from(model.config)), hf_state(model), tied=model.head is None).eval()


def _to_linlm(config: dict, sd: Tensors) -> CausalLM:
    require_transformers("Mamba")
    from transformers import MambaConfig

    refuse_model_type(config, "mamba", "hf-mamba")
    hf_config = MambaConfig.from_dict(config)
    return from_state(config_from_hf(hf_config), sd, bool(hf_config.use_conv_bias))


def _from_linlm(model: CausalLM):
    return hf_config_from(model.config).to_dict(), hf_state(model)


LAYOUT = Layout("hf-mamba", "transformers' MambaForCausalLM (the state-spaces mamba-*-hf checkpoints)", "mamba",
                matches=lambda c: c.get("model_type") == "mamba", to_linlm=_to_linlm, from_linlm=_from_linlm)
