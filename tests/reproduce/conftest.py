"""Fixtures of the reproduce tests: section runners replaced by fast stand-ins, for the tests where the directory
rules, the settings and the outcomes are the point and a real training run is not."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import pytest

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


@pytest.fixture
def fakes(monkeypatch) -> Fakes:
    """Every section runner replaced: training writes a finished sweep, the evaluation sections return minimal
    results of their real shape; the zero-shot section is the real one, on stand-in models (task files whose
    text is "bad" fail to score, any other text scores)."""
    from linlm.reproduce import job as J
    from linlm.reproduce import sections as S

    f = Fakes()
    monkeypatch.setattr(S, "train_sweep", f.train_sweep)
    monkeypatch.setattr(S, "trained_models", lambda sweep, largest_only: {"llama": dict(MODEL)}
                        if (Path(sweep) / "plan.json").is_file() else {})
    monkeypatch.setattr(J.Job, "fits", lambda self: f.section("fits", {"runs": [], "archs": {}, "report": {}})())
    monkeypatch.setattr(S, "quality", f.section("quality", {"models": {}, "max_tokens": 1}))
    monkeypatch.setattr(S, "niah", f.section("niah", {"settings": {}, "models": {}}))
    monkeypatch.setattr(S, "mqar", f.section("mqar", {"task": {"num_kv": 1, "vocab_size": 8}, "chance": 0.2,
                                                      "rows": [], "plot": "mqar.png", "settings": {}}))
    monkeypatch.setattr(S, "decode", f.section("decode", {"rows": [], "environment": {}, "plot": "decode.png",
                                                          "settings": {}}))
    _fake_zeroshot_models(monkeypatch)
    return f


def _fake_zeroshot_models(monkeypatch) -> None:
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
    monkeypatch.setattr(linlm.models.format, "read_config", lambda path: (None, {}))


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


SRC = Path(__file__).resolve().parents[2] / "src"


def cli_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    return env


def hold_lock(directory: Path):
    """A separate live process holding the lock of ``directory`` (killed by the test)."""
    import subprocess
    import sys

    code = ("import sys, time; from linlm.locking import DirLock; DirLock(sys.argv[1], 'x').acquire(); "
            "print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(directory)], env=cli_env(), stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc
