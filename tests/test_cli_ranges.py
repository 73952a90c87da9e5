"""The range table of the numeric flags: its parsing, and docs/cli-ranges.md written from the parser that uses it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from linlm.cli_ranges import RANGES, Number, NumberList

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli-ranges.md"


def test_the_doc_is_generated_from_the_parser_and_current():
    from linlm.commands.ranges_doc import ranges_doc

    text = ranges_doc()
    assert DOC.read_text(encoding="utf-8") == text, "run: python -m linlm.commands.ranges_doc"
    # one row per numeric flag, with the range the parser enforces
    assert "| `linlm train` | `--steps` | a whole number from 1 to 1e9 | - |" in text
    assert "| `linlm mqar` | `--seeds` | a whole number from 1 to 100; a run per seed | 1 |" in text
    assert "| `linlm data prepare` | `--val-fraction` | a number >= 0 and < 1 | 0.005 |" in text
    assert "| `linlm profile` | `--contexts` | comma-separated, each a whole number from 1 to 1073741824 |" in text


@pytest.mark.parametrize("kind, text, value", [
    (Number(int, 1, 10), "7", 7), (Number(int, 1, 10**9), "1e6", 10**6), (Number(int, 0, 5), " 0 ", 0),
    (Number(float, 0, 1, low_open=True), "1", 1.0), (Number(float, 0, 1, high_open=True), "0", 0.0),
])
def test_a_value_in_range_is_taken(kind, text, value):
    got = kind(text)
    assert got == value and type(got) is kind.kind


@pytest.mark.parametrize("kind, text", [
    (Number(int, 1, 10), "0"), (Number(int, 1, 10), "11"), (Number(int, 1, 10), "1.5"), (Number(int, 1, 10), "x"),
    (Number(int, 1, 10), ""), (Number(float, 0, 1, low_open=True), "0"), (Number(float, 0, 1, high_open=True), "1"),
    (Number(float, 0, None), "inf"), (Number(float, 0, None), "nan"), (Number(int, 0, None), "1e400"),
])
def test_a_value_out_of_range_is_one_argparse_error_naming_range_and_value(kind, text):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        kind(text)
    assert str(e.value) == f"expected {kind.describe()}, got {text.strip()!r}"


def test_a_list_checks_every_item_and_names_the_whole_value():
    kind = NumberList(Number(int, 1, 100))
    assert kind("8, 16,,") == [8, 16]
    with pytest.raises(argparse.ArgumentTypeError, match=r"got '0' in '8,0'"):
        kind("8,0")
    with pytest.raises(argparse.ArgumentTypeError):
        kind(" , ")
    assert NumberList(Number(int, 0, 4), empty_ok=True)("") == []


def test_every_seed_is_one_numpy_takes():
    import numpy as np

    seed = RANGES["seed"]
    np.random.seed(seed.high)  # the largest one in range is accepted
    with pytest.raises(ValueError):
        np.random.seed(seed.high + 1)
    assert seed.check(seed.high + 1) == "too large"
