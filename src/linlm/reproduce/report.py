"""DIR/report.md and DIR/report.html of a reproduce job: the claims table first, then every section's tables and
plots (each section renders its own part, :mod:`linlm.reproduce.sections`), then the exact configuration, the
versions and the git revision."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from linlm import outputs
from linlm.reproduce.claims import Verdict, judge
from linlm.reproduce.seeds import seed_values
from linlm.reproduce import sections


@dataclass
class Written:
    md: Path
    html: Path
    claims: list[Verdict]

    def __fspath__(self) -> str:
        return str(self.md)

    def __str__(self) -> str:
        return str(self.md)


def thresholds() -> list[list[str]]:
    """Every test the verdicts use, when it gives a verdict, its chance of a false one, and every margin."""
    import math

    from linlm.reproduce.claims import mossnet as M, scaling_laws as S
    from linlm.reproduce.claims.rule import threshold_rows

    rows = threshold_rows({
        "L(C) exponent": f"±{S.ALPHA_MARGIN:g} (a quarter of Table 3's LLaMA exponent)",
        "loss": f"±{S.LOSS_MARGIN:g} nats/token",
        "accuracy, and its spread across shapes or contexts": f"±{S.ACC_MARGIN:g}",
        "N_opt, D_opt": f"a factor {math.exp(S.RATIO_MARGIN):.2f} (±{S.RATIO_MARGIN:.3f} in log)"})
    return rows + [
        ["above chance", f"MQAR accuracy more than {S.ABOVE_CHANCE:g} above chance on one side",
         "otherwise the part cannot tell (a model at chance has learned nothing to compare)", "stated"],
        ["constant state", f"at most {M.CONSTANT_STATE:g}x from the shortest to the longest context",
         "for; above it, against (a measured size: no noise)", "none: exact"]]


def verdict_cell(v: Verdict) -> str:
    return f"{v.verdict}: {v.why}" if v.why else v.verdict


def claims_blocks(claims: list[Verdict], seeds: list[int]) -> list[tuple]:
    rows = [[c.claim, c.paper, verdict_cell(c), c.scale or "-", c.evidence, c.difference, c.terms] for c in claims]
    seeded = (f"The comparison trained each architecture with {len(seeds)} seeds (train config seeds "
              f"{', '.join(map(str, seeds))})" if len(seeds) > 1 else "The comparison trained each architecture "
              f"with one seed ({seeds[0]}): its differences cannot be judged ('cannot tell: one seed')")
    return [("h2", "Claims"),
            ("p", "Each verdict is computed from this run's numbers by one rule (linlm/reproduce/claims/rule.py): "
                  "every claim names the differences it is about, each with its 95 % interval over the unit that "
                  "varies (seeds, paired where they share the data order; seed replicates for fitted laws). "
                  "Holm's correction runs over every difference of the report that is tested (one that cannot be "
                  "judged, such as a run that did not plateau, is set aside first): a difference that counts is 'for' "
                  "on the side the claim predicts and 'against' on the other; one that does not count is 'alike' "
                  "only when two one-sided tests put it inside its stated margin, and otherwise 'cannot tell'. A "
                  "claim whose parts disagree is 'mixed'. 'cannot tell' says why: the data at this scale cannot "
                  f"decide it, not that the claim is false. {seeded}."),
            ("table", ["claim", "paper", "verdict", "scale", "differences (95 % interval, p) and numbers",
                       "judged by", "the paper's own terms"], rows),
            ("p", "The tests, when each gives a verdict, and its chance of a false one:"),
            ("table", ["test", "for", "verdict", "chance of a false verdict"], thresholds())]


def tradeoff_blocks(recipe) -> list[tuple]:
    """The recipe's ``tradeoffs``: what its sizes give up, section by section (nothing when it states none)."""
    if not recipe.tradeoffs:
        return []
    return [("h2", "What this recipe's size gives up"),
            ("p", f"The {recipe.name} recipe trains small models briefly to fit its time budget; each choice below "
                  "lowers the power of the claims that rest on that section, so read a 'cannot tell' against it."),
            ("table", ["section", "choice and its price"], [[k, str(v)] for k, v in recipe.tradeoffs.items()])]


def _data_dir_used(job, marker: dict) -> str:
    """The directory the zero-shot section read, once it has run; before, the one it will read."""
    used = (job.results.get("zeroshot") or {}).get("data_dir")
    if used:
        return used
    return f"{marker.get('data_dir') or 'none given'} (the section has not run)"


def provenance_blocks(job, marker: dict) -> list[tuple]:
    env = marker["environment"]
    rev = env["git_revision"]
    return [("h2", "Configuration and versions"),
            ("table", ["item", "value"], [["recipe", job.recipe.name], ["linlm", env["linlm_version"]],
                                           ["git revision", rev + ("+dirty" if env["git_dirty"] else "") if rev
                                            else "not a git checkout"],
                                           ["torch", env["torch_version"]], ["numpy", env["numpy_version"]],
                                           ["python", env["python_version"]], ["platform", env["platform"]],
                                           ["CPU", env["cpu_model"]], ["started", marker["created"]],
                                           ["data dir (zero-shot)", _data_dir_used(job, marker)],
                                           ["scaling sweep", marker.get("scaling_dir") or "scaling/"],
                                           ["--set (every training run)", json.dumps(marker.get("overrides") or {})]]),
            ("p", "The recipe, exactly as run (linlm/reproduce/recipes/" + job.recipe.name + ".yaml, with the ladder "
                  f"{job.recipe.scaling.ladder!r} from linlm/scaling/ladders/):"),
            ("pre", json.dumps(job.recipe.source(), indent=1))]


def write(job, pending: list[str], marker: dict) -> Written:
    from linlm.render import render_html, render_markdown

    claims = judge(job.results)
    title = f"linlm reproduce: recipe {job.recipe.name}"
    intro = (f"{job.recipe.description}. Both studies at this recipe's scale on the built-in corpus: the scaling "
             "laws of LLaMA, TNL, HGRN2 and cosFormer2 (arXiv 2406.16690) and MossNet against Mamba and LLaMA "
             "(arXiv 2510.26182).")
    if pending:
        intro += f" Incomplete: {', '.join(pending)} not finished; run the same command again."
    shown = sorted((s for s in sections.SECTIONS if s.render is not None), key=lambda s: s.report_rank)
    seeds = seed_values(job.recipe.compare.ladder, job.seed_count)
    blocks = [("h1", title), ("p", intro), *claims_blocks(claims, seeds),
              *tradeoff_blocks(job.recipe), *(b for s in shown for b in s.render(job, pending)),
              *provenance_blocks(job, marker)]
    for blk in blocks:  # a plot the report shows from elsewhere (the scaling report's) is copied into plots/
        target = job.out / blk[1] if blk[0] == "img" else None
        if target is not None and not (target.is_file() and target.read_bytes() == blk[2]):
            outputs.write_bytes(target, blk[2], "--out")
    md, html = job.out / "report.md", job.out / "report.html"
    outputs.write_text(md, render_markdown(blocks), "--out")
    outputs.write_text(html, render_html(blocks, title=title), "--out")
    # "preset": the key's first name, kept for tools that read results.json.
    results = {"preset": job.recipe.name, "sections": job.results, "failed": job.failures, "pending": pending,
               "waiting": job.waiting, "claims": [c.to_dict() for c in claims], "environment": marker["environment"],
               "settings": {k: marker.get(k) for k in ("overrides", "scaling_dir", "data_dir", "seeds")}}
    outputs.write_json(job.out / "results.json", results, "--out")
    return Written(md, html, claims)
