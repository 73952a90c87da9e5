"""The scaling report: PNG plots, a Markdown page and a self-contained HTML page (plots inlined as base64).

One list of blocks (headings, paragraphs, tables, images) is rendered twice, so the two pages say the same.
Written into OUT: ``report.md``, ``report.html``, ``loss_vs_compute.png``, ``optimal_allocation.png``,
``isoflop.png`` and ``fit.json`` (what ``linlm scaling fit --json`` prints). OUT is checked before anything is
plotted (:func:`linlm.outputs.check_dir`): it must be new, empty, or a directory linlm has written into, and each
of those six names that exists there must be a file linlm wrote. Each file is written through linlm.outputs
(atomically, recorded as linlm's); nothing else in OUT is touched.

The plots are matplotlib Figures of their own (no pyplot: no global backend or figure registry is touched).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import numpy as np

from linlm import outputs
from linlm.render import render_html, render_markdown
from linlm.scaling.analysis import Analysis
from linlm.scaling.fits import PFLOPS_DAY, PowerLaw
from linlm.scaling.paper import PAPER_TABLE3

REPORT_FILES = ("report.md", "report.html", "loss_vs_compute.png", "optimal_allocation.png", "isoflop.png",
                "fit.json")


def _color(arch: str) -> str:
    from linlm.models.registry import arch_color

    return arch_color(arch)


DPI = 110


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def _png(fig) -> bytes:
    """The figure as PNG bytes: written to its file and inlined in the HTML page alike."""
    return outputs.figure_png(fig, DPI)


def _legend(ax, size: int) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size)


def _log_axes(ax, ylabel: str, title: Optional[str] = None) -> None:
    """Log-log axes against compute, with a grid and a legend."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("compute C (PFLOP/s-days)")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.25)
    _legend(ax, 7)


def _plain_y(ax) -> None:
    """Loss ticks as plain numbers on a log axis."""
    from matplotlib.ticker import FormatStrFormatter

    ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%.3g"))


