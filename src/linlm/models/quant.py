"""8-bit weights for inference: every ``nn.Linear`` of a model (and the embeddings) held as int8 with one scale per
output channel.

Storage (weight-only, no calibration): W [N, K] becomes q = round(W / s) in int8 with s[n] = max_k |W[n, k]| / 127,
a symmetric scale per output row, so W ~ q * s[:, None]. A saved model stores q under the weight's own name and s
under ``<name>_scale`` (float32 [N]); config.json says ``"quantization": {"method": "int8", ...}``.

Compute, for inputs of at most ``DYNAMIC_ROWS`` rows (decoding steps, batched or not): torch's fbgemm int8 GEMM
(``torch.ops.quantized.linear_dynamic``, the x86 kernels PyTorch ships). The weight is packed once when loaded; each
call quantises its input to 8 bits on the fly (one scale for the whole input, so the rows of a batched step share
it; ``reduce_range``, 7-bit inputs, as fbgemm needs on x86) and accumulates in int32. It reads the 8-bit weights at
about the memory bandwidth: a batch-1 decoding step reads a quarter of the fp32 bytes. Longer inputs (a prefill, the
perplexity scorer) are multiplied by the dequantised weight in float32: compute-bound, so no slower than the float
model, and with no error in the activations. Measured at batch 1 (24 Mamba layers of mamba-130m's shape, 1 thread,
AMD EPYC Zen 4): fp32 26 ms, this GEMM 6.7 ms, torch's weight-only ``_weight_int8pack_mm`` 12 ms (bfloat16
inputs; float32 ones take a reference loop 10x slower), and at batch 8 and 32: 7.6 and 20 ms against 26 and 80.
``_weight_int4pack_mm_for_cpu`` (bfloat16) was no faster than this int8 GEMM at batch 1 (compute-bound), so there is
no int4.

What is not an ``nn.Linear`` stays as it was: norms, convolutions, Mamba's dt projection, A and D, MoE expert stacks
(``nn.Parameter`` tensors), the HGRN2 lower bounds. The embeddings are int8 rows with a scale per row; a tied head
gets its own packed copy of those rows. ``module.weight`` of a quantised layer is the dequantised float32 weight, made
on demand, for code that reads weights (the perplexity scorer's head, counting): it costs a float32 copy each time.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from linlm.errors import CheckpointError, ConfigError
from linlm.layers.linear import DecodeLinear

METHODS = ("int8",)
SCALE = "_scale"
# Inputs of at most this many rows (decoding steps, short prompts) go through the int8 GEMM; longer ones (a prefill,
# the perplexity scorer) multiply by the dequantised weight: compute-bound, and exact in the activations.
DYNAMIC_ROWS = 64


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], s float32 [N]): symmetric per-row int8, W ~ q * s[:, None]; an all-zero row gets s = 1."""
    w = w.detach().float()
    s = w.abs().amax(dim=1) / 127.0
    s = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.round(w / s[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, s


def _pack(q: torch.Tensor, s: torch.Tensor):
    """fbgemm's packed form of q (per-channel int8, zero points 0)."""
    with warnings.catch_warnings():  # the quantised-tensor constructors warn of their future in torch
        warnings.simplefilter("ignore")
        qt = torch._make_per_channel_quantized_tensor(q, s.double(), torch.zeros_like(s, dtype=torch.long), 0)
        return torch.ops.quantized.linear_prepack(qt, None)


def kernels_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines or "x86" in torch.backends.quantized.supported_engines


# The packed weights of every QuantLinear, by id: the int8 GEMM as an op of linlm's own (``linlm::int8_linear``), whose
# arguments are tensors and that id, so that torch.compile (CausalLM.compile_step) can call it inside a graph, where
# fbgemm's packed-weight object cannot be an argument.
_PACKED: dict[int, object] = {}


@torch.library.custom_op("linlm::int8_linear", mutates_args=())
def _int8_linear(x: torch.Tensor, packed_id: int, out_features: int) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic(x, _PACKED[packed_id], True)


@_int8_linear.register_fake
def _(x, packed_id, out_features):
    return x.new_empty(x.shape[0], out_features)


class QuantLinear(nn.Module):
    """y = x W^T with W ~ q * s (int8 per output row), computed by fbgemm's dynamic int8 GEMM; no bias."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self._packed = None
        self._shape_only = True

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> "QuantLinear":
        m = cls(weight.shape[1], weight.shape[0])
        m.set_int8(*quantize_rows(weight))
        return m

    def set_int8(self, q: torch.Tensor, s: torch.Tensor) -> None:
        if tuple(q.shape) != (self.out_features, self.in_features) or q.dtype != torch.int8:
            raise CheckpointError(f"int8 weight of shape {tuple(q.shape)} and dtype {q.dtype}; this layer needs "
                                  f"[{self.out_features}, {self.in_features}] int8")
        self._packed, self._shape_only = _pack(q.contiguous(), s.float().contiguous()), False
        _PACKED[id(self)] = self._packed
        weakref.finalize(self, _PACKED.pop, id(self), None)

    def int8(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, s) unpacked from the packed weight."""
        qt, _ = torch.ops.quantized.linear_unpack(self._packed)
        return qt.int_repr(), qt.q_per_channel_scales().float()

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised float32 weight [N, K] (a new tensor on each access)."""
        q, s = self.int8()
        return q.float() * s[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != torch.float32 or not x2.is_contiguous():
            x2 = x2.float().contiguous()
        if x2.shape[0] <= DYNAMIC_ROWS:
            if torch.compiler.is_compiling():  # the same GEMM, through an op a graph can hold
                y = _int8_linear(x2, id(self), self.out_features)
            else:  # eagerly the op's own dispatch would cost about as much as a small layer's GEMM
                y = torch.ops.quantized.linear_dynamic(x2, self._packed, True)
        else:
            y = F.linear(x2, self.weight)
        return y.reshape(*lead, self.out_features).to(x.dtype)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        if self._shape_only:
            q = torch.empty(self.out_features, self.in_features, dtype=torch.int8, device="meta")
            s = torch.empty(self.out_features, device="meta")
        else:
            q, s = self.int8()
        destination[prefix + "weight"], destination[prefix + "weight" + SCALE] = q, s

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        names = (prefix + "weight", prefix + "weight" + SCALE)
        for n in names:
            if n not in state_dict:
                missing_keys.append(n)
        if all(n in state_dict for n in names):
            self.set_int8(state_dict[names[0]], state_dict[names[1]])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


class QuantEmbedding(nn.Module):
    """Rows of an int8 table with a scale per row: embed(ids) = q[ids] * s[ids, None]."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.register_buffer("weight", torch.zeros(num_embeddings, embedding_dim, dtype=torch.int8))
        self.register_buffer("weight" + SCALE, torch.ones(num_embeddings))

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> "QuantEmbedding":
        m = cls(*weight.shape)
        m.weight, m.weight_scale = quantize_rows(weight)
        return m

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight).float() * F.embedding(ids, self.weight_scale[:, None])


def is_quantized(model) -> bool:
    return getattr(model, "quantization", None) is not None


def _linears(model) -> list[tuple[nn.Module, str, nn.Linear]]:
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if type(child) in (nn.Linear, DecodeLinear)]


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ConfigError(f"--to: {method!r} is not a quantisation this version has; valid choices are "
                          f"{', '.join(METHODS)}")


