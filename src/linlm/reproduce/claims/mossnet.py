"""The claims of MossNet (arXiv 2510.26182), each in the paper's own terms. MossNet's baselines are the registry's
baseline and its SSMs."""

from __future__ import annotations

from typing import Optional

from linlm.reproduce.claims.evidence import Fits, Retrieval, seeded
from linlm.reproduce.claims.record import Claim
from linlm.reproduce.claims.rule import AGAINST, FOR, Assessment, Difference
from linlm.reproduce.claims.scaling_laws import (ACC_MARGIN, ALPHA_MARGIN, LOSS_MARGIN, accuracy_part, baseline,
                                                 fits_undecidable, mqar_undecidable, seeds_text)

PAPER = "MossNet (arXiv 2510.26182)"
CONSTANT_STATE = 1.01  # state(longest context) / state(shortest) at most this is constant
# The MQAR configurations of the heads claim (linlm.experiments.mqar_grid): the paper's MossNet (E = 4 experts, 2 a
# token), one expert widened to its active parameters, and the SSM with its state per layer.
HEADS = "mossnet-E4-routed-k2"
ONE_WIDE = "mossnet-E1-wide"


def ssm_archs() -> list[str]:
    from linlm.models.archs.base import SSM
    from linlm.models.registry import arch_names

    return arch_names(SSM)


def beats_baselines(results: dict) -> Assessment:
    models = (results.get("compare_quality") or {}).get("models") or {}
    losses = seeded(models, "val_loss", group=lambda m: m["arch"])
    if "mossnet" not in losses:
        return Assessment(reason="no trained MossNet in the comparison (the compare sections did not run)")
    active = {m["arch"]: m.get("params") for m in models.values()}
    parts = []
    for arch in (baseline(), *ssm_archs()):
        if arch in losses:
            parts.append(Difference(f"mossnet - {arch}", "validation loss", "nats", "lower", LOSS_MARGIN,
                                    a_values=losses["mossnet"], b_values=losses[arch],
                                    note=f" (active {active['mossnet']:,} against {active[arch]:,})"))
    numbers = "validation loss over seeds: " + ", ".join(
        f"{a} {sum(v.values()) / len(v):.4f} ({seeds_text(len(v))})" for a, v in losses.items())
    return Assessment(parts, numbers, f"{active['mossnet'] / 1e6:.2g}M active parameters, equal tokens")


def constant_memory(results: dict) -> Assessment:
    from linlm.reproduce.sections.decode import state_growth

    rows = (results.get("decode") or {}).get("rows") or []
    g = state_growth(rows, "mossnet")
    if g is None:
        return Assessment(reason="the decode profile has no MossNet rows at two contexts")
    part = Difference(f"mossnet state at {g['context_hi']} / at {g['context_lo']} tokens", "decoding state", "x",
                      "lower", exact=True, value=g["ratio"])
    part.outcome = FOR if g["ratio"] <= CONSTANT_STATE else AGAINST
    ref = state_growth(rows, baseline())
    numbers = (f"mossnet {g['state_lo']:,} B at {g['context_lo']} tokens, {g['state_hi']:,} B at {g['context_hi']}"
               + (f"; {baseline()}'s KV cache {ref['ratio']:.1f}x over the same contexts" if ref else ""))
    return Assessment([part], numbers, f"contexts {g['context_lo']}-{g['context_hi']}")


def experts_act_as_heads(results: dict) -> Assessment:
    from linlm.experiments.mqar_grid import equal_state_label

    r = Retrieval.read(results.get("mqar"))
    if r is None or r.not_run or not r.runs:
        return Assessment(reason=(r.not_run if r and r.not_run else "the mqar section did not run"))
    if not r.values(HEADS):
        return Assessment(reason=f"MQAR trained no {HEADS} (the recipe's experts and policies must include E = 4, "
                                 "routed-k2)")
    parts = [accuracy_part(r, HEADS, ONE_WIDE, "higher")]
    same_state = equal_state_label("mamba", 4).rsplit("-d", 1)[0]
    if r.values(same_state):
        parts.append(accuracy_part(r, HEADS, same_state, "higher"))
    shown = [c for c in (HEADS, ONE_WIDE, same_state, "mossnet-E1") if r.values(c)]
    numbers = f"MQAR, {r.pairs} pairs, d={r.width()}, chance {r.chance:.3f}: " + ", ".join(
        f"{c} {sum(r.values(c).values()) / len(r.values(c)):.3f}" for c in shown)
    return Assessment(parts, numbers, f"MQAR at d={r.width()}")


