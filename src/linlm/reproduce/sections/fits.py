"""The ``fits`` section: the scaling laws of the scaling sweep (the envelope, L(C), N_opt(C), D_opt(C) and their
intervals, :func:`linlm.scaling.analysis.analyze`), with the sweep's own report in DIR/scaling_report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from linlm import outputs
from linlm.reproduce.section import Blocks, Section, Tick, fmt, heading


def measure(sweep: Path, report_dir: Path, options: dict) -> Optional[dict]:
    """The analysis of the sweep in ``sweep`` as a dict (its report written into ``report_dir``), or None while
    the sweep holds no runs."""
    from linlm.scaling.analysis import FitOptions, analyze
    from linlm.scaling.report import write_report

    if not (sweep / "runs").is_dir():
        return None
    analysis = analyze(sweep, options=FitOptions(**options))
    files = write_report(analysis, report_dir)
    data = json.loads(outputs.dumps(analysis.to_dict()))
    data["report"] = {k: str(v) for k, v in files.items()}
    return data


def run(job, tick: Tick) -> Optional[dict]:
    return measure(job.sweep("scaling"), job.out / "scaling_report", job.recipe.fits)


def render(job, pending: list[str]) -> Blocks:
    b, fits = heading(job, "Scaling laws (LLaMA, TNL, HGRN2, cosFormer2)", pending, "fits", "scaling")
    if fits is None:
        return b
    b.append(("p", f"Ladder {job.recipe.scaling['ladder']!r}: {len(fits['runs'])} runs. The full scaling report, "
                   "with IsoFLOP profiles, L(N, D) and bootstrap intervals, is scaling_report/report.md. C is in "
                   "PFLOP/s-days, counted with the paper's convention."))
    rows = []
    for arch, f in fits["archs"].items():
        env = f.get("envelope") or {}
        law, n_opt, d_opt = env.get("L(C)"), env.get("N_opt(C)"), env.get("D_opt(C)")
        paper = (f.get("paper") or {}).get("L(C)") or {}
        rows.append([arch, str(f["runs"]), fmt(law and law["alpha"]), fmt(law and law["beta"]),
                     fmt(law and law["r2"], ".3f"), fmt(n_opt and n_opt["alpha"]), fmt(d_opt and d_opt["alpha"]),
                     fmt(paper.get("alpha"))])
    b.append(("table", ["arch", "runs", "L(C) alpha", "L(C) beta", "R²", "N_opt alpha", "D_opt alpha",
                        "paper L(C) alpha"], rows))
    errors = [m for f in fits["archs"].values() for m in (f.get("errors") or {}).values()]
    if errors:
        b.append(("p", "Fits that could not be made: " + " ".join(f"({i}) {m}" for i, m in enumerate(errors, 1))))
    png = Path(fits.get("report", {}).get("loss_vs_compute.png", ""))
    if png.is_file():  # the scaling report's plot, copied into plots/ with the report
        b.append(("img", "plots/loss_vs_compute.png", png.read_bytes()))
    return b


SECTION = Section("fits", run, 0.02, needs=("scaling",), settings=("overrides", "scaling_dir"), render=render,
                  report_rank=1, trees=("scaling_report",), plots=("loss_vs_compute.png",),
                  copies=("plots/loss_vs_compute.png",))
