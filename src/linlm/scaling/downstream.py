"""Downstream scores against compute (arXiv 2406.16690's figure of benchmark scores along training): every kept
checkpoint of every run of a sweep, scored on the commonsense average, LAMBADA (perplexity, accuracy), WikiText-2
(word perplexity) and a retrieval measure (NIAH), each placed at its training compute.

A run keeps checkpoints along training with ``checkpoint.keep_log`` / ``checkpoint.keep_every_tokens``
(:func:`linlm.train.checkpoint.kept_steps`); a checkpoint at step s of a run with F training FLOPs per token (paper
convention) and T tokens per step sits at C = F T s FLOPs, reported in PFLOP/s-days as the fits are.

Resumable: each checkpoint's scores are written to ``SWEEP/downstream/<run>/step_XXXXXXXX.json`` when it is done,
with the settings they were scored with, and a second call with the same settings scores only what is missing.
The zero-shot tasks are those of ``data_dir`` (``linlm eval fetch --tasks commonsense,lambada,wikitext2 --out
DIR`` writes them); without it only the retrieval measure runs.

Retrieval is NIAH in easy mode, scored by choice among 4 one-letter values (chance 0.25; see
:mod:`linlm.eval.niah`), at lengths within the run's training context: the measure that still separates small
models, where the paper's 7-digit greedy NIAH reads 0 for all of them. A context too short to hold a needle and its
question leaves NIAH out, with why (``niah_skipped``).

Fits: a perplexity falls as a power law of compute along an envelope, as the loss does; where a run's perplexity
has at least 3 checkpoints, ``ppl = beta C^alpha`` is fitted in log space (the paper's form for loss). Accuracies
are bounded and are plotted without a fit.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional

from linlm.errors import ConfigError

OUT = "downstream"
MEASURES = {"commonsense_avg": "commonsense average", "lambada_acc": "LAMBADA acc", "lambada_ppl": "LAMBADA ppl",
            "wikitext2_word_ppl": "WikiText-2 word ppl", "niah_mean": "NIAH (easy, choice) accuracy"}
FITTED = ("lambada_ppl", "wikitext2_word_ppl")
TASKS = "commonsense,lambada,wikitext2"


def kept_checkpoints(sweep: Path) -> dict[str, tuple[dict, list[tuple[int, Path]]]]:
    """{run name: (its description, [(step, checkpoint)])} of every run under ``sweep``; a ladder whose runs kept
    at most their last checkpoint is refused, in one line saying how to keep more."""
    from linlm.scaling.runs import find_run_dirs, run_description
    from linlm.train.checkpoint import list_checkpoints

    root = sweep / "runs" if (sweep / "runs").is_dir() else sweep
    runs = {p.name: (run_description(p), list_checkpoints(p / "checkpoints")) for p in find_run_dirs(root)}
    if not runs or all(len(c) < 2 for _, c in runs.values()):
        raise ConfigError(f"{sweep}: no run kept checkpoints along training (at most its last one each), so there is "
                          "nothing to place against compute; train the ladder with checkpoint.keep_log=N (N "
                          "log-spaced steps) or checkpoint.keep_every_tokens=T in its overrides, then run "
                          "`linlm scaling evaluate` again")
    return runs


def score_checkpoint(path: Path, *, data_dir: Optional[Path], seq_len: int, haystack: list[str],
                     limit: Optional[int], trials: int) -> dict:
    """The measures of one checkpoint (see the module doc); a task whose file is not in ``data_dir`` is left out."""
    from linlm.eval.evaluator import evaluate
    from linlm.eval.niah import NIAHConfig, run_niah
    from linlm.infer.generate import load_for_generation

    model, tok = load_for_generation(path)
    out: dict = {}
    names = task_names(data_dir)
    if names:
        res = evaluate(model, tok, names, data_dir, limit=limit, drop_overlong=True)
        t = res["tasks"]
        out["commonsense_avg"] = (res.get("commonsense_avg") or {}).get("score")
        if "lambada" in t:
            out["lambada_acc"], out["lambada_ppl"] = t["lambada"]["acc"], t["lambada"]["perplexity"]
        if "wikitext2" in t:
            out["wikitext2_word_ppl"] = t["wikitext2"]["word_perplexity"]
    lengths = sorted({max(32, seq_len // 2), max(32, seq_len - 8)})
    cfg = NIAHConfig(lengths=lengths, depths=[0.0, 50.0, 100.0], mode="easy", trials=trials, scoring="choice",
                     candidates=4, alphabet="letters", value_length=1)
    try:
        niah = run_niah(model, tok, haystack, cfg)
    except ConfigError as e:  # a training context too short to hold a needle and its question: not measured
        out["niah_skipped"] = str(e)
    else:
        out.update(niah_mean=niah["mean"], niah_chance=niah["chance"], niah_band=niah["chance_band"])
    return {k: v for k, v in out.items() if v is not None}


def task_names(data_dir: Optional[Path]) -> list[str]:
    """The zero-shot tasks of :data:`TASKS` whose files ``data_dir`` holds (none without it)."""
    from linlm.eval.tasks import TASKS as ALL, resolve_tasks

    return [n for n in resolve_tasks(TASKS) if data_dir and (data_dir / ALL[n].filename).is_file()]


class Scorer:
    """Scores checkpoints with one set of settings, each kept in ``out_root/RUN/CHECKPOINT.json``: a checkpoint
    scored there before with the same settings (tasks found, limit, trials, haystack) is read back, one scored
    otherwise (or whose file is unreadable) is scored again and its file replaced."""

    def __init__(self, out_root: Path, data_dir: Optional[Path], haystack: str, limit: Optional[int], trials: int):
        self.out_root, self.data_dir, self.haystack = Path(out_root), data_dir, haystack
        self.limit, self.trials = limit, trials
        self.settings = {"tasks": task_names(data_dir), "limit": limit, "trials": trials, "haystack": haystack}
        self._texts: Optional[list[str]] = None

    def scores(self, run: str, step: Optional[int], path: Path, seq_len: int) -> tuple[dict, bool]:
        """(the checkpoint's scores, whether they were read back)."""
        import json

        from linlm import outputs

        target = self.out_root / run / f"{path.name}.json"
        try:
            record = json.loads(target.read_text(encoding="utf-8")) if target.is_file() else None
        except (OSError, ValueError):
            record = None
        if (isinstance(record, dict) and record.get("settings") == self.settings
                and isinstance(record.get("scores"), dict)):
            return record["scores"], True
        if self._texts is None:
            from linlm.data.sources import open_source

            self._texts = list(open_source(self.haystack))
        scores = score_checkpoint(path, data_dir=self.data_dir, seq_len=seq_len, haystack=self._texts,
                                  limit=self.limit, trials=self.trials)
        outputs.make_dir(target.parent, "downstream scores")
        outputs.write_json(target, {"run": run, "step": step, "settings": self.settings, "scores": scores},
                           "downstream scores")
        return scores, False


def evaluate_sweep(sweep: str | Path, *, data_dir: Optional[str | Path] = None, haystack: str = "shakespeare",
                   limit: Optional[int] = None, trials: int = 4,
                   progress: Optional[Callable[[str, int, bool], None]] = None,
                   out: Optional[str | Path] = None, runs: Optional[dict] = None) -> dict:
    """Score every kept checkpoint of every run of ``sweep`` (resumably), then write one plot per measure
    (``<out>/<measure>.png``) and ``summary.json`` into ``out`` (default ``SWEEP/downstream``); returns the
    summary. ``runs``: the sweep's :func:`kept_checkpoints`, where the caller has listed them already."""
    from linlm import outputs
    from linlm.scaling.fits import PFLOPS_DAY
    from linlm.scaling.runs import flops_key

    sweep = Path(sweep)
    runs = kept_checkpoints(sweep) if runs is None else runs
    data = Path(data_dir).expanduser() if data_dir else None
    if data is not None and not data.is_dir():
        raise ConfigError(f"--data-dir {data}: not a directory; give the directory of the task files (`linlm eval "
                          f"fetch --tasks {TASKS} --out DIR`)")
    out_root = Path(out) if out is not None else sweep / OUT
    scorer = Scorer(out_root, data, haystack, limit, trials)
    points: list[dict] = []
    for name, (meta, ckpts) in runs.items():
        per_token = float(meta[flops_key(meta)]) * int(meta["tokens_per_step"])
        seq_len = int(meta.get("seq_len") or 128)  # a run without a config.yaml: a short retrieval context
        for step, path in ckpts:
            scores, done = scorer.scores(name, step, path, seq_len)
            if progress is not None:
                progress(name, step, done)
            points.append({"run": name, "arch": meta["arch"], "params": meta.get("params"), "step": step,
                           "compute_pflops_days": per_token * step / PFLOPS_DAY, **scores})
    out_root.mkdir(parents=True, exist_ok=True)
    fits = {m: fit_power(points, m) for m in FITTED}
    summary = {"points": points, "fits": {m: f for m, f in fits.items() if f}, "plots": []}
    for m in MEASURES:
        if any(m in p for p in points):
            summary["plots"].append(str(outputs.save_figure(figure(points, m, summary["fits"].get(m)),
                                                            out_root / f"{m}.png", "downstream plot").name))
    outputs.write_json(out_root / "summary.json", summary, "downstream summary")
    return summary


def fit_power(points: list[dict], measure: str) -> dict:
    """{arch: {beta, alpha, n}} of ``measure = beta C^alpha`` fitted in log space per architecture over its
    checkpoints (at least 3 with C > 0 and a finite positive value)."""
    import numpy as np

    out = {}
    for arch in sorted({p["arch"] for p in points}):
        xy = [(p["compute_pflops_days"], p[measure]) for p in points if p["arch"] == arch and measure in p
              and p["compute_pflops_days"] > 0 and math.isfinite(p[measure]) and p[measure] > 0]
        if len({x for x, _ in xy}) >= 3:
            alpha, log_beta = np.polyfit(np.log([x for x, _ in xy]), np.log([y for _, y in xy]), 1)
            out[arch] = {"beta": float(math.exp(log_beta)), "alpha": float(alpha), "n": len(xy)}
    return out


def figure(points: list[dict], measure: str, fit: Optional[dict] = None):
    """``measure`` against compute, one colour per architecture (each run a line through its checkpoints), with
    the fitted power law dashed where there is one."""
    import numpy as np
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    archs = sorted({p["arch"] for p in points if measure in p})
    colours = {a: f"C{i}" for i, a in enumerate(archs)}
    for run in sorted({p["run"] for p in points}):
        pts = sorted((p["compute_pflops_days"], p[measure], p["arch"]) for p in points
                     if p["run"] == run and measure in p)
        if pts:
            ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], "o-", color=colours[pts[0][2]], alpha=0.8,
                    label=pts[0][2] if run == min(q["run"] for q in points if q["arch"] == pts[0][2]) else None)
    for arch, f in (fit or {}).items():
        xs = [p["compute_pflops_days"] for p in points if p["arch"] == arch and p["compute_pflops_days"] > 0]
        grid = np.geomspace(min(xs), max(xs), 50)
        ax.plot(grid, f["beta"] * grid ** f["alpha"], "--", color=colours[arch])
    ax.set_xscale("log")
    if measure in FITTED:
        ax.set_yscale("log")
    ax.set_xlabel("training compute (PFLOP/s-days)")
    ax.set_ylabel(MEASURES[measure])
    ax.set_title(f"{MEASURES[measure]} against compute")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
