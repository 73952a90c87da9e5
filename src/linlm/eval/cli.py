"""``linlm eval``, ``linlm perplexity`` and ``linlm niah``: parse, call linlm.eval, print."""

from __future__ import annotations

import os
import sys

from linlm.cli_ranges import RANGES, Grid

DATA_ENV = "LINLM_EVAL_DATA"
OUTPUT_RULE = "a new file, or one linlm wrote; checked before the model loads"


def _text_command(subparsers, name: str, *, help: str, description: str, source: str, source_help: str,
                  source_default: str | None, modes: tuple, mode_help: str, json_help: str, func):
    """The parser of a command that runs a model over a text source (perplexity, niah): its help and description,
    the model flags, the source (any `linlm data` source) and its record field, --mode, --batch-size, --json OUT
    and the function it runs. The caller adds the flags of its own."""
    p = subparsers.add_parser(name, help=help, description=description)
    _add_model(p)
    p.add_argument(source, required=source_default is None, default=source_default, help=source_help)
    p.add_argument("--text-field", default="text", help="field holding the text in JSON Lines / Parquet records")
    p.add_argument("--mode", choices=modes[0], default=modes[1], help=mode_help)
    p.add_argument("--batch-size", type=RANGES["batch"], default=4, help="documents (or windows, or needles) per pass")
    p.add_argument("--json", default=None, metavar="OUT", help=f"{json_help} ({OUTPUT_RULE})")
    p.set_defaults(func=func)
    return p


def _source_and_model(args, source: str):
    """The command's text source, opened, then the model and its tokenizer (after every check)."""
    from linlm.data.sources import open_source

    text = open_source(getattr(args, source), text_field=args.text_field)
    text.check_reachable()  # before the model loads: an unreachable hub is refused at once
    return text, *_load(args)


def _add_model(p, required: bool = True) -> None:
    p.add_argument("--model", required=required, metavar="DIR",
                   help="a run directory (its newest valid checkpoint), a checkpoint directory, or a model.save() "
                        "directory; the tokenizer is the one beside the weights (linlm's or transformers')")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (or its directory) to use instead of the one "
                                                     "beside the weights")
    p.add_argument("--device", default="cpu")


def register(subparsers) -> None:
    from linlm.eval.tasks import GROUPS, TASKS

    p = subparsers.add_parser(
        "eval", help="zero-shot tasks (lm-evaluation-harness conventions): commonsense, LAMBADA, WikiText-2; "
                     "SCROLLS and the recall tasks through lm-eval",
        description="Score multiple-choice tasks and LAMBADA. Tasks: "
                    f"{', '.join(TASKS)}; groups: {', '.join(GROUPS)}; through lm-evaluation-harness' own tasks: scrolls "
                    "(its 7 subtasks), recall (swde, fda, squad_completion and RULER's niah_single_1, niah_multikey_2, "
                    "niah_multikey_3) and ruler_niah (RULER's 8 NIAH variants), each also by name. Without --data-dir each task comes from the "
                    "dataset hub as lm-evaluation-harness defines it, converted once into linlm's cache; `linlm "
                    "eval fetch` writes the same files for a machine without network. See docs/evaluation.md.")
    _add_model(p, required=False)  # required unless `fetch`: checked in cmd_eval
    p.add_argument("--tasks", default=None, help="comma-separated tasks or groups, e.g. piqa,hellaswag or commonsense")
    p.add_argument("--data-dir", default=os.environ.get(DATA_ENV),
                   help=f"directory holding the task files (default: ${DATA_ENV}, else the task cache, filled from "
                        "the dataset hub)")
    p.add_argument("--limit", type=RANGES["limit"], default=None, help="only the first N documents of each task")
    p.add_argument("--batch-size", type=RANGES["batch"], default=16, help="contexts per prefill (their continuations run 2 x this many rows to a forward)")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip malformed JSON Lines lines instead of stopping")
    p.add_argument("--naive", action="store_true", help="score each choice in its own full pass (no shared context)")
    p.add_argument("--max-length", type=RANGES["tokens"], default=None,
                   help="truncate longer inputs from the left (default: the model's limit; none for linear models); "
                        "for scrolls and recall, the context cut (as the paper cut to each model's training context); "
                        "for RULER's NIAH, the length its prompts are made for (default 4096)")
    p.add_argument("--json", default=None, metavar="OUT", help=f"also write the results as JSON to OUT ({OUTPUT_RULE})")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)
    fetch = p.add_subparsers(dest="eval_command", metavar="fetch", required=False).add_parser(
        "fetch", help="write the standard tasks' files into a directory, for `linlm eval --data-dir`",
        description="Get each task from the dataset hub (or linlm's cache) as lm-evaluation-harness defines it and "
                    "write linlm's task files into --out, for a machine without network: `linlm eval --data-dir "
                    "OUT` reads them. See docs/evaluation.md.")
    fetch.add_argument("--tasks", required=True, help="comma-separated tasks or groups, e.g. commonsense,lambada")
    fetch.add_argument("--out", required=True, metavar="DIR",
                       help="directory for the task files (new, empty, or one linlm wrote into)")
    fetch.set_defaults(func=cmd_fetch)
    register_perplexity(subparsers)
    register_niah(subparsers)
    register_lm_eval_hook(subparsers)


