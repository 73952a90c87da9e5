"""The loss curve of a run: training loss (raw and smoothed) and validation loss against tokens seen."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from linlm import outputs


def smooth(values: list[float], window: Optional[int] = None) -> list[float]:
    """Centred moving average (no lag); the window shrinks at both ends. No window: about n/25 values."""
    n = len(values)
    if window is None:
        window = max(1, n // 25)
    elif window < 1:
        raise ValueError(f"smooth: window must be a positive number of values, got {window}")
    half = window // 2
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    out = []
    for i in range(n):
        lo, hi = max(0, i - half), min(n, i + half + 1)
        out.append((prefix[hi] - prefix[lo]) / (hi - lo))
    return out


def plot_loss_curve(records: list[dict], path: str | Path, title: Optional[str] = None) -> Optional[Path]:
    """Write a PNG of the loss curve through linlm.outputs (atomically; a user's file at ``path`` is refused,
    never replaced); returns its path, or None when there is nothing to plot."""
    fig = loss_figure(records, title)
    if fig is None:
        return None
    return outputs.save_figure(fig, path, "out_dir")


def loss_figure(records: list[dict], title: Optional[str] = None):
    """The matplotlib Figure of the loss curve, or None when the records hold no loss."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry is touched

    train = [(r["tokens"], r["loss"]) for r in records if r.get("loss") is not None]
    val = [(r["tokens"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    if not train and not val:
        return None
    fig = Figure(figsize=(7, 4.2), dpi=120)
    ax = fig.subplots()
    if train:
        x, y = zip(*train)
        ax.plot(x, y, color="tab:blue", alpha=0.25, linewidth=0.8, label="train (per step)")
        ax.plot(x, smooth(list(y)), color="tab:blue", linewidth=1.6, label="train (smoothed)")
    if val:
        x, y = zip(*val)
        ax.plot(x, y, "o-", color="tab:orange", markersize=4, linewidth=1.4, label="validation")
    ax.set_xlabel("tokens")
    ax.set_ylabel("cross-entropy loss (nats/token)")
    ax.set_title(title or "loss")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig
