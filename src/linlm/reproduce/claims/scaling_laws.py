"""The claims of Scaling Laws for Linear Complexity Language Models (arXiv 2406.16690), each in the paper's own terms.

The baseline comes from the registry (:func:`linlm.models.registry.baseline_arch`); the linear models are the
paper's own three (TNL, HGRN2, cosFormer2: the rows of its Table 3 besides LLaMA), since its claims are about them.
Linear models it did not study (GLA, RetNet, the delta rule) train on the same ladders but are judged by claims of
their own. Only the claims about one architecture name it (decay: HGRN2 against TNL, as the paper compares them; the
aspect study's cosFormer2 is whichever of the three it trains).
"""

from __future__ import annotations

import math
from typing import Optional

from linlm.reproduce.claims.evidence import Fits, Retrieval
from linlm.reproduce.claims.record import Claim
from linlm.reproduce.claims.rule import Assessment, Difference

PAPER = "Scaling Laws for Linear Complexity LMs (arXiv 2406.16690)"
ALPHA_MARGIN = 0.02  # exponents closer than this are alike (a quarter of Table 3's LLaMA exponent, -0.0798)
LOSS_MARGIN = 0.01  # nats/token
ACC_MARGIN = 0.05  # retrieval accuracy, and its spread across shapes
RATIO_MARGIN = math.log(1.25)  # optimal sizes and tokens within 25 % are alike (a log ratio)
ABOVE_CHANCE = 0.05  # a model within this of chance accuracy has not learned the task


def linear_archs() -> list[str]:
    """The paper's linear models: the architectures of its Table 3 other than the baseline."""
    from linlm.scaling.paper import PAPER_TABLE3

    return [a for a in PAPER_TABLE3 if a != baseline()]


def baseline() -> str:
    """The softmax-attention baseline (the registry's)."""
    from linlm.models.registry import baseline_arch

    return baseline_arch()


def _fits(results: dict) -> tuple[Optional[Fits], Optional[str]]:
    fits = Fits.read(results.get("fits"))
    if fits is None:
        return None, "the scaling fits did not run"
    base = baseline()
    if base in fits.errors or base not in fits.laws:
        return fits, f"{base}'s L(C) fit: {fits.errors.get(base, 'not in the sweep')}"
    return fits, None


def _law_numbers(fits: Fits) -> str:
    return "; ".join(f"{a} alpha {law.alpha:.4f} ({law.runs} runs, {law.sizes} sizes, {law.points} points, "
                     f"{law.failed} failed replicates)" for a, law in fits.laws.items())


def scale_alike(results: dict) -> Assessment:
    fits, why = _fits(results)
    if why:
        return Assessment(reason=why, scale=fits.scale() if fits else "")
    base, ref = baseline(), fits.laws[baseline()]
    parts = []
    for arch in linear_archs():
        if arch not in fits.laws and arch not in fits.errors:
            continue  # not in this sweep
        name = f"{arch} - {base}"
        if arch in fits.errors:
            parts.append(Difference(name, "L(C) exponent", "", "alike", ALPHA_MARGIN, reason=fits.errors[arch]))
            continue
        law = fits.laws[arch]
        parts.append(Difference(name, "L(C) exponent", "", "alike", ALPHA_MARGIN, a_replicates=law.alpha_samples(),
                                b_replicates=ref.alpha_samples(), value=law.alpha - ref.alpha))
    return Assessment(parts, _law_numbers(fits), fits.scale())


def _at_common_compute(results: dict) -> tuple[Optional[Fits], Optional[str]]:
    fits, why = _fits(results)
    if why is None and fits.c_star is None:
        why = f"no compute lies inside every fitted range ({fits.c_why})"
    return fits, why


