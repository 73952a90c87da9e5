"""``linlm convert``: a checkpoint of another library into a linlm model directory, or back (--to)."""

from __future__ import annotations

from pathlib import Path


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


def source_dir(src: str) -> Path:
    """The directory to read: a linlm run directory (or its checkpoints/, or one training checkpoint) stands for its
    newest checkpoint that verifies, as everywhere a model directory is accepted; any other path is itself. (Here,
    in the command, since training checkpoints live in a layer above conversion.)"""
    from linlm.models.io import CONFIG
    from linlm.train.checkpoint import MANIFEST, resolve_checkpoint

    path = Path(src).expanduser()
    if (path / CONFIG).is_file() and not (path / MANIFEST).is_file():
        return path
    if (path / MANIFEST).is_file() or (path / "checkpoints").is_dir() or path.name == "checkpoints":
        return resolve_checkpoint(path)
    return path


def cmd_convert(args) -> int:
    from linlm.conversion import convert

    out = convert(source_dir(args.src), args.out, layout=args.layout, to=args.to, overwrite=args.overwrite)
    print(f"wrote {out}")
    return 0
