"""The hf-qwen3-next and hf-qwen3.5 layouts: transformers' ``Qwen3NextForCausalLM`` (config.json model_type
"qwen3_next") and Qwen3.5's language model (``Qwen3_5ForCausalLM``, "qwen3_5_text", or the text half of
``Qwen3_5ForConditionalGeneration``, "qwen3_5") into linlm's gated_deltanet, with their full-attention layers as a
hybrid stack's attention layers, with dense or sparse (mixture-of-experts) MLPs.

Qwen3.5's layers are Qwen3-Next's but for the linear layers' projections, which are separate
(``in_proj_qkv`` [q; k; v], ``in_proj_z``, ``in_proj_b``, ``in_proj_a``), and its RoPE, which is multimodal (three
position grids); for text the three positions are equal and it is the plain partial RoPE below. From a
``Qwen3_5ForConditionalGeneration`` checkpoint the language model converts (``text_config``; tensors under
``model.language_model.``): the vision tower (``model.visual.``) and the multi-token-prediction head (``mtp.``) are
left out.

Qwen3-Next's linear layers are Gated DeltaNet with grouped values (arXiv 2412.06464; linlm's
layers/gated_deltanet.py with ``v_heads``): Hk = linear_num_key_heads heads of q and k of width
K = linear_key_head_dim, Hv = linear_num_value_heads value heads of width V = linear_value_head_dim (value head h
reads q and k head h // (Hv / Hk)), a causal depthwise convolution of linear_conv_kernel_dim over q, k, v without a
bias, SiLU, L2-normalised q and k with q scaled by K^-1/2, beta = sigmoid(b), log a = -exp(A_log) softplus(a +
dt_bias), the per-head RMSNorm of the output then the SiLU gate z, and out_proj. Its tensors are laid out per key
head:

- ``in_proj_qkvz`` rows, for each key head: q (K), k (K), v (r V), z (r V), with r = Hv / Hk; linlm's fused
  projection wants all of q, then k, v, the gate z, then a and b;
- ``in_proj_ba`` rows, for each key head: b (r), a (r);
- ``conv1d`` runs over [q; k; v] in linlm's order already.

The "full_attention" layers (``layer_types``) become the hybrid's ``attn_layers`` with ``attn_options``: grouped
KV heads (num_key_value_heads), head_dim, an RMSNorm over each head of q and k before RoPE, a sigmoid gate on each
head's output, and RoPE (rope_theta) on the first partial_rotary_factor of each head's channels. ``q_proj``'s rows
hold each head's query and gate in turn; linlm's fused projection wants all queries, then all gates, then k and v.

The blocks are x + mixer(RMSNorm(x)), x + MLP(RMSNorm(x)). Qwen3-Next's
RMSNorms (the blocks', the final one, and the attention's q and k norms) scale by (1 + w): conversion adds 1 to
their weights. The gated output norm of the linear layers scales by w, as linlm's does.

The MLPs are dense SwiGLUs of intermediate_size, or, where num_experts > 0 makes every layer sparse (the released
Qwen3-Next models), Qwen3-Next's sparse block: a router softmax over num_experts, the top num_experts_per_tok
renormalised (norm_topk_prob), SwiGLU experts of moe_intermediate_size, and a shared SwiGLU expert of
shared_expert_intermediate_size scaled per token by sigmoid(shared_expert_gate x): gated_deltanet's
``options.mlp_experts`` and the options beside it. The experts are read from transformers' fused tensors or from
the released files' one tensor per expert.

What does not convert, named in a CheckpointError: a layer type other than linear and full attention, a stack of
sparse and dense MLPs together (mlp_only_layers, decoder_sparse_step > 1), norm_topk_prob false, an activation
other than SiLU, attention biases, RoPE scaling (a rope_type other than "default"), and a number of
attention heads other than linear_num_key_heads (linlm's n_heads is both). One way only: linlm writes no
Qwen3-Next checkpoints.
"""

from __future__ import annotations

import torch

from linlm.conversion.layout import Layout, build, conv_weight, fill, glu_from_hf, refuse_model_type
from linlm.conversion.source import Tensors
from linlm.errors import CheckpointError
from linlm.models.lm import CausalLM

