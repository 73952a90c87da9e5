"""The range of every numeric command-line flag: one table, read by the parsers, the docs and the tests.

Each numeric flag of ``linlm`` takes a :class:`Number` from :data:`RANGES` as its argparse ``type`` (or a
:class:`NumberList` for a comma-separated list), so that a value out of range, not a number, or not finite is refused
by the parser itself, in one line, before anything is imported or read::

    linlm: error: train: argument --steps: expected a whole number from 1 to 1e9, got 0

The bounds are what the command can honour, not a matter of taste:

- a count of work (steps, seeds, resamples) stops where the work would take years on any machine, so that a typo
  such as ``--seeds 1000000`` is refused at once instead of planning a million runs;
- a seed stops at 2**32 - 1, the largest seed numpy's generator (and so every linlm data stream) takes;
- a size that allocates memory (a batch, a context, a width) has a generous bound here; whether it fits the
  machine is decided by the command's memory estimate (:mod:`linlm.resources`), which names the estimate and what
  is available.

docs/cli-ranges.md is written from the parser by :func:`ranges_markdown` (``python -m linlm.commands.ranges_doc``),
and a test checks that it is current.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Iterator, Optional

_INT = "a whole number"
_FLOAT = "a number"


def _shown(value: float) -> str:
    """A bound as the docs and messages write it: 1000000000 -> 1e9, 4294967295 and 0.5 as they are."""
    if float(value).is_integer() and abs(value) < 1e18:
        value = int(value)
        exp = len(str(value)) - 1 if value > 0 else 0
        return f"1e{exp}" if value >= 10**6 and value == 10**exp else str(value)
    return f"{value:g}"


@dataclass(frozen=True)
class Number:
    """A numeric flag's argparse ``type`` and its documented range: ``kind`` (int or float) from ``low`` to
    ``high`` (either None: unbounded on that side), ``low_open`` / ``high_open``: that bound itself excluded. ``note`` says
    what a special value means ("0 is greedy"). Calling it parses a command-line word: a non-number, a non-finite
    number or one outside the range raises argparse.ArgumentTypeError (one line)."""

    kind: type
    low: Optional[float]
    high: Optional[float]
    low_open: bool = False
    note: str = ""
    high_open: bool = False

    @property
    def __name__(self) -> str:  # argparse names the type in some messages
        return "integer" if self.kind is int else "number"

    def describe(self) -> str:
        what = _INT if self.kind is int else _FLOAT
        low = f"{'>' if self.low_open else '>='} {_shown(self.low)}" if self.low is not None else ""
        high = f"{'<' if self.high_open else '<='} {_shown(self.high)}" if self.high is not None else ""
        if low and high and not (self.low_open or self.high_open):
            return f"{what} from {_shown(self.low)} to {_shown(self.high)}"
        return " ".join([what, " and ".join(b for b in (low, high) if b)]).strip()

    def check(self, value) -> Optional[str]:
        """Why ``value`` is out of range (None: it is in range)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return "not a finite number"
        if self.kind is int and not float(value).is_integer():
            return "not a whole number"
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return "too small"
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return "too large"
        return None

    def parse(self, text: str):
        """The value of a command-line word, or ValueError naming what was expected."""
        word = str(text).strip()
        try:
            value = int(word) if self.kind is int else float(word)
        except ValueError:
            try:  # 1e6 for a whole number is fine; 1.5 is not
                value = float(word)
            except ValueError:
                value = None
            if self.kind is int and value is not None and math.isfinite(value) and value.is_integer():
                value = int(value)
            elif self.kind is int:
                value = None
        if value is None or self.check(value) is not None:
            raise ValueError(f"expected {self.describe()}{f' ({self.note})' if self.note else ''}, got {word!r}")
        return value

    def __call__(self, text: str):
        try:
            return self.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None


@dataclass(frozen=True)
class NumberList:
    """A comma-separated list of numbers in ``item``'s range (``--contexts 512,2048``): argparse ``type`` giving a
    list; empty items are skipped, and an empty list is refused unless ``empty_ok``."""

    item: Number
    empty_ok: bool = False

    @property
    def __name__(self) -> str:
        return "list"

    def describe(self) -> str:
        return f"comma-separated, each {self.item.describe()}"

    def __call__(self, text: str) -> list:
        parts = [p.strip() for p in str(text).split(",") if p.strip()]
        if not parts and not self.empty_ok:
            raise argparse.ArgumentTypeError(f"expected {self.describe()}, got {text!r}")
        try:
            return [self.item.parse(p) for p in parts]
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{e} in {text!r}") from None


@dataclass(frozen=True)
class Grid(NumberList):
    """A grid of numbers: a comma-separated list of ``item``s, or ``LO:HI:N`` (N points from LO to HI, each end an
    ``item``, N in ``count``'s range), optionally ``LO:HI:N:SPACING`` with SPACING one of ``spacings``. Checked here
    and returned as written; the command spaces the points (``linlm niah --lengths 1000:16000:35``)."""

    count: Number = Number(int, 1, 10**4)
    spacings: tuple[str, ...] = ()

    def describe(self) -> str:
        extra = f" (or LO:HI:N:{'|'.join(self.spacings)})" if self.spacings else ""
        return f"{NumberList.describe(self)}, or LO:HI:N{extra} with N {self.count.describe()[len(_INT) + 1:]}"

    def __call__(self, text: str) -> str:
        parts = str(text).split(":")
        if len(parts) == 1:
            NumberList.__call__(self, text)
            return str(text)
        if len(parts) not in ((3, 4) if self.spacings else (3,)) or (len(parts) == 4 and parts[3] not in self.spacings):
            raise argparse.ArgumentTypeError(f"expected {self.describe()}, got {text!r}")
        try:
            for p in parts[:2]:
                self.item.parse(p)
            self.count.parse(parts[2])
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{e} in {text!r}") from None
        return str(text)


