"""transformers configs for linlm models: one ``PreTrainedConfig`` class per architecture (model_type linlm_<arch>).

The linlm ``ModelConfig`` travels whole in the ``linlm`` field of config.json; ``vocab_size``, ``hidden_size`` and
``num_hidden_layers`` mirror it for transformers' own utilities.
"""

from __future__ import annotations

from transformers import PreTrainedConfig

from linlm.errors import CheckpointError, ConfigError
from linlm.models.config import ModelConfig
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
            cls = "Linlm" + str(values["arch"]).capitalize() + "ForCausalLM"
            raise CheckpointError(
                f"config.json describes a linlm {values['arch']!r} model, but this class builds {self.arch!r}; load it "
                f"with AutoModelForCausalLM.from_pretrained (which picks the class from model_type) or {cls}"
            )
        try:
            return ModelConfig.from_dict(values)
        except ConfigError as e:
            raise CheckpointError(f"config.json: invalid linlm config: {e}") from None


CONFIG_CLASSES: dict[str, type[LinlmConfig]] = {}
for _arch in ARCHITECTURES:
    _name = "Linlm" + _arch.capitalize() + "Config"
    CONFIG_CLASSES[_arch] = type(_name, (LinlmConfig,), {"model_type": MODEL_TYPE_PREFIX + _arch, "arch": _arch,
                                                         "__module__": __name__, "__qualname__": _name})
    globals()[_name] = CONFIG_CLASSES[_arch]


def hf_config_for(cfg: ModelConfig, **kwargs) -> LinlmConfig:
    """The transformers config of a linlm model config."""
    return CONFIG_CLASSES[cfg.arch](linlm=cfg.to_dict(), vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
                                    num_hidden_layers=cfg.n_layers, **kwargs)
