"""The model config: one dataclass of the fields every architecture shares, plus the options of its own.

An architecture's own options (TNL's slopes, cosFormer2's gate order, Mamba's d_state, MossNet's experts, LLaMA's
grouped-query heads and RoPE scaling, ...) are a dataclass its ArchSpec declares (``ArchSpec.options``);
``ModelConfig.options`` holds the one of ``arch``. Their earlier spellings as flat fields (``tnl_v_silu``,
``tpe``, ``d_state``, ``ssm_experts``, ``n_kv_heads``, ...: ``ArchSpec.flat_options``) are still read everywhere a
config is read from data (:meth:`ModelConfig.from_dict`, saved models, YAML, overrides), and still read as
attributes (``cfg.d_state`` is ``cfg.options.d_state``). A flat option of another architecture is type-checked and
ignored, as it always was, unless its owner lists it in ``ArchSpec.only_here`` (``n_kv_heads`` on a TNL model is
refused rather than ignored).

Options added after models were first saved default to the authors' choice for new models. A saved config that
predates such an option (its config.json lacks the key) is read with :meth:`ModelConfig.from_saved`, which fills
the key with the value linlm used before (``ArchSpec.saved_before``), so an old checkpoint computes exactly what it
did.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from linlm.schema import config_error, from_dict
from linlm.errors import ConfigError, choices_text
from linlm.layers.norm import NORM_KINDS
from linlm.models.registry import ARCHITECTURES


@dataclass
class ModelConfig:
    arch: str = "llama"
    vocab_size: int = 8192
    d_model: int = 512
    n_layers: int = 6
    n_heads: int = 4
    # Hidden width of the GLU channel mixer; 0 means round(8/3 * d_model) up to a multiple of 64.
    glu_dim: int = 0
    # Longest input a model with absolute limits (LLaMA's RoPE cache) accepts.
    max_seq_len: int = 8192
    norm_eps: float = 1e-6
    # False gives the LM head its own weight (real checkpoints' layouts).
    tie_embeddings: bool = True
    # Chunk length of the chunkwise gated-linear-attention form (linear models).
    chunk_size: int = 64
    init_std: float = 0.02
    # Norm of the blocks and the final norm: "auto" is the architecture's own (RMSNorm with a weight for LLaMA, Mamba
    # and MossNet; SRMSNorm without one for TNL, HGRN2, cosFormer2); "rms", "srms" or "layer" (LayerNorm with a
    # weight and a bias) replace it. docs/architectures.md: "layer" reproduces the paper's printed LLaMA counts.
    norm_type: str = "auto"
    # The options of this architecture alone: an instance of its ArchSpec.options (models/archs/), e.g. TNL's
    # slopes and SiLU on v, Mamba's state size, MossNet's experts, LLaMA's KV heads. A mapping of some of them, or
    # None, is read into one (the rest take their defaults).
    options: Any = None
    # A hybrid stack: softmax-attention layers (LLaMA's, with RoPE) in place of this architecture's mixer at some
    # layers, each followed by the architecture's MLP (SwiGLU where it has none). attn_layers lists them (0-based);
    # attn_every = k puts one at layers k - 1, 2k - 1, ... (1 in k); neither: none.
    attn_layers: list[int] = field(default_factory=list)
    attn_every: int = 0
    # Sliding window of those attention layers: each token attends to itself and the window - 1 tokens before it,
    # and the decoding cache holds window - 1 positions. None: full causal attention.
    attn_window: Optional[int] = None
    # The options of those attention layers: LLaMA's (models/archs/llama.py, LlamaOptions: KV heads, RoPE, head
    # width, q/k norms, output gate, partial RoPE), a mapping of some of them; None: LLaMA's defaults.
    attn_options: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.arch, str) and self.arch in ARCHITECTURES:
            self.options = read_options(self.arch, self.options)

    def __getattr__(self, name: str) -> Any:
        """The earlier attribute spellings of this architecture's options: ``cfg.d_state`` is
        ``cfg.options.d_state`` (read only; new code reads ``cfg.options``)."""
        options = self.__dict__.get("options")
        spec = ARCHITECTURES.get(self.__dict__.get("arch"))
        if spec is not None and name in spec.flat_options and options is not None:
            return getattr(options, spec.flat_options[name])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers that are softmax attention in a hybrid stack (attn_layers or attn_every), ascending."""
        if self.attn_every > 0:
            return tuple(range(self.attn_every - 1, self.n_layers, self.attn_every))
        return tuple(sorted(set(self.attn_layers)))

    @property
    def growing_state(self) -> bool:
        """Whether the decoding state grows with the context without bound: a KV cache of full attention (LLaMA,
        or a hybrid's attention layers without a window)."""
        spec = ARCHITECTURES[self.arch]
        return not spec.constant_state or (bool(self.attention_layers) and self.attn_window is None)

    @property
    def per_row_positions(self) -> bool:
        """Whether a batch of sequences of different lengths can decode together (no RoPE cache of one length)."""
        return not ARCHITECTURES[self.arch].position_limit and not self.attention_layers

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads of the attention layers: the options' n_kv_heads (LLaMA's), or n_heads when 0 or
        absent."""
        return getattr(self.options, "n_kv_heads", 0) or self.n_heads

    @property
    def glu_hidden(self) -> int:
        if self.glu_dim:
            return self.glu_dim
        g = int(round(8 * self.d_model / 3))
        return (g + 63) // 64 * 64

    def validate(self) -> "ModelConfig":
        if self.arch not in ARCHITECTURES:
            raise config_error("arch", f"unknown architecture {self.arch!r}; valid choices are "
                                       f"{choices_text(ARCHITECTURES)}")
        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "chunk_size"):
            value = getattr(self, key)
            if value <= 0:
                raise config_error(key, f"must be a positive integer, got {value}")
        if self.glu_dim < 0:
            raise config_error("glu_dim", f"must be >= 0 (0 means automatic), got {self.glu_dim}")
        for key in ("norm_eps", "init_std"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):  # also when built directly, without from_dict
                raise config_error(key, f"must be a positive finite number, got {value}")
        if self.norm_type != "auto" and self.norm_type not in NORM_KINDS:
            raise config_error("norm_type", f"unknown norm {self.norm_type!r}; valid choices are "
                                            f"{choices_text(('auto', *NORM_KINDS))}")
        if self.d_model % self.n_heads:
            raise config_error(
                "d_model", f"{self.d_model} is not divisible by n_heads={self.n_heads}; "
                f"choose n_heads among the divisors of d_model (for example {_divisors(self.d_model)})",
                related=["n_heads"],
            )
        self._validate_pattern()
        spec = ARCHITECTURES[self.arch]
        if not isinstance(self.options, spec.options):  # set after the config was built
            self.options = read_options(self.arch, self.options)
        if hasattr(self.options, "validate"):
            self.options.validate()
        spec.validate(self)
        return self

    def _validate_pattern(self) -> None:
        """The hybrid layer pattern: layers within the depth, one way of naming them, a positive window."""
        if self.attn_every < 0:
            raise config_error("attn_every", f"must be >= 0 (0: no attention layers; k: one in k), got "
                                             f"{self.attn_every}")
        if self.attn_every and self.attn_layers:
            raise config_error("attn_layers", "give the attention layers as attn_layers or as attn_every, not both",
                               related=("attn_every",))
        if self.attn_every > self.n_layers:
            raise config_error("attn_every", f"{self.attn_every} is past the model's depth n_layers={self.n_layers}: "
                                             f"no layer would be attention; choose 1..{self.n_layers}",
                               related=("n_layers",))
        bad = [i for i in self.attn_layers if not 0 <= i < self.n_layers]
        if bad:
            raise config_error("attn_layers", f"layer {bad[0]} is past the model's depth n_layers={self.n_layers}; "
                                              f"layers are numbered 0..{self.n_layers - 1}", related=("n_layers",))
        if self.attn_window is not None and self.attn_window <= 0:
            raise config_error("attn_window", f"must be a positive number of tokens (or null for full attention), "
                                              f"got {self.attn_window}")
        if self.attention_layers and not ARCHITECTURES[self.arch].constant_state:
            raise config_error("attn_layers", f"arch {self.arch!r} is attention at every layer already; a hybrid "
                                              "pattern applies to a linear architecture", related=("arch",))
        if self.attn_window is not None and not self.attention_layers:
            raise config_error("attn_window", "is set but the model has no attention layers (attn_layers or "
                                              "attn_every); set them or drop the window")
        if self.attn_options is not None:
            if not self.attention_layers:
                raise config_error("attn_options", "is set but the model has no attention layers (attn_layers or "
                                                   "attn_every); set them or drop the options")
            self.attn_options = _attention_options(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        """A validated config from data: ModelConfig fields, with options nested under ``options`` or in their
        earlier flat spellings. An error about an option names the key as it was spelled."""
        return _build(data, saved=False)

    @classmethod
    def from_saved(cls, data: Mapping[str, Any]) -> "ModelConfig":
        """A config read back from a saved model or checkpoint (either format): options it lacks take the values of
        the architecture's ``saved_before``."""
        return _build(data, saved=True)

    def replace(self, **overrides: Any) -> "ModelConfig":
        """A copy with ``overrides`` (ModelConfig fields; ``options`` a mapping of some options) validated. A
        change of ``arch`` resets the options to the new architecture's defaults unless ``options`` is given."""
        data = {**self.to_dict(), **overrides}
        if "options" not in overrides:
            if data.get("arch") != self.arch:
                del data["options"]
        elif isinstance(overrides["options"], Mapping) and data.get("arch") == self.arch:
            data["options"] = {**self.to_dict()["options"], **overrides["options"]}
        return ModelConfig.from_dict(data)