SEED_MAX = 2**32 - 1  # numpy's RandomState takes seeds below 2**32
BIG = 10**9  # a count of work or a size: beyond it a command would run for years, or need terabytes
HUGE = 10**15  # a limit that only stops early (documents, tokens): any value is honoured

# name -> range. The parsers name these (``type=RANGES["steps"]``); docs/cli-ranges.md lists them per flag.
RANGES: dict[str, Number] = {
    "steps": Number(int, 1, BIG),
    "seed": Number(int, 0, SEED_MAX),
    "seeds": Number(int, 1, 100, note="a run per seed"),
    "batch": Number(int, 1, 2**20),
    "micro_batches": Number(int, 1, 2**20),
    "tokens": Number(int, 1, 2**30),
    "new_tokens": Number(int, 0, 2**20),
    "decode_tokens": Number(int, 1, 2**20),
    "lr": Number(float, 0, 10**4, low_open=True),
    "threads": Number(int, 1, 4096),
    "jobs": Number(int, 1, 4096),
    "workers": Number(int, 1, 4096),
    "port": Number(int, 1, 65535),
    "requests": Number(int, 1, 4096),
    "fraction": Number(float, 0, 1, high_open=True),
    "temperature": Number(float, 0, 1000, note="0 is greedy"),
    "top_k": Number(int, 0, 2**31 - 1, note="0 keeps every token"),
    "top_p": Number(float, 0, 1, low_open=True, note="1 keeps every token"),
    "checks": Number(int, 0, 10**6, note="0: no check"),
    "tolerance": Number(float, 0, 10**6, low_open=True),
    "limit": Number(int, 1, HUGE),
    "trials": Number(int, 1, 10**6),
    "ratio": Number(float, 0, 10**6, low_open=True),
    "candidates": Number(int, 2, 10**6),
    "value_length": Number(int, 1, 12),
    "vocab": Number(int, 1, 2**24),
    "pairs": Number(int, 1, 2**20),
    "layers": Number(int, 1, 4096),
    "attn_every": Number(int, 0, 4096, note="0: no attention layers"),
    "width": Number(int, 1, 2**20),
    "resamples": Number(int, 0, 10**6, note="0: no intervals"),
    "fit_resamples": Number(int, 0, 10**5, note="0: no intervals"),
    "smooth": Number(int, 1, 10**4),
    "flops": Number(float, 0, 1e24, low_open=True),
    "experts": Number(int, 0, 1024, note="0 alone: no MossNet runs"),
    "chars": Number(int, 1, 2**30),
    "eval_tokens": Number(int, 2, HUGE),
    "context": Number(int, 16, 2**30),  # niah: a needle and its question need 16 tokens
    "percent": Number(float, 0, 100),
}


def number(name: str) -> Number:
    return RANGES[name]


def numeric_type(action: argparse.Action) -> Optional[Number | NumberList]:
    """The range of an argparse action, or None when it takes no number."""
    return action.type if isinstance(action.type, (Number, NumberList)) else None


def numeric_flags(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> \
        Iterator[tuple[tuple[str, ...], argparse.Action]]:
    """(command words, action) of every optional flag of ``parser`` and its subcommands whose type is numeric: a
    :class:`Number`, a :class:`NumberList`, or plain ``int`` / ``float`` (which the tests refuse: every numeric flag
    must have a range)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if sub.prog.split()[-1] == name:  # each parser once, under its own name (not its aliases)
                    yield from numeric_flags(sub, prefix + (name,))
        elif action.option_strings and (numeric_type(action) is not None or action.type in (int, float)):
            yield prefix, action


def ranges_markdown(parser: argparse.ArgumentParser) -> str:
    """docs/cli-ranges.md: per command, each numeric flag's range and default, from the parser's own types."""
    lines = ["# Ranges of the numeric flags", "",
             "Generated by `python -m linlm.commands.ranges_doc` from the types the `linlm` parser uses "
             "(`linlm/cli_ranges.py`); a test checks that it is current. A value outside its range, not a number, "
             "or not finite is refused by the parser in one line (exit 2) before any work. A size that allocates "
             "memory is further checked against this machine's memory before any work (the refusal names the "
             "estimate and what is available).", "",
             "| command | flag | range | default |", "| --- | --- | --- | --- |"]
    for words, action in numeric_flags(parser):
        kind = numeric_type(action)
        text = kind.describe() if kind is not None else "UNBOUNDED"
        note = getattr(getattr(kind, "item", kind), "note", "")
        default = "-" if action.default is None else (
            ",".join(map(str, action.default)) if isinstance(action.default, list) else str(action.default))
        lines.append(f"| `linlm {' '.join(words)}` | `{'`, `'.join(action.option_strings)}` | {text}"
                     f"{f'; {note}' if note else ''} | {default} |")
    return "\n".join(lines) + "\n"