def _fetched(name, path, n: int, stream=None) -> None:
    """Say a task's file was written (``linlm eval`` says it on stderr: its stdout is the results table)."""
    print(f"{name}: {n} documents -> {path}", file=stream, flush=True)


def cmd_fetch(args) -> int:
    from linlm.eval.hub import fetch

    paths = fetch(args.tasks, args.out, progress=_fetched)
    print(f"use them with: linlm eval --data-dir {args.out} --tasks {','.join(paths)} --model DIR")
    return 0


def _json_lock(args):
    """Held from the checks to the write: a second command writing the same --json file is refused (one of the two
    results would otherwise be lost); without --json, nothing."""
    import contextlib

    if args.json is None:
        return contextlib.nullcontext()
    from linlm.data.corpus import cache_dir
    from linlm.locking import FileLock

    return FileLock(args.json, "--json", cache_dir())


def _write_json(args, obj: dict, fmt: str) -> int:
    """Write the results to --json OUT when given (never over a file linlm did not write); exit status 0."""
    if args.json is not None:
        from linlm.eval.evaluator import write_json

        print(f"results: {write_json(args.json, obj, fmt, '--json')}")
    return 0


def _load(args):
    from linlm.infer.generate import load_for_generation
    from linlm.train.cli import setup_logging

    setup_logging()
    return load_for_generation(args.model, tokenizer=args.tokenizer, device=args.device)


def cmd_eval(args) -> int:
    from linlm.cli_args import check_numbers, check_output_files
    from linlm.errors import ConfigError
    from linlm.eval.tasks import resolve_tasks

    # Every check that can refuse runs before the model loads: a mistake costs nothing.
    for flag, value in (("--model", args.model), ("--tasks", args.tasks)):
        if value is None:
            raise ConfigError(f"{flag}: required (`linlm eval --model DIR --tasks piqa,hellaswag`; `linlm eval "
                              "fetch --tasks ... --out DIR` only writes the task files)")
    from linlm.cli_args import comma_list
    from linlm.eval.long_tasks import split_tasks

    own, long = split_tasks(comma_list(args.tasks, "--tasks", empty_ok=True))
    if own or not long:
        resolve_tasks(own)
    check_numbers(("--limit", args.limit, 1, False), ("--batch-size", args.batch_size, 1, False),
                  ("--max-length", args.max_length, 1, False))
    check_output_files(args, "--json")
    with _json_lock(args):
        return _eval(args, own, long)


