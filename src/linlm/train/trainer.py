"""The Trainer: one TrainConfig in, a TrainResult out, hooks for progress and metrics.

``Trainer(cfg, resume=..., overwrite=..., hooks=..., data=...).run()`` (or ``train(cfg, ...)``) runs a config from
start, or from its last checkpoint, to the end. Order of work, so that a mistake costs nothing and leaves nothing
on disk: validate the config; decide what to do with a run already in out_dir and check every path the run
writes there, before the directory is created or locked (:mod:`linlm.train.rundir`); lock it and decide again;
open the data (:mod:`linlm.train.pipeline`); build the model and restore the checkpoint; only then write
config.yaml and train. The end-of-run report is :mod:`linlm.train.report`; a run the divergence guard stops
(:mod:`linlm.train.guard`) gets one too, recorded as not finished, before TrainingDiverged is raised. Each step
itself (forward, backward, clipping, the update) is a :class:`~linlm.train.step.TrainStep`; the Trainer does the
bookkeeping around it: schedule, metrics, evaluation, guards, checkpoints, the run directory.

Determinism: the data order is a pure function of (seed, step), the learning rate a pure function of the step,
and a checkpoint holds the weights, the optimizer state, every RNG state and the data position, so a resumed run
repeats the uninterrupted one; on CPU the final weights are bitwise equal.

No process-wide side effects beyond the run: no allocator tuning; signal handlers only on the main thread and
only while ``run()`` trains; ``deterministic`` and ``threads`` set torch's global switches, as asked.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import shlex
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from linlm.devices import resolve_precision
from linlm.errors import CheckpointError, LinlmError, TrainingDiverged
from linlm.progress import live_display
from linlm.signals import StopSignals
from linlm.train import checkpoint as ckpt
from linlm.train import distributed as dist_utils
from linlm.train import guard
from linlm.train.train_config import TrainConfig
from linlm.train.metrics import METRICS_FILE, MetricsLog, Progress, measure_peak_flops
from linlm.train.optim import build_optimizer, effective_warmup, lr_at
from linlm.train.pipeline import DataFactory, TrainData, check_training_memory, open_prepared, resolve_data
from linlm.train.report import read_summary, write_report
from linlm.train.restore import as_saved, load_initial_weights
from linlm.train.rundir import RunDir
from linlm.train.step import TrainStep, apply_activation_checkpointing, validation_loss, weight_norm

log = logging.getLogger("linlm.train")


@dataclass
class TrainResult:
    out_dir: Path
    step: int
    checkpoint: Optional[Path] = None
    interrupted: Optional[str] = None  # the signal's name when stopped by SIGINT / SIGTERM
    loss: Optional[float] = None
    val_loss: Optional[float] = None
    skipped_steps: int = 0
    samples: list[tuple[str, str]] = field(default_factory=list)
    plot: Optional[Path] = None
    seconds: float = 0.0
    finished: bool = False  # the run has reached cfg.steps
    diverged: Optional[str] = None  # why the divergence guard stopped the run (TrainingDiverged follows)
    flops: float = 0.0  # model FLOPs of the steps done so far (linlm.models.counting), all processes together
    precision: str = "fp32"  # the precision the steps ran in (config's precision, auto resolved)


class TrainHooks:
    """Override any of these; the Trainer calls them on rank 0."""

    def on_start(self, info: dict) -> None:
        """info: arch, params, start_step, steps, tokens_per_step, training_flops_per_token (counted, not the
        paper's closed form: :func:`linlm.models.cost.training_flops`; also under its old name flops_per_token),
        out_dir."""

    def on_step(self, record: dict) -> None:
        """The record written to metrics.jsonl for this step."""

    def on_end(self, result: TrainResult) -> None:
        """The result, once the report is written."""


def _on_main(info: dist_utils.DistInfo, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on rank 0; every rank returns its result or raises its LinlmError."""
    result, error = None, None
    if info.is_main:
        try:
            result = fn()
        except LinlmError as e:
            error = e
    result, error = dist_utils.broadcast_object((result, error), info)
    if error is not None:
        raise error
    return result


class Trainer:
    def __init__(self, cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False,
                 hooks: Optional[TrainHooks] = None, verbose: bool = False, live: Optional[bool] = False,
                 data: Optional[DataFactory] = None):
        self.cfg, self.resume, self.overwrite = cfg, resume, overwrite
        self.hooks = hooks or TrainHooks()
        self.verbose, self.live, self.data_factory = verbose, live, data
        self.run_dir = RunDir(cfg.out_dir)
        self.out = self.run_dir.path

    def say(self, text: str) -> None:
        if self.verbose and self.info.is_main:
            print(text, flush=True)

    # -- the run --

    def run(self) -> TrainResult:
        """Train. Under torchrun every process calls this; rank 0 writes the outputs."""
        self.cfg.validate()
        self.info = dist_utils.init(self.cfg.device, self.cfg.distributed.backend)
        try:
            self._check_memory()
            # Every refusal out_dir can give comes before the directory is created or locked: a refused command
            # leaves it byte for byte as it was. The decision is made again under the lock, in _run.
            _on_main(self.info, lambda: self.run_dir.check(self.cfg, self.resume, self.overwrite))
            _on_main(self.info, lambda: self.run_dir.open() and None)
            try:
                result = self._run()
            finally:
                if self.info.is_main:
                    self.run_dir.close()
            if self.info.enabled:
                # Free the (possibly sharded) model and optimizer while the process group is alive, then wait for
                # rank 0's report: tearing the group down under a peer can abort the gloo transport at exit.
                self.raw = self.model = self.optimizer = self.step_model = self.train_step = None
                gc.collect()
                dist_utils.barrier(self.info)
            return result
        finally:
            dist_utils.shutdown(self.info)

    def _check_memory(self) -> None:
        check_training_memory(self.cfg, self.info.world_size, self.info.device)

    def _run(self) -> TrainResult:
        cfg, info = self.cfg, self.info
        started = time.perf_counter()
        plan = _on_main(info, lambda: self.run_dir.check(cfg, self.resume, self.overwrite))
        if info.is_main:
            for note in plan.notes:
                log.warning("%s", note)
        if plan.finished:
            summary = _on_main(info, lambda: read_summary(self.run_dir))
            if summary is not None:
                return self._already_finished(plan, summary, started)
        show = self.verbose and info.is_main and (live_display() if self.live is None else self.live)
        if self.data_factory is None:
            data_dir = Path(_on_main(info, lambda: str(resolve_data(cfg, show))))
            self.data = open_prepared(cfg, data_dir, info.rank, info.world_size)
        else:
            self.data = self.data_factory(cfg, info.rank, info.world_size)
        self.model_config = cfg.model_config(vocab_size=self.data.vocab_size)
        if plan.checkpoint is not None:
            self.model_config = as_saved(self.model_config, Path(plan.checkpoint), cfg.model.overrides)
        if self.data.tokenizer is not None and hasattr(self.data.tokenizer, "ensure_fits"):
            self.data.tokenizer.ensure_fits(self.model_config.vocab_size)
        self.watch = guard.LossWatch(self.model_config.vocab_size)
        self._build(init_from=cfg.init_from if plan.checkpoint is None else None)
        start_step, self.skipped, last_val = 0, 0, None
        if plan.checkpoint is not None:
            start_step, last_val = self._restore(Path(plan.checkpoint))
        _on_main(info, lambda: self.run_dir.start(cfg, plan, self.overwrite))

        from linlm.models.cost import training_flops
        from linlm.models.counting import count

        counts = count(self.model_config, batch=cfg.batch_size, seq_len=cfg.data.seq_len)
        self.training_flops_per_token = training_flops(1, counts["counted_flops_per_token"],
                                                       counts["lm_head_flops_per_token"])
        self.tokens_per_step = cfg.batch_size * cfg.data.seq_len
        # Checkpoints kept for evaluation along training, beyond the newest checkpoint.keep.
        self.kept = ckpt.kept_steps(cfg.steps, self.tokens_per_step, cfg.checkpoint.keep_every_tokens,
                                    cfg.checkpoint.keep_log)
        n_params = sum(p.numel() for p in self.raw.parameters())
        self.say(f"{'resuming' if plan.checkpoint else 'training'} {self.model_config.arch} ({n_params:,} "
                 f"parameters) in {self.out} from step {start_step} of {cfg.steps}")
        if info.is_main and cfg.schedule.warmup_steps >= cfg.steps > 1:  # said once every check has passed
            log.warning("schedule.warmup_steps=%d is not shorter than steps=%d: the warmup takes %d steps, so that the "
                        "run reaches optim.lr", cfg.schedule.warmup_steps, cfg.steps,
                        effective_warmup(cfg.schedule.warmup_steps, cfg.steps))
        if info.is_main:
            self.hooks.on_start({"arch": self.model_config.arch, "params": n_params, "start_step": start_step,
                                 "steps": cfg.steps, "tokens_per_step": self.tokens_per_step,
                                 "training_flops_per_token": self.training_flops_per_token,
                                 "flops_per_token": self.training_flops_per_token, "out_dir": self.out})
        precision = resolve_precision(cfg.precision, info.device)
        if cfg.precision == "auto":
            self.say(f"precision auto: {precision} on {info.device.type}")
        bf16 = precision == "bf16"
        self.peak = (cfg.peak_flops if cfg.peak_flops is not None
                     else measure_peak_flops(info.device, torch.bfloat16 if bf16 else torch.float32))
        self.autocast = ((lambda: torch.autocast(info.device.type, dtype=torch.bfloat16)) if bf16
                         else contextlib.nullcontext)
        self.train_step = TrainStep(self.model, self.optimizer, [p for p in self.raw.parameters() if p.requires_grad],
                                    info=info, grad_accum=cfg.grad_accum, grad_clip=cfg.optim.grad_clip,
                                    autocast=self.autocast, forward=self.step_model)

        result = TrainResult(self.out, start_step, val_loss=last_val, skipped_steps=self.skipped, precision=precision)
        self.metrics = None
        _on_main(info, lambda: self._open_metrics(start_step))
        diverged: Optional[TrainingDiverged] = None
        try:
            # SIGINT / SIGTERM set stop.name; the loop writes a checkpoint after the current step and stops.
            with StopSignals(lambda name: log.warning("%s received: finishing this step, writing a checkpoint, "
                                                      "then stopping", name)) as stop:
                self._loop(start_step, stop, result)
        except TrainingDiverged as e:
            diverged, result.diverged = e, str(e)
        finally:
            if self.metrics is not None:
                self.metrics.close()
        result.finished = result.step >= cfg.steps and result.interrupted is None and diverged is None
        result.flops = float(self.training_flops_per_token * self.tokens_per_step * result.step)
        if start_step >= cfg.steps and info.is_main:
            result.checkpoint = plan.checkpoint
            self.say(f"{self.out} is already complete at step {cfg.steps}")
        if info.is_main:
            write_report(self.run_dir, result, title=f"{self.model_config.arch}: {self.out.name}",
                         tokenizer=self.data.tokenizer, cfg=cfg, device=info.device, say=self.say)
        if diverged is not None:
            raise diverged
        result.seconds = time.perf_counter() - started
        if info.is_main:
            self.hooks.on_end(result)
        return result

    def _already_finished(self, plan, summary: dict, started: float) -> TrainResult:
        """--resume on a complete run: report it, change nothing."""
        result = TrainResult(self.out, int(summary.get("step") or self.cfg.steps), checkpoint=plan.checkpoint,
                             loss=summary.get("loss"), val_loss=summary.get("val_loss"),
                             skipped_steps=int(summary.get("skipped_steps") or 0), finished=True,
                             flops=float(summary.get("flops") or 0.0),
                             plot=Path(summary["loss_curve"]) if summary.get("loss_curve") else None)
        self.say(f"{self.out} is already complete at step {result.step} (steps={self.cfg.steps}); nothing to do. "
                 "Raise steps to train further")
        result.seconds = time.perf_counter() - started
        if self.info.is_main:
            self.hooks.on_end(result)
        return result

    def _open_metrics(self, start_step: int) -> None:
        self.metrics = MetricsLog(self.out / METRICS_FILE, truncate_after=start_step)

    def _build(self, init_from: Optional[str]) -> None:
        cfg, info = self.cfg, self.info
        if cfg.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.benchmark = False
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        from linlm.models.lm import CausalLM

        raw = CausalLM(self.model_config).to(info.device)
        raw.train()
        self.raw = raw
        if init_from:  # weights before wrapping, so that FSDP shards the loaded ones
            self.say(f"weights from {load_initial_weights(raw, self.model_config, init_from)}")
        if cfg.activation_checkpointing:
            apply_activation_checkpointing(raw)
        self.model = dist_utils.wrap(raw, cfg.distributed.strategy, info)
        self.optimizer = build_optimizer(raw, cfg.optim)
        self.step_model = torch.compile(self.model) if cfg.compile else self.model

    def _restore(self, path: Path) -> tuple[int, Optional[float]]:
        c = ckpt.load_checkpoint(path, verified=True)
        try:
            dist_utils.load_full_state_dicts(self.raw, self.optimizer, c.model, c.optimizer)
        except (RuntimeError, KeyError, ValueError) as e:
            raise CheckpointError(f"{path}: does not match this run's model or optimizer ({e}); resume with the "
                                  "config the run was started with") from None
        saved_fp = c.state.get("data_fingerprint", "")
        if saved_fp and self.data.fingerprint and saved_fp != self.data.fingerprint:
            raise CheckpointError(f"{path}: was trained on other data (fingerprint {saved_fp[:12]}, this run's is "
                                  f"{self.data.fingerprint[:12]}); resume with the same data")
        self.data.train.load_state_dict(c.state["data"])
        ckpt.restore_rng(c.rng["tensors"], c.rng["rest"])
        self.skipped = int(c.state.get("skipped_steps", 0))
        self.watch = guard.LossWatch(self.model_config.vocab_size, c.state.get("loss_watch"))
        self.say(f"resumed from {path}")
        return c.step, c.state.get("val_loss")

    # -- the loop --

    def _loop(self, start_step: int, stop: StopSignals, result: TrainResult) -> None:
        cfg, info = self.cfg, self.info
        params = self.train_step.params
        nan_steps = set(cfg.debug.nan_steps)
        judge = guard.Guard(self.watch, cfg.max_bad_steps, weight_norm(params, info))
        progress = Progress(cfg.steps, start_step, cfg.log_every, enabled=self.verbose and info.is_main,
                            live=self.live)
        run_t0 = time.perf_counter()
        try:
            for step in range(start_step, cfg.steps):
                n = step + 1  # steps completed after this one
                lr = lr_at(step, cfg.optim.lr, cfg.steps, cfg.schedule)
                t0 = time.perf_counter()
                out = self.train_step(self.data.train, lr=lr, poison=n in nan_steps,
                                      stop_requested=lambda: bool(stop.name))
                loss_value, aux_value, norm, why = out.loss, out.aux_loss, out.grad_norm, out.skipped
                stop_now, data_s = out.stop, out.data_s
                if why is None:
                    diverged = judge.good(loss_value, weight_norm(params, info))  # why the run must stop now
                    stop_why = f"{diverged} (lr={lr:g})" if diverged else None
                else:
                    self.skipped += 1
                    diverged, stop_why = None, judge.bad(why)
                dt = time.perf_counter() - t0
                tps = self.tokens_per_step / dt
                rec: dict[str, Any] = {
                    "step": n, "tokens": n * self.tokens_per_step, "loss": loss_value, "lr": lr,
                    "grad_norm": norm, "param_norm": judge.weight_norm, "tokens_per_s": tps, "step_s": dt,
                    "data_s": data_s, "mfu": tps / info.world_size * self.training_flops_per_token / self.peak,
                    "skipped": why is not None, "skipped_steps": self.skipped, "time": time.perf_counter() - run_t0}
                if aux_value:
                    rec["aux_loss"] = aux_value
                if why is not None:
                    log.warning("step %d: %s; the update was skipped (%d in a row)", n, why, judge.streak)
                if cfg.eval.every and (n % cfg.eval.every == 0 or n == cfg.steps) and diverged is None:
                    rec["val_loss"] = validation_loss(self.model, self.step_model, self.data.val, info=self.info,
                                                      autocast=self.autocast)
                    result.val_loss = rec["val_loss"]
                if self.metrics is not None:
                    self.metrics.write(rec)
                if info.is_main:
                    self.hooks.on_step(rec)
                progress.update(rec)
                result.step, result.loss, result.skipped_steps = n, loss_value, self.skipped
                if stop_why is not None:
                    raise TrainingDiverged(f"stopped at step {n}: {stop_why}; {self._advice()}")
                # A bad step writes no periodic checkpoint: the newest one stays the last good state.
                due = (why is None and ((cfg.checkpoint.every and n % cfg.checkpoint.every == 0)
                                        or n in self.kept)) or n == cfg.steps
                if due or stop_now:
                    result.checkpoint = self._save(n, result.val_loss, loss_value, why is None)
                if stop_now:
                    result.interrupted = stop.name or "signal"
                    progress.print(f"stopped by {result.interrupted} at step {n}; checkpoint {result.checkpoint}; "
                                   f"continue with: linlm train --resume --out {shlex.quote(str(self.out))}")
                    return
        finally:
            progress.close()

    def _advice(self) -> str:
        if not self.info.is_main:
            return "see rank 0's message"
        last = guard.last_good_checkpoint(self.run_dir.checkpoints, self.watch.good_loss())
        if last is None and self.cfg.init_from:
            last = ckpt.resolve_checkpoint(self.cfg.init_from)
        return guard.advice(self.cfg, self.out, last)

    def _save(self, step: int, val_loss: Optional[float], loss: float, sane: bool) -> Optional[Path]:
        model_sd, optim_sd = dist_utils.full_state_dicts(self.raw, self.optimizer, self.info)

        def write() -> str:
            state = {"data": self.data.train.state_dict(), "data_fingerprint": self.data.fingerprint,
                     "skipped_steps": self.skipped, "val_loss": val_loss, "world_size": self.info.world_size,
                     "schedule_step": step, "loss": loss if math.isfinite(loss) else None, "sane": sane,
                     "loss_watch": self.watch.state_dict()}
            path = ckpt.save_checkpoint(
                self.run_dir.checkpoints, step, model_state=model_sd, model_config=self.model_config.to_dict(),
                optimizer_state=optim_sd, state=state, config_yaml=self.cfg.to_yaml(),
                tokenizer_dir=self.data.directory, keep=self.cfg.checkpoint.keep, protect=self.kept)
            return str(path)

        return Path(_on_main(self.info, write))


def train(cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False, hooks: Optional[TrainHooks] = None,
          verbose: bool = True, live: Optional[bool] = None, data: Optional[DataFactory] = None) -> TrainResult:
    """``Trainer(cfg, ...).run()``."""
    return Trainer(cfg, resume=resume, overwrite=overwrite, hooks=hooks, verbose=verbose, live=live,
                   data=data).run()


__all__ = ["Trainer", "TrainHooks", "TrainResult", "TrainData", "train"]
