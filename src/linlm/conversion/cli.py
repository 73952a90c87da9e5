"""``linlm convert`` and ``linlm.convert``: a checkpoint of another library into a linlm model directory, or back
(--to). Both take a training run's directory for its newest checkpoint that verifies (linlm.train.model_dirs):
that rule is train's, so it is applied here, above the conversion layer, and not in conversion/convert.py."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def register(subparsers) -> None:
    from linlm.conversion.registry import LAYOUTS

    names = ", ".join(LAYOUTS)
    p = subparsers.add_parser("convert", help="convert a checkpoint of another library into a linlm model directory "
                                              f"(or a linlm model into one of theirs with --to): {names}")
    p.add_argument("src", help="the checkpoint directory (config.json and its weights)")
    p.add_argument("--out", required=True, help="the directory to write (new, empty, or linlm's with --overwrite)")
    p.add_argument("--from", dest="layout", default=None, metavar="LAYOUT",
                   help=f"the source's layout (default: detected from config.json): {names}")
    p.add_argument("--to", default=None, metavar="LAYOUT",
                   help="convert the linlm model SRC into this layout instead: "
                        + ", ".join(n for n, l in LAYOUTS.items() if l.from_linlm is not None))
    p.add_argument("--overwrite", action="store_true", help="replace a directory linlm wrote at --out")
    p.set_defaults(func=cmd_convert)


def convert(src, out, *, layout: Optional[str] = None, to: Optional[str] = None, overwrite: bool = False) -> Path:
    """:func:`linlm.conversion.convert.convert`, where ``src`` may also be a training run's directory."""
    from linlm.conversion.convert import convert as convert_dir
    from linlm.train.model_dirs import model_dir

    return convert_dir(model_dir(src), out, layout=layout, to=to, overwrite=overwrite)


def cmd_convert(args) -> int:
    out = convert(args.src, args.out, layout=args.layout, to=args.to, overwrite=args.overwrite)
    print(f"wrote {out}")
    return 0
