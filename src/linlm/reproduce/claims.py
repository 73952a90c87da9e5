"""The headline claims of the two papers, each judged from this run's own numbers.

A verdict is computed, never written in advance: every function takes the section results and returns the
verdict, the numbers it rests on and the rule (with its threshold) that decided it. Verdicts are one of
``supported``, ``partly supported`` (some of the models compared, not all), ``not supported``,
``not supported at this scale`` (the measurement cannot tell: no fit, or every model at chance) and
``not measured`` (the section did not run).

The architectures compared come from the registry: the baseline is :func:`linlm.models.registry.baseline_arch`,
the linear models of the scaling study's claims are its linear-attention architectures, and MossNet's baselines
are the baseline and the SSMs. Only the claims about one architecture name it (HGRN2's data-dependent decay
against TNL's and cosFormer2's fixed one; MossNet's own).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

SCALING = "Scaling Laws for Linear Complexity LMs (arXiv 2406.16690)"
MOSSNET = "MossNet (arXiv 2510.26182)"

# Thresholds (shown in the report beside each verdict).
EXPONENT_REL_TOL = 0.25  # exponents within 25 % of LLaMA's count as "scaling like" it
MIN_R2 = 0.8  # a fit of L(C) below this R^2 cannot support or refute anything
LOSS_MARGIN = 0.01  # nats/token: a smaller difference in loss is a tie
ACC_MARGIN = 0.05  # accuracy: a smaller difference in retrieval accuracy is a tie
ABOVE_CHANCE = 0.05  # a model within this of chance accuracy has not learned the task
CONSTANT_STATE = 1.01  # state(longest context) / state(shortest) at most this is constant


@dataclass
class Claim:
    claim: str
    paper: str
    verdict: str
    evidence: str
    rule: str

    def to_dict(self) -> dict:
        return asdict(self)


def linear_archs() -> list[str]:
    """The linear-attention architectures of the scaling study (the registry's), whose claims are judged here."""
    from linlm.models.archs.base import LINEAR_ATTENTION
    from linlm.models.registry import arch_names

    return arch_names(LINEAR_ATTENTION, scaling_study=True)


def baseline() -> str:
    """The softmax-attention baseline every claim compares against (the registry's)."""
    from linlm.models.registry import baseline_arch

    return baseline_arch()


def _tally(wins: int, total: int) -> str:
    if total == 0:
        return "not measured"
    return "supported" if wins == total else ("partly supported" if wins else "not supported")


def scale_like_transformers(fits: Optional[dict]) -> Claim:
    text, rule = "Linear models scale like transformers", (
        f"each linear model's L(C) exponent within {EXPONENT_REL_TOL:.0%} of LLaMA's, with R² >= {MIN_R2} for both")
    if not fits:
        return Claim(text, SCALING, "not measured", "the scaling fits did not run", rule)
    laws = {a: (f.get("envelope") or {}).get("L(C)") for a, f in fits.get("archs", {}).items()}
    base = baseline()
    ref = laws.get(base)
    if not ref or ref["r2"] < MIN_R2:
        why = f"no L(C) fit for {base}" if not ref else f"{base}'s L(C) fit has R² {ref['r2']:.2f}"
        return Claim(text, SCALING, "not supported at this scale", why, rule)
    parts, wins, total = [f"{base} alpha {ref['alpha']:.4f} (R² {ref['r2']:.2f})"], 0, 0
    for arch in linear_archs():
        law = laws.get(arch)
        if not law:
            parts.append(f"{arch}: no fit")
            continue
        if law["r2"] < MIN_R2:
            parts.append(f"{arch} alpha {law['alpha']:.4f} but R² {law['r2']:.2f}")
            continue
        rel = abs(law["alpha"] / ref["alpha"] - 1)
        total += 1
        wins += rel <= EXPONENT_REL_TOL
        parts.append(f"{arch} alpha {law['alpha']:.4f} ({rel:.0%} from {base})")
    verdict = _tally(wins, total) if total else "not supported at this scale"
    return Claim(text, SCALING, verdict, "; ".join(parts), rule)


def lower_loss_at_equal_compute(fits: Optional[dict]) -> Claim:
    text = "At equal compute, linear models reach lower loss"
    rule = (f"fitted L(C) of each linear model below LLaMA's by more than {LOSS_MARGIN} nats at the largest compute "
            "every architecture's envelope reaches")
    if not fits:
        return Claim(text, SCALING, "not measured", "the scaling fits did not run", rule)
    envs = {a: f.get("envelope") for a, f in fits.get("archs", {}).items() if f.get("envelope")}
    base = baseline()
    if base not in envs:
        return Claim(text, SCALING, "not supported at this scale", f"no L(C) fit for {base}", rule)
    c = min(max(e["envelope"]["compute_pflops_days"]) for e in envs.values())

    def at(arch):
        law = envs[arch]["L(C)"]
        return law["beta"] * c ** law["alpha"]

    ref = at(base)
    parts, wins, total = [f"at C = {c:.3e} PFLOP/s-days: {base} {ref:.4f}"], 0, 0
    for arch in linear_archs():
        if arch not in envs:
            parts.append(f"{arch}: no fit")
            continue
        v = at(arch)
        total += 1
        wins += v < ref - LOSS_MARGIN
        parts.append(f"{arch} {v:.4f} ({v - ref:+.4f})")
    return Claim(text, SCALING, _tally(wins, total), "; ".join(parts), rule)


def _mqar_best(mqar: Optional[dict]) -> tuple[dict, Optional[int]]:
    """{name-without-width: accuracy} at the largest width of the MQAR experiment."""
    if not mqar or not mqar.get("rows"):
        return {}, None
    width = max(r["d_model"] for r in mqar["rows"])
    return {r["name"].rsplit("-d", 1)[0]: r["accuracy"] for r in mqar["rows"] if r["d_model"] == width}, width


def weaker_at_retrieval(mqar: Optional[dict], niah: Optional[dict]) -> Claim:
    text = "Linear models are weaker at retrieval"
    rule = (f"MQAR accuracy at the largest width: LLaMA above each linear model by more than {ACC_MARGIN:.2f}; "
            f"LLaMA must be more than {ABOVE_CHANCE:.2f} above chance")
    acc, width = _mqar_best(mqar)
    base = baseline()
    if base not in acc:
        return Claim(text, SCALING, "not measured", f"no MQAR result for {base}", rule)
    chance = mqar["chance"]
    parts = [f"MQAR d={width}: {base} {acc[base]:.3f} (chance {chance:.3f})"]
    wins = total = 0
    for arch in linear_archs():
        if arch in acc:
            total += 1
            wins += acc[base] - acc[arch] > ACC_MARGIN
            parts.append(f"{arch} {acc[arch]:.3f}")
    if niah and niah.get("models"):
        parts.append("NIAH mean: " + ", ".join(f"{k} {v['mean']:.2f}" for k, v in niah["models"].items()))
    if acc[base] - chance <= ABOVE_CHANCE:
        return Claim(text, SCALING, "not supported at this scale", "; ".join(parts), rule)
    return Claim(text, SCALING, _tally(wins, total), "; ".join(parts), rule)


def decay_helps_retrieval(mqar: Optional[dict]) -> Claim:
    text = "Data-dependent decay helps retrieval"
    rule = (f"MQAR accuracy at the largest width: HGRN2 (data-dependent decay) above both TNL and cosFormer2 (fixed "
            f"decay) by more than {ACC_MARGIN:.2f}; some linear model must be more than {ABOVE_CHANCE:.2f} above chance")
    acc, width = _mqar_best(mqar)
    fixed = [a for a in ("tnl", "cosformer2") if a in acc]
    if "hgrn2" not in acc or not fixed:
        return Claim(text, SCALING, "not measured", "MQAR did not include hgrn2 and a fixed-decay model", rule)
    chance = mqar["chance"]
    parts = [f"MQAR d={width}: hgrn2 {acc['hgrn2']:.3f}"] + [f"{a} {acc[a]:.3f}" for a in fixed]
    if "mamba" in acc:
        parts.append(f"(mamba, also data-dependent: {acc['mamba']:.3f})")
    if max(acc["hgrn2"], *(acc[a] for a in fixed)) - chance <= ABOVE_CHANCE:
        return Claim(text, SCALING, "not supported at this scale", "; ".join(parts), rule)
    wins = sum(acc["hgrn2"] - acc[a] > ACC_MARGIN for a in fixed)
    return Claim(text, SCALING, _tally(wins, len(fixed)), "; ".join(parts), rule)


def mossnet_beats_baselines(compare_quality: Optional[dict]) -> Claim:
    from linlm.models.archs.base import SSM
    from linlm.models.registry import arch_names

    text = "MossNet beats transformer and SSM baselines"
    rule = (f"validation loss of MossNet below LLaMA's and Mamba's (equal active parameters, equal tokens) by more "
            f"than {LOSS_MARGIN} nats/token")
    models = (compare_quality or {}).get("models", {})
    by_arch = {m["arch"]: m for m in models.values()}
    if "mossnet" not in by_arch:
        return Claim(text, MOSSNET, "not measured", "no trained MossNet in the comparison", rule)
    ref = by_arch["mossnet"]
    parts = [f"mossnet {ref['val_loss']:.4f} ({ref['bits_per_byte']:.4f} bpb, {ref['params']:,} active)"]
    wins = total = 0
    for arch in (baseline(), *arch_names(SSM)):  # the paper's baselines: the transformer and the SSMs
        if arch in by_arch:
            m = by_arch[arch]
            total += 1
            wins += ref["val_loss"] < m["val_loss"] - LOSS_MARGIN
            parts.append(f"{arch} {m['val_loss']:.4f} ({m['bits_per_byte']:.4f} bpb, {m['params']:,} active)")
    return Claim(text, MOSSNET, _tally(wins, total), "; ".join(parts), rule)


def constant_memory_decode(decode: Optional[dict]) -> Claim:
    from linlm.reproduce.sections.decode import state_growth

    text = "MossNet decodes with constant memory"
    rule = f"MossNet's decoding state at the longest profiled context at most {CONSTANT_STATE}x its state at the shortest"
    rows = (decode or {}).get("rows") or []
    g = state_growth(rows, "mossnet")
    if g is None:
        return Claim(text, MOSSNET, "not measured", "decode profile has no MossNet rows", rule)
    parts = [f"mossnet state {g['state_lo']:,} B at {g['context_lo']} tokens, {g['state_hi']:,} B at "
             f"{g['context_hi']} ({g['ratio']:.3f}x over a {g['context_ratio']:.0f}x longer context)"]
    base = baseline()
    ref = state_growth(rows, base)
    if ref is not None:
        parts.append(f"{base} KV cache {ref['ratio']:.1f}x over the same contexts")
    verdict = "supported" if g["ratio"] <= CONSTANT_STATE else "not supported"
    return Claim(text, MOSSNET, verdict, "; ".join(parts), rule)


def judge(results: dict) -> list[Claim]:
    """Every claim, from the saved sections (missing ones give "not measured")."""
    fits = results.get("fits")
    return [scale_like_transformers(fits), lower_loss_at_equal_compute(fits),
            weaker_at_retrieval(results.get("mqar"), results.get("niah")), decay_helps_retrieval(results.get("mqar")),
            mossnet_beats_baselines(results.get("compare_quality")), constant_memory_decode(results.get("decode")),
            shape_matters_more(results.get("aspect_loss"), "aspect ratio"),
            shape_matters_more(results.get("context_loss"), "context length"),
            mossnet_scales_as_well(results.get("mossnet_fits"))]


SHAPE_MARGIN = 0.01  # nats/token: spreads across shapes closer than this (or than the seed range) are a tie


def shape_matters_more(study: Optional[dict], what: str) -> Claim:
    """From a shape study's losses (:func:`linlm.scaling.shapes.study_losses`): is each linear model's spread of
    loss across shapes larger than the baseline's, by more than the seeds' own spread or the stated margin?"""
    text = f"Shape ({what}) matters more for linear models than for LLaMA"
    rule = (f"spread of validation loss across the {what}s (max - min of each shape's mean over seeds): a linear "
            f"model's counts as larger than LLaMA's only if it exceeds it by more than the margin, the larger of "
            f"{SHAPE_MARGIN} nats/token and the largest seed range (max - min over the seeds of one shape) of the "
            "two; smaller by more than the margin counts as smaller; otherwise a tie")
    if not study or "not_run" in study or not study.get("archs"):
        return Claim(text, SCALING, "not measured", f"the {what} study did not run", rule)
    archs, base = study["archs"], baseline()
    if base not in archs:
        return Claim(text, SCALING, "not measured", f"the {what} study has no {base}", rule)
    ref = archs[base]

    def seeds(a: dict) -> str:
        return f", seed range {a['seed_range']:.4f}" if a.get("seed_range") is not None else ", one seed"

    parts = [f"{base} spread {ref['spread']:.4f}{seeds(ref)}"]
    larger = smaller = ties = 0
    for arch in linear_archs():
        if arch not in archs:
            continue
        a = archs[arch]
        margin = max([SHAPE_MARGIN, *(x["seed_range"] for x in (a, ref) if x.get("seed_range") is not None)])
        diff = a["spread"] - ref["spread"]
        if diff > margin:
            larger, word = larger + 1, "larger"
        elif diff < -margin:
            smaller, word = smaller + 1, "smaller"
        else:
            ties, word = ties + 1, "tie"
        parts.append(f"{arch} spread {a['spread']:.4f}{seeds(a)} ({diff:+.4f} against margin {margin:.4f}: {word})")
    total = larger + smaller + ties
    if total == 0:
        return Claim(text, SCALING, "not measured", f"the {what} study has no linear model", rule)
    if larger:
        verdict = _tally(larger, total)
    else:
        verdict = "not supported" if smaller else "not supported at this scale"
    return Claim(text, SCALING, verdict, "; ".join(parts), rule)


def mossnet_scales_as_well(fits: Optional[dict]) -> Claim:
    """From the fits of MossNet's ladder: is MossNet's L(C) exponent at least as steep as each baseline's, by
    the bootstrap intervals?"""
    import math

    from linlm.models.archs.base import SSM
    from linlm.models.registry import arch_names

    text = "MossNet scales at least as well as its baselines"
    rule = (f"L(C) exponent alpha (more negative: loss falls faster with compute) of MossNet against LLaMA's and "
            f"the SSMs' on MossNet's ladder (active parameters), by their 95 % bootstrap intervals: worse only if "
            f"MossNet's interval lies wholly above a baseline's (without intervals, its point estimate above); "
            f"R² >= {MIN_R2} for both")
    if not fits or "not_run" in fits:
        return Claim(text, MOSSNET, "not measured", "MossNet's ladder did not run", rule)
    laws = {a: (f.get("envelope") or {}).get("L(C)") for a, f in fits.get("archs", {}).items()}

    def interval(law: dict) -> tuple[float, float]:
        lo, hi = (law.get("alpha_ci") or [math.nan, math.nan])[:2]
        ok = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (lo, hi))
        return (lo, hi) if ok else (law["alpha"], law["alpha"])

    ref = laws.get("mossnet")
    if not ref or ref["r2"] < MIN_R2:
        why = "no L(C) fit for mossnet" if not ref else f"mossnet's L(C) fit has R² {ref['r2']:.2f}"
        return Claim(text, MOSSNET, "not supported at this scale", why, rule)
    m_lo, m_hi = interval(ref)
    parts = [f"mossnet alpha {ref['alpha']:.4f} [{m_lo:.4f}, {m_hi:.4f}] (R² {ref['r2']:.2f})"]
    wins = total = 0
    for arch in (baseline(), *arch_names(SSM)):
        law = laws.get(arch)
        if not law or law["r2"] < MIN_R2:
            why = "not in the ladder" if arch not in laws else "no fit" if not law else f"R² {law['r2']:.2f}"
            parts.append(f"{arch}: {why}")
            continue
        b_lo, b_hi = interval(law)
        worse, better = m_lo > b_hi, m_hi < b_lo
        total += 1
        wins += not worse
        word = "worse" if worse else "better" if better else "intervals overlap"
        parts.append(f"{arch} alpha {law['alpha']:.4f} [{b_lo:.4f}, {b_hi:.4f}] ({word})")
    verdict = _tally(wins, total) if total else "not supported at this scale"
    return Claim(text, MOSSNET, verdict, "; ".join(parts), rule)