def lower_loss(results: dict) -> Assessment:
    fits, why = _at_common_compute(results)
    if why:
        return Assessment(reason=why, scale=fits.scale() if fits else "")
    base, opt = baseline(), fits.optimum
    parts = []
    for arch in linear_archs():
        if arch not in opt and arch not in fits.errors:
            continue
        name = f"{arch} - {base}"
        if arch not in opt:
            parts.append(Difference(name, "loss at C*", "nats", "lower", LOSS_MARGIN, reason=fits.errors[arch]))
            continue
        a, b = opt[arch], opt[base]
        parts.append(Difference(name, "loss at C*", "nats", "lower", LOSS_MARGIN, a_replicates=a.loss_samples,
                                b_replicates=b.loss_samples, value=a.loss - b.loss,
                                reason=None if a.loss_samples and b.loss_samples else "no seed replicates"))
    numbers = f"C* = {fits.c_star:.3e} PFLOP/s-days; fitted loss there: " + ", ".join(
        f"{a} {o.loss:.4f}" for a, o in opt.items())
    return Assessment(parts, numbers, fits.scale())


def more_params_and_tokens(results: dict) -> Assessment:
    from linlm.scaling.paper import PAPER_COMPUTE_RANGE, PAPER_TABLE3, paper_ratio

    fits, why = _at_common_compute(results)
    if why:
        return Assessment(reason=why, scale=fits.scale() if fits else "")
    base, opt = baseline(), fits.optimum
    if opt[base].n_opt is None:
        return Assessment(reason=f"{base}'s optimum at C*: {opt[base].why}", scale=fits.scale())
    parts, quoted = [], []
    for arch in linear_archs():
        if arch not in opt and arch not in fits.errors:
            continue
        for key, what in (("n", "N_opt at C*"), ("d", "D_opt at C*")):
            name = f"{arch} / {base} {what.split()[0]}"
            row = opt.get(arch)
            if row is None or row.n_opt is None:
                why = fits.errors.get(arch) or (row.why if row else "no fit")
                parts.append(Difference(name, what, "log ratio", "higher", RATIO_MARGIN, reason=why))
                continue
            a, b = getattr(row, f"{key}_opt"), getattr(opt[base], f"{key}_opt")
            ra, rb = getattr(row, f"{key}_samples"), getattr(opt[base], f"{key}_samples")
            parts.append(Difference(name, what, "log ratio", "higher", RATIO_MARGIN,
                                    a_replicates=[math.log(x) for x in ra], b_replicates=[math.log(x) for x in rb],
                                    value=math.log(a / b)))
        if arch in PAPER_TABLE3 and base in PAPER_TABLE3:
            lo, hi = PAPER_COMPUTE_RANGE
            ratios = [f"{paper_ratio(arch, base, f'{k}(C)', lo):.2f}x-{paper_ratio(arch, base, f'{k}(C)', hi):.2f}x"
                      for k in ("N_opt", "D_opt")]
            quoted.append(f"{arch} N_opt {ratios[0]}, D_opt {ratios[1]}")
    numbers = ("at C*: " + ", ".join(f"{a} N_opt {o.n_opt:.3g} D_opt {o.d_opt:.3g}" if o.n_opt else f"{a}: {o.why}"
                                     for a, o in opt.items()))
    if quoted:
        lo, hi = PAPER_COMPUTE_RANGE
        numbers += (f"; the paper's Table 3 over {base}'s, inside its own compute range ({lo:.2g}-{hi:.0f} "
                    "PFLOP/s-days; not extrapolated to this scale): " + "; ".join(quoted))
    return Assessment(parts, numbers, fits.scale())


def retrieval_result(result: Optional[dict], section: str) -> tuple[Optional[Retrieval], Optional[str]]:
    r = Retrieval.read(result)
    if r is None:
        return None, f"the {section} section did not run"
    if r.not_run:
        return r, r.not_run
    if not r.runs:
        return r, f"the {section} section has no runs"
    return r, None


def accuracy_part(r: Retrieval, a: str, b: str, predicts: str, what: str = "MQAR accuracy") -> Difference:
    """``a`` - ``b`` in accuracy over seeds at the largest width; cannot tell when one of them never left chance
    or a run of either stopped before its loss plateaued."""
    va, vb = r.values(a), r.values(b)
    name = f"{a} - {b}"
    if not va or not vb:
        return Difference(name, what, "", predicts, ACC_MARGIN, reason=f"no {a if not va else b} runs")
    if max(sum(va.values()) / len(va), sum(vb.values()) / len(vb)) - r.chance <= ABOVE_CHANCE:
        return Difference(name, what, "", predicts, ACC_MARGIN, reason=f"both at chance ({r.chance:.3f})")
    stopped = [f"{c} {s}" for c in (a, b) for s in r.not_plateaued(c)]
    reason = f"not plateaued: {', '.join(stopped)}" if stopped else None
    return Difference(name, what, "", predicts, ACC_MARGIN, a_values=va, b_values=vb, reason=reason)