def quantize_model(model, method: str = "int8"):
    """Quantise ``model`` in place (a CausalLM with float weights): every nn.Linear without a bias becomes a
    :class:`QuantLinear`, the embeddings a :class:`QuantEmbedding`, a tied head a QuantLinear of the same rows.
    Returns the model, marked with ``model.quantization``."""
    _check_method(method)
    if is_quantized(model):
        raise ConfigError(f"the model is already quantized ({model.quantization['method']}); quantize the float "
                          f"model it came from instead")
    if not kernels_available():
        raise ConfigError("this torch build has no fbgemm int8 kernels (torch.backends.quantized.supported_engines "
                          "lacks fbgemm and x86); int8 models run on x86 CPUs with torch's standard build")
    with torch.no_grad():
        for parent, name, lin in _linears(model):
            if lin.bias is None:
                setattr(parent, name, QuantLinear.from_float(lin.weight))
        tied = model.head is None
        embed = model.embed
        model.embed = QuantEmbedding.from_float(embed.weight)
        model.head = QuantLinear.from_float(embed.weight) if tied else model.head
    model.quantization = {"method": method, "weights": "int8, symmetric, one scale per output channel",
                          "compute": "fbgemm dynamic int8 GEMM (input quantised per call)",
                          "tied_head": tied}
    return model


def quantized_shell(shell, quantization: dict):
    """Turn ``shell`` (a CausalLM built on the meta device from a quantised model's config) into the modules that
    :func:`quantize_model` makes, ready for ``load_state_dict``."""
    method = quantization.get("method") if isinstance(quantization, dict) else None
    if method not in METHODS:
        raise CheckpointError(f"the model is quantized as {method!r}, which this version of linlm cannot run; "
                              f"valid: {', '.join(METHODS)}")
    if not kernels_available():
        raise CheckpointError("this model has int8 weights, and this torch build has no fbgemm int8 kernels; "
                              "load it with torch's standard x86 build")
    for parent, name, lin in _linears(shell):
        if lin.bias is None:
            setattr(parent, name, QuantLinear(lin.in_features, lin.out_features))
    V, d = shell.embed.weight.shape
    shell.embed = QuantEmbedding(V, d)
    if quantization.get("tied_head"):
        shell.head = QuantLinear(d, V)
    shell.quantization = dict(quantization)
    return shell


def head_logits(model, h: torch.Tensor) -> Optional[torch.Tensor]:
    """Logits through a quantised head, or None for a float model (the caller applies head_weight)."""
    head = getattr(model, "head", None)
    return head(h) if isinstance(head, QuantLinear) else None
