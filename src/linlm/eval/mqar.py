"""MQAR, multi-query associative recall (Arora et al., Zoology, 2023): a synthetic test of how much a token mixer can
store in its state and retrieve on demand.

A sequence holds ``num_kv`` key-value pairs, then ``num_queries`` of those keys again, each followed by its value::

    k1 v1 k2 v2 ... kN vN | q1 a1 q2 a2 ... qM aM          (a_j is the value paired with key q_j)

Keys are drawn without replacement from ids 1..K and values from K+1..V-1 (K = (V - 1) // 2; id 0 is never used),
uniformly and independently per sequence, so nothing can be memorised across sequences: the model must recall a_j
from the context. Only the answers are targets (``targets[t] = a_j`` at the position t of q_j, -100 elsewhere);
accuracy is the fraction of answers that are the argmax of the model's prediction (and the fraction of sequences
with every answer right).

A state of constant size holds only so many pairs: that is the point. The experiment (:func:`run_experiment`,
``linlm mqar``) trains small models of every architecture on the same stream and reports accuracy against the width
and the decoding state's size (floats per sequence, ``ModelState.nbytes``), e.g. MossNet with E SSM experts against
a Mamba of equal active size, the direct test of MossNet's multi-head argument. It is resumable run by run, and a
result is recorded only for a run that trained to its end: a stop (Ctrl-C) leaves the stopped run's checkpoint and
no result, and the same call again resumes it.

Batches are a pure function of (seed, split, step, rank): :class:`MQARStream` resumes exactly from
``state_dict()``, and :func:`mqar_data` plugs it into the Trainer (``Trainer(cfg, data=mqar_data(mcfg))``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import torch

from linlm import outputs
from linlm.errors import ConfigError, DataError
from linlm.locking import DirLock

if TYPE_CHECKING:
    from linlm.train import TrainConfig

log = logging.getLogger("linlm.eval.mqar")

IGNORE = -100


@dataclass(frozen=True)
class MQARConfig:
    vocab_size: int = 128
    num_kv: int = 8
    num_queries: Optional[int] = None  # None: every key is queried once (num_queries = num_kv)

    @property
    def queries(self) -> int:
        return self.num_kv if self.num_queries is None else self.num_queries

    @property
    def num_keys(self) -> int:
        return (self.vocab_size - 1) // 2

    @property
    def seq_len(self) -> int:
        return 2 * (self.num_kv + self.queries)

    def validate(self) -> "MQARConfig":
        if self.num_kv < 1:
            raise ConfigError(f"mqar num_kv: must be >= 1, got {self.num_kv}")
        if self.num_keys < self.num_kv:
            raise ConfigError(f"mqar vocab_size: {self.vocab_size} gives {self.num_keys} distinct keys, fewer than "
                              f"num_kv={self.num_kv}; use vocab_size >= {2 * self.num_kv + 1}")
        if self.num_queries is not None and not 1 <= self.num_queries <= self.num_kv:
            raise ConfigError(f"mqar num_queries: must be in 1..num_kv={self.num_kv} (or left out: every key), got "
                              f"{self.num_queries}")
        return self

    def fingerprint(self) -> str:
        """The task's identity, which seeds every batch. "Every key" is written as 0, as it was when 0 meant it, so
        that the streams (and the results drawn from them) stay those of earlier versions."""
        fields = asdict(self)
        if self.num_queries is None:
            fields["num_queries"] = 0
        return hashlib.sha256(json.dumps({"mqar": fields}, sort_keys=True).encode()).hexdigest()[:16]


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & ((1 << 63) - 1)


def mqar_batch(cfg: MQARConfig, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """ids, targets: LongTensor [batch, cfg.seq_len] (see the module doc)."""
    n, m, K = cfg.num_kv, cfg.queries, cfg.num_keys
    keys = torch.rand(batch, K, generator=generator).argsort(-1)[:, :n] + 1
    values = torch.randint(K + 1, cfg.vocab_size, (batch, n), generator=generator)
    pick = torch.rand(batch, n, generator=generator).argsort(-1)[:, :m]
    q_keys, q_values = keys.gather(1, pick), values.gather(1, pick)
    ids = torch.cat([torch.stack([keys, values], -1).flatten(1), torch.stack([q_keys, q_values], -1).flatten(1)], 1)
    targets = torch.full_like(ids, IGNORE)
    targets[:, 2 * n::2] = q_values
    return ids, targets


def _fixed_batch(cfg: MQARConfig, size: int, seed: int, split: str, index: int):
    """Batch ``index`` of a fixed set: its own generator, seeded by (seed, split, task, index)."""
    return mqar_batch(cfg, size, torch.Generator().manual_seed(_seed(seed, split, cfg.fingerprint(), index)))


def mqar_batches(cfg: MQARConfig, n_batches: int, batch: int, seed: int, split: str) -> list:
    """A fixed list of batches (validation or test sets), one generator per batch."""
    return [_fixed_batch(cfg, batch, seed, split, i) for i in range(n_batches)]


def mqar_test_set(cfg: MQARConfig, sequences: int, seed: int, batch: int = 64) -> list:
    """Exactly ``sequences`` held-out sequences, in batches of ``batch`` (the last one smaller when they do not
    divide): a multiple of ``batch`` gives the batches of ``mqar_batches(cfg, sequences // batch, batch, ...)``."""
    if sequences < 1:
        raise ConfigError(f"mqar test_sequences: must be >= 1, got {sequences}")
    return [_fixed_batch(cfg, min(batch, sequences - start), seed, "test", i)
            for i, start in enumerate(range(0, sequences, batch))]


class MQARStream:
    """An endless, resumable stream of training batches: batch ``step`` of process ``rank`` depends only on
    (seed, step, rank); ``state_dict()``/``load_state_dict()`` carry the position."""

    def __init__(self, cfg: MQARConfig, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1):
        self.cfg = cfg.validate()
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.step = 0

    def __iter__(self) -> "MQARStream":
        return self

    def batch(self, step: int):
        g = torch.Generator().manual_seed(_seed(self.seed, "train", self.cfg.fingerprint(), step, self.rank))
        return mqar_batch(self.cfg, self.batch_size, g)

    def __next__(self):
        out = self.batch(self.step)
        self.step += 1
        return out

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.seed, "fingerprint": self.cfg.fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("fingerprint") != self.cfg.fingerprint() or state.get("seed") != self.seed:
            raise DataError("MQAR stream: the saved position belongs to another MQAR config or seed; resume with "
                            "the config the run started with")
        self.step = int(state["step"])


def mqar_data(cfg: MQARConfig, *, val_batches: int = 2, val_batch_size: int = 64, seed: int = 0):
    """The Trainer's ``data=`` factory: ``Trainer(train_cfg, data=mqar_data(MQARConfig(...)))``.

    The model's vocab_size comes from ``cfg.vocab_size``; train_cfg.data.seq_len is not used (sequences are
    ``cfg.seq_len`` long)."""
    cfg = cfg.validate()

    def factory(train_cfg, rank: int, world_size: int):
        from linlm.train import TrainData

        stream = MQARStream(cfg, train_cfg.micro_batch(world_size), seed=_seed(train_cfg.seed, seed) % (1 << 31),
                            rank=rank, world_size=world_size)
        return TrainData(train=stream, val=mqar_batches(cfg, val_batches, val_batch_size, seed, "val"),
                         vocab_size=cfg.vocab_size, tokenizer=None, directory=None,
                         fingerprint="mqar-" + cfg.fingerprint() + f"-seed{seed}")

    return factory


@torch.no_grad()
def mqar_accuracy(model, batches) -> dict:
    """Per-answer and per-sequence accuracy of greedy predictions on ``batches`` of (ids, targets)."""
    was_training = model.training
    model.eval()
    right = total = seq_right = seqs = 0
    try:
        for ids, targets in batches:
            ids, targets = ids.to(model.device), targets.to(model.device)
            pred = model(ids).argmax(-1)
            mask = targets != IGNORE
            ok = (pred == targets) & mask
            right += int(ok.sum())
            total += int(mask.sum())
            seq_right += int((ok.sum(1) == mask.sum(1)).sum())
            seqs += ids.shape[0]
    finally:
        model.train(was_training)
    return {"accuracy": right / max(total, 1), "sequence_accuracy": seq_right / max(seqs, 1), "answers": total}


def state_floats(model, seq_len: int) -> int:
    """Numbers held by the decoding state of one sequence after ``seq_len`` tokens (LLaMA: its KV cache)."""
    ids = torch.ones(1, seq_len, dtype=torch.long, device=model.device)
    with torch.no_grad():
        state = model(ids, return_state=True).state
    return sum(t.numel() for t in _state_tensors(state))


def _state_tensors(state):
    from linlm.layers.state import _tensors

    return list(_tensors([state.layers, state.extra]))


# ---- the experiment ----------------------------------------------------------------------------------------------

RECORD_FILE = "mqar.json"  # in each run's directory: its settings, and its result once the run has finished


@dataclass
class MQARRun:
    """One model of the experiment: an architecture, a width, and model config overrides."""

    arch: str
    d_model: int
    label: str = ""
    overrides: Optional[dict] = None

    def name(self) -> str:
        return self.label or f"{self.arch}-d{self.d_model}"


def default_runs(widths=(32, 64), experts: int = 4, archs=("llama", "tnl", "hgrn2", "cosformer2", "mamba")
                 ) -> list[MQARRun]:
    """Every architecture at each width, plus the MossNet pair: ``experts`` SSM experts with k = 1 and one dense MLP
    expert, against the same model with a single SSM expert (a Mamba block plus that MLP: a single-head SSM of the
    same active size, the router aside). ``experts`` 1 gives that single-expert model alone, 0 no MossNet run."""
    if experts < 0:
        raise ConfigError(f"mqar experts: must be >= 0 (0: no MossNet runs), got {experts}")
    runs = []
    for d in widths:
        runs.extend(MQARRun(arch, d) for arch in archs)
        for e in dict.fromkeys((1, experts)) if experts else ():
            runs.append(MQARRun("mossnet", d, f"mossnet-E{e}-d{d}",
                                {"ssm_experts": e, "ssm_top_k": 1, "mlp_experts": 1, "mlp_top_k": 1}))
    return runs


@dataclass
class _Planned:
    """A run of the experiment, decided before anything is trained or written."""

    run: MQARRun
    train_cfg: "TrainConfig"
    model_over: dict
    settings: dict  # what its result depends on; recorded in RECORD_FILE and compared on a rerun
    row: Optional[dict]  # its result, when it finished earlier with these settings (read back, not recomputed)
    has_run: bool  # its directory holds a training run (the Trainer's files)
    replace: bool  # ... which is not this run's to resume: the Trainer replaces it once this run starts
    new_record: bool  # record these settings (and no result) before anything trains

    @property
    def dir(self) -> Path:
        return Path(self.train_cfg.out_dir)

    def record(self, result: Optional[dict] = None, replace: Optional[bool] = None) -> dict:
        return {"settings": self.settings, "result": result,
                "replace": self.replace if replace is None else replace}


def _plan_run(run: MQARRun, cfg: MQARConfig, out_dir: Path, train: dict, test_sequences: int, overwrite: bool,
              what: str) -> _Planned:
    """Build the run's TrainConfig and decide what to do with its directory; writes nothing.

    A directory holding this run with the same settings continues it: its result is read back when it finished,
    else its training resumes from the checkpoint. One holding another experiment's run (other settings, or a
    training run with no record of this experiment) is refused unless ``overwrite``, which replaces it."""
    from linlm.train import build_config
    from linlm.train.config import config_diff
    from linlm.train.rundir import RunDir

    head_dim, threads = train["head_dim"], train["threads"]
    if head_dim < 1 or run.d_model % head_dim:
        raise ConfigError(f"mqar {run.name()}: d_model {run.d_model} is not a multiple of head_dim {head_dim}; "
                          "choose widths that are multiples of the head dimension (or another head dimension)")
    steps = train["steps"]
    model_over = {"d_model": run.d_model, "n_layers": train["n_layers"], "n_heads": run.d_model // head_dim,
                  "glu_dim": 2 * run.d_model, "max_seq_len": max(64, cfg.seq_len), "chunk_size": 16,
                  "vocab_size": cfg.vocab_size, **(run.overrides or {})}
    run_dir = out_dir / run.name()
    train_cfg = build_config(None, {
        "model": {"arch": run.arch, "preset": None, "overrides": model_over},
        "out_dir": str(run_dir), "steps": steps, "batch_size": train["batch_size"], "seed": train["seed"],
        "optim": {"lr": train["lr"], "weight_decay": 0.1},
        "schedule": {"kind": "cosine", "warmup_steps": min(50, steps // 10)},
        "eval": {"every": steps, "batches": 2}, "checkpoint": {"every": steps, "keep": 1},
        "data": {"seq_len": cfg.seq_len}, "samples": {"prompts": []}, "log_every": max(1, steps // 5),
        "threads": threads,
    })
    # Where the run lives and how many threads train it do not change what it computes.
    trained = {k: v for k, v in train_cfg.to_dict().items() if k not in ("out_dir", "threads")}
    settings = json.loads(json.dumps({"task": asdict(cfg), "test_sequences": test_sequences, "train": trained}))
    outputs.check_dir(run_dir, what, names=[RECORD_FILE])
    record = _read_record(run_dir / RECORD_FILE, what)
    has_run = RunDir(run_dir).has_run()
    again = "pass --overwrite to train it again with these settings, or choose another directory"
    if record is None and has_run and not overwrite:
        raise ConfigError(f"{what} {out_dir}: {run_dir} holds a training run that no MQAR experiment recorded (it "
                          f"has no {RECORD_FILE}); {again}")
    if record is not None and record["settings"] != settings and not overwrite:
        differ = config_diff(record["settings"], settings)
        raise ConfigError(f"{what} {out_dir}: {run_dir} holds {run.name()} of another experiment (its settings "
                          f"differ at {outputs.shown(differ, 6)}); {again}")
    if record is None or overwrite:
        return _Planned(run, train_cfg, model_over, settings, None, has_run, replace=has_run, new_record=True)
    # This run, started before: finished (read back), or to resume, or still to replace an older run (a stopped
    # --overwrite: its run directory still holds what it replaces).
    return _Planned(run, train_cfg, model_over, settings, record.get("result"), has_run,
                    replace=bool(record.get("replace")) and has_run, new_record=False)


def _read_record(path: Path, what: str) -> Optional[dict]:
    """A run's record ({"settings", "result": row or None, "replace"}), or None when there is none."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what} {path}: unreadable ({e}); linlm wrote it, so it was damaged since. Pass "
                          "--overwrite to train that run again, or choose another directory") from None
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        raise ConfigError(f"{what} {path}: not a record of an MQAR run; pass --overwrite to train that run again, "
                          "or choose another directory")
    return record


def run_experiment(runs: list[MQARRun], cfg: MQARConfig, out_dir, *, steps: int = 300, batch_size: int = 32,
                   lr: float = 3e-3, n_layers: int = 2, head_dim: int = 16, seed: int = 0, test_sequences: int = 512,
                   threads: int = 0, overwrite: bool = False, what: str = "out_dir",
                   on_fraction: Optional[Callable[[float], None]] = None) -> list[dict]:
    """Train each run on MQAR with the Trainer (``out_dir/NAME``) and measure its test accuracy; one row per run.

    Resumable, one run at a time. Every run's directory is checked before anything is trained or written (see
    :func:`_plan_run`; ``what`` names the directory in messages, e.g. ``--out-dir``), then each run's settings are
    recorded in ``out_dir/NAME/mqar.json``; ``out_dir`` is locked while the experiment runs. A run's result joins
    its record only once its training has reached ``steps``, and a rerun with the same settings reads it back
    instead of measuring again; a stopped run resumes from its checkpoint. A run the Trainer stopped on SIGINT /
    SIGTERM is neither measured nor recorded, and no later run is trained: this raises
    :class:`linlm.signals.Stopped` (a KeyboardInterrupt). ``overwrite`` trains every run again from step 0: their
    old results are dropped at once, and the Trainer replaces each old run (removing only what linlm wrote) when
    the new one starts, also when a rerun without ``overwrite`` continues a stopped one. ``threads`` 0 leaves
    torch's thread count as it is (TrainConfig.threads). ``on_fraction(f)`` hears the fraction of runs done."""
    cfg = cfg.validate()
    out_dir = Path(out_dir).expanduser()
    names = [r.name() for r in runs]
    if not names:
        raise ConfigError("mqar: no runs to train; give at least one architecture (or MossNet experts)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"mqar: runs {', '.join(twice)} are given twice (a width or architecture repeated?); "
                          "give each once")
    train = {"steps": steps, "batch_size": batch_size, "lr": lr, "n_layers": n_layers, "head_dim": head_dim,
             "seed": seed, "threads": threads}
    test = mqar_test_set(cfg, test_sequences, seed)

    def plan() -> list[_Planned]:
        return [_plan_run(r, cfg, out_dir, train, test_sequences, overwrite, what) for r in runs]

    plan()  # every refusal before anything is created
    outputs.make_dir(out_dir, what)
    rows = []
    with DirLock(out_dir, what):
        plans = plan()  # again under the lock: another experiment may have changed a run since
        for p in plans:
            if p.new_record:
                outputs.write_json(p.dir / RECORD_FILE, p.record(), what)
        for i, p in enumerate(plans, 1):
            if p.row is not None:
                log.info("[%d/%d] %s: finished earlier (%d steps, accuracy %.3f); read back", i, len(plans),
                         p.run.name(), p.row["steps"], p.row["accuracy"])
                rows.append(p.row)
            else:
                rows.append(_train_and_measure(p, cfg, test, seed, what, f"[{i}/{len(plans)}]"))
            if on_fraction is not None:
                on_fraction(i / len(plans))
    return rows


def _hooks(plan: _Planned, prefix: str, what: str):
    """TrainHooks for one run: say whether it starts or resumes, and at which step; once the Trainer has replaced
    an older run in its directory, record that it did."""
    from linlm.train import TrainHooks

    name = plan.run.name()

    class Hooks(TrainHooks):
        def on_start(self, info: dict) -> None:
            if plan.replace:
                outputs.write_json(plan.dir / RECORD_FILE, plan.record(replace=False), what)
            if info["start_step"]:
                log.info("%s %s: resuming at step %d of %d", prefix, name, info["start_step"], info["steps"])
            else:
                log.info("%s %s: training %d steps", prefix, name, info["steps"])

    return Hooks()


def _train_and_measure(plan: _Planned, cfg: MQARConfig, test: list, seed: int, what: str, prefix: str) -> dict:
    """Train (or resume) one run to its end, measure it and record its row; a stopped run raises Stopped."""
    from linlm import load
    from linlm.models.counting import count
    from linlm.models.presets import preset_config
    from linlm.signals import Stopped
    from linlm.train import Trainer
    from linlm.train.metrics import METRICS_FILE, read_metrics

    name, steps = plan.run.name(), plan.train_cfg.steps
    result = Trainer(plan.train_cfg, resume=plan.has_run and not plan.replace, overwrite=plan.replace,
                     hooks=_hooks(plan, prefix, what), verbose=False, live=False, data=mqar_data(cfg, seed=seed)).run()
    if result.interrupted:
        raise Stopped(result.interrupted, f"stopped by {result.interrupted}: {name} at step {result.step} of "
                                          f"{steps} (checkpoint {result.checkpoint})")
    if not result.finished or result.step != steps:
        raise RuntimeError(f"{name}: the Trainer returned at step {result.step} of {steps} without a stop signal")
    model = load(result.checkpoint)
    counts = count(preset_config(plan.run.arch, None, **plan.model_over), batch=1, seq_len=cfg.seq_len)
    # The steps' own time, from the metrics log: a resumed run counts each step once, whichever call trained it.
    seconds = sum(r.get("step_s") or 0.0 for r in read_metrics(plan.dir / METRICS_FILE))
    row = {"name": name, "arch": plan.run.arch, "d_model": plan.run.d_model, "n_layers": plan.model_over["n_layers"],
           "params": counts["non_embedding_params"], "active_params": counts["active_non_embedding_params"],
           "state_floats": state_floats(model, cfg.seq_len), "steps": result.step, "final_loss": result.loss,
           "seconds": seconds, **mqar_accuracy(model, test)}
    outputs.write_json(plan.dir / RECORD_FILE, plan.record(row, replace=False), what)
    log.info("%s %s: accuracy %.3f after %d steps", prefix, name, row["accuracy"], row["steps"])
    return row


def plot_experiment(rows: list[dict], path, what: Optional[str] = None) -> Path:
    """Accuracy against state size (left) and against width (right), one line per architecture, written to the
    PNG ``path`` through linlm.outputs (a Figure of its own: pyplot's global state is not used)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, 2)
    labels = sorted({r["name"].rsplit("-d", 1)[0] for r in rows})
    for label in labels:
        pts = sorted((r for r in rows if r["name"].rsplit("-d", 1)[0] == label), key=lambda r: r["d_model"])
        axes[0].plot([r["state_floats"] for r in pts], [r["accuracy"] for r in pts], "o-", label=label)
        axes[1].plot([r["d_model"] for r in pts], [r["accuracy"] for r in pts], "o-", label=label)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("decoding state (floats per sequence)")
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("model width d")
    for ax in axes:
        ax.set_ylabel("MQAR accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return outputs.save_figure(fig, path, what)