# transformers' Qwen3NextConfig defaults, for keys a config.json leaves out (Qwen3.5's differ where QWEN35 says).
DEFAULTS = dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=48,
                hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False, linear_conv_kernel_dim=4,
                linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                linear_num_value_heads=32, decoder_sparse_step=1, num_experts=512, mlp_only_layers=[],
                num_experts_per_tok=10, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                norm_topk_prob=True,
                full_attention_interval=4, layer_types=None, num_attention_heads=16, num_key_value_heads=2,
                head_dim=256, attention_bias=False, rope_theta=10000.0, partial_rotary_factor=0.25,
                rope_parameters=None, max_position_embeddings=32768)
QWEN35 = dict(DEFAULTS, vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
              num_key_value_heads=4, num_experts=0)


def _resolved(config: dict, defaults: dict = DEFAULTS) -> dict:
    c = {**defaults, **{k: v for k, v in config.items() if v is not None}}
    n = int(c["num_hidden_layers"])
    types = c["layer_types"]
    if types is None:  # transformers' default pattern: full attention every full_attention_interval-th layer
        k = int(c["full_attention_interval"])
        types = ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n)]
    other = [i for i, t in enumerate(types) if t not in ("linear_attention", "full_attention")]
    if other:
        raise CheckpointError(f"layer_types: layers {other} are {types[other[0]]!r}; linlm converts "
                              "'linear_attention' and 'full_attention' layers")
    c["attention_layers"] = [i for i, t in enumerate(types) if t == "full_attention"]
    dense = set(c["mlp_only_layers"] or [])
    sparse = [i for i in range(n) if i not in dense and int(c["num_experts"]) > 0
              and (i + 1) % int(c["decoder_sparse_step"]) == 0]
    if sparse and len(sparse) < n:
        mixed = [i for i in range(n) if i not in sparse]
        raise CheckpointError(f"num_experts: {c['num_experts']} makes layers {sparse[:8]}"
                              f"{' ...' if len(sparse) > 8 else ''} sparse mixtures of experts and layers "
                              f"{mixed[:8]}{' ...' if len(mixed) > 8 else ''} dense (mlp_only_layers, "
                              "decoder_sparse_step); linlm's gated_deltanet has one kind of MLP in every layer, so "
                              "only all-sparse or all-dense stacks convert")
    if sparse and not c["norm_topk_prob"]:
        raise CheckpointError("norm_topk_prob: false weights the chosen experts by their raw softmax "
                              "probabilities; linlm's router renormalises them over the top k (true)")
    c["sparse"] = bool(sparse)
    if c["hidden_act"] not in ("silu", "swish"):
        raise CheckpointError(f"hidden_act: {c['hidden_act']!r} is not supported; Qwen3-Next's MLP uses silu")
    return c


def _attention_options(c: dict, n_heads: int) -> dict:
    """linlm's attn_options for Qwen3-Next's full-attention layers (refusing what does not convert)."""
    if c["attention_bias"]:
        raise CheckpointError("attention_bias: Qwen3-Next attention with biases is not supported")
    if int(c["num_attention_heads"]) != n_heads:
        raise CheckpointError(f"num_attention_heads: {c['num_attention_heads']} attention heads against "
                              f"linear_num_key_heads={n_heads}; linlm's hybrid uses one head count for both")
    rope = {"rope_type": "default", "rope_theta": c["rope_theta"], "partial_rotary_factor": c["partial_rotary_factor"],
            **(c["rope_parameters"] or {})}
    if rope.get("rope_type", "default") != "default":
        raise CheckpointError(f"rope_parameters: rope_type {rope['rope_type']!r} rescales RoPE, which linlm's "
                              "Qwen3-Next conversion does not; only 'default' converts")
    head_dim = int(c["head_dim"])
    rotary = int(head_dim * float(rope.get("partial_rotary_factor") or 1.0))  # transformers rounds down
    return dict(n_kv_heads=int(c["num_key_value_heads"]), head_dim=head_dim, qk_norm=True, output_gate=True,
                rope_fraction=rotary / head_dim, rope_theta=float(rope["rope_theta"]))


