"""Size presets: the paper's ladder (arXiv 2406.16690, Table of model sizes) and tiny sizes for tests.

A row is the shape shared by every architecture; an architecture adapts it with its own preset rule (its module
under models/archs/: TNL's 25 layers at 410M, Mamba's and MossNet's matched sizes). Rules count parameters by
building blocks on the meta device (:func:`layer_params`), never by a formula written out.

A hybrid stack at a paper row (attention layers by attn_layers or attn_every) is matched again: its attention
layers are LLaMA blocks, which are larger or smaller than the blocks they replace, so the setting the rule solved
(ArchSpec.size_knob) is solved again over the whole stack, and where the rule picks the layer count (Mamba,
Mamba-2) so is the count (:func:`hybrid_row`). A setting the caller gives is kept.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from linlm.errors import ConfigError, choices_text
from linlm.layers.shell import meta_device
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
    with meta_device():
        block = Block(cfg, 0, get_arch(cfg.arch))
    return sum(p.numel() for p in block.parameters()), active_params(block)


def preset_row(arch: str, preset: str) -> dict[str, Any]:
    """The fields ``preset`` sets for ``arch``, after the architecture's own preset rule."""
    if preset not in PRESETS:
        raise ConfigError(f"preset: unknown preset {preset!r}; valid choices are {choices_text(PRESETS)}")
    row = {**ModelConfig(arch=arch).to_dict(), **PRESETS[preset]}
    return get_arch(arch).preset_row(preset, row, layer_params)


# A hybrid at a paper row is matched to within this fraction of LLaMA's non-embedding (active) parameters where it
# can be; among the layer counts and settings that are, the one whose setting moves least from the pure stack's.
HYBRID_TOLERANCE = 0.02


def stack_params(values: dict) -> int:
    """Active parameters of the blocks of the config ``values`` (the final norm, the same for every stack at a
    row, left out), each distinct kind of block built once on the meta device."""
    cfg = ModelConfig.from_dict(values)
    attention, spec = set(cfg.attention_layers), get_arch(cfg.arch)
    per_kind: dict[bool, int] = {}
    for i in range(cfg.n_layers):
        if (i in attention) not in per_kind:
            with meta_device():
                per_kind[i in attention] = active_params(Block(cfg, i, spec))
    return sum(per_kind[i in attention] for i in range(cfg.n_layers))


def hybrid_row(preset: str, values: dict, fixed: frozenset = frozenset()) -> dict:
    """``values`` (a hybrid at the paper row ``preset``) with its architecture's size setting (and, for
    architectures whose rule picks it, the layer count) solved so that its blocks hold the row's LLaMA blocks'
    parameters. Settings named in ``fixed`` (the caller's) are kept; a stack no setting can match is returned as
    it is."""
    knob = get_arch(values["arch"]).size_knob
    if knob is None or knob.field in fixed:
        return values
    row = {**ModelConfig(arch="llama").to_dict(), **PRESETS[preset]}
    target = row["n_layers"] * layer_params({**row, "arch": "llama", "options": None})[1]
    layers = values["n_layers"]
    counts = [layers]
    if knob.layers and "n_layers" not in fixed:  # an attention layer stands for about two of these blocks
        counts = range(max(1, layers - 2 * len(ModelConfig.from_dict(values).attention_layers)), layers + 1)
    m, best = knob.multiple, None
    was = knob.get(values) or m
    for n in counts:
        at = {**values, "n_layers": n}
        try:
            low = stack_params(knob.set(at, m))
        except ConfigError:  # the pattern does not fit n layers
            continue
        per_unit = (stack_params(knob.set(at, 2 * m)) - low) / m
        if per_unit <= 0:
            continue
        solved = m * round((m + (target - low) / per_unit) / m)
        for value in {solved, was} if solved >= m else {was}:  # the rule's own value, where it is close enough
            at = knob.set(at, value)
            miss = abs(stack_params(at) - target) / target
            out = miss > HYBRID_TOLERANCE  # outside: the closest stack; inside: the setting that moves least
            rank = (out, miss if out else abs(value - was), miss)
            if best is None or rank < best[0]:
                best = (rank, at)
    return values if best is None else best[1]


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
    if preset is not None and preset.startswith("paper-") and (values.get("attn_layers") or values.get("attn_every")):
        flat = get_arch(arch).flat_options  # an option given in its flat spelling is the caller's too
        fixed = {*overrides, *(f"options.{flat[k]}" for k in overrides if k in flat),
                 *(f"options.{k}" for k in (given if isinstance(given, Mapping) else ()))}
        values = hybrid_row(preset, values, frozenset(fixed))
    return ModelConfig.from_dict(values)