def _attention_options(cfg: ModelConfig) -> Any:
    """``cfg.attn_options`` read as LLaMA's options and checked as an attention layer of cfg's shape would be; an
    error names ``attn_options.KEY``."""
    value = cfg.attn_options
    if isinstance(value, Mapping) or value is None:
        value = from_dict(ARCHITECTURES["llama"].options, value or {}, prefix="attn_options.")
    shape = dataclasses.replace(cfg, arch="llama", options=value, attn_options=None, attn_layers=[], attn_every=0,
                                attn_window=None)
    try:
        shape.validate()
    except ConfigError as e:
        key = getattr(e, "key", None) or ""
        if not key.startswith("options."):
            raise
        raise config_error("attn_" + key, e.detail) from None
    return shape.options


def read_options(arch: str, value: Any) -> Any:
    """The options of architecture ``arch`` from ``value``: an instance of its options class, a mapping of some of
    its options (the rest take their defaults), or None (every default). Errors name ``options.KEY``."""
    kind = ARCHITECTURES[arch].options
    if isinstance(value, kind):
        return value
    if value is None:
        return kind()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)  # another architecture's options: refused below, key by key
    if isinstance(value, Mapping) and value and not dataclasses.fields(kind):
        raise config_error(f"options.{next(iter(value))}", f"unknown key {next(iter(value))!r}; architecture "
                                                            f"{arch!r} has no options of its own")
    return from_dict(kind, value, prefix="options.")