def _panels(n: int):
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig = _figure(6.2 * cols, 4.2 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    flat = axes.ravel()
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat


def plot_loss_vs_compute(a: Analysis) -> bytes:
    """One panel per architecture: every run's loss against compute, the envelope and the fitted L(C)."""
    fig, axes = _panels(len(a.archs))
    for ax, (arch, f) in zip(axes, a.archs.items()):
        for cv in f.curves:
            ax.plot(cv.compute / PFLOPS_DAY, cv.loss, color="0.6", linewidth=0.7, alpha=0.7)
            ax.annotate(f"{cv.params / 1e6:.2g}M", (cv.compute[-1] / PFLOPS_DAY, cv.loss[-1]), fontsize=7,
                        color="0.35")
        if f.env is not None:
            env = f.env
            c = env.compute / PFLOPS_DAY
            ax.plot(c[~env.interior], env.loss[~env.interior], "o", color=_color(arch), markersize=3, alpha=0.3,
                    label="envelope (not bracketed)")
            if env.interior.any():
                ax.plot(c[env.interior], env.loss[env.interior], "o", color=_color(arch), markersize=4,
                        label="envelope (fitted)")
        if f.envelope is not None:
            c = f.env.compute / PFLOPS_DAY
            law = f.envelope.loss
            ax.plot(c, law(c), "--", color="k", linewidth=1.2,
                    label=f"L = {law.beta:.3g} C^{law.alpha:.4f} (R² {law.r2:.3f})")
        _log_axes(ax, "training loss (nats/token)", arch)
        _plain_y(ax)
    fig.tight_layout()
    return _png(fig)


def plot_optimal(a: Analysis) -> bytes:
    """N_opt(C) and D_opt(C): envelope points, IsoFLOP minima and the fitted laws, every architecture."""
    fig = _figure(12.4, 4.4)
    an, ad = fig.subplots(1, 2)
    for arch, f in a.archs.items():
        col = _color(arch)
        if f.envelope is not None:
            env = f.envelope.envelope
            c = env.compute[env.interior] / PFLOPS_DAY
            an.plot(c, env.params[env.interior], "o", color=col, markersize=3, alpha=0.6)
            ad.plot(c, env.tokens[env.interior], "o", color=col, markersize=3, alpha=0.6)
            for ax, law, sym in ((an, f.envelope.params, "N"), (ad, f.envelope.tokens, "D")):
                if law is None:
                    continue
                ax.plot(c, law(c), "-", color=col, label=f"{arch}: {sym} = {law.beta:.3g} C^{law.alpha:.3f}")
        if f.isoflop is not None:
            inside = [p for p in f.isoflop.profiles if p.interior]
            if inside:
                an.plot([p.compute / PFLOPS_DAY for p in inside], [p.n_opt for p in inside], "s", color=col,
                        markerfacecolor="none", markersize=6, label=f"{arch}: IsoFLOP minima")
    for ax, what in ((an, "N_opt (non-embedding parameters)"), (ad, "D_opt (tokens)")):
        _log_axes(ax, what)
    fig.tight_layout()
    return _png(fig)


def plot_isoflop(a: Analysis) -> bytes:
    """One panel per architecture: loss against N at each compute level, with the fitted parabola."""
    import matplotlib

    fig, axes = _panels(len(a.archs))
    cmap = matplotlib.colormaps["viridis"]
    for ax, (arch, f) in zip(axes, a.archs.items()):
        profiles = f.isoflop.profiles if f.isoflop is not None else []
        for i, p in enumerate(profiles):
            col = cmap(i / max(1, len(profiles) - 1))
            ax.plot(p.params, p.loss, "o", color=col, markersize=4)
            if p.parabola is not None:
                x = np.linspace(np.log(min(p.params)), np.log(max(p.params)), 50)
                ax.plot(np.exp(x), np.polyval(p.parabola, x), "-", color=col, linewidth=1,
                        label=f"C = {p.compute / PFLOPS_DAY:.2e}" + ("" if p.interior else " (edge)"))
            if p.interior and p.n_opt:
                ax.axvline(p.n_opt, color=col, linewidth=0.6, linestyle=":")
        if not profiles:
            ax.text(0.5, 0.5, f.errors.get("isoflop", "no profiles"), ha="center", va="center", wrap=True,
                    fontsize=8, transform=ax.transAxes)
        ax.set_xscale("log")
        ax.set_xlabel("non-embedding parameters N")
        ax.set_ylabel("training loss (nats/token)")
        ax.set_title(f"{arch}: IsoFLOP profiles")
        ax.grid(True, which="both", alpha=0.25)
        _legend(ax, 6)
    fig.tight_layout()
    return _png(fig)


# ---- blocks -----------------------------------------------------------------------------------------------


def _ci(lo: float, hi: float, fmt: str) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "n/a"
    return f"[{lo:{fmt}}, {hi:{fmt}}]"


def law_row(arch: str, quantity: str, law: Optional[PowerLaw], why: str = "") -> list[str]:
    paper = PAPER_TABLE3.get(arch, {}).get(quantity)
    p_beta, p_alpha = (f"{paper[0]:.4g}", f"{paper[1]:.4f}") if paper else ("-", "-")
    if law is None:
        return [arch, quantity, "not fitted (see below)" if why else "not fitted", "", "", "", "", p_beta, p_alpha]
    return [arch, quantity, f"{law.beta:.4g}", _ci(*law.beta_ci, ".3g"), f"{law.alpha:.4f}",
            _ci(*law.alpha_ci, ".4f"), f"{law.r2:.4f}", p_beta, p_alpha]


def _spreads(a: Analysis) -> str:
    """Where each architecture's seed spread came from, and each envelope fit's replicates."""
    parts = []
    for arch, f in a.archs.items():
        if f.envelope is None:
            continue
        e = f.envelope
        spread = (f"spread {f.spread.offset:.4f} (offset) and {f.spread.wiggle:.4f} (wiggle) from {f.spread.source}"
                  if f.spread else "no seed spread")
        parts.append(f"{arch}: {spread}; {e.replicates} replicates used, {e.failed} failed")
    return (" " + "; ".join(parts) + ".") if parts else ""


def build_blocks(a: Analysis, images: dict[str, bytes]) -> list[tuple]:
    b: list[tuple] = [("h1", f"Scaling report: {a.root.name or a.root}")]
    runs = a.loaded.runs
    b.append(("p", f"{len(runs)} runs over {len(a.archs)} architecture(s) from {a.root}. Compute C is in "
                   "PFLOP/s-days (1 PFLOP/s-day = 8.64e19 FLOPs), counted by linlm's own counters with the paper's "
                   "convention (embeddings and LM head excluded); N is non-embedding parameters; D is training "
                   "tokens. Losses are training losses (nats per token), logged every step and smoothed by a "
                   f"log-log line through {a.options.smooth} logged points; runs of one size are its seeds. "
                   f"Intervals are 95 % percentiles: of {a.options.bootstrap} seed replicates for the envelope's "
                   "laws (the seed spread measured on sizes trained twice; none: no interval), of "
                   f"{a.options.parametric_bootstrap} run resamples for L(N, D)." + _spreads(a)))
    rows = []
    for r in sorted(runs, key=lambda r: (r.curve.arch, r.curve.params)):
        c = r.curve
        epochs = r.meta.get("data", {}).get("epochs")
        rows.append([r.name, c.arch, f"{c.params:,.0f}", f"{c.tokens[-1]:,.0f}",
                     f"{c.compute[-1] / PFLOPS_DAY:.3e}", f"{c.loss[-1]:.4f}",
                     f"{epochs:.2f}" if isinstance(epochs, (int, float)) else "-", "yes" if r.finished else "no"])
    b.append(("h2", "Runs"))
    b.append(("table", ["run", "arch", "N", "tokens", "C (PFLOP/s-days)", "final loss", "epochs", "finished"], rows))
    if a.loaded.skipped:
        b.append(("h2", "Skipped runs"))
        b.append(("table", ["run", "why"], [[n, w] for n, w in a.loaded.skipped]))

    b.append(("h2", "Loss against compute"))
    b.append(("p", "Grey: every run's curve. Dots: the envelope, the lowest loss at each compute over all runs. "
                   "Only envelope points bracketed by a smaller and a larger run reaching the same compute are "
                   "fitted (faint dots are not). Dashed: the fitted L(C) = beta C^alpha."))
    b.append(("img", "loss_vs_compute.png", images["loss_vs_compute.png"]))

    b.append(("h2", "Fitted laws beside the paper's Table 3"))
    b.append(("p", "Paper coefficients: arXiv 2406.16690, C in PFLOP/s-days, 300B-token runs of 70M-7B models. "
                   "Coefficients fitted at a different scale (and a different corpus and tokenizer) are not "
                   "expected to match the paper's; the exponents are the comparable part."))
    rows = []
    for arch, f in a.archs.items():
        why = f.errors.get("envelope", "")
        e = f.envelope
        rows.append(law_row(arch, "L(C)", e.loss if e else None, why))
        rows.append(law_row(arch, "N_opt(C)", e.params if e else None, why or f.errors.get("N_opt", "")))
        rows.append(law_row(arch, "D_opt(C)", e.tokens if e else None, why or f.errors.get("N_opt", "")))
    b.append(("table", ["arch", "law", "beta", "beta 95% CI", "alpha", "alpha 95% CI", "R²", "paper beta",
                        "paper alpha"], rows))
    errors = [msg for f in a.archs.values() for msg in f.errors.values()]
    if errors:
        b.append(("p", "Fits that could not be made: " + " ".join(f"({i}) {m}." for i, m in enumerate(errors, 1))))

    b.append(("h2", "Compute-optimal allocation"))
    b.append(("p", "N_opt(C) and D_opt(C) from the envelope (dots, lines) and the IsoFLOP minima (squares)."))
    b.append(("img", "optimal_allocation.png", images["optimal_allocation.png"]))

    b.append(("h2", "IsoFLOP profiles (Chinchilla approach 2)"))
    rows = []
    for arch, f in a.archs.items():
        iso = f.isoflop
        if iso is None or iso.params is None:
            rows.append([arch, "not fitted (see above)" if "isoflop" in f.errors else "not fitted", "", "", ""])
            continue
        rows.append([arch, f"{iso.params.alpha:.4f} {_ci(*iso.params.alpha_ci, '.4f')}",
                     f"{iso.tokens.alpha:.4f} {_ci(*iso.tokens.alpha_ci, '.4f')}",
                     str(sum(p.interior for p in iso.profiles)), f"{iso.params.r2:.4f}"])
    b.append(("table", ["arch", "N_opt exponent [CI]", "D_opt exponent [CI]", "profiles used", "R² (N_opt)"], rows))
    b.append(("img", "isoflop.png", images["isoflop.png"]))

    b.append(("h2", "Parametric fit L(N, D) = E + A/N^a + B/D^b (Chinchilla approach 3)"))
    rows = []
    for arch, f in a.archs.items():
        p = f.parametric
        if p is None:
            rows.append([arch, "not fitted (see above)" if "parametric" in f.errors else "not fitted"] + [""] * 6)
            continue
        ci = p.ci
        rows.append([arch, f"{p.E:.4g} {_ci(*ci.get('E', (math.nan,) * 2), '.3g')}",
                     f"{p.A:.4g} {_ci(*ci.get('A', (math.nan,) * 2), '.3g')}",
                     f"{p.B:.4g} {_ci(*ci.get('B', (math.nan,) * 2), '.3g')}",
                     f"{p.a:.4f} {_ci(*ci.get('a', (math.nan,) * 2), '.3f')}",
                     f"{p.b:.4f} {_ci(*ci.get('b', (math.nan,) * 2), '.3f')}",
                     f"{p.r2:.4f}", str(p.n_points)])
    b.append(("table", ["arch", "E", "A", "B", "a", "b", "R² (log L)", "points"], rows))

    b.append(("h2", "Where the fitted L(C) cross"))
    rows = [[c.a, c.b, f"{c.compute:.3e}" if c.compute else "parallel", _ci(*c.ci, ".2e"), c.lower_after or "-"]
            for c in a.crossovers]
    if rows:
        b.append(("table", ["a", "b", "crossover C (PFLOP/s-days)", "95% CI", "lower loss beyond it"], rows))
    else:
        b.append(("p", "Fewer than two architectures have a fitted L(C)."))
    from linlm.models.archs.base import LINEAR_ATTENTION
    from linlm.models.registry import arch_names, baseline_arch
    from linlm.scaling.fits import crossover
    from linlm.scaling.paper import paper_law

    base = baseline_arch()
    paper_rows = [[base, arch, f"{crossover(paper_law(base), paper_law(arch)):.3e}"]
                  for arch in arch_names(LINEAR_ATTENTION, scaling_study=True) if arch in PAPER_TABLE3]
    b.append(("p", "For comparison, the crossovers implied by the paper's own L(C) (beyond them LLaMA's steeper law "
                   "gives the lower loss):"))
    b.append(("table", ["a", "b", "crossover C (PFLOP/s-days)"], paper_rows))
    return b


def write_report(a: Analysis, out: str | Path, what: Optional[str] = None) -> dict[str, Path]:
    """Write the report's files (:data:`REPORT_FILES`) into the directory ``out``; return their paths by name.

    ``out`` is checked first, before anything is plotted (see the module doc); ``what`` names the flag in a
    refusal, e.g. ``--out``."""
    out = outputs.check_dir(out, what, names=REPORT_FILES)
    images = {"loss_vs_compute.png": plot_loss_vs_compute(a), "optimal_allocation.png": plot_optimal(a),
              "isoflop.png": plot_isoflop(a)}
    blocks = build_blocks(a, images)
    files = {name: out / name for name in REPORT_FILES}
    for name, data in images.items():
        outputs.write_bytes(files[name], data, what)
    outputs.write_json(files["fit.json"], a.to_dict(), what)
    outputs.write_text(files["report.md"], render_markdown(blocks), what)
    outputs.write_text(files["report.html"], render_html(blocks, "linlm scaling report"), what)
    return files