def scales_as_well(results: dict) -> Assessment:
    fits = Fits.read(results.get("mossnet_fits"))
    if fits is None or fits.not_run:
        return Assessment(reason=fits.not_run if fits else "MossNet's ladder did not run")
    if "mossnet" not in fits.laws or "mossnet" in fits.errors:
        return Assessment(reason=f"mossnet's L(C) fit: {fits.errors.get('mossnet', 'not in the ladder')}",
                          scale=fits.scale())
    ref = fits.laws["mossnet"]
    parts = []
    for arch in (baseline(), *ssm_archs()):
        if arch not in fits.laws and arch not in fits.errors:
            continue
        name = f"mossnet - {arch}"
        if arch in fits.errors:
            parts.append(Difference(name, "L(C) exponent", "", "lower", ALPHA_MARGIN, reason=fits.errors[arch],
                                    alike_means=FOR))
            continue
        law = fits.laws[arch]
        parts.append(Difference(name, "L(C) exponent", "", "lower", ALPHA_MARGIN, a_replicates=ref.alpha_samples(),
                                b_replicates=law.alpha_samples(), value=ref.alpha - law.alpha, alike_means=FOR))
    numbers = "; ".join(f"{a} alpha {law.alpha:.4f} ({law.runs} runs, {law.sizes} sizes)" for a, law in
                        fits.laws.items())
    return Assessment(parts, numbers, fits.scale() + ", active parameters")


def compare_undecidable(job) -> Optional[str]:
    if "mossnet" not in job.compare_ladder().archs:
        return "the comparison trains no MossNet"
    return "the comparison trains one seed per architecture" if job.seed_count < 2 else None


def decode_undecidable(job) -> Optional[str]:
    d = job.recipe.decode
    archs = d.archs or job.compare_ladder().archs
    if "mossnet" not in archs or len(set(d.contexts)) < 2:
        return "the decode profile has no MossNet at two contexts"
    return None


CLAIMS = [
    Claim("mossnet-beats", "MossNet beats transformer and SSM baselines", PAPER,
          "MossNet above LLaMA and Mamba of similar size and data on the paper's benchmarks",
          f"validation loss of MossNet minus each baseline's at equal active parameters and tokens, paired by seed; "
          f"alike within ±{LOSS_MARGIN} nats", ("compare_quality",), beats_baselines, compare_undecidable),
    Claim("constant-memory", "MossNet decodes with constant memory", PAPER,
          "constant-size recurrent state on a phone and an A100",
          f"MossNet's decoding state at the longest profiled context over the shortest: for at most "
          f"{CONSTANT_STATE}x (a measured size, no noise)", ("decode",), constant_memory, decode_undecidable),
    Claim("heads", "SSM experts act as heads (MossNet's E experts recall better than one)", PAPER,
          "several SSM experts combined per token act as the heads of multi-head attention",
          f"MQAR accuracy of MossNet E = 4, k = 2 minus one expert widened to equal active parameters, and minus "
          f"Mamba of equal state per layer, paired by seed; alike within ±{ACC_MARGIN}", ("mqar",),
          experts_act_as_heads, lambda job: mqar_undecidable(job, (HEADS, ONE_WIDE))),
    Claim("mossnet-scales", "MossNet scales at least as well as its baselines", PAPER,
          "MossNet's loss falls with compute at least as fast as its baselines'",
          f"MossNet's L(C) exponent minus each baseline's on MossNet's ladder (active parameters): for when lower "
          f"or alike within ±{ALPHA_MARGIN}", ("mossnet_fits",), scales_as_well,
          lambda job: fits_undecidable(job, "mossnet")),
]
