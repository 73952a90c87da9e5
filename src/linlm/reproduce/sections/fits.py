"""The ``fits`` section: the scaling laws of the scaling sweep (the envelope, L(C), N_opt(C), D_opt(C) and their
intervals, :func:`linlm.scaling.analysis.analyze`), with the sweep's own report in DIR/scaling_report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from linlm import outputs
from linlm.reproduce.section import Blocks, Section, Tick, fmt, heading
from linlm.scaling.analysis import FitOptions


def measure(sweep: Path, report_dir: Path, options) -> Optional[dict]:
    """The analysis of the sweep in ``sweep`` as a dict (its report written into ``report_dir``), or None while
    the sweep holds no runs."""
    from linlm.scaling.analysis import analyze
    from linlm.scaling.report import write_report

    if not (sweep / "runs").is_dir():
        return None
    analysis = analyze(sweep, options=options)
    files = write_report(analysis, report_dir)
    data = json.loads(outputs.dumps(analysis.to_dict()))
    data["report"] = {k: str(v) for k, v in files.items()}
    return data


def laws_blocks(fits: dict, intro: str, plot: str, *, interval: bool, paper: bool) -> Blocks:
    """A fits section's body: ``intro``, a table of each architecture's fitted laws (with the L(C) exponent's 95 %
    interval, with the paper's exponent, as asked), a paragraph naming the fits that could not be made, and the
    report's loss-against-compute plot as ``plots/{plot}``."""
    rows = []
    for arch, f in fits["archs"].items():
        env = f.get("envelope") or {}
        law, n_opt, d_opt = env.get("L(C)"), env.get("N_opt(C)"), env.get("D_opt(C)")
        ci = (law or {}).get("alpha_ci") or [None, None]
        row = [arch, str(f["runs"]), fmt(law and law["alpha"])]
        row += [f"[{fmt(ci[0])}, {fmt(ci[1])}]" if law else "-"] if interval else []
        row += [fmt(law and law["beta"]), fmt(law and law["r2"], ".3f"), fmt(n_opt and n_opt["alpha"]),
                fmt(d_opt and d_opt["alpha"])]
        row += [fmt(((f.get("paper") or {}).get("L(C)") or {}).get("alpha"))] if paper else []
        rows.append(row)
    head = (["arch", "runs", "L(C) alpha"] + (["alpha 95% CI"] if interval else [])
            + ["L(C) beta", "R²", "N_opt alpha", "D_opt alpha"] + (["paper L(C) alpha"] if paper else []))
    blocks: Blocks = [("p", intro), ("table", head, rows)]
    errors = [m for f in fits["archs"].values() for m in (f.get("errors") or {}).values()]
    if errors:
        blocks.append(("p", "Fits that could not be made: "
                       + " ".join(f"({i}) {m}" for i, m in enumerate(errors, 1))))
    png = Path(fits.get("report", {}).get("loss_vs_compute.png", ""))
    if png.is_file():  # the report's plot, copied into plots/ with the report
        blocks.append(("img", f"plots/{plot}", png.read_bytes()))
    return blocks


def run(job, tick: Tick) -> Optional[dict]:
    return measure(job.sweep("scaling"), job.out / "scaling_report", job.recipe.fits)


def render(job, pending: list[str]) -> Blocks:
    archs = ", ".join(job.ladder("scaling").archs)  # the ladder's, from the registry unless it names its own
    b, fits = heading(job, f"Scaling laws ({archs})", pending, "fits", "scaling")
    if fits is None:
        return b
    return b + laws_blocks(fits, f"Ladder {job.recipe.scaling.ladder!r}: {len(fits['runs'])} runs. The full "
                           "scaling report, with IsoFLOP profiles, L(N, D) and bootstrap intervals, is "
                           "scaling_report/report.md. C is in PFLOP/s-days, counted with the paper's convention.",
                           "loss_vs_compute.png", interval=False, paper=True)


SECTION = Section("fits", run, 0.02, needs=("scaling",), settings=("overrides", "scaling_dir"), render=render,
                  report_rank=1, trees=("scaling_report",), plots=("loss_vs_compute.png",),
                  copies=("plots/loss_vs_compute.png",), key="fits", options=FitOptions)
