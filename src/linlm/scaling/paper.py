"""The paper's published scaling laws (arXiv 2406.16690, Table 3), C in PFLOP/s-days.

Each entry is ``(beta, alpha)`` of ``y = beta * C^alpha``. These are printed values; the paper gives no intervals.
"""

from __future__ import annotations

from linlm.scaling.fits import PowerLaw

PAPER_TABLE3: dict[str, dict[str, tuple[float, float]]] = {
    "llama": {"L(C)": (3.7087, -0.0798), "N_opt(C)": (1.82e8, 0.7118), "D_opt(C)": (2.56e10, 0.5102)},
    "tnl": {"L(C)": (3.5391, -0.0768), "N_opt(C)": (2.74e8, 0.6470), "D_opt(C)": (4.43e10, 0.4684)},
    "hgrn2": {"L(C)": (3.4788, -0.0753), "N_opt(C)": (2.66e8, 0.6427), "D_opt(C)": (4.80e10, 0.4500)},
    "cosformer2": {"L(C)": (3.5877, -0.0756), "N_opt(C)": (2.65e8, 0.6516), "D_opt(C)": (4.23e10, 0.4529)},
}


# The compute the paper's ladder reaches at 300B tokens, C = 6 N D for its smallest and largest rows (20.5M and
# 6,476.5M non-embedding parameters), in PFLOP/s-days: Table 3's laws are quoted only inside this range.
PAPER_COMPUTE_RANGE = (6 * 20.5e6 * 300e9 / 8.64e19, 6 * 6476.5e6 * 300e9 / 8.64e19)


def paper_ratio(arch: str, base: str, quantity: str, c: float) -> float:
    """Table 3's ``quantity`` of ``arch`` over ``base``'s at compute ``c`` (PFLOP/s-days)."""
    (ba, aa), (bb, ab) = PAPER_TABLE3[arch][quantity], PAPER_TABLE3[base][quantity]
    return ba / bb * c ** (aa - ab)


def paper_law(arch: str, quantity: str = "L(C)") -> PowerLaw:
    beta, alpha = PAPER_TABLE3[arch][quantity]
    return PowerLaw(beta=beta, alpha=alpha, r2=float("nan"), n_points=0)