def flat_option_keys() -> dict[str, list[tuple[str, str]]]:
    """Every earlier flat spelling of an option: {flat key: [(architecture, option), ...]}, from the registry."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, spec in ARCHITECTURES.items():
        for flat, option in spec.flat_options.items():
            out.setdefault(flat, []).append((name, option))
    return out


def model_keys() -> set[str]:
    """The keys a model config is given by: its fields and the flat spellings of options."""
    return {f.name for f in dataclasses.fields(ModelConfig)} | set(flat_option_keys())


def _nest(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``data`` with the flat spellings of its architecture's options moved under ``options`` (over what that
    already holds), and {"options.KEY": the flat key it was spelled as}. A flat option of another architecture is
    checked for its type and dropped: it never did anything there."""
    flats = flat_option_keys()
    given = [k for k in data if k in flats]
    if not given:
        return dict(data), {}
    out = {k: v for k, v in data.items() if k not in flats}
    arch = out.get("arch", ModelConfig.arch)
    options = out.get("options")
    options = dict(options) if isinstance(options, Mapping) else {} if options is None else options
    spelled: dict[str, str] = {}
    for key in given:
        owners = flats[key]
        mine = [option for owner, option in owners if owner == arch]
        if mine and isinstance(options, dict):
            options[mine[0]] = data[key]
            spelled[f"options.{mine[0]}"] = key
        elif not mine:
            owner, option = owners[0]
            try:
                value = from_dict(ARCHITECTURES[owner].options, {option: data[key]})
            except ConfigError as e:
                raise config_error(key, e.detail) from None
            _refuse_elsewhere(key, arch, owners, getattr(value, option))
    out["options"] = options
    return out, spelled


