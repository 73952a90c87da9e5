"""``linlm train``: parse, run a :class:`linlm.train.Trainer`, print.

Where a value comes from, lowest priority first: the TrainConfig defaults; on ``--resume`` without ``--config``,
the run's saved config.yaml; the ``--config`` YAML file; flags such as ``--steps``; dotted overrides
(``--set optim.lr=1e-3`` or a positional ``optim.lr=1e-3``).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

# flag name -> dotted config key
FLAGS = {
    "out_dir": "out_dir", "steps": "steps", "arch": "model.arch", "preset": "model.preset", "device": "device",
    "data_dir": "data.dir", "source": "data.source", "tokenizer": "data.tokenizer", "seq_len": "data.seq_len",
    "batch_size": "batch_size", "grad_accum": "grad_accum", "lr": "optim.lr", "precision": "precision",
    "seed": "seed", "strategy": "distributed.strategy", "init_from": "init_from",
}


def register(subparsers) -> None:
    from linlm.cli_args import add_overrides

    p = subparsers.add_parser(
        "train", help="train a language model (also under torchrun for DDP / FSDP)",
        description="Train a model from a YAML config plus overrides. Under `torchrun --nproc_per_node=N -m linlm "
                    "train ...` every process joins one data-parallel run. See docs/training.md.")
    p.add_argument("--config", help="a YAML file, or the name of a config in configs/ (e.g. demo, paper-70m)")
    add_overrides(p)
    p.add_argument("--resume", action="store_true", help="continue the run in out_dir from its newest valid checkpoint")
    p.add_argument("--overwrite", action="store_true", help="delete the run in out_dir and start over")
    p.add_argument("--print-config", action="store_true", help="print the validated config and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar or log lines (metrics.jsonl is still written)")
    g = p.add_argument_group("shortcuts for common keys")
    g.add_argument("--out", "--out-dir", dest="out_dir", metavar="DIR",
                   help="the run directory, out_dir (old spelling: --out-dir)")
    g.add_argument("--steps", type=int)
    g.add_argument("--arch")
    g.add_argument("--preset")
    g.add_argument("--device")
    g.add_argument("--data-dir")
    g.add_argument("--source")
    g.add_argument("--tokenizer")
    g.add_argument("--seq-len", type=int)
    g.add_argument("--batch-size", type=int)
    g.add_argument("--grad-accum", type=int)
    g.add_argument("--lr", type=float)
    g.add_argument("--precision", choices=["fp32", "bf16", "auto"],
                   help="auto: bf16 where the device computes it natively (CUDA, a CPU with AVX-512 or AMX), else fp32")
    g.add_argument("--seed", type=int)
    g.add_argument("--strategy", choices=["ddp", "fsdp"])
    g.add_argument("--init-from", metavar="CHECKPOINT",
                   help="start from the weights of this checkpoint (or run directory) with this config's optimizer "
                        "and schedule; recorded as init_from in the run's config.yaml")
    p.set_defaults(func=cmd_train)


def setup_logging(rank: int = 0) -> None:
    logger = logging.getLogger("linlm")
    if not any(getattr(h, "_linlm", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("linlm: %(levelname)s: %(message)s"))
        handler._linlm = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)


def config_from_args(args):
    """The validated TrainConfig an argparse namespace of `linlm train` describes."""
    from linlm.cli_args import override_items
    from linlm.schema import deep_merge, load_yaml, parse_overrides
    from linlm.errors import ConfigError
    from linlm.train.config_sources import build_config, config_path
    from linlm.train.rundir import RUN_CONFIG_FILE

    flags: dict = {}
    for attr, key in FLAGS.items():
        value = getattr(args, attr, None)
        if value is not None:
            *parents, leaf = key.split(".")
            node = flags
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    overrides = deep_merge(flags, parse_overrides(override_items(args)))
    path = None
    if args.config:
        path = config_path(args.config) or Path(args.config)
        if not path.is_file():
            raise ConfigError(f"--config {args.config!r}: no such file (and no configs/{args.config}.yaml)")
    base = None
    if args.resume and path is None:
        out_dir = overrides.get("out_dir") or "runs/default"
        saved = Path(out_dir) / RUN_CONFIG_FILE
        if saved.is_file():
            base = load_yaml(saved)
    return build_config(path, overrides, base=base)


def cmd_train(args) -> int:
    from linlm.train.trainer import train

    rank = int(os.environ.get("RANK", "0"))
    setup_logging(rank)
    cfg = config_from_args(args)
    if args.print_config:
        if rank == 0:
            print(cfg.to_yaml(), end="")
        return 0
    result = train(cfg, resume=args.resume, overwrite=args.overwrite, verbose=not args.quiet)
    if rank == 0 and not args.quiet:
        loss = f"{result.loss:.4f}" if result.loss is not None else "n/a"
        val = f"{result.val_loss:.4f}" if result.val_loss is not None else "n/a"
        print(f"step {result.step}/{cfg.steps}: loss {loss}, val_loss {val}, skipped steps {result.skipped_steps}, "
              f"{result.seconds:.0f} s")
        print(f"checkpoint: {result.checkpoint}")
        if result.plot:
            print(f"loss curve: {result.plot}")
    if result.interrupted:
        return 143 if result.interrupted == "SIGTERM" else 130
    return 0
