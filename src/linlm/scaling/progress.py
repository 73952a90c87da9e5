"""Progress of a sweep and its time model: how long runs take, and the one display of a grid being trained.

The time model (:func:`fit_step_time`, :func:`wall_seconds`) serves both the plan's estimate and the time left
while a grid trains; :class:`GridProgress` is the display (runs done, compute done, time left). Nothing else in
the scaling package draws progress, so the display can be replaced here alone.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

from linlm.progress import ProgressBar, format_duration
from linlm.scaling.ladder import PlannedRun


def fmt_seconds(s: Optional[float]) -> str:
    if s is None:
        return "n/a"
    return format_duration(s)


def wall_seconds(seconds: list[float], jobs: int) -> float:
    """The time to train runs of these durations, in this order, with ``jobs`` at once (each next run starts
    on the first free worker)."""
    free = [0.0] * max(1, jobs)
    for s in seconds:
        i = free.index(min(free))
        free[i] += s
    return max(free) if seconds else 0.0


def fit_step_time(samples: list[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) of seconds per step = a + b x FLOPs per step, least squares over (FLOPs, seconds) samples, both >= 0.
    Until the samples span a factor of 2 in FLOPs per step (one size, or the same size of several architectures),
    the line would be noise, and so would a negative slope or intercept: then a = 0 and b is the mean rate."""
    xs = [x for x, _ in samples]
    n = len(samples)
    mx, ms = sum(xs) / n, sum(s for _, s in samples) / n
    rate = (0.0, ms / mx if mx > 0 else 0.0)
    if max(xs) < 2 * min(xs):
        return rate
    b = sum((x - mx) * (s - ms) for x, s in samples) / sum((x - mx) ** 2 for x in xs)
    if b <= 0:
        return ms, 0.0
    a = ms - b * mx
    return (a, b) if a >= 0 else rate


class GridProgress:
    """One display for the whole grid: runs done, compute done, and the time left.

    The time left: once runs have finished here, each step still to train is costed by a line fitted to their
    seconds per step against FLOPs per step (a tiny model spends most of a step on fixed costs, so compute alone
    overstates how long the rest takes); before that, by the FLOP rate so far. With ``jobs`` runs at once (each
    finished run's seconds measured while the others ran), the runs left are laid out on ``jobs`` workers in order."""

    def __init__(self, todo: list[PlannedRun], live: bool, say: Callable[[str], None],
                 on_fraction: Optional[Callable[[float], None]] = None, jobs: int = 1):
        """``todo``: the runs of the grid still to train (or to finish)."""
        self.total = sum(r.training_flops for r in todo)
        self.on_fraction = on_fraction
        self.done = 0.0
        self.t0 = time.perf_counter()
        self.say = say
        self.jobs = max(1, jobs)
        self.work = {r.name: r.training_flops for r in todo}
        self.steps = {r.name: r.config.steps for r in todo}
        self.step_flops = {r.name: r.step_flops for r in todo}
        self.stepped = {name: 0 for name in self.steps}  # steps reported here, per run
        self.samples: list[tuple[float, float]] = []
        self.line: Optional[tuple[float, float]] = None
        self._left_at, self._left = -math.inf, ""
        self.bar = ProgressBar("scaling", self.total or 1, count="percent", percent_suffix=" of compute",
                               eta="given", transient=False, enabled=live)

    def eta(self) -> Optional[float]:
        if self.line is not None:
            a, b = self.line
            left = [(self.steps[name] - n) * (a + b * self.step_flops[name]) for name, n in self.stepped.items()]
            return wall_seconds([t for t in left if t > 0], self.jobs)
        if self.done <= 0:
            return None
        return (time.perf_counter() - self.t0) / self.done * (self.total - self.done)

    def step(self, name: str, info: str) -> None:
        """One optimizer step of run ``name``."""
        self.stepped[name] += 1
        self.advance(self.work[name] / self.steps[name], info)

    def finished(self, name: str, seconds: float) -> None:
        """Run ``name`` reached its end after ``seconds`` here: the steps it did not report (a resumed run's
        earlier ones) count now, and its seconds per step join the time-left line."""
        done_here = self.stepped[name]
        self.advance(self.work[name] * (1 - done_here / self.steps[name]), name)
        self.stepped[name] = self.steps[name]
        if done_here > 0 and seconds > 0:
            self.samples.append((self.step_flops[name], seconds / done_here))
            self.line = fit_step_time(self.samples)

    def advance(self, work: float, info: str) -> None:
        self.done += work
        if self.on_fraction is not None:
            self.on_fraction(min(1.0, self.done / self.total) if self.total else 1.0)
        if self.bar.active:
            now = time.perf_counter()
            if now - self._left_at >= 1.0:  # the time left, recomputed once a second, not at every step
                left = self.eta()
                self._left_at, self._left = now, f"about {fmt_seconds(left)} left" if left is not None else ""
            self.bar.update(self.done, info=info, left=self._left)

    def close(self) -> None:
        self.bar.close()
