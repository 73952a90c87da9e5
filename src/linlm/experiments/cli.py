"""``linlm mqar``: parse, call :func:`linlm.experiments.mqar.run_experiment`, print the table, write the results."""

from __future__ import annotations


def register(subparsers):
    from linlm.cli_ranges import RANGES, NumberList
    from linlm.experiments.mqar import default_archs

    from linlm.experiments.mqar_grid import DEFAULT_EXPERTS, DEFAULT_POLICIES

    p = subparsers.add_parser(
        "mqar", help="train small models of each architecture on MQAR; accuracy vs width and state size",
        description="Multi-query associative recall: trains every run (architecture x width, MossNet's SSM experts x "
                    "routing policies, and Mamba and LLaMA sized to MossNet at equal active parameters and at equal "
                    "state size; each with --seeds seeds) with the Trainer on the same synthetic stream, measures "
                    "test accuracy, prints a table and writes results.json and mqar.png into --out. Resumable: "
                    "Ctrl-C stops at the run in training (its checkpoint saved, nothing of it recorded; exit 130), "
                    "and the same command again continues it from that checkpoint, reading the finished runs' "
                    "results back.")
    p.add_argument("--out", "--out-dir", dest="out_dir", required=True, metavar="DIR",
                   help="one run directory per model and seed is made below it (old spelling: --out-dir)")
    p.add_argument("--archs", default=",".join(default_archs()),
                   help="comma-separated architectures (default: every registered one but the mixtures of experts; "
                        "MossNet runs through --mossnet-experts)")
    p.add_argument("--widths", type=NumberList(RANGES["width"]), default="32,64", help="comma-separated d_model values (multiples of --head-dim)")
    p.add_argument("--mossnet-experts", "--experts", dest="experts", type=NumberList(RANGES["experts"], empty_ok=True),
                   default=",".join(map(str, DEFAULT_EXPERTS)),
                   metavar="E,E,...", help="comma-separated SSM expert counts of the MossNet runs (0: no MossNet runs)")
    p.add_argument("--mossnet-policies", dest="policies", default=",".join(DEFAULT_POLICIES), metavar="P,P,...",
                   help="comma-separated routing policies of the MossNet runs: routed-kN (each expert's state "
                        "advances on its own tokens, N experts a token), dense (every state sees every token, the "
                        "router gates all E outputs: gated linear multi-head attention) or dense-kN")
    p.add_argument("--no-matched", dest="matched", action="store_false",
                   help="leave out the baselines sized to MossNet (equal active parameters, equal state size)")
    p.add_argument("--vocab-size", type=RANGES["vocab"], default=64)
    p.add_argument("--num-kv", type=RANGES["pairs"], default=4, help="key-value pairs per sequence")
    p.add_argument("--num-queries", type=RANGES["pairs"], default=None,
                   help="keys queried per sequence, 1..--num-kv (default: every key, once)")
    p.add_argument("--mix", type=NumberList(RANGES["pairs"]), default=None, metavar="N,N,...",
                   help="smaller pair counts that training batches cycle through before --num-kv's (fewer pairs "
                        "teach the lookup sooner); the test stays at --num-kv")
    p.add_argument("--layers", type=RANGES["layers"], default=2)
    p.add_argument("--head-dim", type=RANGES["width"], default=16)
    p.add_argument("--steps", type=RANGES["steps"], default=3000,
                   help="training steps per model (MQAR is learned late: 300 steps leave SSMs near chance)")
    p.add_argument("--batch-size", type=RANGES["batch"], default=32)
    p.add_argument("--lr", type=RANGES["lr"], default=1e-3,  # experiments.mqar.DEFAULT_LR (a test holds them equal)
                   help="peak learning rate (cosine schedule); faster rates leave attention copying a context "
                        "value instead of recalling")
    p.add_argument("--seed", type=RANGES["seed"], default=0, help="the first seed")
    p.add_argument("--seeds", type=RANGES["seeds"], default=1,
                   help="seeds per configuration (--seed, --seed + 1, ...): accuracy is their mean and min-max")
    p.add_argument("--test-sequences", type=RANGES["trials"], default=512, help="held-out sequences each model is tested on")
    p.add_argument("--threads", type=RANGES["threads"], default=None,
                   help="torch threads for training (default: torch's own; 1 with --jobs)")
    p.add_argument("--jobs", type=RANGES["jobs"], default=1,
                   help="runs trained at once, each in its own process with --threads threads (small models use "
                        "several cores poorly: on N cores, N runs of 1 thread finish sooner than N-thread runs)")
    p.add_argument("--overwrite", action="store_true",
                   help="train every run of this experiment again from step 0, also one that finished or belongs "
                        "to another experiment (only files linlm wrote are removed). Without it the same command "
                        "continues an experiment, and a run directory of other settings is refused")
    p.set_defaults(func=cmd_mqar)
    return p


