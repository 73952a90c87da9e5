"""The ``niah`` section: needle in a haystack (:mod:`linlm.eval.niah`) for the largest model of each architecture
of the scaling sweep and for every run (each seed) of the comparison, the haystack cut from each model's own
validation text; a heatmap per model. Every result carries its chance level, and a table where no model is above
chance says that the measurement cannot separate the models at this scale."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from linlm.eval.niah import NIAHConfig

from linlm.reproduce.section import (Blocks, Section, Tick, fmt, group_spreads, heading, image, largest_models,
                                    seeded_models, spread_blocks, validation_text)


def measure(models: dict[str, dict], settings: dict, plots: Path, tick: Tick) -> dict:
    from linlm.eval.niah import NIAHConfig, chance_level, plot_heatmap, run_niah
    from linlm.eval.niah_scores import accuracy_at_bounds
    from linlm.infer.generate import load_for_generation

    cfg = NIAHConfig(**settings).validate()
    out = {"settings": settings, "models": {}, "chance": chance_level(cfg), "scoring": cfg.scoring}
    for i, (label, m) in enumerate(models.items()):
        model, tok = load_for_generation(m["checkpoint"])
        text = validation_text(m["data_dir"], tok, 10 * max(cfg.lengths) + 1000)
        res = run_niah(model, tok, [text], NIAHConfig(**settings))
        png = plots / f"niah_{label}.png"
        plot_heatmap(res, png, title=f"NIAH ({cfg.mode}, {cfg.scoring}): {label}")
        out["models"][label] = {"arch": m["arch"], "group": m.get("group") or m["arch"], "seed": m.get("seed"),
                                "params": m["params"], "plot": png.name,
                                "up_to": {str(b): v for b, v in accuracy_at_bounds(res).items()},
                                **{k: res[k] for k in ("mean", "weighted", "score", "lengths", "skipped_lengths",
                                                       "chance", "chance_band", "items", "above_chance")}}
        tick((i + 1) / len(models))
    out["spread"] = group_spreads(out["models"], "mean")
    return out


def run(job, tick: Tick) -> Optional[dict]:
    models = {**largest_models(job, "scaling"), **seeded_models(job, "compare", prefix="compare-")}
    if not models:
        return None
    return measure(models, dataclasses.asdict(job.recipe.niah), job.plots, tick)


def render(job, pending: list[str]) -> Blocks:
    b, n = heading(job, "Retrieval: needle in a haystack", pending, "niah")
    if n is None:
        return b
    s = n["settings"]
    chance = n.get("chance")
    scoring = n.get("scoring", "greedy")
    value = f"values ({s.get('value_length', 7)} characters each, {s.get('alphabet', 'digits')})"
    how = (f"the true value ranks first by log-likelihood among {s.get('candidates', 4)} {value}"
           if scoring == "choice" else f"greedy decoding reproduces the whole value ({value})")
    b.append(("p", f"Mode {s.get('mode', 'standard')}, haystack from the validation text; a cell is right when {how} "
                   f"(chance {fmt(chance, '.3f')}). As the paper's NIAH table: the accuracy over the cells at or below "
                   "each length bound, the mean over the grid, the weighted average (long contexts and deep needles "
                   "weigh more: the paper's published figure) and the score, in which a length the model could "
                   "not take counts as a miss (linlm's penalty; docs/evaluation.md). A model is above chance beyond "
                   "chance + 2 binomial standard errors over its items (the band)."))
    bounds = sorted({int(x) for v in n["models"].values() for x in v.get("up_to", {})})
    b.append(("table", ["model", "arch", "lengths", "items", *[f"acc <= {x}" for x in bounds], "mean", "weighted",
                        "score", "chance", "band", "above chance"],
              [[k, v["arch"], grid(v["lengths"]), str(v.get("items", "-")),
                *[fmt(v.get("up_to", {}).get(str(x)), ".3f") for x in bounds], fmt(v["mean"], ".3f"),
                fmt(v["weighted"], ".3f"), fmt(v.get("score"), ".3f"), fmt(v.get("chance"), ".3f"),
                fmt(v.get("chance_band"), ".3f"), {True: "yes", False: "no"}.get(v.get("above_chance"), "-")]
               for k, v in n["models"].items()]))
    if chance is not None and n["models"] and not any(v["above_chance"] for v in n["models"].values()):
        b.append(("p", f"Not measurable at this scale: every model is at chance (chance {chance:.3f}; no mean "
                       "accuracy above its band), so these scores cannot order the architectures."))
    if n.get("spread"):
        b += spread_blocks(n["spread"], "NIAH mean accuracy", ".3f")
    for v in n["models"].values():
        img = image(job, v["plot"])
        if img:
            b.append(img)
    return b


def grid(values: list, unit: str = "") -> str:
    """A grid of the plan: its values, or for a long one its count and range."""
    shown = [f"{v:g}" for v in values]
    if len(values) <= 6:
        return ", ".join(shown) + unit
    return f"{len(values)} from {shown[0]}{unit} to {shown[-1]}{unit}"


def plan(p) -> str:
    n = p.niah
    return (f"NIAH ({n.mode}, {n.scoring} scoring): lengths {grid(n.lengths)}, depths {grid(n.depths, ' %')}, "
            f"{n.trials} trial(s) per cell; the scaling sweep's largest models and every seed of the comparison")


# The settings are NIAHConfig's own fields and defaults (linlm.eval.niah), checked by its validate().
SECTION = Section("niah", run, 0.05, needs=("scaling", "compare"), settings=("overrides", "scaling_dir", "seeds"),
                  render=render, report_rank=6, plots=("niah_*",), plan=plan, key="niah", options=NIAHConfig)
