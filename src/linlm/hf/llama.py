"""Convert LLaMA weights both ways between linlm and transformers' ``LlamaForCausalLM``.

linlm fuses q/k/v into one projection and gate/up into another; both use the same half-split RoPE,
so conversion is a re-arrangement of tensors with no numerical change.
"""

from __future__ import annotations

import torch

from linlm.errors import CheckpointError, ConfigError
from linlm.models.config import ModelConfig
from linlm.models.lm import CausalLM


def _require_transformers():
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError("LLaMA conversion needs transformers: pip install 'linlm[hf]'") from None


def _rope_theta(hf_config) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    if params.get("rope_type", "default") not in ("default", None):
        raise CheckpointError(f"rope scaling {params.get('rope_type')!r} is not supported; only plain RoPE converts")
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    return float(theta if theta is not None else 10000.0)


def hf_config_from(cfg: ModelConfig):
    _require_transformers()
    from transformers import LlamaConfig

    if cfg.arch != "llama":
        raise ConfigError(f"arch: only 'llama' models convert to LlamaForCausalLM, got {cfg.arch!r}")
    if cfg.norm_type not in ("auto", "rms"):
        raise ConfigError(f"norm_type: LlamaForCausalLM uses RMSNorm, got norm_type={cfg.norm_type!r}; only "
                          f"norm_type 'auto' or 'rms' converts")
    kwargs = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.glu_hidden,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
        max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=True,
        attention_bias=False, mlp_bias=False, hidden_act="silu",
    )
    try:
        return LlamaConfig(**kwargs, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta})
    except TypeError:  # transformers 4.x
        return LlamaConfig(**kwargs, rope_theta=cfg.rope_theta)


def config_from_hf(hf_config) -> ModelConfig:
    if getattr(hf_config, "num_key_value_heads", hf_config.num_attention_heads) != hf_config.num_attention_heads:
        raise CheckpointError("grouped-query attention (num_key_value_heads != num_attention_heads) is not supported")
    if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
        raise CheckpointError("LLaMA checkpoints with biases are not supported")
    return ModelConfig(
        arch="llama", vocab_size=hf_config.vocab_size, d_model=hf_config.hidden_size,
        n_layers=hf_config.num_hidden_layers, n_heads=hf_config.num_attention_heads,
        glu_dim=hf_config.intermediate_size, max_seq_len=hf_config.max_position_embeddings,
        norm_eps=hf_config.rms_norm_eps, rope_theta=_rope_theta(hf_config),
    ).validate()


def to_hf_llama(model: CausalLM):
    """A ``LlamaForCausalLM`` with the same weights (tied embeddings)."""
    _require_transformers()
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM(hf_config_from(model.config))
    sd = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.norm.weight}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.mixer.qkv.weight.chunk(3, dim=0)
        gate, up = layer.mlp.w_in.weight.chunk(2, dim=0)
        sd.update({
            p + "input_layernorm.weight": layer.norm1.weight,
            p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k, p + "self_attn.v_proj.weight": v,
            p + "self_attn.o_proj.weight": layer.mixer.out.weight,
            p + "post_attention_layernorm.weight": layer.norm2.weight,
            p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
            p + "mlp.down_proj.weight": layer.mlp.w_out.weight,
        })
    sd = {k: v.detach().clone() for k, v in sd.items()}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    if unexpected or any(m != "lm_head.weight" for m in missing):
        raise CheckpointError(f"conversion to LlamaForCausalLM failed: missing {missing}, unexpected {unexpected}")
    hf.tie_weights()
    return hf


def from_hf_llama(hf_model) -> CausalLM:
    """A linlm LLaMA with the weights of a ``LlamaForCausalLM`` (its head must be tied to the embeddings)."""
    cfg = config_from_hf(hf_model.config)
    sd = hf_model.state_dict()
    emb = sd["model.embed_tokens.weight"]
    head = sd.get("lm_head.weight", emb)
    if not torch.equal(head, emb):
        raise CheckpointError("this LlamaForCausalLM has an untied lm_head; linlm models tie the head to the embeddings")
    model = CausalLM(cfg)
    ours = {"embed.weight": emb, "norm.weight": sd["model.norm.weight"]}
    for i in range(cfg.n_layers):
        p, o = f"model.layers.{i}.", f"layers.{i}."
        ours.update({
            o + "norm1.weight": sd[p + "input_layernorm.weight"],
            o + "mixer.qkv.weight": torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], dim=0),
            o + "mixer.out.weight": sd[p + "self_attn.o_proj.weight"],
            o + "norm2.weight": sd[p + "post_attention_layernorm.weight"],
            o + "mlp.w_in.weight": torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]], dim=0),
            o + "mlp.w_out.weight": sd[p + "mlp.down_proj.weight"],
        })
    model.load_state_dict({k: v.detach().clone().float() for k, v in ours.items()}, strict=True)
    return model
