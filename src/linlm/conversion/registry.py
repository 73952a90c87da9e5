"""The checkpoint layouts linlm converts: one line per layout module (see docs/code-layout.md)."""

from __future__ import annotations

from linlm.conversion import fla_delta, fla_gla, fla_hgrn2, hf_llama, hf_mamba, hf_mamba2, hf_qwen3_next, mamba_ssm
from linlm.conversion.layout import Layout

LAYOUTS: dict[str, Layout] = {}


def register(layout: Layout) -> None:
    LAYOUTS[layout.name] = layout


register(hf_llama.LAYOUT)
register(hf_mamba.LAYOUT)
register(mamba_ssm.LAYOUT)
register(fla_hgrn2.LAYOUT)
for _layout in fla_delta.LAYOUTS.values():
    register(_layout)
register(hf_mamba2.LAYOUT)
register(fla_gla.LAYOUT)
register(hf_qwen3_next.LAYOUT)
register(hf_qwen3_next.LAYOUT_35)


def layout_names() -> list[str]:
    return list(LAYOUTS)
