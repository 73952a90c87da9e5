"""The time a sweep's runs will take, estimated before training: from a FLOP rate the user gives, or from
optimizer steps timed on this machine.

A FLOP rate costs each run by its counted FLOPs (what its steps really compute, the LM head included:
:mod:`linlm.models.cost`), at the vocabulary its data will give it. Timed steps are interpolated in FLOPs per
step, since a small model spends much of a step on fixed costs.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

from linlm.models.cost import training_flops
from linlm.scaling.data import vocab_guess
from linlm.scaling.ladder import PlannedRun
from linlm.scaling.plan import PlanRow

MEASURE_MAX_PARAMS = 50_000_000  # above this, --dry-run does not time steps on this machine


def measure_step_seconds(run: PlannedRun, vocab_size: int, steps: int = 2) -> float:
    """Seconds per optimizer step of ``run``'s model on this machine (random tokens, its batch shape, device,
    precision and threads); the fastest of ``steps`` timed steps after one warm-up step."""
    import torch

    from linlm.devices import resolve_device, resolve_precision
    from linlm.train.optim import build_optimizer
    from linlm.models.lm import CausalLM

    cfg = run.config
    model_cfg = cfg.model_config(vocab_size=vocab_size)
    old_threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        device = resolve_device(cfg.device)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        gen = torch.Generator().manual_seed(0)
        model = CausalLM(model_cfg).to(device)
        opt = build_optimizer(model, cfg.optim)  # the run's own optimizer, as the trainer builds it
        micro = max(1, cfg.batch_size // cfg.grad_accum)
        ids = torch.randint(0, model_cfg.vocab_size, (micro, cfg.data.seq_len), generator=gen).to(device)
        bf16 = resolve_precision(cfg.precision, device) == "bf16"
        best = math.inf
        for i in range(steps + 1):
            t0 = time.perf_counter()
            for _ in range(cfg.grad_accum):
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    loss = model(ids, targets=ids).loss
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            if i:
                best = min(best, time.perf_counter() - t0)
        return best
    finally:
        torch.set_num_threads(old_threads)


def estimate(rows: list[PlanRow], flops_per_s: Optional[float], measure: bool,
             say: Callable[[str], None]) -> None:
    """Fill each row's estimated seconds: from ``flops_per_s`` (training FLOPs incl. the LM head), else from
    steps timed on this machine for models up to MEASURE_MAX_PARAMS. Per architecture, the smallest and the
    largest rung are timed and the rungs between are interpolated linearly in FLOPs per step (seconds per step =
    overhead + FLOPs / rate); an architecture with fewer than 3 rungs has every rung timed."""
    todo = [row for row in rows if row.status != "done"]
    for row in rows:
        if row.status == "done":
            row.seconds = 0.0
    if flops_per_s:
        from linlm.models.counting import count

        for row in todo:
            r = row.run
            c = count(r.config.model_config(vocab_size=vocab_guess(r.config, row.data)),
                      batch=r.config.batch_size, seq_len=r.config.data.seq_len)
            spent = training_flops(r.tokens, c["counted_flops_per_token"], c["lm_head_flops_per_token"])
            row.seconds = spent / flops_per_s
        return
    if not measure:
        return
    by_arch: dict[str, list[PlanRow]] = {}
    for row in todo:
        if row.run.params <= MEASURE_MAX_PARAMS:
            by_arch.setdefault(row.run.arch, []).append(row)
    for group in by_arch.values():
        group.sort(key=lambda row: row.run.step_flops)
        timed = [group[0], group[-1]] if len(group) >= 3 else group
        per_step = {}
        for row in timed:
            say(f"timing {row.run.name} ...")
            per_step[id(row)] = measure_step_seconds(row.run, vocab_guess(row.run.config, row.data))
        lo, hi = timed[0], timed[-1]
        for row in group:
            if id(row) in per_step:
                s = per_step[id(row)]
            else:
                f = (row.run.step_flops - lo.run.step_flops) / max(1.0, hi.run.step_flops - lo.run.step_flops)
                s = per_step[id(lo)] + f * (per_step[id(hi)] - per_step[id(lo)])
            row.seconds = row.run.config.steps * s
