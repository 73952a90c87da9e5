"""The training loop: ``train(cfg)`` runs one TrainConfig from start (or from its last checkpoint) to the end.

Order of work, so that a mistake costs nothing and leaves nothing on disk:

1. validate the whole config;
2. check the output directory (a different run there is refused unless ``resume`` or ``overwrite``);
3. prepare or open the data, check that the tokenizer fits the model and the sequence length fits the data;
4. only then create the output directory, build the model, and train.

Determinism: the data order is a pure function of (seed, step) (``linlm.data.Batches``), the learning rate a pure
function of the step, and a checkpoint holds the weights, the optimizer state, every RNG state and the data
position, so a resumed run repeats the uninterrupted one; on CPU the final weights are bitwise equal.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import math
import os
import random
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from linlm.errors import CheckpointError, ConfigError, DataError, LinlmError
from linlm.io_utils import atomic_write_bytes
from linlm.runtime import tune_allocator
from linlm.train import checkpoint as ckpt
from linlm.train import distributed as dist_utils
from linlm.train.config import TrainConfig, config_diff
from linlm.train.metrics import METRICS_FILE, MetricsLog, Progress, measure_peak_flops, read_metrics
from linlm.train.optim import build_optimizer, lr_at, set_lr

log = logging.getLogger("linlm.train")

CONFIG_FILE = "config.yaml"
SAMPLES_FILE = "samples.txt"
PLOT_FILE = "loss_curve.png"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"
# Files and folders a run writes into its out_dir (--overwrite removes exactly these).
RUN_FILES = (CONFIG_FILE, METRICS_FILE, SAMPLES_FILE, PLOT_FILE, SUMMARY_FILE, CHECKPOINT_DIR)
# Keys that may change when a run is resumed: they do not change what the run computes.
RESUMABLE_CHANGES = ("out_dir", "steps", "eval.every", "checkpoint.every", "checkpoint.keep", "samples.",
                     "log_every", "device", "compile", "threads", "peak_flops", "distributed.",
                     "activation_checkpointing", "max_bad_steps", "debug.", "data.dir", "deterministic")


class TrainingDiverged(LinlmError):
    """Too many consecutive steps with a non-finite loss or gradient."""


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


# ---- helpers run on rank 0, with the outcome shared ---------------------------------------------------------


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


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# ---- output directory -------------------------------------------------------------------------------------


def _has_run(out: Path) -> bool:
    return any((out / name).exists() for name in RUN_FILES)


def _allowed_change(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESUMABLE_CHANGES)


def check_out_dir(cfg: TrainConfig, resume: bool, overwrite: bool) -> Optional[str]:
    """Refuse an out_dir holding another run; returns the checkpoint to resume from (or None)."""
    import yaml

    out = Path(cfg.out_dir)
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; pass one of them")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out_dir: {out} is a file; choose a directory")
    if not _has_run(out):
        if resume:
            log.warning("%s holds no run to resume; starting from step 0", out)
        return None
    saved_path = out / CONFIG_FILE
    saved = None
    if saved_path.is_file():
        try:
            saved = yaml.safe_load(saved_path.read_text())
        except yaml.YAMLError as e:
            if not overwrite:
                raise ConfigError(f"{saved_path}: unreadable ({e}); pass --overwrite to replace the run") from None
    new = cfg.to_dict()
    differ = [k for k in config_diff(saved or {}, new)] if isinstance(saved, dict) else ["<unreadable config>"]
    if overwrite:
        return None
    if not resume:
        what = (f"a run with a different config (differs at {', '.join(differ[:8])})" if differ
                else "a run with this config")
        raise ConfigError(f"out_dir: {out} already holds {what}; pass --resume to continue it, --overwrite to "
                          "delete it and start over, or choose another out_dir")
    blocking = [k for k in differ if not _allowed_change(k)]
    if blocking:
        raise ConfigError(f"out_dir: cannot resume {out}: its run was made with a different {', '.join(blocking[:8])}"
                          f"; these change what the run computes. Resume with the saved config ({saved_path}), or "
                          "pass --overwrite to start over")
    if "steps" in differ:
        log.warning("steps changed from %s to %s: the learning-rate schedule after the checkpoint follows the new "
                    "length", (saved or {}).get("steps"), cfg.steps)
    root = out / CHECKPOINT_DIR
    ckpt.clean_temporaries(root)
    found = ckpt.latest_valid(root)
    if found is None:
        log.warning("%s has no valid checkpoint; starting from step 0", root)
        return None
    return str(found)


def _remove_run(out: Path) -> None:
    for name in RUN_FILES:
        path = out / name
        if path.is_dir():
            trash = out / f".{name}.trash"
            os.replace(path, trash)
            shutil.rmtree(trash, ignore_errors=True)
        elif path.exists():
            path.unlink()


# ---- data -------------------------------------------------------------------------------------------------


def prepared_data_dir(cfg: TrainConfig) -> Path:
    """The cache directory for data.source + data.tokenizer (prepared there when missing)."""
    from linlm.data.corpus import cache_dir

    source = cfg.data.source
    if Path(source).expanduser().exists():
        source = str(Path(source).expanduser().resolve())
    tok = cfg.data.tokenizer
    if not tok.startswith("bpe:") and Path(tok).expanduser().exists():
        tok = str(Path(tok).expanduser().resolve())
    key = hashlib.sha256(json.dumps([source, tok, cfg.data.val_fraction]).encode()).hexdigest()[:16]
    slug = "".join(c if c.isalnum() else "-" for c in Path(cfg.data.source).name)[:32].strip("-") or "data"
    return cache_dir() / "prepared" / f"{slug}-{key}"


def resolve_data(cfg: TrainConfig, show_progress: bool) -> Path:
    if cfg.data.dir is not None:
        return Path(cfg.data.dir).expanduser()
    from linlm.data.prepare import prepare

    target = prepared_data_dir(cfg)
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("preparing %s with %s into %s", cfg.data.source, cfg.data.tokenizer, target)
    prepare(cfg.data.source, cfg.data.tokenizer, target, val_fraction=cfg.data.val_fraction, seed=0,
            overwrite=True, progress=show_progress)
    return target


@dataclass
class DataBundle:
    directory: Path
    tokenizer: Any
    model_config: Any
    train: Any  # Batches
    val: list  # fixed validation micro-batches (CPU tensors)


def open_data(cfg: TrainConfig, data_dir: Path, info: dist_utils.DistInfo) -> DataBundle:
    from linlm.data.loader import Batches, TokenDataset

    train_ds = TokenDataset(data_dir, "train")
    tok = train_ds.tokenizer()
    model_cfg = cfg.model_config(vocab_size=_round_up(max(tok.vocab_size, train_ds.vocab_size), 64))
    tok.ensure_fits(model_cfg.vocab_size)
    if train_ds.vocab_size > model_cfg.vocab_size:
        from linlm.errors import TokenizerError

        raise TokenizerError(f"{data_dir}: the data holds token ids up to {train_ds.vocab_size - 1} but the model's "
                             f"vocab_size is {model_cfg.vocab_size}; raise model.overrides.vocab_size")
    world = info.world_size
    if cfg.batch_size % (cfg.grad_accum * world):
        raise ConfigError(f"batch_size: {cfg.batch_size} is not divisible by grad_accum ({cfg.grad_accum}) x "
                          f"processes ({world}); choose a multiple of {cfg.grad_accum * world}")
    micro = cfg.micro_batch(world)
    seq_len = cfg.data.seq_len
    try:
        train = Batches(train_ds, micro, seq_len, seed=cfg.seed, rank=info.rank, world_size=world)
    except DataError as e:
        raise DataError(f"data.seq_len: {e}") from None
    val: list = []
    if cfg.eval.every:
        val_ds = TokenDataset(data_dir, "val")
        try:
            vb = Batches(val_ds, micro, seq_len, seed=cfg.seed, rank=info.rank, world_size=world)
        except DataError as e:
            raise DataError(f"data.seq_len: {e}; or raise data.val_fraction, or set eval.every=0 to train without "
                            "validation") from None
        val = [vb.batch(i) for i in range(cfg.eval.batches * cfg.grad_accum)]
    return DataBundle(data_dir, tok, model_cfg, train, val)


# ---- model ------------------------------------------------------------------------------------------------


def apply_activation_checkpointing(model) -> None:
    """Recompute each block's activations in the backward pass (torch.utils.checkpoint, non-reentrant)."""
    from torch.utils.checkpoint import checkpoint

    for block in model.layers:
        inner = block.forward

        def forward(x, _inner=inner, **kwargs):
            if torch.is_grad_enabled():
                return checkpoint(_inner, x, use_reentrant=False, **kwargs)
            return _inner(x, **kwargs)

        block.forward = forward


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class _StopSignal:
    """SIGINT / SIGTERM set a flag; the loop writes a checkpoint after the current step and stops."""

    def __init__(self):
        self.name: Optional[str] = None
        self._old: dict = {}

    def __enter__(self) -> "_StopSignal":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.name = signal.Signals(signum).name
        log.warning("%s received: finishing this step, writing a checkpoint, then stopping", self.name)

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