def qwen3_next_values(config: dict, defaults: dict = DEFAULTS) -> dict:
    """linlm's gated_deltanet config values of a Qwen3-Next (or, with QWEN35, a Qwen3.5 text) config.json,
    refusing what does not convert."""
    c = _resolved(config, defaults)
    hk, hv = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
    k, v = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
    if hv % hk:
        raise CheckpointError(f"linear_num_value_heads: {hv} is not a multiple of linear_num_key_heads={hk}")
    values = dict(arch="gated_deltanet", vocab_size=int(c["vocab_size"]), d_model=int(c["hidden_size"]),
                  n_layers=int(c["num_hidden_layers"]), n_heads=hk, glu_dim=int(c["intermediate_size"]),
                  norm_eps=float(c["rms_norm_eps"]), norm_type="rms", tie_embeddings=bool(c["tie_word_embeddings"]),
                  max_seq_len=int(c["max_position_embeddings"]), options=dict(head_k_dim=k, expand_v=v / k, short_conv=int(c["linear_conv_kernel_dim"]),
                               neg_eigval=False, v_heads=hv))
    if c["sparse"]:
        values["options"].update(mlp_experts=int(c["num_experts"]), mlp_top_k=int(c["num_experts_per_tok"]),
                                 mlp_expert_dim=int(c["moe_intermediate_size"]),
                                 shared_expert_dim=int(c["shared_expert_intermediate_size"]), shared_expert_gate=True)
    if c["attention_layers"]:
        values.update(attn_layers=c["attention_layers"], attn_options=_attention_options(c, hk))
    return values


def _mixer(sd: Tensors, p: str, hk: int, r: int, k: int, v: int) -> torch.Tensor:
    """linlm's fused projection [q; k; v; z; a; b] from Qwen3-Next's per-key-head in_proj_qkvz and in_proj_ba."""
    qkvz = sd[p + "in_proj_qkvz.weight"]
    d = qkvz.shape[-1]
    q, kk, vv, z = qkvz.view(hk, 2 * k + 2 * r * v, d).split([k, k, r * v, r * v], dim=1)
    b, a = sd[p + "in_proj_ba.weight"].view(hk, 2 * r, d).split([r, r], dim=1)
    return torch.cat([t.reshape(-1, d) for t in (q, kk, vv, z, a, b)], dim=0)


def _qwen35_mixer(sd: Tensors, p: str, *_) -> torch.Tensor:
    """linlm's fused projection [q; k; v; z; a; b] from Qwen3.5's separate projections, already in that order
    within each (the widths ``_mixer`` takes are not needed)."""
    return torch.cat([sd[p + f"in_proj_{n}.weight"] for n in ("qkv", "z", "a", "b")], dim=0)


def _moe(sd: Tensors, p: str, o: str, experts: int) -> dict[str, torch.Tensor]:
    """linlm's MoEMLP weights of Qwen3-Next's sparse block at ``p``: the router, the experts (transformers' fused
    ``experts.gate_up_proj`` [E, 2h, d] and ``experts.down_proj`` [E, d, h], or the released checkpoints' one
    ``experts.{e}.gate_proj`` / ``up_proj`` / ``down_proj`` per expert), the shared expert and its gate."""
    m, ours = p + "mlp.", o + "mlp."
    if dict.__contains__(sd, m + "experts.gate_up_proj"):
        w_in, w_out = sd[m + "experts.gate_up_proj"], sd[m + "experts.down_proj"]
    else:
        e = [f"{m}experts.{i}." for i in range(experts)]
        w_in = torch.stack([torch.cat([sd[x + "gate_proj.weight"], sd[x + "up_proj.weight"]]) for x in e])
        w_out = torch.stack([sd[x + "down_proj.weight"] for x in e])
    s = m + "shared_expert."
    return {ours + "router.weight": sd[m + "gate.weight"], ours + "w_in": w_in, ours + "w_out": w_out,
            ours + "shared.w_in.weight": torch.cat([sd[s + "gate_proj.weight"], sd[s + "up_proj.weight"]]),
            ours + "shared.w_out.weight": sd[s + "down_proj.weight"],
            ours + "shared_gate.weight": sd[m + "shared_expert_gate.weight"]}


