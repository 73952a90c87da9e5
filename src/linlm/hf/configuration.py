"""transformers configs for linlm models: one ``PreTrainedConfig`` class per architecture (model_type linlm_<arch>),
each registered with ``AutoConfig`` when it is made (:class:`PerArch`); importing :mod:`linlm.hf` makes them all.

An architecture's config class has its model's settings as plain attributes, one attribute per setting: every field
of linlm's ModelConfig and every option of the architecture (``ArchSpec.options``: TNL's ``slopes``, cosFormer2's
``tpe``, ...), with the defaults of linlm's ``paper-70m`` preset for that architecture (its preset rule included:
Mamba's matched layer count and dt_rank). A setting that transformers has a standard name for is stored under that
name (:data:`HF_NAMES`: ``hidden_size`` for d_model, ``num_hidden_layers`` for n_layers, ...) and its linlm name is
an alias of it (``attribute_map``), so ``config.d_model`` and ``config.hidden_size`` are the same value; so are the
earlier flat spellings of the options (``tnl_slopes`` of ``slopes``). So
``AutoConfig.for_model("linlm_hgrn2", hidden_size=256, num_hidden_layers=4)`` gives the config of exactly that
model, and config.json holds each setting once.

config.json files of the earlier format, with the whole ModelConfig nested in a ``linlm`` field (and hidden_size,
num_hidden_layers and vocab_size copied beside it), still load: the nested config is the truth, read as a saved
config (``ModelConfig.from_saved``), and its values become the attributes.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from typing import Any, Callable, ClassVar, Iterator, Mapping

from transformers import AutoConfig, PreTrainedConfig

from linlm.errors import CheckpointError, ConfigError
from linlm.models.model_config import ModelConfig, flat_option_keys
from linlm.models.presets import preset_row
from linlm.models.registry import ARCHITECTURES
from linlm.schema import config_error

MODEL_TYPE_PREFIX = "linlm_"
# The preset whose values are the defaults of every config class (the paper's smallest model).
DEFAULT_PRESET = "paper-70m"

# ModelConfig field or option -> the transformers name it is stored under; its own name is an alias of it.
HF_NAMES: dict[str, str] = {
    "d_model": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",  # 0 means num_attention_heads, as in linlm
    "glu_dim": "intermediate_size",  # 0 means round(8/3 * hidden_size) up to a multiple of 64
    "max_seq_len": "max_position_embeddings",
    "init_std": "initializer_range",
    "tie_embeddings": "tie_word_embeddings",
    "d_state": "state_size",  # MambaConfig's names
    "d_conv": "conv_kernel",
    "balance_loss_coef": "router_aux_loss_coef",
}
MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name not in ("arch", "options"))


def hf_name(key: str) -> str:
    """The attribute of a key of linlm's model config: ``d_model`` -> ``hidden_size``, ``options.tpe`` -> ``tpe``,
    ``options.d_state`` -> ``state_size``."""
    name = key.removeprefix("options.")
    return HF_NAMES.get(name, name)


def settings_of(cfg: ModelConfig) -> dict[str, Any]:
    """{attribute: value} of a linlm model config: its fields, then its options, under their transformers names."""
    values = cfg.to_dict()
    options = values.pop("options") or {}
    del values["arch"]
    return {hf_name(k): v for k, v in {**values, **options}.items()}


class LinlmConfig(PreTrainedConfig):
    """Base of the per-architecture configs (``LinlmTnlConfig``, ...), whose fields :func:`config_fields` makes."""

    model_type = "linlm"
    arch: ClassVar[str] = ""
    option_names: ClassVar[tuple[str, ...]] = ()
    attribute_map = dict(HF_NAMES)
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        saved_type = kwargs.pop("model_type", None)
        if saved_type is not None and saved_type != self.model_type:
            raise CheckpointError(_wrong_model_type(saved_type, self.arch))
        nested = kwargs.pop("linlm", None)
        super().__post_init__(**kwargs)
        if nested is not None:
            for key, value in settings_of(self._read_nested(nested)).items():
                setattr(self, key, value)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs):
        """The config of a saved config.json. An option it lacks (it was saved before the option existed) takes the
        value linlm computed with then (``ArchSpec.saved_before``), as ``ModelConfig.from_saved`` does."""
        for alias, name in cls.attribute_map.items():
            if alias in config_dict and name in config_dict and config_dict[alias] != config_dict[name]:
                raise CheckpointError(f"config.json: {name}={config_dict[name]!r} and {alias}={config_dict[alias]!r} "
                                      f"are one setting ({alias} is linlm's name of {name}); keep {name} only")
        if cls.arch and "linlm" not in config_dict:
            config_dict = {**ARCHITECTURES[cls.arch].saved_before, **_without_others_options(cls, config_dict)}
        return super().from_dict(config_dict, **kwargs)

    def to_linlm(self) -> ModelConfig:
        """The linlm model config of these attributes, validated; a ConfigError names the attribute at fault."""
        values = {"arch": self.arch, **{k: getattr(self, hf_name(k)) for k in MODEL_FIELDS},
                  "options": {name: getattr(self, hf_name(name)) for name in self.option_names}}
        try:
            return ModelConfig.from_dict(values)
        except ConfigError as e:
            key = getattr(e, "key", None)
            if key is None:
                raise
            raise config_error(hf_name(key), e.detail, related=[hf_name(k) for k in e.related]) from None

    def _read_nested(self, values: Any) -> ModelConfig:
        """The model config of the earlier format's ``linlm`` field."""
        if not isinstance(values, Mapping) or "arch" not in values:
            raise CheckpointError("config.json: its 'linlm' field holds no linlm model config (no 'arch' in it); "
                                  "save the model again with linlm.hf.modeling.to_hf(model).save_pretrained")
        if values["arch"] != self.arch:
            raise CheckpointError(_other_arch(str(values["arch"]), self.arch))
        try:
            return ModelConfig.from_saved(values)
        except ConfigError as e:
            raise CheckpointError(f"config.json: invalid linlm config: {e}") from None


