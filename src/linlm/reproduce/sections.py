"""The sections of ``linlm reproduce``: each one computes its numbers from the job directory and returns a dict
that is saved as ``DIR/sections/<name>.json`` (so a rerun skips it) and read back by the claims and the report.

A section returns only when it has numbers to show; one that measured nothing (every zero-shot task failed,
every decode context failed) raises instead, so that it is reported as failed, is not saved, and runs again next
time with the settings given then.

Training sections (``scaling``, ``compare``) go through :func:`linlm.scaling.runner.run_grid`, which skips
finished runs and resumes interrupted ones; the evaluation sections read the trained checkpoints.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

from linlm.errors import ConfigError, DataError

log = logging.getLogger("linlm.reproduce")

Tick = Callable[[float], None]  # fraction of the section done


def _summary(run_dir: Path) -> Optional[dict]:
    try:
        return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def trained_models(sweep: Path, largest_only: bool) -> dict[str, dict]:
    """{label: {run, arch, params, checkpoint, data_dir, seq_len}} for each finished run of a sweep directory
    (``largest_only``: the run with the most parameters of each architecture)."""
    from linlm.config import load_yaml
    from linlm.scaling.runs import META_FILE, run_finished

    found: dict[str, dict] = {}
    for run_dir in sorted((sweep / "runs").glob("*")) if (sweep / "runs").is_dir() else []:
        try:
            meta = json.loads((run_dir / META_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        summary = _summary(run_dir)
        if not summary or not summary.get("checkpoint") or not run_finished(run_dir, int(meta["steps"])):
            continue
        cfg = load_yaml(run_dir / "config.yaml")
        row = {"run": run_dir.name, "arch": meta["arch"], "params": int(meta["params"]),
               "tokens": int(meta["tokens"]), "checkpoint": summary["checkpoint"],
               "data_dir": cfg["data"]["dir"], "seq_len": int(cfg["data"]["seq_len"]),
               "train_loss": summary.get("loss"), "val_loss_trainer": summary.get("val_loss")}
        key = meta["arch"] if largest_only else run_dir.name
        if key not in found or row["params"] > found[key]["params"]:
            found[key] = row
    return found


def validation_text(data_dir: str | Path, tokenizer, max_tokens: int) -> str:
    """The first ``max_tokens`` tokens of a prepared validation split, decoded back to text."""
    from linlm.data.loader import TokenDataset

    ds = TokenDataset(data_dir, "val")
    n = min(ds.num_tokens, max_tokens)
    if n < 2:
        raise DataError(f"{data_dir}: the validation split holds {ds.num_tokens} tokens; prepare the data with "
                        "val_fraction > 0")
    return tokenizer.decode([int(t) for t in ds.read(0, n)])


# ---- training ------------------------------------------------------------------------------------------------


def train_sweep(ladder, out: Path, tick: Tick, say: Callable[[str], None], overrides: dict,
                what: str = "--out") -> dict:
    from linlm.scaling.runner import run_grid

    return run_grid(ladder, None, out, overrides=overrides, say=say, on_fraction=tick, what=what)


# ---- quality: validation loss and bits per byte ----------------------------------------------------------------


def quality(models: dict[str, dict], max_tokens: int, tick: Tick) -> dict:
    """Validation loss (nats/token) and bits per byte of each model, on the same validation text: its own
    prepared split, decoded, in sliding windows of its training context with half-window strides."""
    from linlm.eval.perplexity import perplexity
    from linlm.infer.generate import load_for_generation

    rows = {}
    for i, (label, m) in enumerate(models.items()):
        model, tok = load_for_generation(m["checkpoint"])
        text = validation_text(m["data_dir"], tok, max_tokens)
        res = perplexity(model, tok, [text], mode="sliding", window=m["seq_len"], stride=max(1, m["seq_len"] // 2))
        rows[label] = {**m, "val_loss": res.nll_per_token, "bits_per_byte": res.bits_per_byte,
                       "token_perplexity": res.token_perplexity, "scored_tokens": res.tokens, "bytes": res.bytes}
        tick((i + 1) / len(models))
    return {"models": rows, "max_tokens": max_tokens}


# ---- zero-shot tasks -----------------------------------------------------------------------------------------


def check_task_dir(data_dir: str | Path, tasks, what: str = "--data-dir") -> tuple[Path, list[str], list[str]]:
    """(the directory, the tasks whose files it holds, those it lacks); refuses (ConfigError, changing nothing) a
    path that is not a directory or holds none of the task files, so a mistyped --data-dir is caught before any
    work."""
    from linlm.eval.tasks import TASKS, resolve_tasks

    root = Path(data_dir).expanduser()
    names = resolve_tasks(tasks or "commonsense")
    if not root.is_dir():
        raise ConfigError(f"{what} {root}: is not a directory; give the directory of the zero-shot task files "
                          "(JSON Lines, see docs/evaluation.md) (nothing was changed)")
    present = [n for n in names if (root / TASKS[n].filename).is_file()]
    if not present:
        raise ConfigError(f"{what} {root}: holds none of the task files "
                          f"({', '.join(TASKS[n].filename for n in names)}); give the directory that holds them "
                          "(nothing was changed)")
    return root, present, [n for n in names if n not in present]


def zeroshot(models: dict[str, dict], data_dir: Optional[str], tasks, limit: Optional[int], tick: Tick) -> dict:
    """Each model on the preset's tasks from ``data_dir``. A task one model cannot take is named (``not_scored``)
    and the others go on; when no model scored any task, the section failed (DataError), not finished."""
    from linlm.eval.evaluator import evaluate
    from linlm.infer.generate import load_for_generation

    if not data_dir:
        return {"not_run": "no --data-dir was given: the zero-shot tasks need their JSON Lines files "
                           "(see docs/evaluation.md)"}
    root, present, missing = check_task_dir(data_dir, tasks)
    from linlm.errors import LinlmError
    from linlm.eval.scoring import config_max_length
    from linlm.eval.tasks import commonsense_average
    from linlm.models.format import read_config

    # Every model reads the same inputs: contexts cut from the left to the shortest window among the models (LLaMA's
    # max_seq_len; the linear models have none), and documents whose answer alone is longer left out for all. The
    # windows come from the configs; the models are loaded one at a time below.
    limits = [x for x in (config_max_length(read_config(Path(m["checkpoint"]))[0]) for m in models.values())
              if x is not None]
    window = min(limits) if limits else None
    out = {"data_dir": str(root), "limit": limit, "missing_tasks": missing, "models": {}, "not_scored": {},
           "max_length": window}
    for i, (label, m) in enumerate(models.items()):
        model, tok = load_for_generation(m["checkpoint"])
        tasks = {}
        for name in present:  # one task at a time: a task this model cannot take costs that task, not the rest
            try:
                tasks.update(evaluate(model, tok, [name], root, limit=limit, max_length=window,
                                      drop_overlong=True)["tasks"])
            except LinlmError as e:
                out["not_scored"].setdefault(name, str(e))
        out["models"][label] = {"arch": m["arch"], "params": m["params"], "tasks": tasks,
                                "commonsense_avg": commonsense_average(tasks)}
        tick((i + 1) / len(models))
    if not any(t.get("n", 0) > 0 for m in out["models"].values() for t in m["tasks"].values()):
        why = "; ".join(f"{name}: {e}" for name, e in out["not_scored"].items()) or "no task had items to score"
        raise DataError(f"zero-shot: no task was scored for any model from --data-dir {root} ({why}); fix the task "
                        "files, or give a corrected --data-dir, and run the command again")
    return out


# ---- retrieval -----------------------------------------------------------------------------------------------


def niah(models: dict[str, dict], settings: dict, plots: Path, tick: Tick) -> dict:
    from linlm.eval.niah import NIAHConfig, plot_heatmap, run_niah
    from linlm.infer.generate import load_for_generation

    cfg = NIAHConfig(**settings)
    out = {"settings": settings, "models": {}}
    for i, (label, m) in enumerate(models.items()):
        model, tok = load_for_generation(m["checkpoint"])
        text = validation_text(m["data_dir"], tok, 10 * max(cfg.lengths) + 1000)
        res = run_niah(model, tok, [text], NIAHConfig(**settings))
        png = plots / f"niah_{label}.png"
        plot_heatmap(res, png, title=f"NIAH ({cfg.mode}): {label}")
        out["models"][label] = {"arch": m["arch"], "params": m["params"], "mean": res["mean"],
                                "weighted": res["weighted"], "lengths": res["lengths"], "plot": png.name}
        tick((i + 1) / len(models))
    return out


def mqar(settings: dict, out: Path, plots: Path, tick: Tick) -> dict:
    """The MQAR experiment in ``out`` (a directory per run, :func:`linlm.experiments.mqar.run_experiment`): a rerun reads
    the finished runs' results back and resumes a stopped run from its checkpoint. A run stopped by Ctrl-C or
    SIGTERM is not recorded; the stop (a KeyboardInterrupt) goes up to the job, which exits 130."""
    from linlm.eval.mqar import MQARConfig
    from linlm.experiments.mqar import default_runs, plot_experiment, run_experiment

    task = MQARConfig(**settings.get("task", {})).validate()
    kw = {"archs": tuple(settings["archs"])} if settings.get("archs") else {}
    runs = default_runs(tuple(settings.get("widths", (32, 64))), settings.get("experts", 4), **kw)
    train = {k: settings[k] for k in ("steps", "batch_size", "lr", "n_layers", "head_dim", "test_sequences")
             if k in settings}
    rows = run_experiment(runs, task, out, threads=1, what="--out", on_fraction=tick, **train)
    plot_experiment(rows, plots / "mqar.png", "--out")
    chance = 1.0 / max(1, task.vocab_size - 1 - task.num_keys)
    return {"task": asdict(task), "chance": chance, "settings": settings, "rows": rows, "plot": "mqar.png"}


# ---- decoding ------------------------------------------------------------------------------------------------


def decode(settings: dict, archs: list[str], plots: Path, tick: Tick) -> dict:
    """Decode latency, peak memory and state size against context length (random weights: speed and memory do
    not depend on them), one architecture at a time with its shape from the preset."""
    from linlm.infer.profile import environment, plot, profile, rows_to_dicts

    rows = []
    archs = list(settings.get("archs") or archs)
    for i, arch in enumerate(archs):
        overrides = {**settings.get("model", {}), **settings.get("per_arch", {}).get(arch, {})}
        rows += profile([arch], settings.get("preset"), settings.get("contexts", [128, 512, 2048]), device=settings.get("device", "cpu"),
                        dtype=settings.get("dtype", "float32"), decode_tokens=settings.get("decode_tokens", 16),
                        overrides=overrides)
        tick((i + 1) / len(archs))
    measured = rows_to_dicts(rows)
    if not any(r.get("error") is None for r in measured):
        why = "; ".join(sorted({str(r.get("error")) for r in measured})) or "no context was profiled"
        raise DataError(f"decode: no context could be profiled ({why}); the section runs again next time")
    plot(rows, plots / "decode.png", title="decode latency and memory against context")
    return {"rows": measured, "environment": environment(), "plot": "decode.png", "settings": settings}


def state_growth(rows: list[dict], arch: str) -> Optional[dict]:
    """The decoding state of ``arch`` at its shortest and longest profiled context, and their ratio."""
    ok = sorted((r for r in rows if r["arch"] == arch and r.get("error") is None and r.get("state_bytes")),
                key=lambda r: r["context"])
    if len(ok) < 2:
        return None
    lo, hi = ok[0], ok[-1]
    return {"arch": arch, "context_lo": lo["context"], "context_hi": hi["context"], "state_lo": lo["state_bytes"],
            "state_hi": hi["state_bytes"], "ratio": hi["state_bytes"] / lo["state_bytes"],
            "context_ratio": hi["context"] / lo["context"],
            "peak_lo": lo.get("peak_memory_bytes"), "peak_hi": hi.get("peak_memory_bytes")}
