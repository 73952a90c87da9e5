"""How often the judging rule gives a false verdict: on pure noise, a report of every claim at cpu scale.

linlm.reproduce.claims.rule decides every difference of a report together (Holm over all of them; "alike" only by
two one-sided tests within a margin). This measures, over --draws simulated reports:

* ``no difference``: every true difference is 0. A "for" or "against" anywhere in the report is false; the rule
  promises at most 5 %. Beside it, the same differences each judged at 5 % without Holm, and the rule the reports
  used before (two architectures apart when their ranges over 3 seeds do not overlap) on the report's 7 seeded
  comparisons.
* ``at the margin``: every true difference equals its margin. An "alike" anywhere is false; the rule promises at
  most 5 %.

The report has the differences of the cpu recipe's scaling fits and comparison and of cpu-long's retrieval
sections (the cpu recipe had both before revision ea7f4ed), at 3 seeds: 12 read off scaling fits (3 exponents, 3
losses at C*, 3 N_opt and 3 D_opt; each side's replicates drawn around its own noisy estimate, as a calibrated
bootstrap gives them) and 10 over 3 seeds paired by seed (4 retrieval, 2 heads, 2 MossNet losses, 1 aspect, 1
context; seeds share a per-seed offset, as seeds sharing a data order do). Noise is normal with standard deviation
1 (the margins are in those units: 0.5). Writes benchmarks/results/bench_verdicts.json.

    python benchmarks/bench_verdicts.py [--draws 2000] [--replicates 400]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, write_json  # noqa: E402

from linlm.reproduce.claims.rule import ALIKE, CANNOT, Assessment, Difference, decide  # noqa: E402

FITTED, SEEDED, SEEDS, MARGIN = 12, 10, 3, 0.5


def report(rng, truth: float, replicates: int) -> list[Difference]:
    """One simulated report's differences, each with true value ``truth``."""
    parts = []
    for i in range(FITTED):
        est_a, est_b = rng.normal(truth, 1.0), rng.normal(0.0, 1.0)
        parts.append(Difference(f"fit{i}", "x", "", "higher", MARGIN,
                                a_replicates=rng.normal(est_a, 1.0, replicates),
                                b_replicates=rng.normal(est_b, 1.0, replicates), value=est_a - est_b))
    for i in range(SEEDED):
        shared = rng.normal(0.0, 1.0, SEEDS)  # one data order per seed, shared by both sides
        parts.append(Difference(f"seed{i}", "x", "", "higher", MARGIN,
                                a_values=dict(enumerate(truth + shared + rng.normal(0.0, 1.0, SEEDS))),
                                b_values=dict(enumerate(shared + rng.normal(0.0, 1.0, SEEDS)))))
    return parts


def old_rule_separates(d: Difference) -> bool:
    """The rule before: ranges over the seeds apart (either direction)."""
    a, b = list(d.a_values.values()), list(d.b_values.values())
    return max(a) < min(b) or max(b) < min(a)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--replicates", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    counts = {"any false for/against (the rule, Holm)": 0, "any false for/against (each at 5 %, no Holm)": 0,
              "any false separation (the rule before, 7 seeded comparisons)": 0,
              "any false alike (the rule, at the margin)": 0}
    per_part = {"for/against, no difference": 0, "alike, at the margin": 0}
    started = time.perf_counter()
    for _ in range(args.draws):
        null = report(rng, 0.0, args.replicates)
        decide([Assessment(null)])
        counts["any false for/against (the rule, Holm)"] += any(d.outcome not in (CANNOT, ALIKE) for d in null)
        counts["any false for/against (each at 5 %, no Holm)"] += any(d.p <= 0.05 for d in null)
        seeded = [d for d in null if d.a_values is not None][:7]
        counts["any false separation (the rule before, 7 seeded comparisons)"] += any(map(old_rule_separates, seeded))
        per_part["for/against, no difference"] += sum(d.outcome not in (CANNOT, ALIKE) for d in null)
        edge = report(rng, MARGIN, args.replicates)
        decide([Assessment(edge)])
        counts["any false alike (the rule, at the margin)"] += any(d.outcome == ALIKE for d in edge)
        per_part["alike, at the margin"] += sum(d.outcome == ALIKE for d in edge)
    seconds = time.perf_counter() - started
    promised = {"any false for/against (the rule, Holm)": 0.05, "any false alike (the rule, at the margin)": 0.05}
    rows = [{"false verdict": k, "rate": v / args.draws, "promised": promised.get(k),
             "draws": args.draws} for k, v in counts.items()]
    parts = FITTED + SEEDED
    rows += [{"false verdict": f"per difference: {k}", "rate": v / (args.draws * parts), "promised": None,
              "draws": args.draws * parts} for k, v in per_part.items()]
    print_table(["false verdict", "rate", "promised", "draws"],
                [[r["false verdict"], f"{100 * r['rate']:.1f} %",
                  "" if r["promised"] is None else f"<= {100 * r['promised']:.0f} %", r["draws"]] for r in rows])
    path = write_json("bench_verdicts", {"meta": meta(), "differences": {"fitted": FITTED, "seeded": SEEDED,
                                                                        "seeds": SEEDS, "margin": MARGIN,
                                                                        "replicates": args.replicates},
                                         "rates": rows, "seconds": seconds})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
