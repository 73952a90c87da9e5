"""The ``linlm`` command. It parses, calls a library function, and prints.

Mistakes in the input (linlm.errors.LinlmError) print one message without a traceback and exit 2;
anything else is a bug and keeps its traceback (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence


def _add_model_args(p: argparse.ArgumentParser, default_arch: Optional[str] = "llama") -> None:
    from linlm.cli_args import add_overrides

    p.add_argument("--arch", default=default_arch, help="architecture (see `linlm archs`)")
    p.add_argument("--preset", default=None, help="size preset, e.g. paper-70m or tiny")
    add_overrides(p, example="model.overrides.vocab_size=8192")


def _model_config(args):
    """The ModelConfig of --arch, --preset and the model.* overrides (the dialect of `linlm train`)."""
    from linlm.cli_args import override_items
    from linlm.schema import parse_overrides
    from linlm.train.config_sources import build_model_config

    return build_model_config(args.arch, args.preset, parse_overrides(override_items(args)))


def cmd_count(args) -> int:
    from linlm.models.counting import count

    result = count(_model_config(args), batch=args.batch, seq_len=args.seq_len)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    from linlm.render import print_table

    rows = [[k, f"{v:,}" if isinstance(v, int) else (f"{v:.4g}" if isinstance(v, float) else str(v))]
            for k, v in result.items() if k != "config"]
    print_table(["quantity", "value"], rows, title=f"{args.arch} {args.preset or ''}".strip())
    return 0


def cmd_archs(args) -> int:
    from linlm.render import print_table
    from linlm.models.presets import PRESETS
    from linlm.models.registry import ARCHITECTURES

    print_table(["arch", "family", "paper", "description"],
                [[k, s.family, s.paper, s.description] for k, s in ARCHITECTURES.items()], title="architectures")
    print_table(["preset", "shape"], [[k, ", ".join(f"{a}={b}" for a, b in v.items() if a != "per_arch")]
                                      for k, v in PRESETS.items()], title="size presets")
    return 0


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The ``linlm`` parser. With ``command`` (the word a command line starts with) the subsystems register in turn
    only until one has registered it, so that running a command imports no more than its own module's: ``linlm
    generate --lean`` builds its parser without importing torch. Without it (or for an unknown word), all of them."""
    from linlm.cli_args import Parser
    from linlm.cli_ranges import RANGES

    parser = Parser(prog="linlm", description="Linear-complexity language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("count", help="parameters and FLOPs of a model (an architecture at a size preset)")
    _add_model_args(p)
    p.add_argument("--batch-size", "--batch", dest="batch", type=RANGES["batch"], default=480,
                   help="batch size b for flops_per_step (paper: 480; old spelling: --batch)")
    p.add_argument("--seq-len", type=RANGES["tokens"], default=8192, help="sequence length n (paper: 8192)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=cmd_count)

    p = sub.add_parser("archs", help="list architectures and size presets")
    p.set_defaults(func=cmd_archs)

    for module in _subsystem_clis():
        module.register(sub)
        if command is not None and command in sub.choices:
            break
    return parser


def _subsystem_clis():
    """The subsystems' command-line modules, each imported as it is reached."""
    import importlib

    for name in ("linlm.commands.demo", "linlm.data.cli", "linlm.train.cli", "linlm.commands.check", "linlm.infer.cli",
                 "linlm.eval.cli", "linlm.conversion.cli", "linlm.experiments.cli", "linlm.scaling.cli",
                 "linlm.reproduce.cli"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        yield module


def main(argv: Optional[Sequence[str]] = None) -> int:
    from linlm.cli_args import parse_args

    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words and not words[0].startswith("-") else None)
    try:
        args = parse_args(parser, words)
    except SystemExit as e:  # a refused command line (its one line is printed) is exit status 2 like any other
        if e.code in (0, None):  # --help
            raise
        return int(e.code) if isinstance(e.code, int) else 2
    from linlm.runtime import tune_allocator

    tune_allocator()
    _linlm_warnings_on_one_line()
    from linlm.cli_args import exit_status

    return exit_status("linlm", lambda: _run(args))


def _linlm_warnings_on_one_line() -> None:
    """A warning raised from linlm's own code prints as one line, ``linlm: warning: ...``, like its errors;
    other libraries' warnings keep Python's format (file, line and source)."""
    import warnings
    from pathlib import Path

    shown = warnings.showwarning
    if getattr(shown, "linlm", False):
        return
    package = str(Path(__file__).resolve().parent)

    def show(message, category, filename, lineno, file=None, line=None):
        if not str(Path(filename).resolve()).startswith(package):
            return shown(message, category, filename, lineno, file, line)
        print(f"linlm: warning: {message}", file=sys.stderr if file is None else file, flush=True)

    show.linlm = True
    warnings.showwarning = show


def _run(args) -> int:
    """Load the architecture plugins (a refused one stops here, before any work), then run the command."""
    from linlm.models.plugins import load_plugins

    load_plugins()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
