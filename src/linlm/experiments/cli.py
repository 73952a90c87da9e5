"""``linlm mqar``: parse, call :func:`linlm.experiments.mqar.run_experiment`, print the table, write the results."""

from __future__ import annotations


def register(subparsers):
    from linlm.experiments.mqar import default_archs

    p = subparsers.add_parser(
        "mqar", help="train small models of each architecture on MQAR; accuracy vs width and state size",
        description="Multi-query associative recall: trains every run (architecture x width, plus MossNet with one "
                    "and with E SSM experts) with the Trainer on the same synthetic stream, measures test accuracy, "
                    "prints a table and writes results.json and mqar.png into --out. Resumable: Ctrl-C stops at "
                    "the run in training (its checkpoint saved, nothing of it recorded; exit 130), and the same "
                    "command again continues it from that checkpoint, reading the finished runs' results back.")
    p.add_argument("--out", "--out-dir", dest="out_dir", required=True, metavar="DIR",
                   help="one run directory per model is made below it (old spelling: --out-dir)")
    p.add_argument("--archs", default=",".join(default_archs()),
                   help="comma-separated architectures (default: every registered one but the mixtures of experts; "
                        "MossNet runs through --experts)")
    p.add_argument("--widths", default="32,64", help="comma-separated d_model values (multiples of --head-dim)")
    p.add_argument("--experts", type=int, default=4,
                   help="SSM experts of the MossNet run, beside the one-expert MossNet (1: that one alone; 0: no "
                        "MossNet runs)")
    p.add_argument("--vocab-size", type=int, default=64)
    p.add_argument("--num-kv", type=int, default=4, help="key-value pairs per sequence")
    p.add_argument("--num-queries", type=int, default=None,
                   help="keys queried per sequence, 1..--num-kv (default: every key, once)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--steps", type=int, default=3000,
                   help="training steps per model (MQAR is learned late: 300 steps leave SSMs near chance)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2, help="peak learning rate (cosine schedule)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-sequences", type=int, default=512, help="held-out sequences each model is tested on")
    p.add_argument("--threads", type=int, default=None, help="torch threads for training (default: torch's own)")
    p.add_argument("--overwrite", action="store_true",
                   help="train every run of this experiment again from step 0, also one that finished or belongs "
                        "to another experiment (only files linlm wrote are removed). Without it the same command "
                        "continues an experiment, and a run directory of other settings is refused")
    p.set_defaults(func=cmd_mqar)
    return p


def cmd_mqar(args) -> int:
    """Check every flag and output path, run the experiment, print the table, write results.json and mqar.png.
    A stop (Ctrl-C, SIGTERM) prints what stopped and the command that continues; exit 130 (143 for SIGTERM)."""
    import math
    import sys

    from linlm import outputs
    from linlm.cli_args import comma_list
    from linlm.errors import ConfigError
    from linlm.eval.mqar import MQARConfig
    from linlm.experiments.mqar import default_runs, plot_experiment, run_experiment
    from linlm.render import print_table
    from linlm.train.cli import setup_logging

    setup_logging()
    for flag, low in (("vocab_size", 1), ("num_kv", 1), ("num_queries", 1), ("layers", 1), ("head_dim", 1),
                      ("steps", 1), ("batch_size", 1), ("test_sequences", 1), ("threads", 1), ("experts", 0)):
        value = getattr(args, flag)
        if value is not None and value < low:
            raise ConfigError(f"--{flag.replace('_', '-')} {value}: must be >= {low}"
                              + (" (0: no MossNet runs)" if flag == "experts" else ""))
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise ConfigError(f"--lr {args.lr}: must be a positive number, e.g. 1e-2")
    widths = comma_list(args.widths, "--widths", item=int, what="integers >= 1", example="32,64", minimum=1)
    archs = tuple(comma_list(args.archs, "--archs", empty_ok=True))
    runs = default_runs(widths, args.experts, archs)
    cfg = MQARConfig(vocab_size=args.vocab_size, num_kv=args.num_kv, num_queries=args.num_queries).validate()
    out = outputs.check_dir(args.out_dir, "--out", names=["results.json", "mqar.png"])
    try:
        rows = run_experiment(runs, cfg, out, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                              n_layers=args.layers, head_dim=args.head_dim, seed=args.seed,
                              test_sequences=args.test_sequences, threads=0 if args.threads is None else args.threads,
                              overwrite=args.overwrite, what="--out")
    except KeyboardInterrupt as e:
        print(f"linlm mqar: {str(e) or 'interrupted'}; nothing unfinished was recorded and no further run was trained. "
              f"To continue, run the same command again: {_mqar_command(args)}", file=sys.stderr)
        return getattr(e, "exit_code", 130)
    table = [[r["name"], r["d_model"], f"{r['active_params']:,}", f"{r['state_floats']:,}", f"{r['accuracy']:.3f}",
              f"{r['sequence_accuracy']:.3f}", f"{r['final_loss']:.3f}"] for r in rows]
    print_table(["model", "d", "active params", "state (floats)", "accuracy", "all answers right", "train loss"], table,
                title=f"MQAR: {cfg.num_kv} pairs, {cfg.queries} queries, vocab {cfg.vocab_size}, {args.steps} steps")
    plot = plot_experiment(rows, out / "mqar.png", "--out")
    task = {"vocab_size": cfg.vocab_size, "num_kv": cfg.num_kv, "num_queries": cfg.queries, "seq_len": cfg.seq_len}
    path = outputs.write_json(out / "results.json", {
        "mqar": task, "settings": {k: v for k, v in vars(args).items() if k != "func"}, "runs": rows,
        "format": "linlm-mqar"}, "--out")
    print(f"results: {path}\nplot: {plot}")
    return 0


def _mqar_command(args) -> str:
    """The `linlm mqar` command that continues this one: its flags that differ from the defaults, less
    --overwrite (with it the rerun would start over instead of continuing)."""
    import argparse
    import shlex

    defaults = vars(register(argparse.ArgumentParser().add_subparsers()).parse_args(["--out", "-"]))
    words = ["linlm", "mqar"]
    for key, value in vars(args).items():
        if key in defaults and key not in ("func", "overwrite") and (key == "out_dir" or value != defaults[key]):
            words += ["--out" if key == "out_dir" else "--" + key.replace("_", "-"), str(value)]
    return shlex.join(words)
