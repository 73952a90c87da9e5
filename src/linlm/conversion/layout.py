"""What a checkpoint layout of another library is to the converters, and the helpers every layout shares.

A layout module defines ``LAYOUT = Layout(...)``; conversion/registry.py lists it with one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch

from linlm.errors import CheckpointError, ConfigError
from linlm.layers.shell import meta_device
from linlm.models.lm import CausalLM
from linlm.models.model_config import ModelConfig


@dataclass(frozen=True)
class Layout:
    name: str  # the --from / --to value, e.g. "hf-mamba"
    description: str  # the library and class whose checkpoints these are
    arch: str  # the linlm architecture it converts to
    matches: Callable[[dict], bool]  # (config.json) -> True when the directory is in this layout
    # (config.json, source tensors) -> a linlm model computing what the source computes
    to_linlm: Callable[[dict, Any], CausalLM]
    # (a linlm model of ``arch``) -> (config.json, tensors) of a directory in this layout; None: one way only
    from_linlm: Optional[Callable[[CausalLM], "tuple[dict, dict[str, torch.Tensor]]"]] = None


def require_transformers(what: str) -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError(f"{what} conversion needs transformers: pip install 'linlm[hf]'") from None


def found(config: Mapping) -> str:
    """What a config.json describes, for an error message."""
    if config.get("format") == "linlm-model":
        arch = config.get("config", {}).get("arch") if isinstance(config.get("config"), dict) else None
        return f"a linlm model ({arch})"
    kind, classes = config.get("model_type"), config.get("architectures")
    if kind is not None or classes:
        names = ", ".join(map(str, classes)) if isinstance(classes, list) else ""
        return f"a transformers {kind!r} checkpoint" + (f" ({names})" if names else "")
    keys = ", ".join(sorted(map(str, config))[:6])
    return f"a config of no known layout (keys: {keys or 'none'})"


def build(cfg_values: dict, where: str) -> ModelConfig:
    """A validated ModelConfig; a value linlm cannot build is a CheckpointError naming the source."""
    try:
        return ModelConfig.from_dict(cfg_values)
    except ConfigError as e:
        raise CheckpointError(f"{where}: this checkpoint does not fit linlm's {cfg_values.get('arch')}: {e}") from None


def fill(cfg: ModelConfig, tensors: Mapping[str, torch.Tensor], where: str) -> CausalLM:
    """A model of ``cfg`` holding ``tensors`` (linlm's names), after checking every name and shape first."""
    from linlm.models.format import check_tensors

    with meta_device():
        shell = CausalLM(cfg)
    check_tensors(where, tensors, shell.state_dict(), hint="the weights do not fit their config.json")
    model = CausalLM(cfg)
    model.load_state_dict({k: v.detach().clone().float() for k, v in tensors.items()}, strict=True)
    return model.eval()


def load_into(hf, tensors: Mapping[str, torch.Tensor], tied: bool):
    """The transformers model ``hf`` holding ``tensors`` (its own names); a tied head is tied again afterwards."""
    missing, unexpected = hf.load_state_dict(dict(tensors), strict=False)
    if unexpected or set(missing) - ({"lm_head.weight"} if tied else set()):
        raise CheckpointError(f"conversion to {type(hf).__name__} failed: missing {missing}, unexpected {unexpected}")
    if tied:
        hf.tie_weights()
    return hf


def refuse_model_type(config: Mapping, want: str, layout: str, where: str = "config.json") -> None:
    """A CheckpointError when ``config`` (config.json, or a transformers config's dict) is not of ``want``."""
    if config.get("model_type") != want:
        raise CheckpointError(f"{where}: describes {found(config)}, not a {want!r} one; {layout} converts only "
                              f"{want!r} checkpoints (`linlm convert` detects the layout when --from is left out)")


def conv_weight(t: torch.Tensor) -> torch.Tensor:
    """A depthwise ``nn.Conv1d`` weight [C, 1, K] as linlm's ShortConv weight [C, K]."""
    return t.reshape(t.shape[0], t.shape[-1])


def glu_from_hf(sd: Mapping[str, torch.Tensor], prefix: str, ours: str) -> dict[str, torch.Tensor]:
    """A transformers-style SwiGLU MLP (``{prefix}mlp.gate_proj`` / ``up_proj`` / ``down_proj``) as the weights of
    linlm's GLU under ``{ours}mlp.``: ``w_in`` is gate and up stacked, ``w_out`` the down projection."""
    gate, up = sd[prefix + "mlp.gate_proj.weight"], sd[prefix + "mlp.up_proj.weight"]
    return {ours + "mlp.w_in.weight": torch.cat([gate, up], dim=0),
            ours + "mlp.w_out.weight": sd[prefix + "mlp.down_proj.weight"]}


def glu_to_hf(mlp, prefix: str) -> dict[str, torch.Tensor]:
    """linlm's GLU ``mlp`` as the gate, up and down projections of a transformers-style block at ``prefix``."""
    gate, up = mlp.w_in.weight.chunk(2, dim=0)
    return {prefix + "mlp.gate_proj.weight": gate, prefix + "mlp.up_proj.weight": up,
            prefix + "mlp.down_proj.weight": mlp.w_out.weight}
