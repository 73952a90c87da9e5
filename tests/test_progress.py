"""The one progress display: a bar on stderr only on a terminal (or when asked), its columns, and plain lines."""

from __future__ import annotations

import io

import pytest

from linlm.progress import ProgressBar, format_duration, live_display


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_display_only_on_an_interactive_terminal_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setattr("sys.stderr", _Terminal())
    assert live_display()
    monkeypatch.setenv("TERM", "dumb")
    assert not live_display()
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("CI", "1")
    assert not live_display()
    monkeypatch.delenv("CI")
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert not live_display()


def test_off_a_terminal_the_bar_is_off_and_lines_go_to_stdout(capsys):
    bar = ProgressBar("train", 10)  # pytest's stderr is no terminal
    assert not bar.active
    bar.update(3, info="loss 1.0")
    bar.update(advance=2)
    bar.print("step 5/10 | loss 1.0")
    bar.close()
    out = capsys.readouterr()
    assert out.out == "step 5/10 | loss 1.0\n" and out.err == ""


def test_asked_off_the_bar_is_off_even_on_a_terminal(monkeypatch, capsys):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setattr("sys.stderr", _Terminal())
    assert live_display() and not ProgressBar("x", 3, enabled=False).active


def test_count_columns_and_the_description(capsys):
    with ProgressBar("train", 10, completed=2, eta_label="eta", transient=False, enabled=True) as bar:
        assert bar.active
        bar.update(7, info="loss 1.234 [bold]raw[/bold]")  # shown as it is, not read as markup
    out = capsys.readouterr()
    assert out.out == ""
    for text in ("train", "7/10", "loss 1.234 [bold]raw[/bold]", "eta"):
        assert text in out.err, (text, out.err)


@pytest.mark.parametrize("kw, update, expected", [
    (dict(label="scaling", total=200.0, count="percent", percent_suffix=" of compute", eta="given"),
     dict(completed=50.0, info="[1/3] llama-xs", left="about 2m left"), ["scaling", "25% of compute", "[1/3] llama-xs",
                                                                          "about 2m left"]),
    (dict(label="tokenising corpus", total=None, count="bytes", eta=None), dict(completed=2_000_000),
     ["tokenising corpus", "2.0", "MB"]),
    (dict(label="piqa", total=8, elapsed=False), dict(advance=3), ["piqa", "3/8"]),
])
def test_each_kind_of_bar_shows_its_columns(capsys, kw, update, expected):
    with ProgressBar(transient=False, enabled=True, **kw) as bar:
        bar.update(**update)
    err = capsys.readouterr().err
    for text in expected:
        assert text in err, (text, err)


def test_a_line_printed_over_a_live_bar_goes_to_stderr_above_it(capsys):
    with ProgressBar("train", 4, enabled=True) as bar:
        bar.print("step 2/4 | loss 3.0 [x]")
    out = capsys.readouterr()
    assert out.out == "" and "step 2/4 | loss 3.0 [x]" in out.err


def test_a_transient_bar_leaves_nothing_behind_off_a_terminal(capsys):
    with ProgressBar("train", 4, enabled=True) as bar:
        bar.update(2)
    assert "2/4" not in capsys.readouterr().err


def test_bad_columns_are_refused():
    with pytest.raises(ValueError, match="count"):
        ProgressBar("x", 1, count="lines", enabled=False)
    with pytest.raises(ValueError, match="eta"):
        ProgressBar("x", 1, eta="guess", enabled=False)


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (42.9, "42s"), (187, "3m07s"), (7500, "2h05m"), (-3, "0s")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