def _without_others_options(cls: type, config_dict: dict[str, Any]) -> dict[str, Any]:
    """``config_dict`` without the settings of other architectures' options: config.json files written while
    those were ModelConfig fields hold every one of them (a Mamba model's rope_scaling, which transformers would
    otherwise read as its own RoPE setting); they never changed this model."""
    mine = {*vars(cls).get("__annotations__", {}), *cls.attribute_map}
    others = {name for flat in flat_option_keys() for name in (flat, hf_name(flat))} - mine
    return {k: v for k, v in config_dict.items() if k not in others}


def _other_arch(saved: str, arch: str) -> str:
    return (f"config.json describes a linlm {saved!r} model, but this class builds {arch!r}; load it with "
            f"AutoModelForCausalLM.from_pretrained (which picks the class from model_type) or "
            f"{class_name(saved, 'ForCausalLM')}")


def _wrong_model_type(saved: str, arch: str) -> str:
    if saved.startswith(MODEL_TYPE_PREFIX) and saved[len(MODEL_TYPE_PREFIX):] in ARCHITECTURES:
        return _other_arch(saved[len(MODEL_TYPE_PREFIX):], arch)
    return (f"config.json has model_type {saved!r}: no linlm model config; a Llama checkpoint converts with "
            f"linlm.hf.llama.from_hf_llama, and a fresh config is AutoConfig.for_model('{MODEL_TYPE_PREFIX}{arch}', "
            "hidden_size=..., ...)")


