"""A Mamba language model's decoding step in one call of the compiled CPU kernel (linlm.ops.step_kernel.
mamba_model_step): every layer's norm, mixer and residual addition, the final norm and the head, where the eager
step makes about eight kernel calls and a dozen module calls per layer. At batch 1 on a CPU a step reads every
weight once, and what the Python between the layers costs is what separates it from an engine such as llama.cpp
(benchmarks/bench_llamacpp.py).

It takes a model whose every layer is a plain Mamba block (RMSNorm, then a Mamba mixer whose projections
linlm.layers.linear.decode_weights reads: float32 Linear layers or int8 ones; no MLP), with a plain or int8 head,
no embedding mixer, no forward hooks anywhere, float32 tensors and at most 8 rows; :func:`fused_step` returns None
for anything else and the caller steps through the modules, which compute the same values.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from linlm.layers.linear import decode_weights
from linlm.layers.mamba import MambaMixer, ShortConv
from linlm.layers.norm import RMSNorm
from linlm.models.block import Block
from linlm.ops import step_kernel
from linlm.ops.gemv_kernel import GEMV_MAX_ROWS

__all__ = ["fused_step"]


def _hooked(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks)


def _global_hooks() -> bool:
    return bool(torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks)


def _norm_weight(norm: nn.Module):
    """(True, its weight or None) for a plain RMSNorm without hooks; (False, None) otherwise."""
    if type(norm) is not RMSNorm or _hooked(norm):
        return False, None
    return True, norm.weight


def fused_step(model, ids: torch.Tensor, state) -> Optional[tuple[torch.Tensor, list]]:
    """(logits [B, V], the layers' new states) of ``model``'s step on ids [B, 1] from ``state`` (a ModelState the
    caller has checked), in one kernel call; None where the kernel does not take this model or these tensors."""
    if (model.embed_mixer is not None or model.shared is not None or _hooked(model) or _global_hooks()
            or torch.jit.is_tracing() or not model.layers or state.extra):
        return None
    B = ids.shape[0]
    ok, final_w = _norm_weight(model.norm)
    if not ok or not 0 < B <= GEMV_MAX_ROWS:
        return None
    eps = model.norm.eps
    h = model.embed(ids[:, 0])
    if h.dtype != torch.float32 or tuple(h.shape) != (B, model.config.d_model):
        return None
    h = h.contiguous()
    layers, sizes = [], None
    for block, layer_state in zip(model.layers, state.layers):
        if type(block) is not Block or block.mlp is not None or _hooked(block):
            return None
        ok, norm_w = _norm_weight(block.norm1)
        mixer = block.mixer
        if not ok or block.norm1.eps != eps or type(mixer) is not MambaMixer or _hooked(mixer) \
                or type(mixer.conv) is not ShortConv or _hooked(mixer.conv) or not isinstance(layer_state, dict):
            return None
        projections = [decode_weights(m) for m in (mixer.in_proj, mixer.x_proj, mixer.out_proj)]
        if any(p is None for p in projections):
            return None
        args = (projections[0], layer_state["conv"], mixer.conv.weight, mixer.conv.bias, projections[1],
                mixer.dt_weight, mixer.dt_bias, mixer.decay(), mixer.D, projections[2], layer_state["ssm"])
        if not step_kernel.mamba_mixer_step_takes(h, *args) or (norm_w is not None and not step_kernel.rms_rows_takes(
                h, norm_w)):
            return None
        layer_sizes = (h.shape[1], mixer.d_inner, mixer.d_state, mixer.dt_rank, mixer.conv.kernel)
        if sizes is not None and layer_sizes != sizes:
            return None
        sizes = layer_sizes
        layers.append((norm_w, *args))
    head = decode_weights(model.head) if model.head is not None else (model.embed.weight, None, None)
    if head is None or head[2] is not None or (final_w is not None and not step_kernel.rms_rows_takes(h, final_w)):
        return None
    if head[1] is None and not (head[0].dtype == torch.float32 and head[0].is_contiguous()
                                and tuple(head[0].shape) == (model.config.vocab_size, h.shape[1])):
        return None
    if head[1] is not None and not (head[0].dtype == torch.int8 and head[0].is_contiguous()
                                    and head[1].dtype == torch.float32 and head[1].is_contiguous()):
        return None
    logits, outs = step_kernel.mamba_model_step(h, layers, final_w, head, eps, sizes)
    return logits, [{"conv": st, "ssm": s} for st, s in outs]