def _eval(args, own: list[str], long: list[str]) -> int:
    from linlm.eval.evaluator import RESULTS_HEADERS, evaluate, results_rows
    from linlm.eval.hub import task_dir
    from linlm.render import print_table

    data_dir = task_dir(own, args.data_dir, progress=lambda *a: _fetched(*a, stream=sys.stderr)) if own else None
    model, tok = _load(args)
    results = {"format": "linlm-eval", "tasks": {}}
    if own:
        results = evaluate(model, tok, own, data_dir, limit=args.limit, batch_size=args.batch_size,
                           skip_bad=args.skip_bad_lines, shared=not args.naive,
                           max_length=args.max_length if args.max_length is not None else -1,
                           show_progress=not args.quiet)
        print_table(RESULTS_HEADERS, results_rows(results), title=f"zero-shot: {args.model}")
    if long:
        from linlm.eval.long_tasks import run_long_tasks

        res = run_long_tasks(model, tok, long, limit=args.limit, max_context=args.max_length,
                             batch_size=args.batch_size)
        rows = [[name, ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in d.items()
                             if k != "n"), str(d["n"])]
                for name, d in res["tasks"].items()]
        if res["scrolls_avg"] is not None:
            rows.append(["scrolls avg (13 metrics)", f"{res['scrolls_avg']:.2f}", "-"])
        print_table(["task", "lm-eval metrics", "n"], rows, title=f"long-context (lm-eval): {args.model}")
        c = res["cut"]
        print(f"context cut: {c['cut']} of {c['requests']} requests cut from the left to {c['window']} tokens "
              f"(longest input {c['longest_input']})" if c["window"] else
              "context cut: none (no --max-length and no position limit: whole inputs through the state)")
        results["long_tasks"] = res
    results["model"] = str(args.model)
    return _write_json(args, results, "linlm-eval")


def register_lm_eval_hook(subparsers) -> None:
    p = subparsers.add_parser(
        "lm-eval-hook", help="let lm-evaluation-harness' own `lm_eval --model linlm` find linlm (opt-in)",
        description="install: write a .pth file into this environment's site-packages so that the `lm_eval` "
                    "command sees the model `linlm` (linlm is imported only when that model is asked for); "
                    "remove: delete it; status: say whether it is there. See docs/evaluation.md.")
    p.add_argument("action", choices=["install", "remove", "status"])
    p.add_argument("--site-dir", default=None,
                   help="the site-packages directory to use (default: the running environment's)")
    p.set_defaults(func=cmd_lm_eval_hook)


def cmd_lm_eval_hook(args) -> int:
    from linlm.eval import lm_eval_hook as hook

    if args.action == "install":
        print(f"installed: {hook.install(args.site_dir)}; `lm_eval --model linlm --model_args pretrained=DIR` "
              "now works in this environment (`linlm lm-eval-hook remove` undoes it)")
    elif args.action == "remove":
        path = hook.remove(args.site_dir)
        print(f"removed: {path}" if path else f"not installed: no {hook.pth_path(args.site_dir)}")
    else:
        state = "installed" if hook.installed(args.site_dir) else "not installed"
        print(f"{state}: {hook.pth_path(args.site_dir)}")
    return 0


def register_perplexity(subparsers) -> None:
    from linlm.eval.perplexity import MODES

    p = _text_command(
        subparsers, "perplexity", help="perplexity and bits per byte of a model on any text source",
        description="Score the documents of a text source (a file, directory, glob, JSON Lines, Parquet, "
                    "'shakespeare' or hf:NAME[:CONFIG][@SPLIT]) and print token perplexity, bits per byte and word "
                    "perplexity. See docs/evaluation.md.",
        source="--source", source_help="text source spec (as for `linlm data prepare`), or wikitext2: WikiText-2's "
                                       "test documents scored as lm-eval's wikitext task (word and byte perplexity, "
                                       "bits per byte)", source_default=None,
        modes=(MODES, "auto"), mode_help="stateful: whole documents through the recurrent state; sliding: windows; "
                                         "auto: stateful unless the model has a position limit (LLaMA)",
        json_help="also write the result as JSON to OUT", func=cmd_perplexity)
    p.add_argument("--window", type=RANGES["tokens"], default=None,
                   help="sliding window length, >= 1 (default: max_seq_len or 2048)")
    p.add_argument("--stride", type=RANGES["tokens"], default=None,
                   help="sliding window stride, 1 to --window (default: window / 2)")
    p.add_argument("--chunk", type=RANGES["tokens"], default=2048, help="tokens per forward pass in the stateful mode")
    p.add_argument("--max-docs", type=RANGES["limit"], default=None)
    p.add_argument("--max-tokens", type=RANGES["limit"], default=None, help="stop once this many tokens were scored")
    p.add_argument("--data-dir", default=os.environ.get(DATA_ENV),
                   help=f"with --source wikitext2: the directory holding wikitext2.jsonl (default: ${DATA_ENV}, else "
                        "the task cache, filled from the dataset hub; `linlm eval fetch --tasks wikitext2`)")


