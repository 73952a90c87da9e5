"""Reports as text: one list of blocks rendered as Markdown and as a self-contained HTML page, and terminal tables.

A report is built once as a list of blocks and rendered twice, so that its two pages say the same:

- ``("h1", text)``, ``("h2", text)``: headings;
- ``("p", text)``: a paragraph;
- ``("pre", text)``: preformatted text (a code block);
- ``("table", headers, rows)``: a table; cells are shown with ``str``;
- ``("img", name, png_bytes)``: a PNG, linked by ``name`` from the Markdown page (the caller writes the file
  beside it) and inlined as base64 in the HTML page.

:func:`markdown_table` is one Markdown table alone; :func:`print_table` prints one table to the terminal (rich).
"""

from __future__ import annotations

import base64
import html
from typing import Sequence

Blocks = list[tuple]


def _md_cell(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence, rows: Sequence[Sequence], cell=str) -> list[str]:
    """A Markdown table as lines: ``cell`` shows each value (``str`` unless given); pipes are escaped and line
    breaks flattened, so no value can break the table."""
    out = ["| " + " | ".join(map(_md_cell, headers)) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    return out + ["| " + " | ".join(_md_cell(cell(c)) for c in r) + " |" for r in rows]


def render_markdown(blocks: Blocks) -> str:
    """The blocks as a Markdown page."""
    out = []
    for blk in blocks:
        kind = blk[0]
        if kind == "h1":
            out.append(f"# {blk[1]}\n")
        elif kind == "h2":
            out.append(f"## {blk[1]}\n")
        elif kind == "p":
            out.append(blk[1] + "\n")
        elif kind == "pre":
            out.append("```\n" + blk[1] + "\n```\n")
        elif kind == "img":
            out.append(f"![{blk[1]}]({blk[1]})\n")
        elif kind == "table":
            out += markdown_table(blk[1], blk[2]) + [""]
    return "\n".join(out)


def render_html(blocks: Blocks, title: str) -> str:
    """The blocks as one HTML page, its images inlined (nothing else to fetch)."""
    e = html.escape
    parts = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>{e(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
             "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f2f2f2}"
             "img{max-width:100%}</style></head><body>"]
    for blk in blocks:
        kind = blk[0]
        if kind in ("h1", "h2"):
            parts.append(f"<{kind}>{e(blk[1])}</{kind}>")
        elif kind == "p":
            parts.append(f"<p>{e(blk[1])}</p>")
        elif kind == "pre":
            parts.append(f"<pre>{e(blk[1])}</pre>")
        elif kind == "img":
            data = base64.b64encode(blk[2]).decode("ascii")
            parts.append(f"<img alt='{e(blk[1])}' src='data:image/png;base64,{data}'>")
        elif kind == "table":
            parts.append("<table><tr>" + "".join(f"<th>{e(str(h))}</th>" for h in blk[1]) + "</tr>")
            for r in blk[2]:
                parts.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>")
            parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def print_table(headers: Sequence[str], rows: Sequence[Sequence], title: str | None = None) -> None:
    """One table on the terminal (stdout), cells shown with ``str``."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for h in headers:
        table.add_column(str(h))
    for row in rows:
        table.add_row(*[str(c) for c in row])
    Console().print(table)