def config_fields(arch: str) -> dict[str, tuple[Any, Any]]:
    """{attribute: (type, default)} of the config class of ``arch``: the ModelConfig fields under their transformers
    names, then the architecture's options; the defaults are the architecture's ``DEFAULT_PRESET`` model."""
    spec = ARCHITECTURES[arch]
    defaults = settings_of(ModelConfig.from_dict({**preset_row(arch, DEFAULT_PRESET), "arch": arch}))
    hints = typing.get_type_hints(ModelConfig)
    types = {hf_name(k): hints[k] for k in MODEL_FIELDS}
    option_hints = typing.get_type_hints(spec.options)
    taken = {*types, *(k for k in HF_NAMES if k in MODEL_FIELDS), *(f.name for f in dataclasses.fields(LinlmConfig)),
             *dir(LinlmConfig)}
    # Options that were ModelConfig fields were attributes of these configs already (rope_scaling replaces
    # transformers' property of that name, as it did then).
    were_fields = {flat for flat, option in spec.flat_options.items() if flat == option}
    for option in dataclasses.fields(spec.options):
        if hf_name(option.name) in taken and option.name not in were_fields:
            raise ValueError(f"ArchSpec {arch!r}: option {option.name!r} has the name of another attribute of a "
                             "transformers config; rename the option")
        types[hf_name(option.name)] = option_hints[option.name]
    return {name: (kind, defaults[name]) for name, kind in types.items()}


def _config_attrs(arch: str) -> dict[str, Any]:
    fields = config_fields(arch)
    spec = ARCHITECTURES[arch]
    # linlm's names of the attributes stored under transformers names, and the earlier flat spellings of the options
    # ("tnl_slopes"), are aliases.
    aliases = {**{k: v for k, v in HF_NAMES.items() if v in fields},
               **{flat: hf_name(option) for flat, option in spec.flat_options.items() if flat != hf_name(option)}}
    return {"model_type": MODEL_TYPE_PREFIX + arch, "arch": arch, "attribute_map": aliases,
            "option_names": tuple(f.name for f in dataclasses.fields(spec.options)),
            "__annotations__": {name: kind for name, (kind, _) in fields.items()},
            **{name: _class_default(default) for name, (_, default) in fields.items()}}


def _class_default(default: Any) -> Any:
    """A class attribute's default: a list (a hybrid's attn_layers) as a dataclass factory, since transformers makes
    its configs dataclasses, which refuse mutable defaults."""
    return dataclasses.field(default_factory=lambda: list(default)) if isinstance(default, list) else default


class PerArch(Mapping):
    """{architecture: class} over the registry as it is at each access: the class of an architecture, a subclass of
    ``base`` named ``Linlm<Arch><suffix>`` with the class attributes ``attrs(arch)``, is made the first time it is
    asked for and handed to ``register`` (transformers' Auto classes), so an architecture registered after this
    module was imported has one too. Each class is also a module attribute of ``module`` under its own name."""

    def __init__(self, base: type, suffix: str, attrs: Callable[[str], dict], register: Callable[[type], None],
                 module: str):
        self._base, self._suffix, self._attrs, self._register = base, suffix, attrs, register
        self._module, self._made = module, {}

    def __getitem__(self, arch: str) -> type:
        if arch not in ARCHITECTURES:
            raise KeyError(arch)
        if arch not in self._made:
            name = class_name(arch, self._suffix)
            cls = type(name, (self._base,), {**self._attrs(arch), "__module__": self._module, "__qualname__": name})
            self._register(cls)
            self._made[arch] = cls
            setattr(sys.modules[self._module], name, cls)
        return self._made[arch]

    def __iter__(self) -> Iterator[str]:
        return iter(list(ARCHITECTURES))

    def __len__(self) -> int:
        return len(ARCHITECTURES)

    def named(self, name: str) -> type:
        """The class called ``name`` (a module's ``__getattr__``); AttributeError when there is none."""
        for arch in self if name.startswith("Linlm") else ():
            if self[arch].__name__ == name:
                return self[arch]
        raise AttributeError(f"module {self._module!r} has no attribute {name!r}")


def class_name(arch: str, suffix: str) -> str:
    return "Linlm" + arch.capitalize() + suffix


CONFIG_CLASSES: Mapping[str, type[LinlmConfig]] = PerArch(
    LinlmConfig, "Config", _config_attrs,
    lambda cls: AutoConfig.register(cls.model_type, cls, exist_ok=True), __name__)


def __getattr__(name: str) -> type:
    return CONFIG_CLASSES.named(name)


def hf_config_for(cfg: ModelConfig, **kwargs) -> LinlmConfig:
    """The transformers config of a linlm model config."""
    return CONFIG_CLASSES[cfg.arch](**settings_of(cfg), **kwargs)
