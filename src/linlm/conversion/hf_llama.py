"""The hf-llama layout: LLaMA weights both ways between linlm and transformers' ``LlamaForCausalLM``.

linlm fuses q/k/v into one projection and gate/up into another; both use the same half-split RoPE,
so conversion is a re-arrangement of tensors with no numerical change. The layouts of real Llama-family checkpoints
convert: grouped-query attention (``num_key_value_heads`` -> ``n_kv_heads``), an untied ``lm_head``
(``tie_word_embeddings=False`` -> ``tie_embeddings=False``), Llama 3.1's "llama3" RoPE scaling and a head_dim other
than hidden_size / num_attention_heads (``options.head_dim``). Other RoPE scalings, biases and activations other
than SiLU are refused with a CheckpointError naming the field.
"""

from __future__ import annotations

import torch

from linlm.conversion.layout import (Layout, fill, glu_from_hf, glu_to_hf, load_into, refuse_model_type,
                                     require_transformers)
from linlm.errors import CheckpointError, ConfigError
from linlm.models.model_config import ModelConfig
from linlm.models.lm import CausalLM


def _rope_fields(hf_config) -> dict:
    """linlm's rope_* options from a LlamaConfig (transformers 5 ``rope_parameters`` or 4.x ``rope_scaling``)."""
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    out = {"rope_theta": float(theta if theta is not None else 10000.0)}
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind == "default":
        return out
    if kind != "llama3":
        raise CheckpointError(
            f"rope_parameters: RoPE scaling {kind!r} is not supported; linlm converts plain RoPE and 'llama3' scaling "
            "(use a checkpoint without this scaling, or convert it with its rope scaling removed)"
        )
    try:
        out.update(rope_scaling="llama3", rope_factor=float(params["factor"]),
                   rope_low_freq_factor=float(params["low_freq_factor"]),
                   rope_high_freq_factor=float(params["high_freq_factor"]),
                   rope_original_max_len=int(params.get("original_max_position_embeddings")
                                             or hf_config.max_position_embeddings))
    except KeyError as e:
        raise CheckpointError(f"rope_parameters: llama3 scaling without {e.args[0]!r}; the config is incomplete") from None
    return out


def hf_config_from(cfg: ModelConfig):
    require_transformers("LLaMA")
    from transformers import LlamaConfig

    if cfg.arch != "llama":
        raise ConfigError(f"arch: only 'llama' models convert to LlamaForCausalLM, got {cfg.arch!r}")
    if cfg.norm_type not in ("auto", "rms"):
        raise ConfigError(f"norm_type: LlamaForCausalLM uses RMSNorm, got norm_type={cfg.norm_type!r}; only "
                          f"norm_type 'auto' or 'rms' converts")
    o = cfg.options
    for name, plain in (("qk_norm", False), ("output_gate", False), ("rope_fraction", 1.0)):
        if getattr(o, name) != plain:
            raise ConfigError(f"options.{name}: LlamaForCausalLM has no such variant (only {name}={plain!r} "
                              f"converts), got {getattr(o, name)!r}")
    rope = {"rope_type": "default", "rope_theta": o.rope_theta}
    if o.rope_scaling == "llama3":
        rope.update(rope_type="llama3", factor=o.rope_factor, low_freq_factor=o.rope_low_freq_factor,
                    high_freq_factor=o.rope_high_freq_factor,
                    original_max_position_embeddings=o.rope_original_max_len)
    kwargs = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.glu_hidden,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        attention_bias=False, mlp_bias=False, hidden_act="silu", head_dim=o.head_dim or cfg.head_dim,
    )
    try:
        return LlamaConfig(**kwargs, rope_parameters=rope)
    except TypeError:  # transformers 4.x
        theta = rope.pop("rope_theta")
        return LlamaConfig(**kwargs, rope_theta=theta, rope_scaling=None if rope["rope_type"] == "default" else rope)


