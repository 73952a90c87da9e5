"""Size presets: the paper's ladder (arXiv 2406.16690, Table of model sizes) and tiny sizes for tests.

A row is the shape shared by every architecture; an architecture adapts it with its own preset rule (its module
under models/archs/: TNL's 25 layers at 410M, Mamba's and MossNet's matched sizes). Rules count parameters by
building blocks on the meta device (:func:`layer_params`), never by a formula written out.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from linlm.errors import ConfigError, choices_text
from linlm.models.block import Block
from linlm.models.model_config import ModelConfig
from linlm.models.measure import active_params
from linlm.models.registry import get_arch

PAPER_VOCAB = 100_280

# name -> shape. The 1B row uses h = 12, g = 4096: only those reproduce the paper's own parameter and FLOP counts.
PRESETS: dict[str, dict[str, Any]] = {
    "paper-70m": dict(n_layers=6, d_model=512, n_heads=4, glu_dim=1536),
    "paper-160m": dict(n_layers=12, d_model=768, n_heads=6, glu_dim=2048),
    "paper-410m": dict(n_layers=26, d_model=1024, n_heads=8, glu_dim=2816),
    "paper-1b": dict(n_layers=32, d_model=1536, n_heads=12, glu_dim=4096),
    "paper-3b": dict(n_layers=35, d_model=2560, n_heads=20, glu_dim=6912),
    "paper-7b": dict(n_layers=32, d_model=4096, n_heads=32, glu_dim=11008),
    "tiny": dict(n_layers=2, d_model=64, n_heads=2, glu_dim=128, vocab_size=512, max_seq_len=2048, chunk_size=16),
    "small": dict(n_layers=4, d_model=256, n_heads=2, glu_dim=640, vocab_size=8192, max_seq_len=4096),
}
for _name in PRESETS:
    if _name.startswith("paper-"):
        PRESETS[_name].setdefault("vocab_size", PAPER_VOCAB)
        PRESETS[_name].setdefault("max_seq_len", 8192)


def layer_params(values: dict) -> tuple[int, int]:
    """(parameters, active parameters) of one block of the config ``values``, built on the meta device."""
    cfg = ModelConfig.from_dict(values)
    with torch.device("meta"):
        block = Block(cfg, 0, get_arch(cfg.arch))
    return sum(p.numel() for p in block.parameters()), active_params(block)


def preset_row(arch: str, preset: str) -> dict[str, Any]:
    """The fields ``preset`` sets for ``arch``, after the architecture's own preset rule."""
    if preset not in PRESETS:
        raise ConfigError(f"preset: unknown preset {preset!r}; valid choices are {choices_text(PRESETS)}")
    row = {**ModelConfig(arch=arch).to_dict(), **PRESETS[preset]}
    return get_arch(arch).preset_row(preset, row, layer_params)


def preset_config(arch: str, preset: Optional[str] = None, **overrides: Any) -> ModelConfig:
    """The config of ``arch`` at ``preset`` (None: the defaults) with ``overrides`` (fields, flat options, or
    ``options``: a mapping merged over the options the preset sets)."""
    values: dict[str, Any] = {"arch": arch}
    if preset is not None:
        values.update(preset_row(arch, preset))
    given = overrides.get("options")
    if isinstance(given, Mapping) and isinstance(values.get("options"), Mapping):
        overrides = {**overrides, "options": {**values["options"], **given}}
    values.update(overrides)
    return ModelConfig.from_dict(values)
