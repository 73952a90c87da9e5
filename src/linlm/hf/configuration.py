"""transformers configs for linlm models: one ``PreTrainedConfig`` class per architecture (model_type linlm_<arch>),
each registered with ``AutoConfig`` when it is made (:class:`PerArch`); importing :mod:`linlm.hf` makes them all.

The linlm ``ModelConfig`` travels whole in the ``linlm`` field of config.json; ``vocab_size``, ``hidden_size`` and
``num_hidden_layers`` mirror it for transformers' own utilities.
"""

from __future__ import annotations

import sys
from typing import Callable, Iterator, Mapping

from transformers import AutoConfig, PreTrainedConfig

from linlm.errors import CheckpointError, ConfigError
from linlm.models.model_config import ModelConfig
from linlm.models.registry import ARCHITECTURES

MODEL_TYPE_PREFIX = "linlm_"


class LinlmConfig(PreTrainedConfig):
    """Base of the per-architecture configs; build one with :func:`hf_config_for`."""

    model_type = "linlm"
    arch = ""
    linlm: dict | None = None
    vocab_size: int = 8192
    hidden_size: int = 512
    num_hidden_layers: int = 6
    # linlm ties (or not) the head inside its own model; transformers must not tie anything.
    tie_word_embeddings: bool = False
    use_cache: bool = True

    def to_linlm(self) -> ModelConfig:
        if not isinstance(self.linlm, dict) or "arch" not in self.linlm:
            raise CheckpointError(
                "config.json has no linlm model config (no 'linlm' field); "
                "this is not a linlm transformers model (a Llama checkpoint converts with "
                "linlm.hf.llama.from_hf_llama; a fresh config is made by linlm.hf.configuration.hf_config_for)"
            )
        values = dict(self.linlm)
        if values["arch"] != self.arch:
            cls = class_name(str(values["arch"]), "ForCausalLM")
            raise CheckpointError(
                f"config.json describes a linlm {values['arch']!r} model, but this class builds {self.arch!r}; load it "
                f"with AutoModelForCausalLM.from_pretrained (which picks the class from model_type) or {cls}"
            )
        try:
            return ModelConfig.from_dict(values)
        except ConfigError as e:
            raise CheckpointError(f"config.json: invalid linlm config: {e}") from None


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
    LinlmConfig, "Config", lambda arch: {"model_type": MODEL_TYPE_PREFIX + arch, "arch": arch},
    lambda cls: AutoConfig.register(cls.model_type, cls, exist_ok=True), __name__)


def __getattr__(name: str) -> type:
    return CONFIG_CLASSES.named(name)


def hf_config_for(cfg: ModelConfig, **kwargs) -> LinlmConfig:
    """The transformers config of a linlm model config."""
    return CONFIG_CLASSES[cfg.arch](linlm=cfg.to_dict(), vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
                                    num_hidden_layers=cfg.n_layers, **kwargs)
