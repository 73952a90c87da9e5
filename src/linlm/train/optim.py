"""AdamW with decay / no-decay parameter groups, and the learning-rate schedules.

Weight decay applies to the weight matrices of linear and convolution layers only. Everything else gets none:
embeddings (and the head tied to them), norm weights, biases, every 1-D parameter, and the free parameters some
mixers own (HGRN2's lower-bound table, cosFormer2's TPE), as well as any parameter marked
``_no_weight_decay = True``.

Schedules are pure functions of the step (0-based index of the optimizer step being taken), so the scheduler's
position in a checkpoint is the step count alone:

- warmup (all kinds): ``lr * (step + 1) / warmup_steps`` for ``step < warmup_steps``;
- ``constant``: ``lr`` after warmup;
- ``cosine``: from ``lr`` at ``step = warmup_steps`` down to ``min_lr = lr * min_lr_ratio`` at the last step,
  along half a cosine;
- ``wsd`` (warmup-stable-decay): ``lr`` until the last ``round(decay_fraction * steps)`` steps, then a linear
  decay that reaches ``min_lr`` at the last step.
"""

from __future__ import annotations

import math

import torch
from torch import nn

DECAY_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d)


def split_decay(model: nn.Module) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """(decay, no_decay) lists of (name, parameter); each trainable parameter appears once."""
    decay, no_decay, seen = [], [], set()
    for mod_name, module in model.named_modules():
        for p_name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            wants_decay = (isinstance(module, DECAY_MODULES) and p_name == "weight" and p.dim() >= 2
                           and not getattr(p, "_no_weight_decay", False))
            (decay if wants_decay else no_decay).append((name, p))
    return decay, no_decay


def fused_adamw_takes(params) -> bool:
    """Whether torch's fused AdamW (one kernel over every tensor) can run these parameters: plain tensors (not the
    DTensors of FSDP2) of a floating dtype, all on the CPU or all on one CUDA device: one pass over all parameters
    instead of the default per-tensor loop."""
    params = list(params)
    if not params:
        return False
    devices = {p.device for p in params}
    return (len(devices) == 1 and next(iter(devices)).type in ("cpu", "cuda")
            and all(type(p.data) is torch.Tensor and p.is_floating_point() for p in params))


def build_optimizer(model: nn.Module, optim_cfg) -> torch.optim.AdamW:
    decay, no_decay = split_decay(model)
    groups = [
        {"params": [p for _, p in decay], "weight_decay": optim_cfg.weight_decay},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0},
    ]
    fused = fused_adamw_takes(p for _, p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                             fused=fused or None)


def wsd_decay_start(steps: int, decay_fraction: float) -> int:
    """First step of the WSD decay phase."""
    return steps - max(1, round(decay_fraction * steps))


def effective_warmup(warmup_steps: int, steps: int) -> int:
    """The warmup a run of ``steps`` steps takes: ``warmup_steps``, cut to ``steps - 1`` when it is not shorter than
    the run, so that the run reaches its peak learning rate (a 3-step run with warmup_steps 100 would otherwise train
    at 1 to 3 % of it) and still has a step after the warmup."""
    return max(0, min(warmup_steps, steps - 1))


def lr_at(step: int, base_lr: float, steps: int, schedule) -> float:
    """The learning rate of optimizer step ``step`` (0-based) in a run of ``steps`` steps.

    Warmup (:func:`effective_warmup` steps): linear, its last step at ``base_lr``. Then constant; or a decay from
    its first step ``start`` (still at ``base_lr``) to the run's last step ``end = steps - 1`` (at ``base_lr *
    min_lr_ratio``): cosine from the end of the warmup, WSD linear over its last ``decay_fraction`` of the steps.
    A decay one step long (``start == end``) puts that step at the floor, after a step at ``base_lr``; the only
    step of a one-step run takes ``base_lr``. So every run of every length reaches the asked learning rate."""
    warmup = effective_warmup(schedule.warmup_steps, steps)
    if step < warmup:
        return base_lr * (step + 1) / warmup
    if schedule.kind == "constant":
        return base_lr
    min_lr = base_lr * schedule.min_lr_ratio
    start = warmup if schedule.kind == "cosine" else max(warmup, wsd_decay_start(steps, schedule.decay_fraction))
    end = steps - 1
    if step < start or (step == start and (start < end or step == 0)):
        t = 0.0
    else:
        t = 1.0 if end <= start else min(1.0, (step - start) / (end - start))
    if schedule.kind == "cosine":
        return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))
    if schedule.kind == "wsd":
        return base_lr + (min_lr - base_lr) * t
    raise ValueError(f"unknown schedule kind {schedule.kind!r}")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