def accuracies_line(r: Retrieval, configs) -> str:
    shown = []
    for c in configs:
        v = r.values(c)
        if v:
            shown.append(f"{c} {sum(v.values()) / len(v):.3f} ({seeds_text(len(v))})")
    return (f"MQAR, {r.pairs} pairs, d={r.width()}, chance {r.chance:.3f}: " + ", ".join(shown)) if shown else ""


def weaker_at_retrieval(results: dict) -> Assessment:
    r, why = retrieval_result(results.get("mqar"), "mqar")
    if why:
        return Assessment(reason=why)
    base = baseline()
    archs = [a for a in linear_archs() if r.values(a)]
    parts = [accuracy_part(r, a, base, "lower") for a in archs]
    return Assessment(parts, accuracies_line(r, [base, *archs]), f"MQAR at d={r.width()}")


def decay_helps_retrieval(results: dict) -> Assessment:
    r, why = retrieval_result(results.get("mqar"), "mqar")
    if why:
        return Assessment(reason=why)
    return Assessment([accuracy_part(r, "hgrn2", "tnl", "higher")], accuracies_line(r, ["hgrn2", "tnl"]),
                      f"MQAR at d={r.width()}")


def _study(results: dict, section: str, key: str, what: str) -> Assessment:
    r, why = retrieval_result(results.get(section), section)
    if why:
        return Assessment(reason=why)
    base = baseline()
    ref = r.study_values(base, key)
    archs = [a for a in linear_archs() if r.study_values(a, key)]
    if not ref:
        return Assessment(reason=f"the {section} study has no {base} at two {what}s or more")
    parts = []
    for arch in archs:
        va = r.study_values(arch, key)
        accs = [x.accuracy for x in r.runs if x.arch in (arch, base) and x.accuracy is not None]
        stopped = [f"{a} {s}" for a in (arch, base) for s in r.study_not_plateaued(a, key)]
        reason = (f"every model at chance ({r.chance:.3f})" if max(accs) - r.chance <= ABOVE_CHANCE else
                  f"not plateaued: {', '.join(stopped)}" if stopped else None)
        parts.append(Difference(f"{arch} - {base}", f"spread of MQAR accuracy across {what}s", "", "higher",
                                ACC_MARGIN, a_values=va, b_values=ref, reason=reason))
    levels = sorted({x.study[key] for x in r.runs if key in x.study}, key=str)
    numbers = f"{what}s {', '.join(map(str, levels))}; spread (max - min across them, per seed): " + ", ".join(
        f"{a} {sum(v.values()) / len(v):.3f}" for a, v in ((a, r.study_values(a, key)) for a in [base, *archs]))
    return Assessment(parts, numbers, f"MQAR, {r.pairs} pairs")


def shape_matters(results: dict) -> Assessment:
    return _study(results, "aspect", "shape", "shape")


def context_matters(results: dict) -> Assessment:
    return _study(results, "context", "context", "context")


# ---- what a recipe's settings can decide (linlm reproduce --dry-run) ---------------------------------------------


def fits_undecidable(job, name: str = "scaling") -> Optional[str]:
    """Why the fits of the training section ``name`` cannot decide a claim, before anything is trained."""
    from collections import Counter

    if not job.has_ladder(name):
        return f"the recipe trains no {name} ladder"
    ladder = job.ladder(name)
    sizes = {r.name for r in ladder.rungs if r.archs is None}
    if len(sizes) < 3:
        return f"the {name} ladder has {len(sizes)} size(s); an envelope fit needs at least 3"
    seeded = Counter(a for r in ladder.rungs if r.archs is not None for a in r.archs)
    if not seeded:
        return (f"no size of the {name} ladder is trained with a second seed: no seed spread, so no fit has an "
                "interval (scaling: {seeds: ...})")
    return None


