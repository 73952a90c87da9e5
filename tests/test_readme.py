"""The README's quickstart and Python API run as written, and its results quote their generated pages.

The quickstart block is found by its marker comment and run command by command, in order, in one temporary
directory, through linlm's own command-line entry point (the parser every user meets: a renamed flag fails here).
Only sizes are changed, by the exact substitutions of TINY; each must be found in the block, so an edited README
fails here until the table follows it. Then the API block runs in the same directory (it trains on the data the
quickstart prepared).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# README text -> the tiny version the test runs. The corpus is a small generated text (conftest's text_file):
# tokenising the built-in one takes longer than this whole test; held out at a larger fraction, as it is short.
TINY_COMMANDS = {
    "--source shakespeare --tokenizer": "--source {text} --val-fraction 0.1 --tokenizer",
    "--steps 400": "--steps 2",
    "--source shakespeare --max-tokens 50000": "--source {text} --max-tokens 256",
    "--max-new-tokens 80": "--max-new-tokens 8",
    "--preset paper-70m --contexts 512,2048": "--preset tiny --contexts 32,64",
}
TINY_API = {'"steps": 50': '"steps": 2'}


def fenced_block(marker: str, lang: str) -> str:
    """The first ```lang block after the HTML comment that starts with `<!-- marker`."""
    text = README.read_text(encoding="utf-8")
    at = text.find(f"<!-- {marker}")
    assert at >= 0, f"README.md has no <!-- {marker} ... --> marker"
    m = re.compile(rf"```{lang}\n(.*?)```", re.S).search(text, at)
    assert m, f"no ```{lang} block after the {marker} marker"
    return m.group(1)


def shrink(block: str, table: dict, **fmt) -> str:
    for readme, tiny in table.items():
        assert readme in block, f"the doc no longer says {readme!r}: update the test's table"
        block = block.replace(readme, tiny.format(**fmt))
    return block


def commands(block: str) -> list[list[str]]:
    """Each command line of a bash block (comments and blank lines dropped, continuations joined)."""
    lines = block.replace("\\\n", " ").splitlines()
    return [shlex.split(ln, comments=True) for ln in lines if shlex.split(ln, comments=True)]


def test_quickstart_and_api_run_as_written(tmp_path, monkeypatch, text_file, capsys):
    from linlm.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cmds = commands(shrink(fenced_block("quickstart", "bash"), TINY_COMMANDS, text=str(text_file)))
    assert [c[:2] for c in cmds] == [["linlm", "data"], ["linlm", "train"], ["linlm", "perplexity"],
                                     ["linlm", "generate"], ["linlm", "profile"]]
    for argv in cmds:
        assert main(argv[1:]) == 0, f"`{shlex.join(argv)}` failed"
    out = capsys.readouterr().out
    assert "bits_per_byte" in out and "ROMEO:" in out
    assert (tmp_path / "runs/quick/summary.json").is_file() and (tmp_path / "runs/profile.json").is_file()

    code = shrink(fenced_block("api", "python"), TINY_API)
    scope: dict = {}
    exec(compile(code, "README.md (Python API)", "exec"), scope)
    assert scope["result"].finished and (tmp_path / "runs/api/summary.json").is_file()
    assert scope["logits"].shape[:2] == (2, 64) and scope["same"].config == scope["model"].config
    assert "bytes of state, whatever the context length" in capsys.readouterr().out


def results_bullets() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    return [b for b in re.split(r"\n- ", section) if "docs/results/" in b and b.startswith("**")]


NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?x?")


@pytest.mark.parametrize("bullet", results_bullets(), ids=lambda b: b[2:b.index("**", 2)])
def test_readme_results_are_on_their_pages(bullet):
    """Every number of a results bullet appears on a page that bullet links to (the pages are generated)."""
    links = re.findall(r"\]\((docs/results/[^)]+\.md)\)", bullet)
    assert links, "a results bullet links to its page"
    pages = " ".join((ROOT / link).read_text(encoding="utf-8") for link in links)
    prose = re.sub(r"\[[^\]]*\]\([^)]*\)", "", bullet)  # link texts and targets are not measurements
    numbers = NUMBER.findall(prose)
    assert numbers, "a results bullet quotes numbers"
    for n in numbers:
        assert re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", pages), f"{n} is not on {links}"


def readme_claims() -> list[list[str]]:
    """The rows (claim, verdict, on what) of the README's claims table."""
    text = README.read_text(encoding="utf-8")
    block = text.split("<!-- claims:", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()[1:]
            if line.startswith("|")]
    return rows[2:]  # past the header and its rule


def test_readme_claims_are_the_published_verdicts():
    """Each claim row of the README says the verdict its results file gives, and every number it quotes is on the
    claims page; the table has every claim of that file."""
    link = re.search(r"\[page\]\((docs/results/reproduce_[\w-]+)\.md\)", README.read_text(encoding="utf-8")
                     .split("<!-- claims:", 1)[0].rsplit("\n\n", 2)[-2]).group(1)
    data = json.loads((ROOT / f"{link}.json").read_text(encoding="utf-8"))
    page = (ROOT / f"{link}.md").read_text(encoding="utf-8")
    verdicts = {re.sub(r" \([^)]*\)$", "", c["claim"]): c["verdict"] for c in data["claims"]}
    rows = readme_claims()
    assert sorted(r[0] for r in rows) == sorted(verdicts)
    for claim, verdict, why in rows:
        assert verdict == verdicts[claim], claim
        for n in NUMBER.findall(why):
            assert re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", page), f"{claim}: {n} is not on {link}.md"
