"""The runs of a scaling directory: what each says about itself (scaling.json), and reading them all back as
curves the fits can use.

A scaling directory (``linlm scaling run --out DIR``) holds ``DIR/runs/<arch>-<rung>/``, each an ordinary
training run directory (config.yaml, metrics.jsonl, summary.json, checkpoints/) plus ``scaling.json``
(:func:`run_meta`), written before training starts: the architecture, non-embedding parameters N, training FLOPs
per token (``paper_flops_per_token``, paper convention: embeddings and LM head excluded; files written before
that name say ``flops_per_token``, and are read too), the LM head's FLOPs per token, tokens per step, the
planned steps, the data it trains on (source, tokenizer, the prepared data's fingerprints, its token count
and the run's epochs) and, for a study's run, what its rung varies (``study``: the kind, shape, context, seed).

Plain training run directories (no scaling.json) are read too: N and FLOPs per token come from their
config.yaml (neither depends on the vocabulary), the data identity from data.source and data.tokenizer.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from linlm.errors import DataError, LinlmError
from linlm.scaling.data import DataInfo
from linlm.scaling.fits import PFLOPS_DAY, Curve
from linlm.scaling.ladder import Ladder, PlannedRun

META_FILE = "scaling.json"
METRICS = "metrics.jsonl"
FLOPS_KEY = "paper_flops_per_token"
OLD_FLOPS_KEY = "flops_per_token"  # the same figure, in scaling.json files written before it was named apart


def flops_key(meta: dict) -> str:
    """The key of the paper FLOPs per token in the run description ``meta``: the old name in a file that has only
    that one, else the current name."""
    return OLD_FLOPS_KEY if FLOPS_KEY not in meta and OLD_FLOPS_KEY in meta else FLOPS_KEY


def run_meta(run: PlannedRun, ladder: Ladder, data: DataInfo) -> dict:
    """What ``run``'s scaling.json says: the plan of the run and the data it trains on."""
    cfg = run.config
    epochs = run.tokens / data.train_tokens if data.train_tokens else None
    tags = next((r.tags for r in ladder.rungs if r.name == run.rung), {})
    study = {"study": {"kind": ladder.study.get("kind"), **tags}} if ladder.study else {}
    return {"ladder": ladder.name, "arch": run.arch, "rung": run.rung, "params": run.params, **study,
            FLOPS_KEY: run.paper_flops_per_token, "head_flops_per_token": run.head_flops_per_token,
            "tokens_per_step": run.tokens_per_step, "log_interval_tokens": run.tokens_per_step,
            "steps": cfg.steps, "tokens": run.tokens, "compute_flops": run.compute,
            "compute_pflops_days": run.compute / PFLOPS_DAY,
            "data": {"source": cfg.data.source, "tokenizer": cfg.data.tokenizer,
                     "source_fingerprint": data.source_fingerprint, "tokenizer_fingerprint": data.tokenizer_fingerprint,
                     "train_tokens": data.train_tokens, "epochs": epochs}}


@dataclass
class RunRecord:
    name: str
    path: Path
    meta: dict
    curve: Curve
    finished: bool


@dataclass
class Loaded:
    runs: list[RunRecord]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (run, why)


def data_identity(meta: dict) -> str:
    d = meta.get("data", {})
    return json.dumps([d.get("source_fingerprint") or d.get("source"),
                       d.get("tokenizer_fingerprint") or d.get("tokenizer")])


def _meta_from_config(path: Path) -> dict:
    """What scaling.json would say, for a plain training run directory."""
    import yaml

    from linlm.models.cost import plan_cost
    from linlm.train.config_sources import build_config

    raw = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8"))
    cfg = build_config(None, raw)
    cost = plan_cost(cfg.model_config, cfg.batch_size, cfg.data.seq_len)
    return {"arch": cfg.model.arch, "rung": path.name, "params": cost.params, FLOPS_KEY: cost.paper_flops_per_token,
            "tokens_per_step": cfg.batch_size * cfg.data.seq_len, "steps": cfg.steps,
            "data": {"source": cfg.data.source, "tokenizer": cfg.data.tokenizer}}


def run_description(path: Path) -> dict:
    """What a run directory says about itself (scaling.json, else its config.yaml), with its training context
    ``seq_len`` (data.seq_len of its config.yaml) added when the description lacks it."""
    import yaml

    meta = json.loads((path / META_FILE).read_text(encoding="utf-8")) if (path / META_FILE).is_file() \
        else _meta_from_config(path)
    if "seq_len" not in meta and (path / "config.yaml").is_file():
        raw = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8")) or {}
        meta["seq_len"] = (raw.get("data") or {}).get("seq_len")
    return meta


def train_seed(path: Path) -> Optional[int]:
    """The train config's seed of a run directory (its config.yaml), or None when it cannot be read: the fits
    tell seeds of one size apart by it (linlm.scaling.fits_seeds)."""
    import yaml

    try:
        raw = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    seed = raw.get("seed", 0) if isinstance(raw, dict) else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def read_losses(path: Path) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(tokens, loss, steps whose loss is missing or not finite) from a run's metrics.jsonl."""
    from linlm.train.metrics import read_metrics

    tokens, loss, bad = [], [], []
    for rec in read_metrics(path / METRICS):
        value = rec.get("loss")
        if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
            bad.append(int(rec["step"]))
            continue
        tokens.append(float(rec["tokens"]))
        loss.append(float(value))
    return np.asarray(tokens), np.asarray(loss), bad


