"""``linlm eval``, ``linlm perplexity``, ``linlm niah`` and ``linlm mqar``: parse, call linlm.eval, print."""

from __future__ import annotations

import os

DATA_ENV = "LINLM_EVAL_DATA"


def _add_model(p) -> None:
    p.add_argument("--model", required=True, metavar="DIR",
                   help="a run directory (its newest valid checkpoint), a checkpoint directory, or a model.save() "
                        "directory; the tokenizer is the tokenizer.json beside the weights")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json to use instead of the one beside the weights")
    p.add_argument("--device", default="cpu")


def register(subparsers) -> None:
    from linlm.eval.tasks import GROUPS, TASKS

    p = subparsers.add_parser(
        "eval", help="zero-shot tasks (lm-evaluation-harness conventions): commonsense, LAMBADA",
        description="Score multiple-choice tasks and LAMBADA from local JSON Lines files. Tasks: "
                    f"{', '.join(TASKS)}; groups: {', '.join(GROUPS)}. See docs/evaluation.md.")
    _add_model(p)
    p.add_argument("--tasks", required=True, help="comma-separated tasks or groups, e.g. piqa,hellaswag or commonsense")
    p.add_argument("--data-dir", default=os.environ.get(DATA_ENV),
                   help=f"directory holding the task files (default: ${DATA_ENV})")
    p.add_argument("--limit", type=int, default=None, help="only the first N documents of each task")
    p.add_argument("--batch-size", type=int, default=8, help="contexts per forward pass")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip malformed JSON Lines lines instead of stopping")
    p.add_argument("--naive", action="store_true", help="score each choice in its own full pass (no shared context)")
    p.add_argument("--max-length", type=int, default=None,
                   help="truncate longer inputs from the left (default: the model's limit; none for linear models)")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the results as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)


def _load(args):
    from linlm.infer.generate import load_for_generation
    from linlm.train.cli import setup_logging

    setup_logging()
    return load_for_generation(args.model, tokenizer=args.tokenizer, device=args.device)


def cmd_eval(args) -> int:
    from linlm.errors import ConfigError
    from linlm.eval.evaluator import RESULTS_HEADERS, evaluate, results_rows, write_json
    from linlm.eval.tasks import resolve_tasks
    from linlm.infer.report import print_table

    resolve_tasks(args.tasks)  # an unknown task fails before the model loads
    if not args.data_dir:
        raise ConfigError(f"--data-dir: not given and ${DATA_ENV} is not set; pass the directory holding the task "
                          "JSON Lines files (see docs/evaluation.md for their formats)")
    model, tok = _load(args)
    results = evaluate(model, tok, args.tasks, args.data_dir, limit=args.limit, batch_size=args.batch_size,
                       skip_bad=args.skip_bad_lines, shared=not args.naive,
                       max_length=args.max_length if args.max_length is not None else -1,
                       show_progress=not args.quiet)
    results["model"] = str(args.model)
    print_table(RESULTS_HEADERS, results_rows(results), title=f"zero-shot: {args.model}")
    if args.json:
        print(f"results: {write_json(args.json, results)}")
    return 0