def _to_linlm(config: dict, sd: Tensors, qwen35: bool = False) -> CausalLM:
    """A linlm model of a Qwen3-Next checkpoint, or of Qwen3.5's language model (``qwen35``)."""
    model, mixer = "model.", _mixer
    if qwen35:
        if config.get("model_type") == "qwen3_5":  # the multimodal model: its language model converts
            text = dict(config.get("text_config") or {})
            if text.get("tie_word_embeddings") is None and config.get("tie_word_embeddings") is not None:
                text["tie_word_embeddings"] = config["tie_word_embeddings"]  # set on the whole model
            config, model = text, "model.language_model."
        else:
            refuse_model_type(config, "qwen3_5_text", LAYOUT_35.name)
        values, mixer = qwen3_next_values(config, QWEN35), _qwen35_mixer
    else:
        refuse_model_type(config, "qwen3_next", LAYOUT.name)
        values = qwen3_next_values(config)
    cfg = build(values, "config.json")
    hk, k = cfg.n_heads, cfg.options.head_k_dim
    hv = cfg.options.v_heads
    v = int(round(k * cfg.options.expand_v))
    shift = 1.0  # their RMSNorms scale by (1 + w), linlm's by w
    ours = {"embed.weight": sd[model + "embed_tokens.weight"], "norm.weight": sd[model + "norm.weight"] + shift}
    if not cfg.tie_embeddings:
        ours["head.weight"] = sd["lm_head.weight"]
    for i in range(cfg.n_layers):
        p, o = f"{model}layers.{i}.", f"layers.{i}."
        experts = cfg.options.mlp_experts
        ours.update({o + "norm1.weight": sd[p + "input_layernorm.weight"] + shift,
                     o + "norm2.weight": sd[p + "post_attention_layernorm.weight"] + shift,
                     **(_moe(sd, p, o, experts) if experts else glu_from_hf(sd, p, o))})
        if i in cfg.attention_layers:
            a = p + "self_attn."
            heads, dh = cfg.n_heads, cfg.attn_options.head_dim
            q, gate = sd[a + "q_proj.weight"].view(heads, 2 * dh, -1).split([dh, dh], dim=1)
            ours.update({
                o + "mixer.qkv.weight": torch.cat([q.reshape(heads * dh, -1), gate.reshape(heads * dh, -1),
                                                   sd[a + "k_proj.weight"], sd[a + "v_proj.weight"]], dim=0),
                o + "mixer.q_norm.weight": sd[a + "q_norm.weight"] + shift,
                o + "mixer.k_norm.weight": sd[a + "k_norm.weight"] + shift,
                o + "mixer.out.weight": sd[a + "o_proj.weight"]})
            continue
        a = p + "linear_attn."
        ours.update({
            o + "mixer.proj.weight": mixer(sd, a, hk, hv // hk, k, v),
            o + "mixer.conv.weight": conv_weight(sd[a + "conv1d.weight"]),
            o + "mixer.A_log": sd[a + "A_log"], o + "mixer.dt_bias": sd[a + "dt_bias"],
            o + "mixer.norm.weight": sd[a + "norm.weight"], o + "mixer.out.weight": sd[a + "out_proj.weight"]})
    left_out = {n for n in sd if n.startswith(("model.visual.", "mtp."))} if qwen35 else set()
    sd.check_used({"lm_head.weight"} | left_out)
    return fill(cfg, ours, sd.where)


LAYOUT = Layout("hf-qwen3-next", "transformers' Qwen3NextForCausalLM (dense or sparse MLPs)",
                "gated_deltanet", matches=lambda c: c.get("model_type") == "qwen3_next", to_linlm=_to_linlm)
LAYOUT_35 = Layout("hf-qwen3.5", "Qwen3.5's language model: transformers' Qwen3_5ForCausalLM, or the text half of "
                   "Qwen3_5ForConditionalGeneration", "gated_deltanet",
                   matches=lambda c: c.get("model_type") in ("qwen3_5_text", "qwen3_5"),
                   to_linlm=lambda c, sd: _to_linlm(c, sd, qwen35=True))