def run_finished(path: Path, steps: int) -> bool:
    try:
        summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    # The planned steps, not the summary's own "finished": a run may have been trained to fewer steps.
    return (summary.get("interrupted") is None and summary.get("finished", True) is not False
            and int(summary.get("step") or 0) >= steps)


def finished_runs(sweep: Path) -> list[dict]:
    """Each finished run of the sweep directory ``sweep`` (its ``runs/``) that saved a checkpoint, in directory
    order: {run, arch, params, tokens, checkpoint, data_dir, seq_len, seed, train_loss, val_loss_trainer, study}
    (seed: the train config's; study: what a study's rung varies, or None)."""
    from linlm.schema import load_yaml

    rows = []
    for run_dir in sorted((sweep / "runs").glob("*")) if (sweep / "runs").is_dir() else []:
        try:
            meta = json.loads((run_dir / META_FILE).read_text(encoding="utf-8"))
            summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not summary.get("checkpoint") or not run_finished(run_dir, int(meta["steps"])):
            continue
        cfg = load_yaml(run_dir / "config.yaml")
        rows.append({"run": run_dir.name, "arch": meta["arch"], "params": int(meta["params"]),
                     "tokens": int(meta["tokens"]), "checkpoint": summary["checkpoint"],
                     "data_dir": cfg["data"]["dir"], "seq_len": int(cfg["data"]["seq_len"]),
                     "seed": int(cfg.get("seed") or 0), "train_loss": summary.get("loss"), "val_loss_trainer": summary.get("val_loss"),
                     "study": meta.get("study")})
    return rows


def find_run_dirs(root: Path) -> list[Path]:
    """Directories under ``root`` (itself, children, grandchildren) that hold a metrics log or scaling.json."""
    out = []
    for p in [root, *sorted(root.glob("*")), *sorted(root.glob("*/*"))]:
        if p.is_dir() and ((p / METRICS).is_file() or (p / META_FILE).is_file()):
            out.append(p)
    return out


def load_runs(root: str | Path, *, strict: bool = False, include_unfinished: bool = False) -> Loaded:
    """Every usable run under ``root``. A run with missing or non-finite losses, or none at all, is named in
    ``skipped`` (``strict`` raises instead). Unfinished runs are skipped unless ``include_unfinished``.
    Runs trained on different data or tokenizers are refused (DataError): their losses are not comparable."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: no such directory; give the --out directory of `linlm scaling run`")
    dirs = find_run_dirs(root)
    if not dirs:
        raise DataError(f"{root}: holds no training runs (no metrics.jsonl found); run `linlm scaling run "
                        f"--out {root}` first")
    loaded = Loaded([])

    def skip(name: str, why: str) -> None:
        if strict:
            raise DataError(f"run {name}: {why} (drop --strict to skip such runs)")
        loaded.skipped.append((name, why))

    for path in dirs:
        name = str(path.relative_to(root)) if path != root else path.name
        name = name[len("runs/"):] if name.startswith("runs/") else name
        try:
            meta = (json.loads((path / META_FILE).read_text(encoding="utf-8")) if (path / META_FILE).is_file()
                    else _meta_from_config(path))
        except (OSError, ValueError, LinlmError) as e:
            skip(name, f"unreadable run description ({e})")
            continue
        tokens, loss, bad = read_losses(path)
        if bad:
            shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            skip(name, f"NaN or missing loss at step {shown}")
            continue
        if len(loss) == 0:
            skip(name, "no losses logged (empty metrics.jsonl)")
            continue
        try:
            curve = Curve(name, meta["arch"], float(meta["params"]), float(meta[flops_key(meta)]), tokens,
                          loss, seed=train_seed(path))
            steps = int(meta.get("steps", 0))
        except (AttributeError, KeyError, TypeError, ValueError) as e:  # no arch, params, FLOPs per token, steps
            skip(name, f"unreadable run description ({path / META_FILE}: {type(e).__name__} {e})")
            continue
        finished = run_finished(path, steps)
        if not finished and not include_unfinished:
            skip(name, f"unfinished ({len(loss)} of {meta.get('steps', '?')} steps logged); resume it with "
                       "`linlm scaling run` or pass --include-unfinished")
            continue
        loaded.runs.append(RunRecord(name, path, meta, curve, finished))
    groups: dict[str, list[str]] = {}
    for r in loaded.runs:
        groups.setdefault(data_identity(r.meta), []).append(r.name)
    if len(groups) > 1:
        parts = []
        for key, names in groups.items():
            source, tok = json.loads(key)
            parts.append(f"{source!s:.24} / {tok!s:.24}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}")
        raise DataError(f"{root}: runs were trained on different data or tokenizers ({'; '.join(parts)}); their "
                        "losses are not comparable. Fit each group from its own directory")
    return loaded