def cmd_perplexity(args) -> int:
    from linlm.cli_args import check_numbers, check_output_files

    check_numbers(*((flag, getattr(args, flag[2:].replace("-", "_")), 1, False)
                    for flag in ("--window", "--stride", "--chunk", "--batch-size", "--max-docs", "--max-tokens")))
    check_output_files(args, "--json")
    with _json_lock(args):
        return _wikitext_perplexity(args) if args.source == WIKITEXT else _perplexity(args)


def _perplexity(args) -> int:
    from linlm.eval.perplexity import perplexity
    from linlm.render import print_table

    source, model, tok = _source_and_model(args, "source")
    res = perplexity(model, tok, source, mode=args.mode, window=args.window, stride=args.stride, chunk=args.chunk,
                     batch_size=args.batch_size, max_docs=args.max_docs, max_tokens=args.max_tokens)
    d = res.to_dict()
    rows = [[k, f"{v:.4f}" if isinstance(v, float) else str(v)] for k, v in d.items()]
    print_table(["quantity", "value"], rows, title=f"perplexity: {args.source}")
    return _write_json(args, {"model": str(args.model), "source": args.source, **d}, "linlm-perplexity")


WIKITEXT = "wikitext2"  # the --source of `linlm perplexity` that names the task, not a file


def _wikitext_perplexity(args) -> int:
    """``linlm perplexity --source wikitext2``: the WikiText-2 test documents, scored and counted as
    lm-evaluation-harness' ``wikitext`` task (linlm.eval.tasks, rolling kind)."""
    from linlm.errors import ConfigError
    from linlm.eval.evaluator import evaluate
    from linlm.eval.hub import task_dir
    from linlm.render import print_table

    given = [flag for flag, value, default in (("--mode", args.mode, "auto"), ("--window", args.window, None),
                                               ("--stride", args.stride, None), ("--max-tokens", args.max_tokens, None))
             if value != default]
    if given:
        raise ConfigError(f"{', '.join(given)}: not taken with --source {WIKITEXT}, which scores each whole "
                          "document as lm-eval's wikitext task does (through the state, or windows of the model's "
                          "max_seq_len); leave them out, or give a text source to use them")
    data_dir = task_dir([WIKITEXT], args.data_dir, progress=lambda *a: _fetched(*a, stream=sys.stderr))
    model, tok = _load(args)
    res = evaluate(model, tok, [WIKITEXT], data_dir, limit=args.max_docs)["tasks"][WIKITEXT]
    keys = ("word_perplexity", "byte_perplexity", "bits_per_byte", "n", "words", "bytes", "max_length")
    print_table(["quantity", "value"], [[k, f"{res[k]:.4f}" if isinstance(res[k], float) else str(res[k])]
                                        for k in keys], title="perplexity: WikiText-2 (lm-eval's wikitext)")
    return _write_json(args, {"model": str(args.model), "source": WIKITEXT, **res}, "linlm-perplexity")


