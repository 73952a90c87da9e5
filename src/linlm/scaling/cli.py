"""``linlm scaling run | fit | report | ladders``: thin wrappers over :mod:`linlm.scaling`."""

from __future__ import annotations

import os
import sys


def register(subparsers) -> None:
    from linlm.cli_ranges import RANGES

    sc = subparsers.add_parser("scaling", help="scaling-law sweeps: run a ladder, fit the laws, write a report",
                               description="See docs/scaling.md.")
    sub = sc.add_subparsers(dest="scaling_command", required=True)

    p = sub.add_parser("run", help="train every (architecture x size) of a ladder; resumable",
                       description="Train the grid of a ladder through the Trainer. Finished runs are skipped, "
                                   "interrupted ones resumed; the --out directory is locked while it runs.")
    p.add_argument("--ladder", required=True, help="a built-in ladder (paper, cpu, smoke) or a YAML ladder file")
    p.add_argument("--archs", default=None, help="comma-separated architectures (default: the ladder's)")
    p.add_argument("--out", required=True, help="the sweep directory")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a training config key for every run, e.g. --set data.source=corpus.txt (repeatable)")
    p.add_argument("--jobs", type=RANGES["jobs"], default=None,
                   help="train this many runs at once, each in its own process with its config's threads "
                        "(default: the ladder's jobs, usually 1); e.g. 2 single-threaded runs on 2 cores")
    p.add_argument("--dry-run", action="store_true",
                   help="print the runs, compute, tokens, epochs and estimated time; train nothing")
    p.add_argument("--flops-per-s", type=RANGES["flops"], default=None,
                   help="with --dry-run: estimate time from this sustained training FLOP/s instead of timing steps "
                        "on this machine (e.g. 8 GPUs x 400e12 x 0.4 MFU = 1.28e15)")
    p.add_argument("--no-measure", action="store_true", help="with --dry-run: do not time steps here")
    p.add_argument("--emit", choices=["torchrun"], default=None,
                   help="print one torchrun command per run (grouped by rung) and write their configs to "
                        "OUT/configs; train nothing")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("fit", help="fit the scaling laws of a sweep directory")
    _fit_args(p)
    p.add_argument("--json", action="store_true", help="print every fit as JSON")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("report", help="write a Markdown and a self-contained HTML report with plots")
    _fit_args(p)
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the report directory: new, empty, or one linlm wrote a report into (a file there that "
                        "linlm did not write is never replaced)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("study", help="the loss per shape per architecture of a shape study's sweep",
                       description="Score every finished run of an aspect-ratio or context-length study (a ladder "
                                   "with a study: `linlm scaling run --ladder aspect-cpu --out DIR`) on its "
                                   "validation text, and print the loss per shape per architecture and its spread "
                                   "across shapes; with --downstream (or --data-dir), also each shape's "
                                   "commonsense average, LAMBADA, WikiText-2 and NIAH, as the paper's tables of "
                                   "its shape studies. See docs/scaling.md.")
    p.add_argument("dir", help="the sweep directory of a study (linlm scaling run --out)")
    p.add_argument("--max-tokens", type=RANGES["eval_tokens"], default=None,
                   help="validation tokens scored per run (default 32768)")
    p.add_argument("--downstream", action="store_true",
                   help="score each run's final checkpoint on the downstream measures too (kept in "
                        "DIR/downstream/: a second call scores nothing new); NIAH only, without --data-dir")
    _downstream_args(p, "; implies --downstream")
    p.add_argument("--json", action="store_true", help="print the losses as JSON")
    p.set_defaults(func=cmd_study)

    p = sub.add_parser("evaluate", help="downstream scores of every kept checkpoint, against compute; resumable",
                       description="Score every checkpoint each run of a sweep kept along training "
                                   "(checkpoint.keep_log / keep_every_tokens) on the commonsense average, LAMBADA, "
                                   "WikiText-2 (the task files of --data-dir) and NIAH (easy, choice), and plot each "
                                   "against training compute per architecture, writing SWEEP/downstream/. A second "
                                   "call scores only what is missing. See docs/scaling.md.")
    p.add_argument("dir", help="the sweep directory (linlm scaling run --out)")
    _downstream_args(p, "; without it only NIAH runs")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("ladders", help="list the built-in ladders")
    p.set_defaults(func=cmd_ladders)


def _downstream_args(p, data_note: str) -> None:
    """The flags of the downstream measures (``scaling evaluate`` and ``scaling study``)."""
    from linlm.cli_ranges import RANGES

    p.add_argument("--data-dir", default=None,
                   help="task files (`linlm eval fetch --tasks commonsense,lambada,wikitext2 --out DIR`)" + data_note)
    p.add_argument("--haystack", default="shakespeare", help="text source of the NIAH haystack")
    p.add_argument("--limit", type=RANGES["limit"], default=None, help="items scored per task (default: every item)")
    p.add_argument("--trials", type=RANGES["trials"], default=4, help="NIAH needles per cell")


