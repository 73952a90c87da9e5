"""The token-mixer contract: what every architecture's mixer is, takes, returns and declares.

A token mixer is the sequence half of a block (models/block.py: ``x = x + mixer(norm(x))``). Each architecture's
mixer derives from :class:`TokenMixer`; registering the architecture (``linlm.register``) checks the class with
:func:`contract_gaps`, so a missing piece is one line at registration instead of NaN logits or undercounted FLOPs
later. What a mixer must define:

``__init__(self, cfg, layer_idx)``
    cfg is the model config (its shared fields, and ``cfg.options``: the architecture's own), layer_idx is
    0 .. n_layers - 1.
``forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None)``
    x [B, T, d] is the normed block input; returns ``(y, new_state)`` with y [B, T, d], or ``(y, new_state, aux)``
    where aux is a 0-d float tensor added to the training loss (routers' balance losses). ``state`` is None at the
    start of a sequence, else a ``new_state`` this mixer returned; ``reset`` [B, T] bool is True at the first token
    of each packed document, and no document may see an earlier one; ``offset`` is the position of x[:, 0] (an
    int, or a 0-d tensor under export); ``new_state`` may be None when ``return_state`` is False; ``ctx`` is the
    output of the architecture's ``shared`` module (one per model), or None. tests/models/test_invariants.py holds
    every registered architecture to: prefill then one-token steps give the logits of one full pass, and a packed
    batch gives those of its documents run one by one.
``state_spec(self, batch, context, dtype)``
    The decoding state after ``context`` tokens of a batch of ``batch`` sequences in a model computing in ``dtype``:
    the nesting ``forward`` returns (tensor, tuple, list or dict), with a tensor on the meta device of the right
    shape and dtype at each leaf. Every state tensor is batch-first (dim 0 is the sequence), so that a state's rows
    can be selected, reordered and joined (``ModelState.map``, beam search, batched decoding). A recurrent state
    does not depend on ``context`` (the ArchSpec says ``constant_state=True``); a KV cache grows with it. Gated
    linear attention keeps its state in float32 at least (:func:`float32_at_least`). tests/models/test_mixer_contract.py
    compares the spec with the state every registered architecture returns.
``mixing_flops_per_token(self, seq_len)``
    Forward FLOPs per token that the counting walk (models/measure.py) cannot see: it counts the ``nn.Linear``
    layers (and the children with a hook of their own), so this is the sequence mixing itself, element-wise gates,
    parameters used as plain matrices. Required, even when it is 0. A mixer that counts its whole forward defines
    ``flops_per_token(seq_len)`` instead; the walk then does not descend into it (MossNet). These FLOPs are the
    scaling fits' compute C where an architecture has no paper formula, and every MFU.

Optional:

``init_buffers(self)``
    Compute the mixer's computed buffers (``register_buffer(..., persistent=False)``: TNL's decays). They are not
    in the saved weights, so a model materialised from the meta device (transformers' ``from_pretrained``) holds
    uninitialised memory there until this runs. The model calls it on every module that defines it when built,
    and the transformers wrapper when it loads; a model whose module holds a computed buffer without defining it
    is refused when built (:func:`buffers_without_init`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

# The keyword arguments every mixer's forward takes, with their defaults.
FORWARD_KEYWORDS = {"state": None, "reset": None, "offset": 0, "return_state": False, "ctx": None}
FORWARD_SIGNATURE = "forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None)"
# The FLOP hooks, either of which satisfies the contract (models/measure.py reads both).
FLOP_HOOKS = ("mixing_flops_per_token", "flops_per_token")


def float32_at_least(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a recurrent state in a model computing in ``dtype``: float32, or float64 for a float64 model."""
    return torch.promote_types(dtype, torch.float32)


