"""The one progress display of every linlm command: a live bar on stderr, only on an interactive terminal.

A :class:`ProgressBar` shows, in one line::

    LABEL  ━━━━━━━━━━━━━━━━━━━━━━━  COUNT  INFO  ELAPSED  [ETA-LABEL] REMAINING

- COUNT is ``done/total`` (``count="n/total"``), a percentage with an optional suffix (``"percent"``), or bytes
  done of the total with the transfer speed (``"bytes"``; a total of None shows the bytes alone);
- INFO is a description line the caller changes as the work goes (``update(info=...)``);
- REMAINING is rich's estimate from the rate so far (``eta="estimate"``), a text the caller computes
  (``eta="given"``, ``update(left=...)``), or nothing (``eta=None``).

The bar is off (every method does nothing, :attr:`ProgressBar.active` is False) when ``enabled`` is False, and when
``enabled`` is None and :func:`live_display` says no: stderr is not a terminal (tests, CI, a pipe, a log file), CI
is set, or TERM is ``dumb``. What a command must say whatever the terminal (its log lines) it says itself;
:meth:`ProgressBar.print` writes such a line above a live bar, or to stdout when there is none.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

COUNTS = ("n/total", "percent", "bytes")
ETAS = ("estimate", "given", None)


def live_display() -> bool:
    """A live display only on an interactive terminal outside CI."""
    return sys.stderr.isatty() and not os.environ.get("CI") and os.environ.get("TERM") != "dumb"


def format_duration(seconds: float) -> str:
    """``42s``, ``3m07s``, ``2h05m``: a duration for a progress line."""
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class ProgressBar:
    """One live bar (see the module doc). ``total`` None is an unknown total (the bar pulses); ``completed`` is
    where it starts (a resumed run); ``transient`` removes the bar from the terminal when it closes. Usable as a
    context manager, which closes it."""

    def __init__(self, label: str, total: Optional[float], *, completed: float = 0, count: str = "n/total",
                 percent_suffix: str = "", eta: Optional[str] = "estimate", eta_label: str = "",
                 elapsed: bool = True, transient: bool = True, enabled: Optional[bool] = None):
        if count not in COUNTS:
            raise ValueError(f"count: expected one of {COUNTS}, got {count!r}")
        if eta not in ETAS:
            raise ValueError(f"eta: expected one of {ETAS}, got {eta!r}")
        self._bar = None
        if not (live_display() if enabled is None else enabled):
            return
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn, TransferSpeedColumn)

        def text(fmt: str):
            return TextColumn(fmt, markup=False)  # a path or "[1/3] name" in the text is shown as it is

        columns = [text(label), BarColumn()]
        if count == "n/total":
            columns.append(MofNCompleteColumn())
        elif count == "percent":
            columns.append(text("{task.percentage:>4.0f}%" + percent_suffix))
        else:
            columns += [DownloadColumn(), TransferSpeedColumn()]
        columns.append(text("{task.fields[info]}"))
        if elapsed:
            columns.append(TimeElapsedColumn())
        if eta is not None and eta_label:
            columns.append(text(eta_label))
        if eta == "estimate":
            columns.append(TimeRemainingColumn())
        elif eta == "given":
            columns.append(text("{task.fields[left]}"))
        self._bar = Progress(*columns, console=Console(stderr=True), transient=transient)
        self._bar.start()
        self._task = self._bar.add_task(label, total=total, completed=completed, info="", left="")

    @property
    def active(self) -> bool:
        """Whether a live bar is shown."""
        return self._bar is not None

    def update(self, completed: Optional[float] = None, *, advance: Optional[float] = None,
               info: Optional[str] = None, left: Optional[str] = None) -> None:
        """Move the bar to ``completed`` or on by ``advance``; set the description ``info`` and the caller's time
        left ``left`` (``eta="given"``). What is not given stays."""
        if self._bar is None:
            return
        fields = {k: v for k, v in (("info", info), ("left", left)) if v is not None}
        self._bar.update(self._task, completed=completed, advance=advance, **fields)

    def print(self, text: str) -> None:
        """A line above the live bar; a plain line on stdout when there is no bar."""
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
