"""Report blocks rendered as Markdown and as one HTML page, and terminal tables."""

from __future__ import annotations

import base64

from linlm.render import print_table, render_html, render_markdown

PNG = b"\x89PNG\r\n\x1a\nnot really"
BLOCKS = [("h1", "Report"), ("p", "a <b> & c"), ("h2", "Table"), ("table", ["arch", "a|b"], [["tnl", 1.5], ["x\ny", None]]),
          ("pre", "{\n \"k\": 1\n}"), ("img", "plot.png", PNG)]


def test_markdown_page():
    md = render_markdown(BLOCKS)
    assert md.splitlines()[:3] == ["# Report", "", "a <b> & c"]
    assert "| arch | a\\|b |\n| --- | --- |\n| tnl | 1.5 |\n| x y | None |" in md  # pipes escaped, one line a row
    assert "```\n{\n \"k\": 1\n}\n```" in md
    assert "![plot.png](plot.png)" in md and "base64" not in md


def test_html_page_escapes_text_and_inlines_images():
    page = render_html(BLOCKS, title="t <1>")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<title>t &lt;1&gt;</title>" in page and "<p>a &lt;b&gt; &amp; c</p>" in page
    assert "<tr><th>arch</th><th>a|b</th></tr>" in page and "<td>x\ny</td><td>None</td>" in page
    assert f"src='data:image/png;base64,{base64.b64encode(PNG).decode()}'" in page


def test_print_table_writes_headers_and_cells_to_stdout(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    print_table(["arch", "params"], [["tnl", 1234], ["mamba", None]], title="models")
    out = capsys.readouterr()
    assert out.err == ""
    for text in ("models", "arch", "params", "tnl", "1234", "mamba", "None"):
        assert text in out.out


def test_markdown_table_escapes_every_cell_and_applies_the_formatter():
    from linlm.render import markdown_table

    lines = markdown_table(["a|b", "c"], [[1.5, "x\ny|z"]], cell=lambda v: f"<{v}>")
    assert lines == ["| a\\|b | c |", "| --- | --- |", "| <1.5> | <x y\\|z> |"]