def training_undecidable(settings, section: str) -> Optional[str]:
    """Why an MQAR section's training (mqar, aspect, context, hybrid) cannot decide a claim, or None."""
    if settings.seeds < 2:
        return f"{section} trains one seed per configuration"
    if settings.plateau is None:
        return f"{section} trains a fixed number of steps, not to a plateau (no plateau rule)"
    return None


def mqar_undecidable(job, archs: tuple[str, ...]) -> Optional[str]:
    m = job.recipe.mqar
    if not m.widths:
        return "the recipe runs no MQAR experiment"
    names = {c.name().rsplit("-d", 1)[0] for c in m.configs()}
    missing = [a for a in archs if a not in names]
    if missing:
        return f"mqar trains no {', '.join(missing)}"
    return training_undecidable(m, "mqar")


def study_undecidable(job, section: str) -> Optional[str]:
    s = getattr(job.recipe, section)
    levels = s.shapes if section == "aspect" else s.gaps
    if not levels:
        return f"the recipe runs no {section} study"
    if baseline() not in s.archs or not set(s.archs) & set(linear_archs()):
        return f"the {section} study trains no {baseline()} beside a linear model"
    return training_undecidable(s, section)


CLAIMS = [
    Claim("scale-alike", "Linear models scale like transformers", PAPER,
          "Table 3: L(C) = beta C^alpha with alpha -0.0798 (LLaMA), -0.0768 (TNL), -0.0753 (HGRN2), -0.0756 "
          "(cosFormer2), 70M-7B, 300B tokens",
          f"each linear model's L(C) exponent minus LLaMA's; alike within ±{ALPHA_MARGIN}", ("fits",), scale_alike,
          fits_undecidable),
    Claim("lower-loss", "At equal compute, linear models reach lower loss", PAPER,
          "Table 3's L(C): the linear models' beta below LLaMA's, so lower loss at equal FLOPs over its range",
          f"fitted loss at C*, a compute inside every fit's range, minus LLaMA's; alike within ±{LOSS_MARGIN} nats",
          ("fits",), lower_loss, fits_undecidable),
    Claim("weaker-retrieval", "Linear models are weaker at retrieval", PAPER,
          "NIAH at 7B: LLaMA 59.7 weighted against TNL 20.5, HGRN2 30.8, cosFormer2 23.6",
          f"MQAR accuracy (key-value pairs beyond a small state) minus LLaMA's, paired by seed, each model at its "
          f"own learning rate and trained to a plateau; alike within ±{ACC_MARGIN}", ("mqar",), weaker_at_retrieval,
          lambda job: mqar_undecidable(job, (baseline(), *linear_archs()))),
    Claim("decay", "Data-dependent decay helps retrieval", PAPER,
          "HGRN2 (data-dependent decay) above TNL (fixed decay) in NIAH: 30.8 against 20.5 at 7B",
          "MQAR accuracy of HGRN2 minus TNL's, paired by seed", ("mqar",), decay_helps_retrieval,
          lambda job: mqar_undecidable(job, ("hgrn2", "tnl"))),
    Claim("optimum", "At the compute optimum, linear models use more parameters and more tokens", PAPER,
          "Table 3's N_opt(C) and D_opt(C): the linear models' above LLaMA's over the paper's compute range",
          f"log N_opt and log D_opt at C* (read at that compute) minus LLaMA's; alike within a factor "
          f"{math.exp(RATIO_MARGIN):.2f}", ("fits",), more_params_and_tokens, fits_undecidable),
    Claim("aspect", "Shape (aspect ratio) matters more for linear models than for LLaMA", PAPER,
          "the 1B aspect study (d/l 1536/32 to 3072/8): cosFormer2's retrieval collapses at the shallowest shape",
          "spread of MQAR accuracy across shapes of equal size (>= 3 layers) minus LLaMA's, per seed",
          ("aspect",), shape_matters, lambda job: study_undecidable(job, "aspect")),
    Claim("context", "Shape (context length) matters more for linear models than for LLaMA", PAPER,
          "the 1B model trained at 2K, 4K and 16K: the linear models' retrieval depends on the context length",
          "spread of MQAR accuracy across contexts (pairs and queries apart by a gap) minus LLaMA's, per seed",
          ("context",), context_matters, lambda job: study_undecidable(job, "context")),
]


def seeds_text(n: int) -> str:
    return f"{n} seed" + ("s" if n != 1 else "")