def _refuse_elsewhere(key: str, arch: str, owners: list[tuple[str, str]], value: Any) -> None:
    """A flat option that its owner keeps to itself (``ArchSpec.only_here``), set to another value than its default
    for an architecture without it, is refused: it would be ignored."""
    for owner, option in owners:
        what = ARCHITECTURES[owner].only_here.get(option)
        if what is not None and value != getattr(ARCHITECTURES[owner].options(), option):
            mine = [o for o, opt in owners if opt in ARCHITECTURES[o].only_here]
            raise config_error(key, f"{what} exists only for arch {' or '.join(map(repr, mine))}, not {arch!r}",
                               related=("arch",))


def options_given(data: Mapping[str, Any], arch: str) -> set[str]:
    """The options of ``arch`` that ``data`` (a model config or overrides, in either format) sets; checks nothing."""
    nested = data.get("options")
    names = set(nested) if isinstance(nested, Mapping) else set()
    return names | {option for flat, owners in flat_option_keys().items() if flat in data
                    for owner, option in owners if owner == arch}


def _build(data: Mapping[str, Any], saved: bool) -> ModelConfig:
    if not isinstance(data, Mapping):
        return from_dict(ModelConfig, data)  # refused, with from_dict's message
    data, spelled = _nest(data)
    options = data.pop("options", None)
    try:
        cfg = from_dict(ModelConfig, data)
        if cfg.arch in ARCHITECTURES:
            if saved and (options is None or isinstance(options, Mapping)):
                options = {**ARCHITECTURES[cfg.arch].saved_before, **(options or {})}
            cfg.options = read_options(cfg.arch, options)
        return cfg.validate()
    except ConfigError as e:
        key = getattr(e, "key", None)
        if key not in spelled:
            raise
        raise config_error(spelled[key], e.detail, related=[spelled.get(k, k) for k in e.related]) from None


def resume_options(cfg: ModelConfig, saved: Mapping[str, Any], overrides: Mapping[str, Any]) -> ModelConfig:
    """``cfg`` to resume a checkpoint whose model config is ``saved``: each option of cfg's architecture that
    ``saved`` predates (it lacks the key in both spellings) and that ``overrides`` (the run's model.overrides) does
    not set keeps the value the checkpoint was computed with (``ArchSpec.saved_before``)."""
    had = options_given(saved, cfg.arch) | options_given(overrides, cfg.arch)
    keep = {k: v for k, v in ARCHITECTURES[cfg.arch].saved_before.items() if k not in had}
    return cfg.replace(options=keep) if keep else cfg


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 64) + 1) if n % d == 0][-6:]
