"""Command-line pieces every ``linlm`` command shares: dotted ``key=value`` overrides, comma-separated lists and
checked numbers.

One override dialect for every command (``linlm train``, ``linlm demo``, ``linlm count``): the keys are the
dotted keys of the training config (docs/training.md), e.g. ``optim.lr=1e-3`` or
``model.overrides.vocab_size=8192``. An override may be given as ``--set KEY=VALUE`` or as a bare
``KEY=VALUE`` word anywhere on the command line, before or after flags (torchrun command lines put them last).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Optional, Sequence, TypeVar

from linlm.schema import is_override

T = TypeVar("T")


class Parser(argparse.ArgumentParser):
    """argparse's parser, except that a mistake on the command line is one line on stderr (exit 2), like every
    other refusal of ``linlm``: ``linlm: error: train: argument --steps: expected ..., got '0' (see `linlm train
    --help`)``, without the usage block. Subcommands' parsers are of this class too (argparse makes them of the
    parent's class)."""

    def error(self, message: str):
        command = self.prog.partition(" ")[2]
        self.exit(2, f"linlm: error: {command + ': ' if command else ''}{message} (see `{self.prog} --help`)\n")


def add_overrides(parser: argparse.ArgumentParser, example: str = "optim.lr=1e-3") -> None:
    """``--set KEY=VALUE`` (repeatable) and bare ``KEY=VALUE`` words; read them with :func:`override_items`."""
    parser.add_argument("--set", dest="set_overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a config key, e.g. --set {example} (repeatable; see docs/training.md)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help=f"more overrides, anywhere on the command line, e.g. {example}")


def override_items(args: argparse.Namespace) -> list[str]:
    """Every override of a parsed command line: the ``--set`` ones first, then the bare words in order."""
    return list(getattr(args, "set_overrides", None) or []) + list(getattr(args, "overrides", None) or [])


def parse_args(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """``parser.parse_args``, except that a ``KEY=VALUE`` word after a flag is an override too (argparse alone
    takes a run of positional words only once, so ``train --steps 5 optim.lr=1`` would be refused).

    Afterwards ``args.overrides`` holds every override (``--set`` ones and bare words) in command-line order, so
    that a later one wins, and ``args.set_overrides`` is empty."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    words = [w for w in extra if is_override(w)]
    unknown = [w for w in extra if not is_override(w)]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not hasattr(args, "overrides"):
        if words:
            parser.error(f"unrecognized arguments: {' '.join(words)} (this command takes no KEY=VALUE overrides)")
        return args
    position: dict[str, int] = {}
    for i, word in enumerate(argv):
        position.setdefault(word.removeprefix("--set="), i)
    items = override_items(args) + words
    args.overrides = sorted(items, key=lambda item: position.get(item, len(argv)))
    args.set_overrides = []
    return args


def comma_list(text: str, flag: str, *, item: Callable[[str], T] = str, what: str = "names",
               example: str = "", minimum: Optional[float] = None, empty_ok: bool = False) -> list[T]:
    """The items of a comma-separated flag value (``--contexts 512,2048``), each stripped and converted by ``item``
    (``int``, ``float``, ``str``); empty items (``a,,b``, a trailing comma) are skipped.

    A ConfigError naming ``flag``, the value and ``example`` refuses an item ``item`` cannot convert, an item below
    ``minimum``, and no item at all unless ``empty_ok``: ``--contexts: expected comma-separated positive integers,
    got '8,abc' (e.g. 512,2048)``. ``what`` names the items in that message."""
    from linlm.errors import ConfigError

    def refuse() -> ConfigError:
        return ConfigError(f"{flag}: expected comma-separated {what}, got {text!r}"
                           + (f" (e.g. {example})" if example else ""))

    try:
        values = [item(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError:
        raise refuse() from None
    if (not values and not empty_ok) or (minimum is not None and any(v < minimum for v in values)):
        raise refuse()
    return values


def comma_lists(values: Optional[list[str]], flag: str, **kwargs) -> Optional[list]:
    """The items of a flag that takes both spellings, ``--archs tnl,llama`` and ``--archs tnl llama`` (an
    ``nargs="*"`` flag, kept where users already pass space-separated names): every value is a comma list
    (:func:`comma_list`, with its checks). None stays None (the flag was not given)."""
    if values is None:
        return None
    return [v for text in values for v in comma_list(text, flag, empty_ok=True, **kwargs)]


def check_numbers(*checks: tuple[str, Optional[float], float, bool]) -> None:
    """Refuse numeric flags out of range, before any work, in one line (a ConfigError naming the flag).

    Each check is ``(flag, value, bound, strict)``: the value must be ``> bound`` when ``strict``, else ``>=
    bound``. None (the flag not given) passes, because no flag's default is spelled 0: a 0 the user typed is a
    value like any other, and never silently "the default"."""
    from linlm.errors import ConfigError

    for flag, value, bound, strict in checks:
        if value is not None and not (value > bound if strict else value >= bound):
            raise ConfigError(f"{flag}: must be {'>' if strict else '>='} {bound:g}, got {value:g}; leave the flag "
                              "out to take its default")


def check_output_files(args: argparse.Namespace, *flags: str) -> None:
    """Refuse, before any work, each single-file output flag given (``--json``, ``--plot``) whose path linlm may
    not write (:func:`linlm.outputs.check_file`: a user's file, a directory, a path under a file, an unwritable
    place), in one line; nothing is written."""
    from linlm import outputs

    for flag in flags:
        path = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if path is not None:
            outputs.check_file(path, flag)


def exit_status(prog: str, fn: Callable[[], Any]) -> int:
    """Run a command's body and turn the outcome into its exit status: its own return value (0 for None); a
    mistake in the input (LinlmError) is one line ``PROG: error: ...`` on stderr and 2, and so is an allocation
    failure that the command's memory estimate let through (linlm.resources: a request too large for this machine,
    not a bug); Ctrl-C is 130. Anything else is a bug and keeps its traceback (Python's exit status 1)."""
    from linlm.errors import LinlmError
    from linlm.resources import is_out_of_memory, out_of_memory_message

    try:
        return int(fn() or 0)
    except LinlmError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:
        if not is_out_of_memory(e):
            raise
        print(f"{prog}: error: {out_of_memory_message(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
