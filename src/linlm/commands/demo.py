"""``linlm demo``: train a small model on the built-in Shakespeare corpus in a few minutes on a CPU, then print
samples and where the loss curve and checkpoint are (configs/demo.yaml).

The demo trains into ``runs/demo`` (or ``--out``) and marks its runs with a ``.demo-run`` file, written
through :mod:`linlm.outputs`. It replaces a run there only when linlm wrote that mark (a ``.demo-run`` the user
made or changed does not count); any other run is refused and left as it is. Replacing a demo run is
``linlm train --overwrite``: only what linlm wrote is removed (see :mod:`linlm.train.rundir`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from linlm import outputs
from linlm.errors import ConfigError

DEMO_MARK = ".demo-run"


def register(subparsers) -> None:
    from linlm.cli_args import add_overrides
    from linlm.cli_ranges import RANGES

    p = subparsers.add_parser("demo", help="a first training run, a few minutes on a CPU: a small model on the "
                                           "built-in Shakespeare corpus, then samples and where the loss curve and "
                                           "checkpoint are")
    p.add_argument("--archs", nargs="*", default=None,
                   help="the one architecture to train instead of the demo's (see `linlm archs`)")
    p.add_argument("--preset", default=None, help="train this size preset instead of the demo's shape")
    p.add_argument("--out", "--out-dir", dest="out_dir", default=None, metavar="DIR",
                   help="run directory (default: runs/demo; a demo run there is replaced, any other run is refused; "
                        "old spelling: --out-dir)")
    p.add_argument("--steps", type=RANGES["steps"], default=None, help="optimizer steps, a positive number (default: from the "
                                                           "demo config)")
    add_overrides(p)
    p.set_defaults(func=cmd_demo)


def cmd_demo(args) -> int:
    from linlm.cli_args import comma_lists, override_items
    from linlm.train.cli import setup_logging

    setup_logging()
    result = run_demo(archs=comma_lists(args.archs, "--archs"), preset=args.preset, out_dir=args.out_dir,
                      steps=args.steps, overrides=override_items(args))
    return 130 if result.interrupted else 0


def _mark_demo_run():
    """Hooks that mark the run directory as the demo's when training starts (the class is made on use: the trainer
    imports torch, and building the command line does not)."""
    from linlm.train.trainer import TrainHooks

    class MarkDemoRun(TrainHooks):
        def on_start(self, info: dict) -> None:
            outputs.write_text(Path(info["out_dir"]) / DEMO_MARK,
                               "written by `linlm demo`; the next demo may replace this run\n", "--out")

    return MarkDemoRun()


def unigram_entropy(data_dir, split: str = "train") -> float:
    """Entropy (nats/token) of the split's unigram distribution: the loss of a model that ignores context."""
    import numpy as np

    from linlm.data.loader import TokenDataset

    ds = TokenDataset(data_dir, split)
    counts = np.zeros(ds.vocab_size, dtype=np.int64)
    step = 1 << 22
    for start in range(0, ds.num_tokens, step):
        counts += np.bincount(ds.read(start, min(step, ds.num_tokens - start)), minlength=ds.vocab_size)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def run_demo(archs: Optional[Sequence[str]] = None, preset: Optional[str] = None, out_dir: Optional[str] = None,
             steps: Optional[int] = None, overrides: Optional[Sequence[str]] = None):
    """Train configs/demo.yaml (the first of ``archs`` replaces its architecture) into ``out_dir``."""
    import time

    from linlm.schema import load_yaml, parse_overrides
    from linlm.train.config_sources import build_config, config_path
    from linlm.train.pipeline import prepared_data_dir
    from linlm.train.rundir import RunDir
    from linlm.train.trainer import train

    if archs is not None and len(archs) > 1:
        raise ConfigError(f"--archs: the demo trains one architecture, got {len(archs)} ({', '.join(archs)}); give "
                          f"one, e.g. --archs {archs[0]} (each into its own --out to compare them)")
    path = config_path("demo")
    if path is None:
        raise ConfigError("configs/demo.yaml was not found beside the linlm sources; run the demo from a source "
                          "checkout, or use `linlm train --config FILE`")
    base = load_yaml(path)
    if archs:
        base["model"]["arch"] = archs[0]
    if preset is not None:  # a preset replaces the demo's own shape
        base["model"].update(preset=preset, overrides={})
    if out_dir is not None:
        base["out_dir"] = out_dir
    if steps is not None:  # 0 is refused by the config's validation, never read as "the default"
        base["steps"] = steps
    cfg = build_config(None, parse_overrides(list(overrides or [])), base=base)
    run = RunDir(cfg.out_dir)
    mark = run.path / DEMO_MARK
    ours = outputs.owns_file(mark)
    if run.has_run() and not ours:
        raise ConfigError(f"out_dir: {run.path} holds a run that `linlm demo` did not make; nothing was changed. "
                          f"Choose another --out, or continue that run with `linlm train --resume --out {run.path}`")
    outputs.check_file(mark, "--out")  # a .demo-run of the user's is refused here, before any work
    started = time.perf_counter()
    result = train(cfg, overwrite=ours and run.has_run(), hooks=_mark_demo_run())
    data_dir = cfg.data.dir or prepared_data_dir(cfg)
    entropy = unigram_entropy(data_dir)
    val = f"{result.val_loss:.3f}" if result.val_loss is not None else "n/a"
    loss = f"{result.loss:.3f}" if result.loss is not None else "n/a"
    print(f"\nlinlm demo: {cfg.model.arch}, {result.step} steps in {time.perf_counter() - started:.0f} s "
          f"(data preparation included)")
    print(f"  final train loss {loss}, validation loss {val} nats/token; the unigram entropy of the "
          f"data is {entropy:.3f} (a model that ignores context)")
    print(f"  loss curve: {result.plot}")
    print(f"  checkpoint: {result.checkpoint}")
    if result.samples:
        print(f"  samples:    {result.out_dir / 'samples.txt'}")
    print(f"  more text:  linlm generate --model {result.out_dir} --prompt 'ROMEO:'")
    return result