def _fit_args(p) -> None:
    from linlm.cli_ranges import RANGES

    p.add_argument("dir", help="a sweep directory (linlm scaling run --out), or a directory of training runs")
    p.add_argument("--strict", action="store_true",
                   help="fail on a run with NaN or missing losses, or a fit that cannot be made, instead of "
                        "skipping it")
    p.add_argument("--include-unfinished", action="store_true", help="fit runs that have not finished too")
    p.add_argument("--bootstrap", type=RANGES["resamples"], default=1000, help="bootstrap resamples for the power-law intervals")
    p.add_argument("--parametric-bootstrap", type=RANGES["fit_resamples"], default=50,
                   help="bootstrap resamples for the L(N, D) intervals (each is an L-BFGS fit)")
    p.add_argument("--smooth", type=RANGES["smooth"], default=5, help="centred moving mean over this many logged losses")


def _analyze(args):
    from linlm.scaling.analysis import FitOptions, analyze

    if args.bootstrap < 0 or args.parametric_bootstrap < 0 or args.smooth < 1:
        from linlm.errors import ConfigError

        raise ConfigError("--bootstrap and --parametric-bootstrap must be >= 0, --smooth >= 1")
    opt = FitOptions(bootstrap=args.bootstrap, parametric_bootstrap=args.parametric_bootstrap, smooth=args.smooth)
    return analyze(args.dir, strict=args.strict, include_unfinished=args.include_unfinished, options=opt)


def _say_skipped(a) -> None:
    for name, why in a.loaded.skipped:
        print(f"linlm: skipped {name}: {why}", file=sys.stderr)


def cmd_evaluate(args) -> int:
    from linlm.cli_args import check_numbers
    from linlm.render import print_table
    from linlm.scaling.downstream import MEASURES, evaluate_sweep

    check_numbers(("--limit", args.limit, 1, False), ("--trials", args.trials, 1, False))

    def said(run: str, step: int, done: bool) -> None:
        print(f"{run} step {step}: {'done before' if done else 'scored'}", flush=True)

    summary = evaluate_sweep(args.dir, data_dir=args.data_dir, haystack=args.haystack, limit=args.limit,
                             trials=args.trials, progress=said)
    shown = [m for m in MEASURES if any(m in p for p in summary["points"])]
    rows = [[p["run"], str(p["step"]), f"{p['compute_pflops_days']:.3g}",
             *[f"{p[m]:.4g}" if m in p else "-" for m in shown]] for p in summary["points"]]
    print_table(["run", "step", "C (PFLOP/s-days)", *shown], rows, title=f"downstream against compute: {args.dir}")
    for m, fits in summary["fits"].items():
        for arch, f in fits.items():
            print(f"{m} {arch}: {f['beta']:.4g} C^{f['alpha']:.4f} over {f['n']} checkpoints")
    print(f"plots: {', '.join(summary['plots'])} in {args.dir}/downstream")
    return 0


def cmd_fit(args) -> int:
    a = _analyze(args)
    _say_skipped(a)
    if args.json:
        from linlm import outputs

        print(outputs.dumps(a.to_dict()), end="")
        return 0
    from linlm.render import print_table
    from linlm.scaling.report import law_row

    rows = []
    for arch, f in a.archs.items():
        e = f.envelope
        if e is not None:
            rows += [law_row(arch, q, law) for q, law in (("L(C)", e.loss), ("N_opt(C)", e.params),
                                                          ("D_opt(C)", e.tokens))]
    if rows:
        print_table(["arch", "law", "beta", "beta CI", "alpha", "alpha CI", "R²", "paper beta", "paper alpha"],
                    rows, title="envelope fits (C in PFLOP/s-days)")
    for arch, f in a.archs.items():
        for name, msg in f.errors.items():
            print(f"not fitted: {msg}")
        if f.parametric:
            p = f.parametric
            print(f"{arch} L(N, D) = {p.E:.4g} + {p.A:.4g}/N^{p.a:.4f} + {p.B:.4g}/D^{p.b:.4f} (R² {p.r2:.4f})")
    for c in a.crossovers:
        where = f"{c.compute:.3e} PFLOP/s-days" if c.compute else "never (parallel)"
        print(f"{c.a} and {c.b} cross at {where}; beyond it {c.lower_after} is lower")
    return 0


def cmd_report(args) -> int:
    from linlm import outputs
    from linlm.scaling.report import REPORT_FILES, write_report

    # The report directory is checked before the fits run (they take a while): a refusal costs nothing.
    outputs.check_dir(args.out, "--out", names=REPORT_FILES)
    a = _analyze(args)
    _say_skipped(a)
    files = write_report(a, args.out, "--out")
    print(f"report: {files['report.md']} and {files['report.html']}")
    return 0


