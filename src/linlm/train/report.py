"""The end of a run: the loss curve, text samples from the final checkpoint, and summary.json.

Every file goes through :mod:`linlm.outputs` (RunDir.write_file, plot_loss_curve): a user's file at one of these
names is refused, never replaced. summary.json says ``finished: true`` only for a run that reached its steps; a
run stopped by a signal says which, and one the divergence guard stopped says why (``diverged``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Optional

from linlm import outputs
from linlm.train.metrics import METRICS_FILE, read_metrics
from linlm.train.plot import plot_loss_curve
from linlm.train.rundir import PLOT_FILE, SAMPLES_FILE, SUMMARY_FILE, RunDir


def sample_texts(checkpoint: Path, tokenizer: Any, samples_cfg, seed: int, device) -> list[tuple[str, str]]:
    """(prompt, continuation) for every prompt of ``samples_cfg``, from the model in ``checkpoint``."""
    from linlm.models.generation import generate
    from linlm.models.io import load

    model = load(checkpoint, device=device)
    out = []
    for i, prompt in enumerate(samples_cfg.prompts):
        text = generate(model, tokenizer, prompt, samples_cfg.max_new_tokens, temperature=samples_cfg.temperature,
                        top_k=samples_cfg.top_k, seed=seed + i)
        out.append((prompt, text))
    return out


def _finite(value: Optional[float]) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None


def write_report(run: RunDir, result, *, title: str, tokenizer: Any, cfg, device,
                 say: Callable[[str], None]) -> None:
    """Fill ``result.plot`` and ``result.samples`` and write loss_curve.png, samples.txt and summary.json."""
    records = read_metrics(run.path / METRICS_FILE)
    if result.loss is None and records:  # nothing trained in this call (a run killed after its last checkpoint)
        result.loss = records[-1].get("loss")
        result.val_loss = next((r["val_loss"] for r in reversed(records) if r.get("val_loss") is not None), None)
    result.plot = plot_loss_curve(records, run.path / PLOT_FILE, title=title)
    s = cfg.samples
    if (result.interrupted is None and result.diverged is None and result.checkpoint is not None
            and tokenizer is not None and s.prompts and s.max_new_tokens):
        result.samples = sample_texts(result.checkpoint, tokenizer, s, cfg.seed, device)
        for prompt, text in result.samples:
            say(f"--- sample: {prompt!r}\n{prompt}{text}")
        run.write_file(SAMPLES_FILE, "".join(f"=== {p!r}\n{p}{t}\n\n" for p, t in result.samples).encode())
    summary = {"step": result.step, "finished": result.finished, "loss": _finite(result.loss),
               "val_loss": _finite(result.val_loss), "skipped_steps": result.skipped_steps, "flops": result.flops,
               "checkpoint": str(result.checkpoint), "interrupted": result.interrupted, "diverged": result.diverged,
               "loss_curve": str(result.plot) if result.plot else None, "precision": result.precision}
    run.write_file(SUMMARY_FILE, outputs.dumps(summary).encode())


def read_summary(run: RunDir) -> Optional[dict]:
    """summary.json of a finished run, or None when absent or unreadable."""
    try:
        data = json.loads((run.path / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
