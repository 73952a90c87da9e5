"""The ``quality`` and ``compare_quality`` sections: validation loss and bits per byte of the largest model of each
architecture of the scaling sweep, and of every run of the comparison (each seed), with the mean and spread over
seeds of each architecture."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from linlm.errors import ConfigError
from linlm.reproduce.section import (Blocks, Section, Tick, fmt, group_spreads, heading, largest_models,
                                    seeded_models, setting, spread_blocks, validation_text)


@dataclass
class QualitySettings:
    """The recipe's ``quality:`` (both quality sections)."""

    max_tokens: int = setting(40_000, "validation tokens scored per model")

    def validate(self) -> "QualitySettings":
        if self.max_tokens < 2:
            raise ConfigError(f"max_tokens: {self.max_tokens}; give at least 2 tokens to score")
        return self


def measure(models: dict[str, dict], max_tokens: int, tick: Tick) -> dict:
    """Validation loss (nats/token) and bits per byte of each model, on the same validation text: its own
    prepared split, decoded, in sliding windows of its training context with half-window strides."""
    from linlm.eval.perplexity import perplexity
    from linlm.infer.generate import load_for_generation

    rows = {}
    for i, (label, m) in enumerate(models.items()):
        model, tok = load_for_generation(m["checkpoint"])
        text = validation_text(m["data_dir"], tok, max_tokens)
        res = perplexity(model, tok, [text], mode="sliding", window=m["seq_len"], stride=max(1, m["seq_len"] // 2))
        rows[label] = {**m, "val_loss": res.nll_per_token, "bits_per_byte": res.bits_per_byte,
                       "token_perplexity": res.token_perplexity, "scored_tokens": res.tokens, "bytes": res.bytes}
        tick((i + 1) / len(models))
    return {"models": rows, "max_tokens": max_tokens, "spread": group_spreads(rows, "val_loss")}



def quality_section(name: str, sweep: str, title: str, weight: float, settings: tuple[str, ...],
                    report_rank: int, plan=None, every_seed: bool = False) -> Section:
    """The section ``name``: the models of the training section ``sweep`` (its largest per architecture, or, with
    ``every_seed``, every run), shown under ``title``."""

    def run(job, tick: Tick) -> Optional[dict]:
        models = seeded_models(job, sweep) if every_seed else largest_models(job, sweep)
        if not models:
            return None
        return measure(models, job.recipe.quality.max_tokens, tick)

    def render(job, pending: list[str]) -> Blocks:
        b, q = heading(job, title, pending, name)
        if q is None:
            return b
        rows = [[label, m["arch"], f"{m['params']:,}", f"{m['tokens']:,}", fmt(m["train_loss"]), fmt(m["val_loss"]),
                 fmt(m["bits_per_byte"]), fmt(m["token_perplexity"], ".2f"), f"{m['scored_tokens']:,}"]
                for label, m in q["models"].items()]
        b.append(("p", "Validation loss (nats/token) and bits per byte on the same held-out text for every model: "
                       "the prepared validation split, decoded, scored in sliding windows of the training context "
                       "with a half-window stride."))
        b.append(("table", ["model", "arch", "active N", "training tokens", "final train loss", "val loss",
                            "bits/byte", "perplexity", "tokens scored"], rows))
        if every_seed:
            b += spread_blocks(q.get("spread") or {}, "validation loss (nats/token)")
        return b

    return Section(name, run, weight, needs=(sweep,), settings=settings, render=render, report_rank=report_rank,
                   plan=plan, key="quality", options=QualitySettings)


QUALITY = quality_section(
    "quality", "scaling", "Validation loss and bits per byte (largest rung per architecture)", 0.02,
    ("overrides", "scaling_dir"), report_rank=3,
    plan=lambda p: f"validation loss and bits/byte: up to {p.quality.max_tokens:,} tokens per model")
COMPARE_QUALITY = quality_section(
    "compare_quality", "compare", "MossNet against Mamba and LLaMA (equal active parameters, equal tokens)", 0.02,
    ("overrides", "seeds"), report_rank=2, every_seed=True,
    plan=lambda p: "MossNet vs Mamba vs LLaMA: validation loss of every seed of each architecture")
