"""Data-parallel training under torchrun: DDP or FSDP2 (``fully_shard``), gloo on CPU, nccl on CUDA.

A process started by ``torchrun`` sees ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` in its environment; without
them the run is a single process and nothing here touches torch.distributed.

Saving under FSDP: the full (unsharded) model and optimizer state dicts are gathered onto rank 0 with
``torch.distributed.checkpoint.state_dict.get_state_dict(full_state_dict=True, cpu_offload=True)`` and written
by rank 0 as one ordinary checkpoint, exactly like a DDP or single-process run. Any world size (and strategy)
can resume it: every rank reads the checkpoint and ``set_state_dict`` keeps its own shard. This needs the full
state to fit in rank 0's CPU memory, which holds for the model sizes this library trains; it is the simplest
format that stays portable.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from linlm.devices import resolve_device


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: Optional[str] = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(device_spec: str, backend: str = "auto") -> DistInfo:
    """Start the process group when launched by torchrun; pick this process's device."""
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return DistInfo(device=resolve_device(device_spec))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = resolve_device(device_spec, local_rank)
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=device, backend=backend)


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_object(obj: Any, info: DistInfo) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not info.enabled:
        return obj
    box = [obj if info.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def wrap(model: nn.Module, strategy: str, info: DistInfo) -> nn.Module:
    """DDP or FSDP2 around ``model`` (FSDP shards every block, then the root). Single process: unchanged."""
    if not info.enabled:
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [info.device.index] if info.device.type == "cuda" else None
    return DDP(model, device_ids=ids)


@contextlib.contextmanager
def no_grad_sync(model: nn.Module, enabled: bool):
    """Skip the gradient all-reduce of an accumulation micro-step (DDP no_sync, FSDP2 requires_gradient_sync)."""
    if not enabled:
        yield
        return
    if hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def full_state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo) -> tuple[dict, dict]:
    """Full model and optimizer state dicts keyed by parameter name (on rank 0; other ranks may get empty ones).

    A collective under FSDP: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=info.enabled)
    return get_state_dict(model, optimizer, options=opts)


def load_full_state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict, optim_sd: dict) -> None:
    """Load full state dicts (read by every rank) into a possibly sharded model and its optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                   options=StateDictOptions(full_state_dict=True, strict=True))
    for group in optimizer.param_groups:  # tuples come back as lists from the JSON part of a checkpoint
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])


def grad_norm_value(norm: Any) -> float:
    """A float from clip_grad_norm_'s result (a DTensor under FSDP)."""
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)