def config_from_hf(hf_config) -> ModelConfig:
    refuse_model_type(hf_config.to_dict(), "llama", "from_hf_llama", "the transformers config")
    if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
        raise CheckpointError("attention_bias/mlp_bias: LLaMA checkpoints with biases are not supported")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise CheckpointError(f"hidden_act: {hf_config.hidden_act!r} is not supported; linlm's LLaMA uses silu")
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None)
    own_width = head_dim is not None and head_dim * heads != hf_config.hidden_size
    kv = getattr(hf_config, "num_key_value_heads", None) or heads
    try:
        return ModelConfig.from_dict(dict(
            arch="llama", vocab_size=hf_config.vocab_size, d_model=hf_config.hidden_size,
            n_layers=hf_config.num_hidden_layers, n_heads=heads,
            tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
            glu_dim=hf_config.intermediate_size, max_seq_len=hf_config.max_position_embeddings,
            norm_eps=hf_config.rms_norm_eps,
            options={"n_kv_heads": 0 if kv == heads else kv, "head_dim": head_dim if own_width else 0,
                     **_rope_fields(hf_config)},
        ))
    except ConfigError as e:
        raise CheckpointError(f"this Llama config does not fit linlm's LLaMA: {e}") from None


def to_hf_llama(model: CausalLM):
    """A ``LlamaForCausalLM`` with the same weights and layout (GQA, tied or untied head, RoPE scaling)."""
    require_transformers("LLaMA")
    from transformers import LlamaForCausalLM

    cfg = model.config
    hf = LlamaForCausalLM(hf_config_from(cfg))
    sd = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.norm.weight}
    if model.head is not None:
        sd["lm_head.weight"] = model.head.weight
    head_dim = cfg.options.head_dim or cfg.head_dim
    q_rows, kv_rows = cfg.n_heads * head_dim, cfg.kv_heads * head_dim
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.mixer.qkv.weight.split([q_rows, kv_rows, kv_rows], dim=0)
        sd.update({
            p + "input_layernorm.weight": layer.norm1.weight,
            p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k, p + "self_attn.v_proj.weight": v,
            p + "self_attn.o_proj.weight": layer.mixer.out.weight,
            p + "post_attention_layernorm.weight": layer.norm2.weight,
            **glu_to_hf(layer.mlp, p),
        })
    return load_into(hf, {k: v.detach().clone() for k, v in sd.items()}, tied=model.head is None)


def from_hf_llama(hf_model) -> CausalLM:
    """A linlm LLaMA with the weights and layout of a ``LlamaForCausalLM``."""
    from linlm.conversion.source import Tensors

    cfg = config_from_hf(hf_model.config)
    return from_state(cfg, Tensors(hf_model.state_dict(), type(hf_model).__name__))


def from_state(cfg: ModelConfig, sd) -> CausalLM:
    """A linlm LLaMA of ``cfg`` from the tensors of a Llama checkpoint (a ``Tensors``: every one must be used)."""
    ours = {"embed.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"]}
    if not cfg.tie_embeddings:
        if "lm_head.weight" not in sd:
            raise CheckpointError("tie_word_embeddings is False but the model has no lm_head.weight")
        ours["head.weight"] = sd["lm_head.weight"]
    for i in range(cfg.n_layers):
        p, o = f"model.layers.{i}.", f"layers.{i}."
        ours.update({
            o + "norm1.weight": sd[p + "input_layernorm.weight"],
            o + "mixer.qkv.weight": torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], dim=0),
            o + "mixer.out.weight": sd[p + "self_attn.o_proj.weight"],
            o + "norm2.weight": sd[p + "post_attention_layernorm.weight"],
            **glu_from_hf(sd, p, o),
        })
    sd.check_used({"lm_head.weight"} | {k for k in sd if k.endswith("rotary_emb.inv_freq")})
    return fill(cfg, ours, sd.where)


def _to_linlm(config: dict, sd) -> CausalLM:
    require_transformers("LLaMA")
    from transformers import LlamaConfig

    refuse_model_type(config, "llama", "hf-llama")
    return from_state(config_from_hf(LlamaConfig.from_dict(config)), sd)


def _from_linlm(model: CausalLM):
    hf = to_hf_llama(model)
    sd = hf.state_dict()
    if model.config.tie_embeddings:
        del sd["lm_head.weight"]  # the embeddings' own tensor, which transformers ties again on loading
    return hf.config.to_dict(), sd


LAYOUT = Layout("hf-llama", "transformers' LlamaForCausalLM (Llama 2/3, TinyLlama, SmolLM, ...)", "llama",
                matches=lambda c: c.get("model_type") == "llama", to_linlm=_to_linlm, from_linlm=_from_linlm)