# ---- the run ----------------------------------------------------------------------------------------------


def train(cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False, verbose: bool = True,
          live: Optional[bool] = None) -> TrainResult:
    """Train ``cfg``. ``resume`` continues the run in ``cfg.out_dir`` from its newest valid checkpoint;
    ``overwrite`` replaces a run there. Under torchrun every process calls this; rank 0 writes the outputs."""
    cfg.validate()
    tune_allocator()
    info = dist_utils.init(cfg.device, cfg.distributed.backend)
    runner = _Run(cfg, info, verbose, live)
    try:
        result = runner.run(resume, overwrite)
        if info.enabled:
            # Free the (possibly sharded) model and optimizer while the process group is alive, then wait for
            # rank 0's samples and plot: tearing the group down under a peer, or leaving FSDP state to be
            # collected after it is gone, can abort the gloo transport at exit. (Not on errors: a peer may be
            # blocked in another collective.)
            runner.release()
            gc.collect()
            dist_utils.barrier(info)
        return result
    finally:
        dist_utils.shutdown(info)


class _Run:
    def __init__(self, cfg: TrainConfig, info: dist_utils.DistInfo, verbose: bool, live: Optional[bool]):
        self.cfg, self.info = cfg, info
        self.verbose = verbose and info.is_main
        self.live = live
        self.out = Path(cfg.out_dir)

    def release(self) -> None:
        self.raw = self.model = self.optimizer = self.step_model = None

    def say(self, text: str) -> None:
        if self.verbose:
            print(text, flush=True)

    # -- setup --

    def run(self, resume: bool, overwrite: bool) -> TrainResult:
        cfg, info = self.cfg, self.info
        started = time.perf_counter()
        resume_from = _on_main(info, lambda: check_out_dir(cfg, resume, overwrite))
        from linlm.train.metrics import use_live_display

        show = self.verbose and (use_live_display() if self.live is None else self.live)
        data_dir = Path(_on_main(info, lambda: str(resolve_data(cfg, show))))
        data = open_data(cfg, data_dir, info)
        self.data = data

        def make_out_dir() -> None:
            if overwrite and _has_run(self.out):
                _remove_run(self.out)
            self.out.mkdir(parents=True, exist_ok=True)
            ckpt.clean_temporaries(self.out / CHECKPOINT_DIR)
            atomic_write_bytes(self.out / CONFIG_FILE, cfg.to_yaml().encode())

        _on_main(info, make_out_dir)

        if cfg.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.benchmark = False
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        _seed_everything(cfg.seed)

        from linlm.models.lm import CausalLM

        device = info.device
        raw = CausalLM(data.model_config).to(device)
        raw.train()
        if cfg.activation_checkpointing:
            apply_activation_checkpointing(raw)
        model = dist_utils.wrap(raw, cfg.distributed.strategy, info)
        optimizer = build_optimizer(raw, cfg.optim)
        step_model = torch.compile(model) if cfg.compile else model
        self.raw, self.model, self.optimizer, self.step_model = raw, model, optimizer, step_model

        start_step, self.skipped, last_val = 0, 0, None
        if resume_from is not None:
            start_step, last_val = self._restore(Path(resume_from))
        self.say(f"{'resuming' if resume_from else 'training'} {data.model_config.arch} "
                 f"({sum(p.numel() for p in raw.parameters()):,} parameters) in {self.out} "
                 f"from step {start_step} of {cfg.steps}; data {data_dir}")

        from linlm.models.counting import count

        counts = count(data.model_config, batch=cfg.batch_size, seq_len=cfg.data.seq_len)
        self.flops_per_token = counts["flops_per_token"] + counts["lm_head_flops_per_token"]
        bf16 = cfg.precision == "bf16"
        self.peak = cfg.peak_flops or measure_peak_flops(device, torch.bfloat16 if bf16 else torch.float32)
        self.autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

        result = TrainResult(self.out, start_step, val_loss=last_val)
        self.metrics = MetricsLog(self.out / METRICS_FILE, truncate_after=start_step) if info.is_main else None
        try:
            with _StopSignal() as stop:
                self._loop(start_step, stop, result)
        finally:
            if self.metrics is not None:
                self.metrics.close()
        if info.is_main:
            self._finish(result)
        result.seconds = time.perf_counter() - started
        return result

    def _restore(self, path: Path) -> tuple[int, Optional[float]]:
        c = ckpt.load_checkpoint(path, verified=True)
        try:
            dist_utils.load_full_state_dicts(self.raw, self.optimizer, c.model, c.optimizer)
        except (RuntimeError, KeyError, ValueError) as e:
            raise CheckpointError(f"{path}: does not match this run's model or optimizer ({e}); resume with the "
                                  "config the run was started with") from None
        self.data.train.load_state_dict(c.state["data"])
        ckpt.restore_rng(c.rng["tensors"], c.rng["rest"])
        self.skipped = int(c.state.get("skipped_steps", 0))
        self.say(f"resumed from {path}")
        return c.step, c.state.get("val_loss")

    # -- the loop --

    def _loop(self, start_step: int, stop: _StopSignal, result: TrainResult) -> None:
        cfg, info = self.cfg, self.info
        device, A = info.device, cfg.grad_accum
        params = [p for p in self.raw.parameters() if p.requires_grad]
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        tokens_per_step = cfg.batch_size * cfg.data.seq_len
        nan_steps = set(cfg.debug.nan_steps)
        bad_streak = 0
        progress = Progress(cfg.steps, start_step, cfg.log_every, enabled=self.verbose, live=self.live)
        run_t0 = time.perf_counter()
        try:
            for step in range(start_step, cfg.steps):
                n = step + 1  # steps completed after this one
                lr = lr_at(step, cfg.optim.lr, cfg.steps, cfg.schedule)
                set_lr(self.optimizer, lr)
                t0 = time.perf_counter()
                ce_sum = torch.zeros((), device=device)
                aux_sum = torch.zeros((), device=device)
                data_s = 0.0
                for micro in range(A):
                    t_data = time.perf_counter()
                    ids, targets = next(self.data.train)
                    ids, targets = ids.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                    data_s += time.perf_counter() - t_data
                    with dist_utils.no_grad_sync(self.model, info.enabled and micro < A - 1):
                        with self.autocast():
                            out = self.step_model(ids, targets=targets, return_aux=True)
                        ce = out.loss
                        if n in nan_steps:
                            ce = ce * float("nan")
                        aux = out.aux_loss.float()
                        ((ce + aux) / A).backward()
                    ce_sum += ce.detach()
                    aux_sum += aux.detach()
                stats = torch.stack([ce_sum / A, aux_sum / A,
                                     torch.tensor(1.0 if stop.name else 0.0, device=device)]).double()
                dist_utils.all_reduce_sum(stats, info)
                loss_value = float(stats[0]) / info.world_size
                aux_value = float(stats[1]) / info.world_size
                stop_now = bool(stats[2] > 0)
                norm = dist_utils.grad_norm_value(torch.nn.utils.clip_grad_norm_(params, clip))
                ok = math.isfinite(loss_value) and math.isfinite(norm)
                if ok:
                    self.optimizer.step()
                    bad_streak = 0
                else:
                    self.skipped += 1
                    bad_streak += 1
                self.optimizer.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                dt = time.perf_counter() - t0
                tps = tokens_per_step / dt
                rec: dict[str, Any] = {
                    "step": n, "tokens": n * tokens_per_step, "loss": loss_value, "lr": lr,
                    "grad_norm": norm, "tokens_per_s": tps, "step_s": dt, "data_s": data_s,
                    "mfu": tps / info.world_size * self.flops_per_token / self.peak,
                    "skipped": not ok, "skipped_steps": self.skipped,
                    "time": time.perf_counter() - run_t0}
                if aux_value:
                    rec["aux_loss"] = aux_value
                if not ok:
                    log.warning("step %d: non-finite %s; the update was skipped (%d in a row)", n,
                                "loss" if not math.isfinite(loss_value) else "gradient", bad_streak)
                if cfg.eval.every and (n % cfg.eval.every == 0 or n == cfg.steps):
                    rec["val_loss"] = self._evaluate()
                    result.val_loss = rec["val_loss"]
                if self.metrics is not None:
                    self.metrics.write(rec)
                progress.update(rec)
                result.step, result.loss, result.skipped_steps = n, loss_value, self.skipped
                if bad_streak >= cfg.max_bad_steps:
                    last = ckpt.list_checkpoints(self.out / CHECKPOINT_DIR) if info.is_main else []
                    where = f"the last good checkpoint is {last[-1][1]}" if last else "no checkpoint was written yet"
                    raise TrainingDiverged(
                        f"stopped at step {n}: {bad_streak} consecutive steps had a non-finite loss or gradient "
                        f"(max_bad_steps={cfg.max_bad_steps}); {where}. Lower optim.lr, lengthen "
                        "schedule.warmup_steps or check the data, then continue with --resume")
                # A skipped step writes no periodic checkpoint: the newest one stays the last good state.
                due = (ok and cfg.checkpoint.every and n % cfg.checkpoint.every == 0) or n == cfg.steps
                if due or stop_now:
                    result.checkpoint = self._save(n, result.val_loss)
                if stop_now:
                    result.interrupted = stop.name or "signal"
                    progress.print(f"stopped by {result.interrupted} at step {n}; checkpoint {result.checkpoint}; "
                                   "continue with --resume")
                    return
        finally:
            progress.close()
        if start_step >= cfg.steps and info.is_main:
            last = ckpt.latest_valid(self.out / CHECKPOINT_DIR, quarantine=False)
            result.checkpoint = last
            self.say(f"{self.out} is already complete at step {cfg.steps}")

    @torch.no_grad()
    def _evaluate(self) -> float:
        device = self.info.device
        self.model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=device)
        try:
            for ids, targets in self.data.val:
                ids, targets = ids.to(device), targets.to(device)
                with self.autocast():
                    mean = self.step_model(ids, targets=targets, return_aux=True).loss
                total[0] += mean.double() * targets.numel()
                total[1] += targets.numel()
        finally:
            self.model.train()
        dist_utils.all_reduce_sum(total, self.info)
        return float(total[0] / total[1])

    def _save(self, step: int, val_loss: Optional[float]) -> Optional[Path]:
        model_sd, optim_sd = dist_utils.full_state_dicts(self.raw, self.optimizer, self.info)

        def write() -> str:
            state = {"data": self.data.train.state_dict(), "skipped_steps": self.skipped, "val_loss": val_loss,
                     "world_size": self.info.world_size, "schedule_step": step}
            path = ckpt.save_checkpoint(
                self.out / CHECKPOINT_DIR, step, model_state=model_sd, model_config=self.data.model_config.to_dict(),
                optimizer_state=optim_sd, state=state, config_yaml=self.cfg.to_yaml(),
                tokenizer_dir=self.data.directory, keep=self.cfg.checkpoint.keep)
            return str(path)

        return Path(_on_main(self.info, write))

    # -- the end --

    def _finish(self, result: TrainResult) -> None:
        from linlm.train.plot import plot_loss_curve

        cfg = self.cfg
        records = read_metrics(self.out / METRICS_FILE)
        result.plot = plot_loss_curve(records, self.out / PLOT_FILE,
                                      title=f"{self.data.model_config.arch}: {self.out.name}")
        if result.interrupted is None and result.checkpoint is not None and cfg.samples.prompts \
                and cfg.samples.max_new_tokens:
            result.samples = self._samples(result.checkpoint)
            for prompt, text in result.samples:
                self.say(f"--- sample: {prompt!r}\n{prompt}{text}")
        summary = {"step": result.step, "loss": result.loss, "val_loss": result.val_loss,
                   "skipped_steps": result.skipped_steps, "checkpoint": str(result.checkpoint),
                   "interrupted": result.interrupted, "loss_curve": str(result.plot) if result.plot else None}
        atomic_write_bytes(self.out / SUMMARY_FILE, (json.dumps(summary, indent=1) + "\n").encode())

    def _samples(self, checkpoint: Path) -> list[tuple[str, str]]:
        from linlm.infer.generate import generate
        from linlm.models.io import load

        cfg = self.cfg.samples
        model = load(checkpoint, device=self.info.device)
        out = []
        for i, prompt in enumerate(cfg.prompts):
            text = generate(model, self.data.tokenizer, prompt, cfg.max_new_tokens, temperature=cfg.temperature,
                            top_k=cfg.top_k, seed=self.cfg.seed + i)
            out.append((prompt, text))
        body = "".join(f"=== {p!r}\n{p}{t}\n\n" for p, t in out)
        atomic_write_bytes(self.out / SAMPLES_FILE, body.encode())
        return out
