"""Printing tables to the terminal (rich)."""

from __future__ import annotations

from typing import Sequence


def print_table(headers: Sequence[str], rows: Sequence[Sequence], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for h in headers:
        table.add_column(str(h))
    for row in rows:
        table.add_row(*[str(c) for c in row])
    Console().print(table)