def cmd_study(args) -> int:
    from pathlib import Path

    from linlm.cli_args import check_numbers
    from linlm.errors import DataError
    from linlm.render import print_table
    from linlm.scaling.shapes import DEFAULT_MAX_TOKENS, study_downstream, study_losses, study_table

    check_numbers(("--max-tokens", args.max_tokens, 2, False))
    root = Path(args.dir).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: no such directory; give the --out directory of `linlm scaling run` of a study")
    data = Path(args.data_dir).expanduser() if args.data_dir else None
    if data is not None and not data.is_dir():
        raise DataError(f"--data-dir {data}: not a directory; give the directory of the task files (`linlm eval "
                        "fetch --tasks commonsense,lambada,wikitext2 --out DIR`)")
    res = study_losses(root, max_tokens=args.max_tokens or DEFAULT_MAX_TOKENS)
    if res is None:
        raise DataError(f"{root}: holds no finished run of a study (a ladder with `study:`); train it with "
                        f"`linlm scaling run --ladder LADDER --out {root}` first")
    if args.downstream or data is not None:
        study_downstream(root, res, data_dir=data, haystack=args.haystack, limit=args.limit, trials=args.trials)
    if args.json:
        from linlm import outputs

        print(outputs.dumps(res), end="")
        return 0
    head, rows = study_table(res)
    print_table(head, rows, title=f"{res['kind']} study: {len(res['runs'])} runs, loss in nats/token")
    above = (res.get("downstream") or {}).get("niah_above_chance")
    if above == 0:
        print(f"NIAH: no run is above chance ({res['downstream']['niah_chance']:.3f}, by more than two binomial "
              "standard errors), so it cannot order the shapes")
    return 0


def cmd_ladders(args) -> int:
    from linlm.render import print_table
    from linlm.scaling.ladder import builtin_ladders, load_ladder

    rows = []
    for name in builtin_ladders():
        lad = load_ladder(name)
        rows.append([name, str(len(lad.rungs)), ", ".join(lad.archs), lad.description])
    print_table(["ladder", "rungs", "archs", "description"], rows, title="ladders")
    return 0


def cmd_run(args) -> int:
    from pathlib import Path

    from linlm.schema import parse_overrides
    from linlm.scaling.ladder import check_ladder_overrides, load_ladder, plan_runs
    from linlm.scaling.estimate import estimate
    from linlm.errors import ResourceError
    from linlm.scaling.plan import check_runs_memory, emit_torchrun, plan_rows, print_plan
    from linlm.scaling.runner import run_grid

    from linlm.cli_args import check_numbers, comma_list

    check_numbers(("--flops-per-s", args.flops_per_s, 0, True))
    for flag, given in (("--no-measure", args.no_measure), ("--flops-per-s", args.flops_per_s is not None)):
        if given and not args.dry_run:
            from linlm.errors import ConfigError

            raise ConfigError(f"{flag}: only changes the estimate of --dry-run, and no run trains differently; add "
                              "--dry-run, or drop it")
    ladder = load_ladder(args.ladder)
    if args.jobs is not None:
        if args.jobs < 1:
            from linlm.errors import ConfigError

            raise ConfigError(f"--jobs: expected 1 or more runs to train at once, got {args.jobs}")
        ladder.jobs = args.jobs
    archs = comma_list(args.archs, "--archs", empty_ok=True) if args.archs else None
    overrides = parse_overrides(args.overrides)
    check_ladder_overrides(ladder, overrides)
    if args.emit:
        runs = plan_runs(ladder, archs, args.out, overrides)
        for line in emit_torchrun(ladder, runs, Path(args.out), write=not args.dry_run):
            print(line)
        if args.dry_run:
            print(f"dry run: nothing written; without --dry-run the configs go to {Path(args.out) / 'configs'}",
                  file=sys.stderr)
        return 0
    if args.dry_run:
        from linlm.scaling.sweepdir import check_started_runs, check_sweep_dir

        runs = plan_runs(ladder, archs, args.out, overrides)
        # The real run's checks of --out, which write nothing; its memory check is a note, since a plan may be for
        # another machine.
        check_sweep_dir(Path(args.out).expanduser(), ladder, "--out")
        check_started_runs(runs, "--out")
        say = lambda text: print(text, file=sys.stderr)  # noqa: E731
        try:
            check_runs_memory(runs)
        except ResourceError as e:
            say(f"note: training on this machine would be refused: {e}")
        rows = plan_rows(ladder, runs, say)
        estimate(rows, args.flops_per_s, measure=not args.no_measure, say=say)
        timed = (f"from {args.flops_per_s:.3g} FLOP/s" if args.flops_per_s else
                 "n/a: --no-measure" if args.no_measure else
                 "from training steps timed now on this machine (smallest and largest rung per arch, the rest "
                 f"interpolated), load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; other load "
                 "changes it")
        print_plan(rows, ladder, timed=timed)
        return 0
    from linlm.progress import live_display

    result = run_grid(ladder, archs, args.out, overrides=overrides, live=live_display())
    print(f"{len(result['trained'])} run(s) trained, {len(result['done'])} already finished; "
          f"fit with: linlm scaling fit {args.out}")
    return 130 if result["interrupted"] else 0
