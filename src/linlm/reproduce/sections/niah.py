"""The ``niah`` section: needle in a haystack (:mod:`linlm.eval.niah`) for the largest model of each architecture
of both sweeps, the haystack cut from each model's own validation text; a heatmap per model."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from linlm.reproduce.section import Blocks, Section, Tick, fmt, heading, image, largest_models, validation_text


def measure(models: dict[str, dict], settings: dict, plots: Path, tick: Tick) -> dict:
    from linlm.eval.niah import NIAHConfig, plot_heatmap, run_niah
    from linlm.infer.generate import load_for_generation

    cfg = NIAHConfig(**settings)
    out = {"settings": settings, "models": {}}
    for i, (label, m) in enumerate(models.items()):
        model, tok = load_for_generation(m["checkpoint"])
        text = validation_text(m["data_dir"], tok, 10 * max(cfg.lengths) + 1000)
        res = run_niah(model, tok, [text], NIAHConfig(**settings))
        png = plots / f"niah_{label}.png"
        plot_heatmap(res, png, title=f"NIAH ({cfg.mode}): {label}")
        out["models"][label] = {"arch": m["arch"], "params": m["params"], "mean": res["mean"],
                                "weighted": res["weighted"], "lengths": res["lengths"], "plot": png.name}
        tick((i + 1) / len(models))
    return out


def run(job, tick: Tick) -> Optional[dict]:
    models = largest_models(job, "scaling", "compare")
    if not models:
        return None
    return measure(models, job.recipe.niah, job.plots, tick)


def render(job, pending: list[str]) -> Blocks:
    b, n = heading(job, "Retrieval: needle in a haystack", pending, "niah")
    if n is None:
        return b
    b.append(("p", f"Mode {n['settings'].get('mode', 'standard')}, haystack from the validation text; mean accuracy "
                   "over the grid and the weighted score (long contexts and deep needles weigh more)."))
    b.append(("table", ["model", "arch", "lengths", "mean", "weighted"],
              [[k, v["arch"], ", ".join(map(str, v["lengths"])), fmt(v["mean"], ".3f"), fmt(v["weighted"], ".3f")]
               for k, v in n["models"].items()]))
    for v in n["models"].values():
        img = image(job, v["plot"])
        if img:
            b.append(img)
    return b


SECTION = Section("niah", run, 0.03, needs=("scaling", "compare"), settings=("overrides", "scaling_dir"),
                  render=render, report_rank=6, plots=("niah_*",),
                  plan=lambda p: f"NIAH: lengths {p.niah.get('lengths')}, depths {p.niah.get('depths')}")
