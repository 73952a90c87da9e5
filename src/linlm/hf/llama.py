"""The old home of the Llama conversion, which now lives in linlm.conversion.hf_llama (re-exported here)."""

from linlm.conversion.hf_llama import config_from_hf, from_hf_llama, hf_config_from, to_hf_llama  # noqa: F401

__all__ = ["config_from_hf", "from_hf_llama", "hf_config_from", "to_hf_llama"]
