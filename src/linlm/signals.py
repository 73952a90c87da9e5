"""A clean stop on SIGINT / SIGTERM: the handlers the Trainer and the sweep runner's worker pool share, and the
exception a job raises once it has stopped on one."""

from __future__ import annotations

import signal
import threading
from typing import Callable, Optional


class StopSignals:
    """While entered (on the main thread; elsewhere Python cannot install handlers, and this does nothing): SIGINT
    and SIGTERM set ``name`` to the signal's name and call ``on_signal(name)``; a second SIGINT (Ctrl-C pressed
    again) raises KeyboardInterrupt, to stop now. The previous handlers come back on exit."""

    def __init__(self, on_signal: Optional[Callable[[str], None]] = None):
        self.name: Optional[str] = None
        self.on_signal = on_signal
        self._old: dict = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.name = signal.Signals(signum).name
        if self.on_signal is not None:
            self.on_signal(self.name)

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class Stopped(KeyboardInterrupt):
    """A long job stopped cleanly on SIGINT / SIGTERM: its state is saved and nothing unfinished was recorded as a
    result. A KeyboardInterrupt, so that every caller that stops on Ctrl-C stops on it too (``linlm`` exits 130);
    ``signal`` names the signal, ``exit_code`` is the shell's code for it (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signal_name: str, message: str):
        super().__init__(message)
        self.signal = signal_name

    @property
    def exit_code(self) -> int:
        return 128 + int(signal.Signals.__members__.get(self.signal, signal.SIGINT))  # "signal": a peer's stop

    def __str__(self) -> str:
        return str(self.args[0])
