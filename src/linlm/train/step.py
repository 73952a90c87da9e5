"""One optimizer step, apart from the trainer's bookkeeping, and activation checkpointing.

:class:`TrainStep` is what a step computes: ``grad_accum`` micro-batches of forward and backward (the gradient
all-reduce only on the last), the global gradient norm and clipping, and the optimizer update, which is skipped
when the loss or the gradient is not finite. What the trainer does around it (the learning-rate schedule, logging,
evaluation, checkpoints, the divergence guards) is :mod:`linlm.train.trainer`'s; :func:`weight_norm` measures
the parameters for those guards, and :func:`validation_loss` is the evaluation's forward passes.

:func:`apply_activation_checkpointing` makes each block recompute its activations in the backward pass.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator, Optional

import torch
from torch import nn

from linlm.train import distributed as dist_utils
from linlm.train import guard
from linlm.train.optim import set_lr
from linlm.train.pipeline import split_batch


@dataclass
class StepOutcome:
    loss: float  # mean cross-entropy of the step's micro-batches, averaged over the processes
    aux_loss: float  # the same mean of the routers' auxiliary loss (0 for dense models)
    grad_norm: float  # the global gradient norm before clipping
    skipped: Optional[str]  # why the update was not applied (a non-finite loss or gradient), else None
    stop: bool  # some process asked to stop after this step
    data_s: float  # seconds spent taking batches from the iterator


def on_device(batch, device: torch.device) -> tuple:
    """A batch's ``(ids, targets, reset)`` on ``device`` (``reset`` may be None)."""
    ids, targets, reset = split_batch(batch)
    ids, targets = ids.to(device, non_blocking=True), targets.to(device, non_blocking=True)
    return ids, targets, (reset.to(device, non_blocking=True) if reset is not None else None)


class TrainStep:
    """``step(batches, lr=...)`` runs one optimizer step on ``grad_accum`` batches taken from ``batches``.

    ``model`` is the module the parallel wrapper returned (its gradient sync is switched off for every micro-step
    but the last); ``forward`` calls it, or its compiled form, on ``(ids, targets=, reset=, return_aux=True)``.
    ``params`` are the trainable parameters whose gradients are clipped to ``grad_clip`` (0: measured, not clipped).
    ``autocast`` returns the context each forward runs in (bf16 autocast, or a null context).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, params: list, *,
                 info: dist_utils.DistInfo, grad_accum: int, grad_clip: float,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext,
                 forward: Optional[Callable] = None):
        self.model, self.optimizer, self.params, self.info = model, optimizer, params, info
        self.grad_accum = grad_accum
        self.clip = grad_clip if grad_clip > 0 else float("inf")
        self.autocast = autocast
        self.forward = forward if forward is not None else model

    def __call__(self, batches: Iterator, *, lr: float, poison: bool = False,
                 stop_requested: Callable[[], bool] = lambda: False) -> StepOutcome:
        """``poison`` multiplies the loss by NaN (to exercise the guard). ``stop_requested()`` (read once the
        backward passes are done) is this process's request to stop after the step; it travels in the losses'
        all-reduce, so that every process stops at the same step."""
        info, device, A = self.info, self.info.device, self.grad_accum
        set_lr(self.optimizer, lr)
        ce_sum = torch.zeros((), device=device)
        aux_sum = torch.zeros((), device=device)
        data_s = 0.0
        for micro in range(A):
            t_data = time.perf_counter()
            ids, targets, reset = on_device(next(batches), device)
            data_s += time.perf_counter() - t_data
            with dist_utils.no_grad_sync(self.model, info.enabled and micro < A - 1):
                with self.autocast():
                    out = self.forward(ids, targets=targets, reset=reset, return_aux=True)
                ce = out.loss
                if poison:
                    ce = ce * float("nan")
                aux = out.aux_loss.float()
                ((ce + aux) / A).backward()
            ce_sum += ce.detach()
            aux_sum += aux.detach()
        asked = torch.tensor(1.0 if stop_requested() else 0.0, device=device)
        stats = torch.stack([ce_sum / A, aux_sum / A, asked]).double()
        dist_utils.all_reduce_sum(stats, info)
        loss = float(stats[0]) / info.world_size
        norm = dist_utils.grad_norm_value(torch.nn.utils.clip_grad_norm_(self.params, self.clip))
        why = guard.bad_step(loss, norm)
        if why is None:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return StepOutcome(loss=loss, aux_loss=float(stats[1]) / info.world_size, grad_norm=norm, skipped=why,
                           stop=bool(stats[2] > 0), data_s=data_s)


@torch.no_grad()
def validation_loss(model: nn.Module, forward: Callable, batches, *, info: dist_utils.DistInfo,
                    autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> float:
    """Mean cross-entropy per target token over ``batches``, all processes together; ``model`` is in eval mode
    meanwhile and back in train mode after."""
    total = torch.zeros(2, dtype=torch.float64, device=info.device)
    model.eval()
    try:
        for batch in batches:
            ids, targets, reset = on_device(batch, info.device)
            with autocast():
                mean = forward(ids, targets=targets, reset=reset, return_aux=True).loss
            counted = int((targets != -100).sum())
            if counted:
                total[0] += mean.double() * counted
                total[1] += counted
    finally:
        model.train()
    dist_utils.all_reduce_sum(total, info)
    return float(total[0] / total[1])


def weight_norm(params: list, info: dist_utils.DistInfo) -> float:
    """The global L2 norm of ``params`` (summed over FSDP shards)."""
    total = torch.zeros((), dtype=torch.float64, device=info.device)
    sharded = False
    for p in params:
        t = p.detach()
        if hasattr(t, "to_local"):
            t, sharded = t.to_local(), True
        total += t.double().pow(2).sum()
    if sharded:
        dist_utils.all_reduce_sum(total, info)
    return math.sqrt(float(total))


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in the backward pass instead of keeping them from the forward pass:
    every block of ``model.layers`` is wrapped, in place, in torch's checkpoint wrapper, which runs it through
    non-reentrant ``torch.utils.checkpoint.checkpoint``. The wrapper keeps the block's names: ``state_dict``,
    ``load_state_dict``, ``named_parameters`` and torch.distributed.checkpoint's state dicts see the keys of the
    unwrapped model, so a checkpoint saved with activation checkpointing loads without it, and the other way
    round. Apply it before the parallel wrapper (FSDP then shards the wrapped blocks). A second call changes
    nothing."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointImpl, CheckpointWrapper,
                                                                             checkpoint_wrapper)

    for i, block in enumerate(model.layers):
        if not isinstance(block, CheckpointWrapper):
            model.layers[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
