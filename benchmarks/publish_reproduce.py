"""Publish a finished `linlm reproduce` job as a results file, so that its claims get a generated page.

    python benchmarks/publish_reproduce.py runs/rep \
        --command "linlm reproduce --recipe cpu --out runs/rep --data-dir data/eval"
    python benchmarks/render_results.py            # docs/results/reproduce_cpu.json -> reproduce_cpu.md

Writes docs/results/reproduce_<recipe>.json (--out for another path): the environment the job's last run recorded
(revision, CPU, torch), the command given, the recipe, each section's finishing time (from the times its result
files were written: the sections run one after another, so the differences are their durations; a job stopped and
continued counts the pause too, unless --paused names it: then the pause is taken out of the section it fell in
and recorded beside it), the claims, judged from the job's saved sections by this checkout's
linlm/reproduce/claims/ (its revision is recorded as judged_at), and ``evidence``: the parts of the sections the
claims read (per-seed values, seed replicates, fitted points), from which a test computes every verdict again.
The recipe's description and trade-offs are read as the job's revision had them.
A job with a section pending or failed is refused: a stopped job is not a result.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
from pathlib import Path

from linlm.environment import environment
from linlm.io_utils import atomic_write_bytes
from linlm.outputs import dumps

ROOT = Path(__file__).resolve().parents[1]


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(timespec="seconds")


def _timestamp(utc: str) -> float:
    return datetime.datetime.fromisoformat(utc.replace("Z", "+00:00")).timestamp()


def parse_pause(text: str) -> tuple[float, float]:
    """``FROM/TO``, two UTC times (ISO 8601) between which the job was not running."""
    try:
        start, end = (_timestamp(t.strip()) for t in text.split("/"))
    except ValueError:
        raise SystemExit(f"publish_reproduce: --paused {text!r} is not FROM/TO in UTC, e.g. "
                         "2026-12-07T09:20:00Z/2026-12-07T11:14:00Z") from None
    if end <= start:
        raise SystemExit(f"publish_reproduce: --paused {text!r} ends before it starts; give FROM/TO in that order")
    return start, end


def section_times(job: Path, created: str, paused: list[tuple[float, float]] = ()) -> list[dict]:
    """Each saved section in the order the job runs them, with when its result was written and the minutes since
    the one before (the first: since the job was created), less any pause in ``paused`` (start, end in Unix
    seconds: the job was not running), whose minutes are kept as ``paused_minutes``."""
    from linlm.reproduce.sections import SECTIONS

    rows, before = [], _timestamp(created)
    for section in SECTIONS:
        path = job / "sections" / f"{section.name}.json"
        if not path.is_file():
            continue
        done = path.stat().st_mtime
        idle = sum(max(0.0, min(done, end) - max(before, start)) for start, end in paused)
        row = {"section": section.name, "finished_utc": _utc(done), "minutes": (done - before - idle) / 60}
        rows.append({**row, "paused_minutes": idle / 60} if idle else row)
        before = done
    return rows


def recipe_at(name: str, revision: str | None):
    """The recipe ``name`` as the job's revision had it (so that the page's description and trade-offs are what the
    job ran), merged over its bases as linlm merges them; this checkout's when the revision is not in this
    repository."""
    import yaml

    from linlm.reproduce.recipes import build_recipe, load_recipe
    from linlm.schema import deep_merge

    def data(n: str, seen: tuple = ()) -> dict:
        text = subprocess.run(["git", "show", f"{revision}:src/linlm/reproduce/recipes/{n}.yaml"], cwd=ROOT,
                              check=True, capture_output=True, text=True).stdout
        d = yaml.safe_load(text)
        base = d.pop("base", None)
        if base is None or base in (*seen, n):
            return d
        return {**deep_merge(data(base, (*seen, n)), d), "name": d.get("name", n)}

    if revision:
        try:
            return build_recipe(data(name), f"{name}.yaml at {revision[:10]}")
        except (OSError, subprocess.CalledProcessError):
            pass
    return load_recipe(name)


def publish(job: Path, command: str, data_dir_shown: str | None = None,
            paused: list[tuple[float, float]] = ()) -> dict:
    from linlm.reproduce.claims import judge
    from linlm.reproduce.claims.evidence import published

    marker_path, results_path = job / "reproduce.json", job / "results.json"
    if not marker_path.is_file() or not results_path.is_file():
        raise SystemExit(f"publish_reproduce: {job} is not a reproduce job with a report (no reproduce.json or "
                         "results.json); give the --out directory of a `linlm reproduce` run")
    marker = json.loads(marker_path.read_text(encoding="utf-8"))
    results = json.loads(results_path.read_text(encoding="utf-8"))
    unfinished = {"pending": results.get("pending") or [], "failed": sorted(results.get("failed") or {}),
                  "waiting": sorted(results.get("waiting") or {})}
    if any(unfinished.values()):
        raise SystemExit(f"publish_reproduce: {job} has not finished ({unfinished}); run its command again until "
                         "every section is done, then publish")
    recipe = recipe_at(marker["preset"], marker["environment"].get("git_revision"))
    times = section_times(job, marker["created"], paused)
    here = environment()
    return {
        "meta": {"benchmark": "linlm-reproduce", "command": command, **marker["environment"],
                 "utc_time": marker["created"], "published_by": shlex.join(["python", *sys.argv])},
        "judged_at": here.get("git_revision"), "judged_dirty": here.get("git_dirty"),
        "recipe": {"name": recipe.name, "description": recipe.description, "seeds": recipe.seeds,
                   "tradeoffs": recipe.tradeoffs},
        "settings": {**(results.get("settings") or {}),
                     **({"data_dir": data_dir_shown} if data_dir_shown is not None else {})},
        "sections": times,
        "total_minutes": sum(r["minutes"] for r in times),
        **({"paused": [{"from_utc": _utc(a), "to_utc": _utc(b)} for a, b in paused]} if paused else {}),
        "claims": [c.to_dict() for c in judge(results["sections"])],
        "evidence": published(results["sections"]),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", type=Path, help="the --out directory of a finished `linlm reproduce` job")
    ap.add_argument("--command", required=True, help="the reproduce command the job was run with, as typed")
    ap.add_argument("--data-dir-shown", default=None,
                    help="what the page says for the job's --data-dir instead of its path on this machine")
    ap.add_argument("--paused", action="append", type=parse_pause, default=[], metavar="FROM/TO",
                    help="two UTC times between which the job was stopped (its process gone) before it was "
                         "continued; taken out of the sections' minutes and shown on the page (repeatable)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the results file (default: docs/results/reproduce_<recipe>.json)")
    args = ap.parse_args(argv)
    data = publish(args.job, args.command, args.data_dir_shown, args.paused)
    out = args.out or ROOT / "docs" / "results" / f"reproduce_{data['recipe']['name']}.json"
    atomic_write_bytes(out, dumps(data, indent=2).encode("utf-8"))
    print(f"wrote {out}: {len(data['claims'])} claims, {data['total_minutes']:.1f} minutes in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
