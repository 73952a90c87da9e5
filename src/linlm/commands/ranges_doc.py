"""Write docs/cli-ranges.md, the range of every numeric flag, from the parser of ``linlm`` itself
(:func:`linlm.cli_ranges.ranges_markdown`): ``python -m linlm.commands.ranges_doc [PATH]``."""

from __future__ import annotations

import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "cli-ranges.md"


def ranges_doc() -> str:
    from linlm.cli import build_parser
    from linlm.cli_ranges import ranges_markdown

    return ranges_markdown(build_parser())


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DOC
    path.write_text(ranges_doc(), encoding="utf-8")
    print(f"wrote {path}")