def meta(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    """A state tensor's description in :meth:`TokenMixer.state_spec`: an empty tensor on the meta device."""
    return torch.empty(*shape, dtype=dtype, device="meta")


class TokenMixer(nn.Module):
    """The base class of every token mixer (the contract is this module's docstring)."""

    def __init__(self, cfg, layer_idx: int):
        super().__init__()

    def forward(self, x: torch.Tensor, *, state: Any = None, reset: torch.Tensor | None = None, offset=0,
                return_state: bool = False, ctx: Any = None):
        raise NotImplementedError(f"{type(self).__name__} defines no forward")

    def state_spec(self, batch: int, context: int, dtype: torch.dtype) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no state_spec(batch, context, dtype)")

    def state_nbytes(self, batch: int, context: int, dtype: torch.dtype) -> int:
        """Bytes of the decoding state after ``context`` tokens (from :meth:`state_spec`)."""
        return spec_nbytes(self.state_spec(batch, context, dtype))

    def mixing_flops_per_token(self, seq_len: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} defines no mixing_flops_per_token(seq_len)")

    def init_buffers(self) -> None:
        """Compute the computed (non-persistent) buffers; nothing for a mixer that has none."""


def spec_nbytes(spec: Any) -> int:
    """Bytes of the tensors of a state or a state spec (any nesting of tensors, tuples, lists and dicts)."""
    if isinstance(spec, torch.Tensor):
        return spec.numel() * spec.element_size()
    if isinstance(spec, dict):
        return sum(spec_nbytes(v) for v in spec.values())
    if isinstance(spec, (list, tuple)):
        return sum(spec_nbytes(v) for v in spec)
    return 0


def spec_of(state: Any) -> Any:
    """A state's own spec: each tensor replaced by a meta tensor of its shape and dtype (to compare with
    :meth:`TokenMixer.state_spec`)."""
    if isinstance(state, torch.Tensor):
        return meta(*state.shape, dtype=state.dtype)
    if isinstance(state, dict):
        return {k: spec_of(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(spec_of(v) for v in state)
    return state


def spec_text(spec: Any) -> str:
    """A spec (or state) as text, e.g. ``{'conv': [2, 3, 128] float32, 'ssm': [2, 128, 16] float32}``."""
    if isinstance(spec, torch.Tensor):
        return f"{list(spec.shape)} {str(spec.dtype).removeprefix('torch.')}"
    if isinstance(spec, dict):
        return "{" + ", ".join(f"{k!r}: {spec_text(v)}" for k, v in spec.items()) + "}"
    if isinstance(spec, (list, tuple)):
        inner = ", ".join(spec_text(v) for v in spec)
        return f"({inner})" if isinstance(spec, tuple) else f"[{inner}]"
    return repr(spec)


def spec_mismatch(spec: Any, state: Any, where: str = "state") -> str | None:
    """Where ``state`` (a state, or its spec) differs from ``spec`` in nesting, shape or dtype, as one phrase; None
    when it matches."""
    if isinstance(spec, torch.Tensor) or isinstance(state, torch.Tensor):
        if not (isinstance(spec, torch.Tensor) and isinstance(state, torch.Tensor)
                and spec.shape == state.shape and spec.dtype == state.dtype):
            return f"{where} is {spec_text(state)}, its state_spec says {spec_text(spec)}"
        return None
    if isinstance(spec, dict) and isinstance(state, dict) and spec.keys() == state.keys():
        pairs = [(spec[k], state[k], f"{where}[{k!r}]") for k in spec]
    elif (isinstance(spec, (list, tuple)) and isinstance(state, (list, tuple)) and len(spec) == len(state)
          and isinstance(state, tuple) == isinstance(spec, tuple)):
        pairs = [(a, b, f"{where}[{i}]") for i, (a, b) in enumerate(zip(spec, state))]
    elif spec is None and state is None:
        return None
    else:
        return f"{where} is {spec_text(state)}, its state_spec says {spec_text(spec)}"
    return next((m for a, b, w in pairs if (m := spec_mismatch(a, b, w)) is not None), None)


def _defines(cls: type, name: str) -> bool:
    """True when ``cls`` (or a base below TokenMixer) defines ``name`` itself, not TokenMixer's placeholder."""
    return any(name in vars(k) for k in cls.__mro__ if k not in (TokenMixer, nn.Module, object))


def contract_gaps(cls: Any) -> list[str]:
    """What ``cls`` lacks to be a token mixer, each as a short phrase; empty when it keeps the contract."""
    if not (isinstance(cls, type) and issubclass(cls, TokenMixer)):
        return ["the base class linlm.TokenMixer (a mixer is a TokenMixer subclass)"]
    gaps = []
    try:
        init = inspect.signature(cls.__init__)
        init.bind(None, object(), 0)
    except (TypeError, ValueError):
        gaps.append("__init__(self, cfg, layer_idx)")
    if not _defines(cls, "forward"):
        gaps.append(FORWARD_SIGNATURE)
    else:
        params = inspect.signature(cls.forward).parameters
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            missing = [k for k in FORWARD_KEYWORDS if k not in params]
            if missing:
                gaps.append(f"forward keyword{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                            f"(the signature is {FORWARD_SIGNATURE})")
    if not _defines(cls, "state_spec"):
        gaps.append("state_spec(batch, context, dtype) (the shapes of its decoding state)")
    if not any(_defines(cls, hook) for hook in FLOP_HOOKS):
        gaps.append("a FLOP hook, mixing_flops_per_token(seq_len) (0.0 when everything is in its nn.Linear layers)")
    return gaps


def has_init_buffers(module: nn.Module) -> bool:
    """True when ``module`` defines ``init_buffers()`` (TokenMixer's placeholder does not count)."""
    if isinstance(module, TokenMixer):
        return _defines(type(module), "init_buffers")
    return callable(getattr(module, "init_buffers", None))


def init_buffers(model: nn.Module) -> None:
    """Call ``init_buffers()`` on every module of ``model`` that defines it."""
    for module in model.modules():
        if has_init_buffers(module):
            module.init_buffers()


def buffers_without_init(model: nn.Module) -> list[str]:
    """The computed (non-persistent) buffers of ``model`` whose module defines no ``init_buffers()``: nothing
    would recompute them after a load from the meta device."""
    saved = set(model.state_dict(keep_vars=True))
    missing = []
    for name, _ in model.named_buffers():
        owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        if name not in saved and not has_init_buffers(owner):
            missing.append(name)
    return missing
