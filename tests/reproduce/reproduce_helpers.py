"""Helpers of the reproduce tests (imported as a module): section runners replaced by fast stand-ins, for the tests
where the directory rules, the settings and the outcomes are the point and a real training run is not; snapshots
for "changes nothing"; a process that holds a lock."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from linlm import outputs
from linlm.errors import DataError


class Fakes:
    """What the stand-ins saw, and switches that make them fail. The training stand-in writes a sweep as the
    runner would (plan.json, each run's config.yaml and a finished summary.json, all through linlm.outputs)."""

    def __init__(self):
        self.trained: list[tuple[str, str, dict]] = []  # (ladder, sweep, overrides)
        self.fail_training: Optional[str] = None  # "early": nothing written (unreadable data); "late": every
        # run's config.yaml written, none finished (runs started, then a failure)
        self.calls: list[str] = []

    def train_sweep(self, ladder, out, tick, say, overrides, what="--out"):
        from linlm.scaling.ladder import plan_runs

        self.trained.append((ladder.name, str(out), overrides))
        if self.fail_training == "early":
            raise DataError(f"{ladder.name}: the data source is unreadable (a stand-in's failure)")
        runs = plan_runs(ladder, None, out, overrides)
        outputs.write_json(Path(out) / "plan.json", {"ladder": ladder.name, "archs": ladder.archs,
                                                     "runs": [r.name for r in runs]})
        for r in runs:
            run_dir = Path(r.config.out_dir)
            outputs.write_text(run_dir / "config.yaml", r.config.to_yaml())
            if self.fail_training:
                continue
            outputs.write_json(run_dir / "summary.json", {"step": r.config.steps, "interrupted": None,
                                                          "finished": True})
        if self.fail_training:
            raise DataError(f"{ladder.name}: the data source is unreadable (a stand-in's failure)")
        return {"done": [], "trained": [r.name for r in runs], "interrupted": None}

    def section(self, name, result):
        def run(*args, **kwargs):
            self.calls.append(name)
            return result
        return run


MODEL = {"run": "llama-m", "arch": "llama", "params": 1000, "tokens": 100, "checkpoint": "/nonexistent/ckpt",
         "data_dir": "/nonexistent/data", "seq_len": 32, "train_loss": 3.0, "val_loss_trainer": 3.1}


def fake_zeroshot_models(monkeypatch) -> None:
    import linlm.eval.evaluator
    import linlm.eval.scoring
    import linlm.infer.generate
    import linlm.models.format
    from linlm.errors import LinlmError

    def evaluate(model, tok, names, root, **kw):
        (name,) = names
        from linlm.eval.tasks import TASKS

        if (Path(root) / TASKS[name].filename).read_text().strip() == "bad":
            raise LinlmError(f"{name}: line 1 is not a JSON object")
        return {"tasks": {name: {"metric": "acc", "acc": 0.5, "acc_stderr": 0.1, "acc_norm": 0.5,
                                 "acc_norm_stderr": 0.1, "n": 4}}}

    monkeypatch.setattr(linlm.eval.evaluator, "evaluate", evaluate)
    monkeypatch.setattr(linlm.eval.scoring, "config_max_length", lambda cfg: None)
    monkeypatch.setattr(linlm.infer.generate, "load_for_generation", lambda ckpt, *a, **k: (None, None))
    real = linlm.models.format.read_config  # stand-in checkpoints only (they do not exist): models/io.py may bind
    # this name after the patch, and the sections that train for real (aspect, context) read checkpoints through it
    monkeypatch.setattr(linlm.models.format, "read_config",
                        lambda path: real(path) if Path(path).exists() else (None, {}))


def task_dir(root: Path, text: str) -> Path:
    """A directory of zero-shot task files (piqa only) holding ``text``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "piqa.jsonl").write_text(text + "\n")
    return root


def snapshot(root: Path) -> dict:
    """Every path under root with its bytes and, for a file, its modification time: what 'changes nothing'
    compares, the lock file included (taking a lock rewrites it). Directories count by their presence only (the
    write probe of linlm.outputs leaves no entry but touches its directory's time)."""
    out = {}
    for p in sorted(root.rglob("*")) if root.exists() else []:
        is_file = p.is_file()
        out[str(p.relative_to(root))] = (p.read_bytes(), os.stat(p).st_mtime_ns) if is_file else None
    return out


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from output_asserts import hold_lock  # noqa: E402,F401  (re-exported for the reproduce tests)
from train_helpers import cli_env  # noqa: E402,F401  (the worktree's src first, one thread)