def register_niah(subparsers) -> None:
    from linlm.eval.niah import ALPHABETS, MODES, SCORINGS

    p = _text_command(
        subparsers, "niah", help="needle in a haystack: accuracy over a grid of context lengths x needle depths",
        description="Insert a needle (a magic number) at each depth of a haystack cut to each context length, ask "
                    "for it, score greedy answers; print the mean and weighted accuracy, write JSON and a heatmap. "
                    "See docs/evaluation.md for the weights.",
        source="--haystack", source_help="text source for the haystack (any `linlm data` source)",
        source_default="shakespeare", modes=(MODES, "standard"),
        mode_help="standard: the needle states the number; easy: it also holds the question",
        json_help="write the grid and the scores as JSON", func=cmd_niah)
    p.add_argument("--lengths", type=Grid(RANGES["context"], spacings=("linear", "geometric")),
                   default="1000:16000:35",
                   help="context lengths: a list, LO:HI:N (equal steps, the paper's grid) or LO:HI:N:geometric")
    p.add_argument("--depths", type=Grid(RANGES["percent"]), default="0:100:35",
                   help="needle depths in percent: a list or LO:HI:N (linear)")
    p.add_argument("--trials", type=RANGES["trials"], default=1, help="needles per cell")
    p.add_argument("--seed", type=RANGES["seed"], default=0)
    p.add_argument("--length-ratio", type=RANGES["ratio"], default=4.0, help="weight of the longest length / the shortest")
    p.add_argument("--depth-ratio", type=RANGES["ratio"], default=2.0, help="weight of the deepest needle / the shallowest")
    p.add_argument("--scoring", choices=SCORINGS, default="greedy",
                   help="greedy: the answer must be the value exactly; choice: the value ranked first among "
                        "--candidates by log-likelihood (chance 1/candidates: small models can be told apart)")
    p.add_argument("--candidates", type=RANGES["candidates"], default=4, help="values ranked per needle with --scoring choice")
    p.add_argument("--alphabet", choices=list(ALPHABETS), default="digits", help="the characters of the value")
    p.add_argument("--value-length", type=RANGES["value_length"], default=7, help="characters of the needle's value")
    p.add_argument("--plot", default=None, metavar="PNG", help=f"a heatmap of the grid as a PNG file ({OUTPUT_RULE})")


def cmd_niah(args) -> int:
    from linlm.cli_args import check_numbers, check_output_files
    from linlm.eval.niah import NIAHConfig, parse_grid

    cfg = NIAHConfig(lengths=[int(x) for x in parse_grid(args.lengths, "lengths")],
                     depths=parse_grid(args.depths, "depths"), mode=args.mode, trials=args.trials, seed=args.seed,
                     length_ratio=args.length_ratio, depth_ratio=args.depth_ratio, scoring=args.scoring,
                     candidates=args.candidates, alphabet=args.alphabet, value_length=args.value_length).validate()
    check_numbers(("--batch-size", args.batch_size, 1, False))
    check_output_files(args, "--json", "--plot")
    with _json_lock(args):
        return _niah(args, cfg)


def _niah(args, cfg) -> int:
    from linlm.eval.niah import check_niah_memory, plot_heatmap, run_niah
    from linlm.eval.niah_scores import accuracy_at_bounds

    source, model, tok = _source_and_model(args, "haystack")
    check_niah_memory(model, cfg, args.batch_size)
    res = run_niah(model, tok, source, cfg, batch_size=args.batch_size)
    res.update(model=str(args.model), haystack=args.haystack)
    print(f"NIAH {res['mode']}: mean accuracy {res['mean']:.4f}, weighted {res['weighted']:.4f}, score "
          f"{res['score']:.4f} over {len(res['lengths'])} lengths x {len(res['depths'])} depths (chance "
          f"{res['chance']:.4f})")
    print("accuracy at or below: " + ", ".join(f"{b} tokens {v:.4f}" for b, v in accuracy_at_bounds(res).items()))
    if res["skipped_lengths"]:
        print(f"skipped lengths beyond the model's limit: {res['skipped_lengths']}")
    if args.plot is not None:
        print(f"heatmap: {plot_heatmap(res, args.plot, what='--plot')}")
    return _write_json(args, res, "linlm-niah")
