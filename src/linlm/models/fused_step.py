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

from linlm.layers.linear import decode_weights, has_hooks
from linlm.layers.mamba import MambaMixer, ShortConv
from linlm.layers.norm import RMSNorm
from linlm.models.block import Block
from linlm.ops import step_kernel
from linlm.ops.gemv_kernel import GEMV_MAX_ROWS

__all__ = ["fused_step", "model_takes"]


def _plain_norm(norm: nn.Module, eps: float) -> bool:
    return type(norm) is RMSNorm and norm.eps == eps and not has_hooks(norm)


def model_takes(model) -> bool:
    """Whether ``model``'s modules are ones the one-call step computes (its tensors are checked by
    :func:`fused_step`): plain Mamba blocks (an RMSNorm with the final norm's eps, a Mamba mixer, no MLP), no
    embedding mixer, no forward hook on the model, a block, a norm, a mixer or its conv, nor a global one. Type and
    attribute tests only, so that a decoding step of any other model spends next to nothing here."""
    if (not model.layers or model.embed_mixer is not None or model.shared is not None or has_hooks(model)
            or torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks):
        return False
    eps = getattr(model.norm, "eps", None)
    if not _plain_norm(model.norm, eps):
        return False
    for block in model.layers:
        if type(block) is not Block or block.mlp is not None or has_hooks(block) or not _plain_norm(block.norm1, eps):
            return False
        mixer = block.mixer
        if type(mixer) is not MambaMixer or has_hooks(mixer) or type(mixer.conv) is not ShortConv:
            return False
    return True


def fused_step(model, ids: torch.Tensor, state) -> Optional[tuple[torch.Tensor, list]]:
    """(logits [B, V], the layers' new states) of ``model``'s step on ids [B, 1] from ``state`` (a ModelState the
    caller has checked), in one kernel call, for a model that :func:`model_takes`; None where the kernel does not
    take its tensors (another dtype, more than GEMV_MAX_ROWS rows, a projection it cannot read, ...)."""
    B = ids.shape[0]
    if state.extra or torch.jit.is_tracing() or not 0 < B <= GEMV_MAX_ROWS:
        return None
    h = model.embed(ids[:, 0])
    if h.dtype != torch.float32 or tuple(h.shape) != (B, model.config.d_model):
        return None
    h = h.contiguous()
    final_w = model.norm.weight
    layers, sizes = [], None
    for block, layer_state in zip(model.layers, state.layers):
        mixer, norm_w = block.mixer, block.norm1.weight
        args = mixer.kernel_args(h, layer_state) if isinstance(layer_state, dict) else None
        if args is None or (norm_w is not None and not step_kernel.rms_rows_takes(h, norm_w)):
            return None
        layer_sizes = (h.shape[1], mixer.d_inner, mixer.d_state, mixer.dt_rank, mixer.conv.kernel)
        if sizes is not None and layer_sizes != sizes:
            return None
        sizes = layer_sizes
        layers.append((norm_w, *args))
    head = decode_weights(model.head) if model.head is not None else (model.embed.weight, None, None)
    V, d = model.config.vocab_size, h.shape[1]
    if (head is None or head[2] is not None or not step_kernel.projection_takes(head, V, d)
            or (final_w is not None and not step_kernel.rms_rows_takes(h, final_w))):
        return None
    logits, outs = step_kernel.mamba_model_step(h, layers, final_w, head, model.norm.eps, sizes)
    return logits, [{"conv": st, "ssm": s} for st, s in outs]