def cmd_mqar(args) -> int:
    """Check every flag and output path, run the experiment, print the table, write results.json and mqar.png.
    A stop (Ctrl-C, SIGTERM) prints what stopped and the command that continues; exit 130 (143 for SIGTERM)."""
    import datetime
    import math
    import sys
    from dataclasses import asdict

    from linlm import outputs
    from linlm.cli_args import comma_list
    from linlm.environment import environment
    from linlm.errors import ConfigError
    from linlm.eval.mqar import MQARConfig, pairs_text
    from linlm.experiments.mqar import default_runs, plot_experiment, run_experiment
    from linlm.experiments.mqar_grid import DEFAULT_POLICIES
    from linlm.experiments.mqar_summary import comparison_groups, config_table, group_table, summarize
    from linlm.render import print_table
    from linlm.train.cli import setup_logging

    setup_logging()
    for flag, low in (("vocab_size", 1), ("num_kv", 1), ("num_queries", 1), ("layers", 1), ("head_dim", 1),
                      ("steps", 1), ("batch_size", 1), ("test_sequences", 1), ("threads", 1), ("seeds", 1),
                      ("jobs", 1)):
        value = getattr(args, flag)
        if value is not None and value < low:
            raise ConfigError(f"--{flag.replace('_', '-')} {value}: must be >= {low}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise ConfigError(f"--lr {args.lr}: must be a positive number, e.g. 1e-3")
    widths = args.widths
    archs = tuple(comma_list(args.archs, "--archs", empty_ok=True))
    experts = args.experts
    if 0 in experts and experts != [0]:
        raise ConfigError(f"--mossnet-experts {','.join(map(str, experts))}: 0 means no MossNet runs; give it alone, "
                          "or counts >= 1")
    policies = comma_list(args.policies, "--mossnet-policies", what="policies", example=",".join(DEFAULT_POLICIES))
    _check_policies(policies, [e for e in experts if e])
    cfg = MQARConfig(vocab_size=args.vocab_size, num_kv=args.num_kv, num_queries=args.num_queries,
                     mix=tuple(args.mix or ())).validate()
    seeds = range(args.seed, args.seed + args.seeds)
    runs = default_runs(widths, [e for e in experts if e], archs, policies, seeds, args.matched,
                        n_layers=args.layers, head_dim=args.head_dim, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len)
    _check_memory(runs, cfg, args)
    _check_not_a_run(args.out_dir)
    out = outputs.check_dir(args.out_dir, "--out", names=["results.json", "mqar.png"])
    command = _mqar_command(args)
    # Before any training: the record of the source and the machine the runs start from.
    meta = {"command": command, **environment(),
            "utc_time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        rows = run_experiment(runs, cfg, out, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                              n_layers=args.layers, head_dim=args.head_dim, test_sequences=args.test_sequences,
                              threads=(1 if args.jobs > 1 else 0) if args.threads is None else args.threads,
                              overwrite=args.overwrite, what="--out", jobs=args.jobs)
    except KeyboardInterrupt as e:
        print(f"linlm mqar: {str(e) or 'interrupted'}; nothing unfinished was recorded and no further run was trained. "
              f"To continue, run the same command again: {command}", file=sys.stderr)
        return getattr(e, "exit_code", 130)
    configs = summarize(rows)
    groups = comparison_groups(configs)
    print_table(*config_table(configs),
                title=f"MQAR: {pairs_text(asdict(cfg))}, {cfg.queries} queries, vocab {cfg.vocab_size}, {args.steps} steps")
    print_table(*group_table(groups), title="Comparison groups")
    plot = plot_experiment(configs, out / "mqar.png", "--out")
    task = {"vocab_size": cfg.vocab_size, "num_kv": cfg.num_kv, "num_queries": cfg.queries, "seq_len": cfg.seq_len,
            "mix": list(cfg.mix)}
    path = outputs.write_json(out / "results.json", {
        "meta": meta, "mqar": task, "settings": {k: v for k, v in vars(args).items() if k != "func"},
        "seeds": list(seeds), "runs": rows, "configs": configs, "groups": groups, "format": "linlm-mqar"}, "--out")
    print(f"results: {path}\nplot: {plot}")
    return 0


def _check_policies(policies: list[str], experts: list[int]) -> None:
    """Refuse a routing policy that no expert count of the grid can take (routed-k9 with --mossnet-experts 2): the
    grid leaves out a k above E, and a policy above every E would train no MossNet at all under its name."""
    from linlm.errors import ConfigError
    from linlm.experiments.mqar_grid import parse_policy

    for text in policies:
        k = parse_policy(text).k
        if experts and k is not None and k > max(experts):
            raise ConfigError(f"--mossnet-policies {text}: takes {k} experts a token, more than any "
                              f"--mossnet-experts count ({','.join(map(str, experts))}) has; give k <= "
                              f"{max(experts)}, or more experts")


def _check_not_a_run(out_dir) -> None:
    """Refuse an --out that is itself a training run's directory: the experiment would write its runs and results
    among that run's checkpoints and logs."""
    from linlm.errors import ConfigError
    from linlm.train.rundir import RunDir

    if RunDir(out_dir).has_run():
        raise ConfigError(f"--out {out_dir}: is the directory of a training run (linlm train); the experiment makes "
                          "one run directory per model below --out. Give a new or empty directory, or one an MQAR "
                          "experiment wrote (nothing was changed)")


def _check_memory(runs, cfg, args) -> None:
    """Refuse, before anything is trained, a grid whose widest models cannot train in this machine's memory."""
    from linlm.experiments.mqar_grid import model_overrides
    from linlm.models.memory import training_floor
    from linlm.models.presets import preset_config
    from linlm.resources import check_memory

    widest = max(r.d_model for r in runs) if runs else 0
    seen = set()
    for run in (r for r in runs if r.d_model == widest and r.name() not in seen):
        seen.add(run.name())
        model = preset_config(run.arch, None, **model_overrides(run, args.layers, args.head_dim, cfg.vocab_size,
                                                                cfg.seq_len))
        check_memory(training_floor(model, args.batch_size, cfg.seq_len),
                     f"--widths {widest}: training {run.name()} at --batch-size {args.batch_size}",
                     "give smaller --widths (or --layers, --batch-size)")


def _mqar_command(args) -> str:
    """The `linlm mqar` command that continues this one: its flags that differ from the defaults, less
    --overwrite (with it the rerun would start over instead of continuing)."""
    import argparse
    import shlex

    parser = register(argparse.ArgumentParser().add_subparsers())
    defaults = vars(parser.parse_args(["--out", "-"]))
    words = ["linlm", "mqar"]
    for action in parser._actions:
        key, value = action.dest, getattr(args, action.dest, None)
        if key not in defaults or key in ("help", "func", "overwrite") or (key != "out_dir" and value == defaults[key]):
            continue
        flag = "--out" if key == "out_dir" else action.option_strings[0]
        shown = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        words += [flag] if action.nargs == 0 else [flag, shown]
    return shlex.join(words)
