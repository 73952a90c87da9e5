"""The ``decode`` section: decode latency, peak memory and the decoding state's size against context length, for
each architecture of the comparison at its shapes (random weights: speed and memory do not depend on them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from linlm.errors import ConfigError, DataError
from linlm.reproduce.section import Blocks, Section, Tick, fmt, heading, image, setting


@dataclass
class DecodeSettings:
    """The recipe's ``decode:``."""

    contexts: list[int] = setting([128, 512, 2048], "context lengths profiled")
    decode_tokens: int = setting(16, "tokens decoded at each context")
    archs: Optional[list[str]] = setting(None, "architectures (null: the comparison's)")
    preset: Optional[str] = setting(None, "a size preset for every architecture (null: model and per_arch)")
    model: dict = setting({}, "model config keys of every architecture")
    per_arch: dict = setting({}, "model config keys of one architecture, over model's")
    device: str = setting("cpu", "where it runs")
    dtype: str = setting("float32", "weights and activations")

    def validate(self) -> "DecodeSettings":
        if not self.contexts or min(self.contexts) < 1 or self.decode_tokens < 1:
            raise ConfigError(f"contexts: {self.contexts}, decode_tokens: {self.decode_tokens}; give positive "
                              "context lengths and at least 1 decoded token")
        return self


def measure(settings: DecodeSettings, archs: list[str], plots: Path, tick: Tick) -> dict:
    """Decode latency, peak memory and state size against context length (random weights: speed and memory do
    not depend on them), one architecture at a time with its shape from the recipe."""
    from linlm.environment import environment
    from linlm.infer.profile import plot, profile, rows_to_dicts

    rows = []
    archs = list(settings.archs or archs)
    for i, arch in enumerate(archs):
        overrides = {**settings.model, **settings.per_arch.get(arch, {})}
        rows += profile([arch], settings.preset, settings.contexts, device=settings.device, dtype=settings.dtype,
                        decode_tokens=settings.decode_tokens, overrides=overrides)
        tick((i + 1) / len(archs))
    measured = rows_to_dicts(rows)
    if not any(r.get("error") is None for r in measured):
        why = "; ".join(sorted({str(r.get("error")) for r in measured})) or "no context was profiled"
        raise DataError(f"decode: no context could be profiled ({why}); the section runs again next time")
    plot(rows, plots / "decode.png", title="decode latency and memory against context")
    return {"rows": measured, "environment": environment(), "plot": "decode.png", "settings": asdict(settings)}


def run(job, tick: Tick) -> Optional[dict]:
    return measure(job.recipe.decode, job.compare_ladder().archs, job.plots, tick)


def state_growth(rows: list[dict], arch: str) -> Optional[dict]:
    """The decoding state of ``arch`` at its shortest and longest profiled context, and their ratio."""
    ok = sorted((r for r in rows if r["arch"] == arch and r.get("error") is None and r.get("state_bytes")),
                key=lambda r: r["context"])
    if len(ok) < 2:
        return None
    lo, hi = ok[0], ok[-1]
    return {"arch": arch, "context_lo": lo["context"], "context_hi": hi["context"], "state_lo": lo["state_bytes"],
            "state_hi": hi["state_bytes"], "ratio": hi["state_bytes"] / lo["state_bytes"],
            "context_ratio": hi["context"] / lo["context"],
            "peak_lo": lo.get("peak_memory_bytes"), "peak_hi": hi.get("peak_memory_bytes")}


def render(job, pending: list[str]) -> Blocks:
    b, d = heading(job, "Decoding: speed and memory against context length", pending, "decode")
    if d is None:
        return b
    env = d["environment"]
    b.append(("p", f"Random weights at the comparison's shapes; {env.get('torch_num_threads')} thread(s), load "
                   f"average {fmt(env.get('load_average_1min'), '.1f')} when measured. State = the decoding state "
                   "(LLaMA: its KV cache)."))
    rows = [[r["arch"], str(r["context"]), fmt(r.get("decode_ms_per_token"), ".2f"),
             fmt(r.get("prefill_tokens_per_s"), ".0f"),
             fmt((r.get("peak_memory_bytes") or 0) / 2**20, ".1f") if r.get("peak_memory_bytes") else "-",
             f"{r['state_bytes']:,}" if r.get("state_bytes") else "-", r.get("error") or ""] for r in d["rows"]]
    b.append(("table", ["arch", "context", "decode ms/token", "prefill tokens/s", "peak MiB", "state bytes",
                        "error"], rows))
    img = image(job, d["plot"])
    if img:
        b.append(img)
    return b


SECTION = Section("decode", run, 0.04, render=render, report_rank=7, plots=("decode.png",), key="decode",
                  options=DecodeSettings, plan=lambda p: f"decode: contexts {p.decode.contexts}")
