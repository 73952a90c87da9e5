"""linlm: linear-complexity language models (MossNet, TNL, HGRN2, cosFormer2) with LLaMA and Mamba baselines."""

from linlm import errors
from linlm.models.model_config import ModelConfig
from linlm.models.io import load
from linlm.models.lm import CausalLM, LMOutput, create_model
from linlm.models.presets import PRESETS
from linlm.models.registry import ARCHITECTURES, register
from linlm.models.archs.base import ArchSpec
from linlm.layers.mixer import TokenMixer
from linlm.conversion import convert

from linlm.version import __version__

__all__ = ["errors", "ModelConfig", "CausalLM", "LMOutput", "create_model", "load", "PRESETS", "ARCHITECTURES", "convert",
           "register", "ArchSpec", "TokenMixer", "__version__"]
