"""Training the runs of a grid: one at a time in this process, or several at once in worker processes.

A ladder's ``jobs: N`` (or ``linlm scaling run --jobs N``) trains up to N runs at the same time, each in its own
process with the thread count of its config. Small models cannot use many cores in one
step, so on a multi-core CPU N single-threaded runs do about N times the work of one.

Each worker reports every step to the parent, which keeps the one progress display. Stopping is the same as for a
single run: SIGINT or SIGTERM to the parent is passed on to every worker as SIGTERM; each writes a checkpoint
after its current step and exits, and the next ``linlm scaling run`` resumes them. A worker whose parent has
died stops the same way. A worker that fails makes the parent stop the others and raise its error.

A worker is ``python -m linlm.train.workers``: it reads its pickled TrainConfig on stdin and writes one JSON
line per message on stdout, so nothing depends on how the parent was started (script, notebook or CLI). A job may
also be any picklable object with a ``run_in_worker(on_step) -> dict`` method (an MQAR run, trained and measured:
:mod:`linlm.experiments.mqar`): its dict comes back as the result's ``result``, and a stop it raises as a
KeyboardInterrupt (:class:`linlm.signals.Stopped`) comes back as the result's ``interrupted``, as a training run's.
"""

from __future__ import annotations

import json
import math
import os
import queue as queue_mod
import signal
import sys
import threading
from typing import Callable, Optional

from linlm.errors import LinlmError
from linlm.signals import StopSignals


class WorkerError(LinlmError):
    """A worker process ended without reporting a result."""


def train_run(cfg, on_step: Callable[[dict], None]):
    """Train one run through the Trainer API, resuming whatever its directory holds; hooks report each step."""
    from linlm.train import Trainer, TrainHooks
    from linlm.train.rundir import RunDir

    class Hooks(TrainHooks):
        def on_step(self, record: dict) -> None:
            on_step(record)

    resume = RunDir(cfg.out_dir).has_run()
    return Trainer(cfg, resume=resume, hooks=Hooks(), verbose=False, live=False).run()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _error_message(e: BaseException) -> dict:
    return {"type": type(e).__name__ if isinstance(e, LinlmError) else "WorkerError",
            "message": str(e) if isinstance(e, LinlmError) else f"{type(e).__name__}: {e}"}


def _error_from(msg: dict) -> LinlmError:
    import linlm.errors as errors

    cls = getattr(errors, msg.get("type", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, LinlmError)):
        cls = WorkerError
    try:
        return cls(msg.get("message", ""))
    except TypeError:
        return WorkerError(msg.get("message", ""))


def worker_main() -> int:
    """A worker process (``python -m linlm.train.workers``): read the pickled (key, job) on stdin, train it
    (a TrainConfig, or an object's ``run_in_worker``), and write one JSON line per step, then one for the result or
    the error, on stdout."""
    import pickle

    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else written to stdout goes to stderr, so the message stream stays clean
    parent = os.getppid()

    def send(kind: str, payload) -> None:
        try:
            out.write(json.dumps({"kind": kind, "payload": payload}) + "\n")
        except OSError:  # the parent is gone; on_step has already asked the Trainer to stop
            pass

    try:
        signal.signal(signal.SIGTERM, _interrupt)  # until the Trainer installs its own handlers
        key, cfg = pickle.load(sys.stdin.buffer)
        # A worker is a training process of its own, like the linlm CLI: the same allocator settings (without them
        # every step's activations come back as fresh zero-filled pages; LINLM_ALLOCATOR=system turns this off).
        from linlm.runtime import tune_allocator

        tune_allocator()

        def on_step(rec: dict) -> None:
            if os.getppid() != parent:  # the parent is gone: checkpoint and stop, as on SIGTERM
                os.kill(os.getpid(), signal.SIGTERM)
            loss = rec.get("loss")
            send("step", loss if isinstance(loss, float) and math.isfinite(loss) else None)

        if callable(getattr(cfg, "run_in_worker", None)):
            send("done", {"result": cfg.run_in_worker(on_step), "interrupted": None})
        else:
            res = train_run(cfg, on_step)
            send("done", {"loss": res.loss, "seconds": res.seconds, "interrupted": res.interrupted})
    except KeyboardInterrupt as e:  # a job's own stop (Stopped), a stop before the Trainer's handlers, a 2nd Ctrl-C
        send("done", {"loss": None, "seconds": 0.0, "interrupted": getattr(e, "signal", None) or "SIGINT"})
    except BaseException as e:  # noqa: BLE001 -- every failure goes back to the parent, which raises it
        send("error", _error_message(e))
    return 0


class _Forward(StopSignals):
    """While the pool runs: SIGINT / SIGTERM to this process stop new starts and reach every worker as SIGTERM."""

    def __init__(self, procs: dict):
        super().__init__(on_signal=lambda name: self.stop_all())
        self.procs = procs

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except OSError:
                    pass


def _start(key: str, cfg, messages: "queue_mod.Queue"):
    import pickle
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "linlm.train.workers"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=os.environ.copy())
    proc.stdin.write(pickle.dumps((key, cfg)))
    proc.stdin.close()

    def read() -> None:
        for line in proc.stdout:
            try:
                msg = json.loads(line)
                messages.put((msg["kind"], key, msg["payload"]))
            except (ValueError, KeyError, TypeError):
                continue
        messages.put(("eof", key, None))

    threading.Thread(target=read, name=f"linlm-{key}", daemon=True).start()
    return proc


def run_pool(jobs: list, n_workers: int, *, on_start: Callable[[str], None],
             on_step: Callable[[str, Optional[float]], None],
             on_done: Callable[[str, dict], None]) -> Optional[str]:
    """Train ``jobs`` (a list of (key, TrainConfig or an object with ``run_in_worker``)) with up to ``n_workers``
    at once, in the given order.

    ``on_start(key)`` / ``on_step(key, loss)`` / ``on_done(key, result)`` run in this process. Returns the name
    of the signal that stopped the pool (its running workers checkpointed), or None when every job finished.
    Raises the first worker's error after the other workers have stopped."""
    messages: queue_mod.Queue = queue_mod.Queue()
    pending = list(jobs)
    procs: dict = {}
    answered: set = set()
    error: Optional[BaseException] = None
    interrupted: Optional[str] = None
    with _Forward(procs) as fwd:
        while pending or procs:
            stopping = fwd.name is not None or error is not None or interrupted is not None
            while pending and len(procs) < n_workers and not stopping:
                key, cfg = pending.pop(0)
                on_start(key)
                procs[key] = _start(key, cfg, messages)
            if not procs:
                break
            try:
                kind, key, payload = messages.get(timeout=0.5)
            except queue_mod.Empty:
                continue
            if kind == "step":
                on_step(key, payload)
            elif kind == "eof":  # the worker closed its stream: it has ended
                proc = procs.pop(key, None)
                code = proc.wait() if proc is not None else 0
                if key not in answered and fwd.name is None and error is None:
                    # Killed (by a signal, or for memory) before it could answer.
                    error = WorkerError(f"{key}: its worker process exited with code {code} before finishing; "
                                        "run the same command again to resume it")
                    fwd.stop_all()
            elif kind == "error":
                answered.add(key)
                if error is None:
                    error = _error_from(payload)
                    fwd.stop_all()
            else:
                answered.add(key)
                if payload.get("interrupted"):
                    interrupted = interrupted or payload["interrupted"]
                on_done(key, payload)
        interrupted = fwd.name or interrupted
    if error is not None:
        raise error
    return interrupted


if __name__ == "__main__":
    sys.exit(worker_main())
