"""``linlm reproduce``: parse, call :func:`linlm.reproduce.run` (or print the plan), print where the report is."""

from __future__ import annotations

import sys


def register(subparsers) -> None:
    from linlm.reproduce.recipes import recipe_names

    p = subparsers.add_parser(
        "reproduce", help="the main job: both studies end to end (scaling laws, MossNet vs baselines, evaluation, "
                          "retrieval, decoding) with a report; resumable (`make demo` runs its smoke recipe)",
        description="Run both studies at the sizes of a recipe (--recipe) into --out and write OUT/report.md and "
                    "OUT/report.html. Run the same command again to continue an interrupted job. Everything given "
                    "is checked before any work; a refused command changes nothing. A job that has not finished "
                    "takes a corrected --set, --scaling-dir, --data-dir or --seeds (given again, it replaces the "
                    "job's) as long as none of the sections it changes has finished; otherwise it is refused, naming "
                    "them. "
                    "Not given, each keeps the job's. See docs/reproduce.md.")
    p.add_argument("--recipe", "--preset", dest="recipe", default="smoke",
                   help=f"what the job runs and at which size: {', '.join(recipe_names())} (default: smoke; "
                        "old spelling: --preset)")
    p.add_argument("--out", required=True, help="the job directory (new, empty, or a reproduce job's)")
    p.add_argument("--data-dir", default=None,
                   help="a directory of zero-shot task files (JSON Lines, see docs/evaluation.md); without it the "
                        "zero-shot section is skipped and the report says so")
    p.add_argument("--resume", action="store_true",
                   help="continue the job in --out even if it was started with another recipe or linlm version")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in --out: remove the files linlm wrote there (its ledgers list them) and "
                        "nothing else; refused, removing nothing, when a file of yours is where the new job "
                        "writes or another process is using a directory there. A --scaling-dir is never removed")
    p.add_argument("--scaling-dir", default=None,
                   help="take the scaling sweep from this `linlm scaling run --ladder L` directory (L: the recipe's "
                        "ladder; an empty directory starts one there) instead of OUT/scaling; unfinished runs "
                        "there are trained")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a training config key for every training run, e.g. --set data.source=corpus.txt "
                        "(repeatable; checked against the training config before any work)")
    p.add_argument("--train-here", action="store_true",
                   help="torchrun recipes (paper): also train MQAR's models in this process, on a GPU node; "
                        "without it MQAR waits and the report says how to run it")
    p.add_argument("--seeds", type=int, default=None, metavar="N",
                   help="train each architecture of the MossNet comparison N times, with train config seeds 0..N-1 "
                        "past the recipe's own (default: the recipe's compare.seeds; cpu: 3, smoke: 1); the "
                        "comparison's verdicts count a difference only beyond the spread over seeds")
    p.add_argument("--dry-run", action="store_true",
                   help="check everything the real run checks, print its plan (runs still to train, compute in "
                        "PFLOP/s-days, time here or GPU-hours for cluster recipes) and write nothing")
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args) -> int:
    from linlm.reproduce.plan import print_plan

    from linlm.schema import parse_overrides

    overrides = parse_overrides(args.overrides)
    if args.seeds is not None:
        from linlm.reproduce.seeds import seed_count

        seed_count({"seeds": args.seeds}, "--seeds")
    if args.dry_run:
        print_plan(args.recipe, args.out, overrides=overrides, seeds=args.seeds, data_dir=args.data_dir,
                   scaling_dir=args.scaling_dir, resume=args.resume, overwrite=args.overwrite,
                   train_here=args.train_here)
        return 0
    from linlm.reproduce.job import run
    from linlm.train.cli import setup_logging
    from linlm.progress import live_display

    setup_logging()
    say = lambda text: print(f"linlm reproduce: {text}", file=sys.stderr)  # noqa: E731
    try:
        result = run(args.recipe, args.out, data_dir=args.data_dir, resume=args.resume, overwrite=args.overwrite,
                     overrides=overrides, scaling_dir=args.scaling_dir, train_here=args.train_here,
                     live=live_display(), say=say, seeds=args.seeds)
    except KeyboardInterrupt:
        print("linlm reproduce: interrupted; run the same command again to continue from where it stopped",
              file=sys.stderr)
        return 130
    print(f"\nclaims ({args.recipe}):")
    for c in result["claims"]:
        print(f"  {c.verdict:<12} {c.claim}" + (f" ({c.why})" if c.why else ""))
    for name, why in result["waiting"].items():
        print(f"{name}: not run yet: {why}")
    rest = [n for n in result["pending"] if n not in result["waiting"]]
    if rest:
        print(f"not finished: {', '.join(rest)}; run the same command again")
    print(f"report: {result['report']}\n        {result['report'].html}")
    if result["failed"]:  # the report is written, but the job is not done: say so in the exit status too
        print(f"failed sections: {', '.join(result['failed'])} (see errors.log beside the report); fix what it "
              "names and run the same command again to retry them")
        return 2
    return 0
