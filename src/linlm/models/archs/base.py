"""What an architecture entry holds, and the pieces several entries share.

An architecture module defines ``SPEC = ArchSpec(...)``; models/registry.py registers it with one line.
Modules here never import ModelConfig: they receive the config (or a plain dict of its fields) as an argument,
so that the registry stays below models/model_config.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from torch import nn

from linlm.errors import ConfigError
from linlm.layers.glu import GLU
from linlm.schema import config_error

# (values: a full dict of ModelConfig fields) -> (parameters, active parameters) of one block, counted on the meta
# device. Preset rules receive it, so that no parameter count is written out as a formula.
LayerCounter = Callable[[dict], "tuple[int, int]"]


# The families an architecture belongs to; defaults, claims and plots select architectures by family.
BASELINE = "baseline"  # softmax attention: the transformer every linear model is measured against
LINEAR_ATTENTION = "linear attention"
SSM = "ssm"
MIXTURE = "mixture of experts"
FAMILIES = (BASELINE, LINEAR_ATTENTION, SSM, MIXTURE)


@dataclass(frozen=True)
class SizeKnob:
    """The one setting an architecture's preset rule solves to match LLaMA's parameters at a paper row (a
    ModelConfig field, or ``options.NAME``), in steps of ``multiple``. A block's (active) parameters grow linearly
    with it, so a hybrid stack (ModelConfig.attn_layers / attn_every) at that row is matched again by solving the
    same setting over the whole stack (models/presets.py). ``layers``: the rule picks the layer count too (Mamba's
    blocks are about half a LLaMA block), so a hybrid may take another count."""

    field: str
    multiple: int
    layers: bool = False

    def get(self, values: dict) -> Any:
        if self.field.startswith("options."):
            return (values.get("options") or {}).get(self.field[len("options."):])
        return values.get(self.field)

    def set(self, values: dict, value: int) -> dict:
        if self.field.startswith("options."):
            return {**values, "options": {**(values.get("options") or {}), self.field[len("options."):]: value}}
        return {**values, self.field: value}


@dataclass(frozen=True)
class NoOptions:
    """The options of an architecture that has none of its own."""


@dataclass(frozen=True)
class ArchSpec:
    name: str
    mixer: type  # a linlm.layers.mixer.TokenMixer subclass, built as mixer(cfg, layer_idx)
    mlp: Optional[Callable[..., nn.Module]]  # (cfg, layer_idx) -> channel mixer, or None (Mamba)
    norm: str  # the architecture's own norm: "rms" (with weight) or "srms" (no weight); cfg.norm_type may replace it
    description: str
    family: str = LINEAR_ATTENTION  # one of FAMILIES
    paper: str = ""  # the publication that defines it, e.g. "arXiv 2406.16690"
    color: str = "tab:gray"  # its colour in every plot
    # True for the architectures of the scaling study (arXiv 2406.16690): its ladders and claims cover these.
    scaling_study: bool = False
    # FLOPs of one training step (fwd + bwd) by the paper's formula, embeddings excluded: (cfg, b, n) -> float
    paper_flops: Optional[Callable[..., float]] = None
    # Model-level module whose output every layer receives as ctx (HGRN2's lower-bound table).
    shared: Optional[Callable[..., nn.Module]] = None
    # (cfg) -> a module applied once to the embeddings, or None when the config turns it off (cosFormer2's TPE).
    embed_mixer: Optional[Callable[..., Optional[nn.Module]]] = None
    # True when the decoding state does not grow with the context.
    constant_state: bool = True
    # True when inputs longer than cfg.max_seq_len must be refused.
    position_limit: bool = False
    # (cfg) -> None; raises ConfigError for settings this architecture cannot build.
    extra_validate: Optional[Callable[..., None]] = None
    # (preset name, row: full dict of ModelConfig fields, layer counter) -> the row this architecture uses.
    preset_rule: Optional[Callable[[str, dict, LayerCounter], dict]] = None
    # The setting preset_rule solves, when it solves one (a hybrid stack at a preset solves it again).
    size_knob: Optional[SizeKnob] = None
    # The options of this architecture alone: a frozen dataclass whose every field has a default (the authors'
    # choice); ModelConfig.options holds one. Its validate(), when defined, raises ConfigError for bad values.
    options: type = NoOptions
    # Earlier spellings of these options as flat ModelConfig fields ({"tnl_v_silu": "v_silu"}): still read.
    flat_options: Mapping[str, str] = field(default_factory=dict, hash=False)
    # The value each option had before it existed ({"v_silu": False}): a config saved then, which lacks the
    # option, is read back with it (ModelConfig.from_saved), so that it computes what it computed.
    saved_before: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # Options another architecture must not be given in their flat spelling with a value other than the default,
    # with what they are ({"n_kv_heads": "grouped-query attention"}): elsewhere they would be silently ignored.
    only_here: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError(f"ArchSpec {self.name!r}: family {self.family!r} is not one of {FAMILIES}")
        names = {f.name for f in dataclasses.fields(self.options)}
        unknown = sorted({*self.flat_options.values(), *self.saved_before, *self.only_here} - names)
        if unknown:
            raise ConfigError(f"ArchSpec {self.name!r}: {unknown} are not fields of {self.options.__name__}")

    def validate(self, cfg) -> None:
        if self.extra_validate is not None:
            self.extra_validate(cfg)

    def norm_kind(self, cfg) -> str:
        """The norm of the blocks and of the final norm: the config's norm_type, or this architecture's own."""
        kind = getattr(cfg, "norm_type", "auto")
        return self.norm if kind == "auto" else kind

    def preset_row(self, preset: str, row: dict, layer_params: LayerCounter) -> dict:
        return self.preset_rule(preset, dict(row), layer_params) if self.preset_rule is not None else row


def own_names(options: type) -> dict[str, str]:
    """``flat_options`` for options that were flat ModelConfig fields under their own names (Mamba's d_state)."""
    return {f.name: f.name for f in dataclasses.fields(options)}


def positive_ints(options, *names: str) -> None:
    """Raise a ConfigError naming ``options.NAME`` for the first of ``names`` that is not a positive integer."""
    for name in names:
        value = getattr(options, name)
        if value <= 0:
            raise config_error(f"options.{name}", f"must be a positive integer, got {value}")


def swiglu(cfg, layer_idx: int) -> nn.Module:
    return GLU(cfg.d_model, cfg.glu_hidden, activation="silu")


def sglu(cfg, layer_idx: int) -> nn.Module:
    return GLU(cfg.d_model, cfg.glu_hidden, activation=None)


def paper_base_flops(cfg, b: int, n: int) -> float:
    """72 b n l d^2: the leading term every formula of arXiv 2406.16690 shares."""
    return 72.0 * b * n * cfg.n_layers * cfg.d_model**2


def layers_on(presets: dict[str, int]) -> Callable[[str, dict, Any], dict]:
    """A preset rule that changes only the layer count on the named presets (TNL and cosFormer2 at paper-410m)."""

    def rule(preset: str, row: dict, layer_params) -> dict:
        if preset in presets:
            row["n_layers"] = presets[preset]
        return row

    return rule


GLU_MULTIPLE = 8
GLU_KNOB = SizeKnob("glu_dim", GLU_MULTIPLE)


def glu_matched(multiple: int = GLU_MULTIPLE) -> Callable[[str, dict, Any], dict]:
    """A preset rule: on every paper-* row, keep d, n_layers and n_heads and solve glu_dim (to a multiple of
    ``multiple``) so that one block has the parameters of the row's LLaMA block (both stacks end with one norm of
    width d, so the non-embedding parameters then match). A block's parameters grow linearly with glu_dim; both
    counts come from blocks built on the meta device."""

    def rule(preset: str, row: dict, layer_params) -> dict:
        if not preset.startswith("paper-"):
            return row
        target = layer_params({**row, "arch": "llama", "options": None})[0]
        m = multiple
        at_m = layer_params({**row, "glu_dim": m})[0]
        per_unit = (layer_params({**row, "glu_dim": 2 * m})[0] - at_m) / m
        row["glu_dim"] = max(m, m * round((m + (target - at_m) / per_unit) / m))
        return row

    return rule


glu_matched_to_llama = glu_matched()
