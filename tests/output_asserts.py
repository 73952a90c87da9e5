"""Checks the CLI tests share (imported as a module): a refusal is one line, a plot is a real picture, nothing
changed on disk, and a directory another live process holds."""

from __future__ import annotations

from pathlib import Path


def one_line_error(err: str, *needles: str, prog: str = "linlm") -> str:
    """``err`` (a command's stderr) is exactly one ``PROG: error:`` line, with no traceback, naming each needle."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def assert_png(path: Path, size: tuple[int, int]) -> None:
    """``path`` opens as a PNG of ``size`` pixels (width, height) that is not blank: no one colour covers 98 % of
    it, and it holds many colours (axes, text and data are drawn, antialiased)."""
    from PIL import Image

    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == size, (im.format, im.size)
        rgb = im.convert("RGB")
        colours = rgb.getcolors(maxcolors=size[0] * size[1])
    assert colours is not None and len(colours) > 50, len(colours or ())
    assert max(n for n, _ in colours) < 0.98 * size[0] * size[1]


def snapshot(root: Path) -> dict:
    """Every path under ``root`` with its bytes (None for a directory): what "nothing changed" compares."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def forbid(monkeypatch, *targets: str, why: str) -> None:
    """Make each function at ``targets`` (dotted paths) fail the test if it is called: the work it starts must not
    begin before the command's checks (an AssertionError is not a linlm error, so the CLI lets it through)."""

    def fail(*args, **kwargs):
        raise AssertionError(why)

    for target in targets:
        monkeypatch.setattr(target, fail)


def hold_lock(directory: Path):
    """A separate live process holding the lock of ``directory`` (the test kills it): the holder whose directory
    linlm must never clear or write into."""
    import os
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    code = ("import sys, time; from linlm.locking import DirLock; DirLock(sys.argv[1], 'x').acquire(); "
            "print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(directory)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc
