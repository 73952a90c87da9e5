"""8-bit weights for inference: every ``nn.Linear`` of a model (and the embeddings) held as int8 with one scale per
output channel.

Storage (weight-only, no calibration): W [N, K] becomes q = round(W / s) in int8 with s[n] = max_k |W[n, k]| / 127,
a symmetric scale per output row, so W ~ q * s[:, None]. A saved model stores q under the weight's own name and s
under ``<name>_scale`` (float32 [N]); config.json says ``"quantization": {"method": "int8", ...}``.

Compute, for inputs of at most ``DYNAMIC_ROWS`` (64) rows (decoding steps, batched or not, and a prefill's pieces,
:func:`prefill_tokens`): linlm's int8 matrix-vector kernel (linlm.ops.gemv_kernel.q8_linear), which quantises each
input row to int8 with a scale of its own (max |x| / 127), sums exactly in int32 and reads each 8-bit weight row once
for all the rows. Where that kernel is not built, torch's fbgemm int8 GEMM (``torch.ops.quantized.linear_dynamic``;
one input scale for all rows, 7-bit inputs as fbgemm needs on x86), its packed copy of the weight made on the first
call. linlm's kernel
holds no such copy: on an AMD EPYC (Zen 5, 1 thread), for a Mamba of mamba-130m's shape, fbgemm's copies raised the
resident set by 95-123 MiB and its packing made a 32-token prompt take 280-293 ms against 54-61 (a decoding step of
32 sequences took 68-72 ms on fbgemm, 89-90 on linlm's kernel: fbgemm's GEMM sums faster, from its copy). Longer
inputs (the model's forward: the perplexity scorer, evaluation) are multiplied by the dequantised weight in float32,
1024 weight rows at a time (no float32 copy of a whole weight is held): compute-bound, so no slower than the float
model, and with no error in the activations. benchmarks/bench_llamacpp.py times int8 decoding against llama.cpp's
Q8_0. Earlier, on an AMD EPYC Zen 4, torch's weight-only ``_weight_int8pack_mm`` (bfloat16 inputs) and
``_weight_int4pack_mm_for_cpu`` were no faster than fbgemm's int8 GEMM at batch 1, so there is no int4.

What is not an ``nn.Linear`` stays as it was: norms, convolutions, Mamba's dt projection, A and D, MoE expert stacks
(``nn.Parameter`` tensors), the HGRN2 lower bounds. The embeddings are int8 rows with a scale per row; a tied head
gets its own int8 copy of those rows. ``module.weight`` of a quantised layer is the dequantised float32 weight, made
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
from linlm.ops.gemv_kernel import Q8_MAX_ROWS, q8_linear, q8_linear_takes

METHODS = ("int8",)
SCALE = "_scale"
# Inputs of at most this many rows (decoding steps, a prefill's pieces) go through int8 products; longer ones (the
# forward of the perplexity scorer, evaluation) multiply by the dequantised weight: exact in the activations.
DYNAMIC_ROWS = Q8_MAX_ROWS
DEQUANT_ROWS = 1024  # weight rows dequantised at a time for longer inputs


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


# Every QuantLinear, by id (weakly): the int8 GEMM as an op of linlm's own (``linlm::int8_linear``), whose arguments
# are tensors and that id, so that torch.compile (CausalLM.compile_step) can call it inside a graph, where the layer
# and fbgemm's packed-weight object cannot be arguments.
_LAYERS: dict[int, "weakref.ref[QuantLinear]"] = {}


@torch.library.custom_op("linlm::int8_linear", mutates_args=())
def _int8_linear(x: torch.Tensor, layer_id: int, out_features: int) -> torch.Tensor:
    return _LAYERS[layer_id]()._product(x)


@_int8_linear.register_fake
def _(x, layer_id, out_features):
    return x.new_empty(x.shape[0], out_features)


class QuantLinear(nn.Module):
    """y = x W^T with W ~ q * s (int8 per output row); no bias. Inputs of at most DYNAMIC_ROWS rows go to linlm's
    int8 kernel (each row quantised with a scale of its own; where it is not built, fbgemm's dynamic int8 GEMM, the
    weight packed for it on first use), longer ones to the dequantised weight."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self._q = self._s = self._packed = None
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
        if q.numel() and int(q.min()) < -127:  # quantize_rows never writes -128; the int8 kernel's sums need +-127
            raise CheckpointError("int8 weight holds -128; linlm's int8 weights lie in [-127, 127] (quantize the "
                                  "float model again with linlm quantize)")
        self._q, self._s = q.detach().contiguous(), s.detach().float().contiguous()
        self._packed, self._shape_only = None, False
        if id(self) not in _LAYERS:
            _LAYERS[id(self)] = weakref.ref(self)
            weakref.finalize(self, _LAYERS.pop, id(self), None)

    def int8(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q int8 [N, K], s float32 [N]), the layer's own tensors."""
        return self._q, self._s

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised float32 weight [N, K] (a new tensor on each access)."""
        return self._q.float() * self._s[:, None]

    def _fbgemm(self):
        """fbgemm's packed form of the weight, made on first use."""
        if self._packed is None:
            self._packed = _pack(self._q, self._s)
        return self._packed

    def _product(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 [M, K] float32 contiguous, M <= DYNAMIC_ROWS: on linlm's int8 kernel where it takes x2, else fbgemm."""
        if q8_linear_takes(x2, self._q, self._s, None):
            return q8_linear(x2, self._q, self._s)
        return torch.ops.quantized.linear_dynamic(x2, self._fbgemm(), True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != torch.float32 or not x2.is_contiguous():
            x2 = x2.float().contiguous()
        if x2.shape[0] <= DYNAMIC_ROWS:
            if torch.compiler.is_compiling():  # the same products, through an op a graph can hold
                y = _int8_linear(x2, id(self), self.out_features)
            else:  # eagerly the op's own dispatch would cost about as much as a small layer's product
                y = self._product(x2)
        else:
            y = self._dequantised_product(x2)
        return y.reshape(*lead, self.out_features).to(x.dtype)

    def _dequantised_product(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 [M, K] (q s)^T in float32, the weight dequantised DEQUANT_ROWS rows at a time: y^T's rows are q's
        rows against x2, scaled once. No float32 copy of the whole weight is ever held (a prefill chunk would
        otherwise make two, of every layer, and the allocator keeps the heap they grew)."""
        N = self.out_features
        yt = torch.empty(N, x2.shape[0], dtype=torch.float32)
        for a in range(0, N, DEQUANT_ROWS):
            torch.mm(self._q[a:a + DEQUANT_ROWS].float(), x2.T, out=yt[a:a + DEQUANT_ROWS])
        return yt.mul_(self._s[:, None]).T

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
                          "compute": "int8 products, the input quantised per call (linlm's kernel up to 64 rows, "
                                     "the dequantised weight beyond)",
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


def prefill_tokens(model, batch: int) -> Optional[int]:
    """Tokens per prefill piece of a quantised model of ``batch`` prompts (None for a float model): as many as keep
    each product within DYNAMIC_ROWS rows, so that a prefill's products are int8 products like a decoding step's (on
    linlm's kernel each row quantised with a scale of its own), not the dequantised weight's float32 ones. On an AMD
    EPYC (Zen 5), for an int8 Mamba of mamba-130m's shape, a prefill of 2,048 tokens in pieces of 64 against 256
    tokens (the float models' pieces): 1 thread 710-740 tokens/s against 470-485 and the peak resident set 36-44 MiB
    above the model's against 130-144; 2 threads 1105-1160 tokens/s against 795-818 (benchmarks/bench_llamacpp.py
    prints the int8 prefill's tokens/s and peak memory). The model's forward (the
    perplexity scorer, evaluation) keeps the dequantised weight, exact in the activations."""
    return max(1, DYNAMIC_ROWS // max(batch, 1)) if is_quantized(model) else None


def head_logits(model, h: torch.Tensor) -> Optional[torch.Tensor]:
    """Logits through a quantised head, or None for a float model (the caller applies head_weight)."""
    head = getattr(model, "head", None)
    return head(h) if isinstance(head, QuantLinear) else None
