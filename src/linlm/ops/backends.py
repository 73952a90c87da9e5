"""GPU kernels from other libraries behind linlm's own op signatures: flash-linear-attention (``fla``) for gated
linear attention, mamba_ssm for the selective scan and Mamba-2's SSD.

Which op goes where (``choose_gla``, ``choose_scan`` and ``choose_ssd`` decide; all are pure functions of plain
values):

- ``linlm.ops.gla.gla`` (TNL, HGRN2, cosFormer2, TPE and MossNet's "ssd" experts, through
  ``layers.linear_attention.run_gla``) runs on fla when its inputs are CUDA tensors and fla imports:
  - vector gate [B, T, H, K]            -> ``fla.ops.gla.chunk_gla(q, k, v, g=log_a)``
  - scalar gate [B, T, H]               -> ``fla.ops.simple_gla.chunk_simple_gla(q, k, v, g=log_a)``
  - constant gate [H]                   -> ``chunk_simple_gla(..., g_gamma=log_a)``; as ``g`` broadcast over
                                           [B, T, H] when log_a needs a gradient (fla returns none for g_gamma)
  - no gate                             -> ``chunk_simple_gla`` with neither g nor g_gamma (plain linear attention)
  fla and linlm agree on everything else: [B, T, H, dim] layout (fla 0.5 has no head_first), gates as natural
  logs, a state [B, H, K, V] in float32 entering and leaving. linlm applies no scale to q, so ``scale=1.0``
  (fla's default is K^-1/2). Packed documents (``reset``) become fla's ``cu_seqlens``: the rows are flattened
  into one row of B * T tokens, cut at every row start and every reset; the first document of a row starts from
  that row's initial state (zeros where the row itself starts with a reset), the final state of a row is that of
  its last document. Finding the cuts costs one device-to-host copy of ``reset``.
- ``linlm.ops.delta_rule.delta_rule`` (DeltaNet, Gated DeltaNet) runs on fla the same way:
  - no gate  -> ``fla.ops.delta_rule.chunk_delta_rule(q, k, v, beta, scale, use_qk_l2norm_in_kernel=qk_l2norm)``
  - gate [B, T, H] -> ``fla.ops.gated_delta_rule.chunk_gated_delta_rule(q, k, v, g=log_a, beta, ...)``
  beta None becomes ones (fla requires one); linlm's ``scale`` and ``qk_l2norm`` are fla's own (both normalise
  x / sqrt(sum x^2 + 1e-6), then scale q); packed documents as for GLA. Head dims over 256 stay on linlm's path
  (fla's delta-rule kernels refuse them).
- ``linlm.ops.selective_scan.selective_scan`` (Mamba) runs on mamba_ssm's ``selective_scan_fn`` when its inputs
  are CUDA tensors and mamba_ssm imports, with u, dt [Bt, Din, T] and B, C [Bt, N, T] (mamba_ssm's layout:
  time last), A [Din, N] and D [Din] in float32, and dt_softplus as ``delta_softplus``.
- ``ssd`` (Mamba-2's layer, ``linlm.layers.mamba2``, before it falls back to ``gla``) runs on mamba_ssm's
  ``mamba_chunk_scan_combined(x=u, dt, A, B, C, chunk_size)``: u [B, T, H, P], dt [B, T, H] (already through
  softplus: no dt_bias, no dt_softplus), A [H] and the grouped B, C [B, T, G, N] are mamba_ssm's own layouts; D and
  the gate z stay in linlm's layer. States are [B, H, P, N] there and [B, H, N, P] in linlm (transposed both
  ways). Packed documents become ``seq_idx`` (the document number of each position in its row); a row that
  starts with a reset starts from zeros, not from its initial state. mamba_ssm backpropagates through the
  initial and the final state.

Everything else falls back, silently, to linlm's own path (the same maths):

- any tensor not on CUDA, or ``LINLM_GPU_KERNELS=torch``, or the library not importable (or, for fla, older than
  FLA_MIN_VERSION: a warning says so), or torch.export tracing;
- torch.use_deterministic_algorithms(True) (training's ``deterministic: true``): linlm's path is deterministic,
  the libraries' kernels do not promise it (mamba_ssm's backward accumulates with atomic adds);
- float64 inputs, gates or states (neither library computes in float64); an empty sequence;
- GLA: a head dim K or V under 16 (fla's Triton tiles are at least 16 wide); a backward through
  chunk_simple_gla's gate g where fla cannot run it (``fla_gated_backward_ok``: Hopper with an affected Triton);
- scan: an initial state, resets (mamba_ssm's selective_scan_fn takes neither), A [Bt, Din, N] or D [Bt, Din]
  (MossNet's batched experts), N over 256, and a final state that needs a gradient (selective_scan_fn returns the
  last state but does not backpropagate through it). Per-row ``lengths`` are run, as in the chunked form, as
  dt = 0 and C = 0 on the padding;
- ssd: N or P over 256, or mamba_ssm's Triton kernels not importable (then Mamba-2 runs on fla through ``gla``,
  or on linlm's path).

Inputs of mixed floating dtypes are computed in their promoted dtype (a bfloat16 u with a float32 dt runs in
float32), and outputs are returned in linlm's dtypes: o in v's dtype, y in u's, states in float32.

Switch: ``LINLM_GPU_KERNELS=auto`` (default) or ``torch`` (always linlm's path), read at every call; the
context manager ``gpu_kernels("torch")`` does the same for a block of code. The CPU path never imports either
library.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import re
import shutil
import sys
import warnings
from types import SimpleNamespace

import torch
from torch import Tensor

from linlm.errors import ConfigError

__all__ = ["MODES", "available", "choose_gla", "choose_scan", "choose_ssd", "delta_rule", "fla_gated_backward_ok",
           "gla", "gpu_kernels", "mode", "on_gpu", "selective_scan", "ssd"]

ENV = "LINLM_GPU_KERNELS"
MODES = ("auto", "torch")
_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FLA_MIN_HEAD_DIM = 16
FLA_MAX_DELTA_HEAD_DIM = 256  # fla's delta-rule kernels refuse larger head dims
MAMBA_MAX_STATE = 256  # selective_scan_cuda rejects a larger d_state
SSD_MAX_DIM = 256  # the largest state size N and head width P the SSD mapping sends to mamba_ssm

_override: list[str] = []  # innermost gpu_kernels() block last


def _check_mode(name: str, where: str) -> str:
    name = str(name).strip().lower() or "auto"
    if name not in MODES:
        raise ConfigError(f"{where}={name!r} is not a GPU kernel mode; use one of {', '.join(MODES)}")
    return name


def mode() -> str:
    """The GPU kernel mode: the innermost ``gpu_kernels()`` block, else $LINLM_GPU_KERNELS (auto by default)."""
    if _override:
        return _override[-1]
    return _check_mode(os.environ.get(ENV, "auto"), ENV)


@contextlib.contextmanager
def gpu_kernels(name: str):
    """Within the block, use mode ``name`` ("auto" or "torch") whatever $LINLM_GPU_KERNELS says."""
    _override.append(_check_mode(name, "gpu_kernels"))
    try:
        yield
    finally:
        _override.pop()


# ---------------------------------------------------------------------------------------------------------------------
# loading the libraries (only ever from a CUDA call)


def _import(top: str, modules: dict[str, tuple[str, str]]) -> SimpleNamespace | None:
    """The named functions {attr: (module, function)}, or None when ``top`` is not installed or fails to import
    (a warning says why in that case: an installed library that does not load is worth knowing about)."""
    if importlib.util.find_spec(top) is None:
        return None
    try:
        return SimpleNamespace(**{a: getattr(importlib.import_module(m), f) for a, (m, f) in modules.items()})
    except Exception as e:  # a broken CUDA extension or Triton raises anything: fall back rather than fail
        warnings.warn(f"linlm: {top} is installed but could not be loaded ({type(e).__name__}: {e}); "
                      f"using linlm's pure-torch ops", RuntimeWarning, stacklevel=3)
        return None


FLA_MIN_VERSION = (0, 5, 2)  # the version the mapping was written against; before 0.5 the layout was head-first


def fla_version_ok(version: str) -> bool:
    """Whether an fla ``__version__`` is one the mapping here was written for (at least FLA_MIN_VERSION)."""
    parts = re.findall(r"\d+", version)[:3]
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts)) >= FLA_MIN_VERSION


@functools.lru_cache(maxsize=None)
def _fla() -> SimpleNamespace | None:
    fns = _import("fla", {"chunk_gla": ("fla.ops.gla", "chunk_gla"),
                          "chunk_simple_gla": ("fla.ops.simple_gla", "chunk_simple_gla"),
                          "chunk_delta_rule": ("fla.ops.delta_rule", "chunk_delta_rule"),
                          "chunk_gated_delta_rule": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")})
    version = getattr(sys.modules.get("fla"), "__version__", "0")
    if fns is not None and not fla_version_ok(version):
        warnings.warn(f"linlm: fla {version} is older than {'.'.join(map(str, FLA_MIN_VERSION))}, the version its "
                      f"kernels are mapped for; using linlm's pure-torch ops (pip install -U fla-core)",
                      RuntimeWarning, stacklevel=3)
        return None
    return fns


@functools.lru_cache(maxsize=None)
def _mamba() -> SimpleNamespace | None:
    return _import("mamba_ssm", {"selective_scan_fn": ("mamba_ssm.ops.selective_scan_interface",
                                                       "selective_scan_fn")})


@functools.lru_cache(maxsize=None)
def _mamba_ssd() -> SimpleNamespace | None:
    return _import("mamba_ssm", {"mamba_chunk_scan_combined": ("mamba_ssm.ops.triton.ssd_combined",
                                                               "mamba_chunk_scan_combined")})


@functools.lru_cache(maxsize=None)
def fla_gated_backward_ok(device_index: int) -> bool:
    """Whether fla can run the backward of chunk_simple_gla with a gate g on this CUDA device. fla 0.5 refuses it
    (a RuntimeError in the backward) on Hopper GPUs (sm90) with Triton >= 3.4.0 and < 3.7.1, where Triton
    miscompiles that kernel (fla's issue #640), unless its TileLang backend can take over (tilelang installed, and
    nvcc to build it)."""
    if torch.cuda.get_device_capability(device_index)[0] != 9:
        return True
    try:
        import triton
    except ImportError:
        return True
    version = tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:3])
    if not (3, 4, 0) <= version < (3, 7, 1):
        return True
    return importlib.util.find_spec("tilelang") is not None and shutil.which("nvcc") is not None


def available(library: str) -> bool:
    """Whether ``library`` ("fla", "mamba_ssm", or "mamba_ssm.ssd": its Triton SSD kernels) is installed and loads.
    Imports it: call only where CUDA is."""
    loaders = {"fla": _fla, "mamba_ssm": _mamba, "mamba_ssm.ssd": _mamba_ssd}
    if library not in loaders:
        raise ConfigError(f"available: {library!r} is not a GPU kernel library; use one of {', '.join(loaders)}")
    return loaders[library]() is not None


# ---------------------------------------------------------------------------------------------------------------------
# the decisions: pure functions of plain values


def _kernel_dtype(dtypes) -> torch.dtype | None:
    """The promoted dtype of the inputs, if a kernel computes in it (float32, bfloat16, float16), else None."""
    dt = functools.reduce(torch.promote_types, dtypes)
    return dt if dt in _KERNEL_DTYPES else None


def on_gpu(t) -> bool:
    """Whether the ops should ask this module at all: t is a tensor on a CUDA device. Every other call stays on
    linlm's own path without touching the libraries."""
    return isinstance(t, Tensor) and _device_type(t) == "cuda"


def _device_type(t: Tensor) -> str:
    return t.device.type


def _call(x):
    return x() if callable(x) else x


def choose_gla(*, device_type: str, dtypes, head_dims: tuple[int, int], seq_len: int, mode: str = "auto",
               fla_available: bool = False, exporting: bool = False, float64_state: bool = False,
               gated_backward: bool = False, gated_backward_ok: bool = True, deterministic: bool = False,
               max_head_dim: int | None = None) -> str:
    """"fla" or "torch" for a gla or delta_rule call. dtypes: of q, k, v; head_dims: (K, V), at least
    FLA_MIN_HEAD_DIM and at most max_head_dim (None: no limit); float64_state: log_a (or beta) or the initial
    state is float64 (linlm then computes in float64); gated_backward: the call will backpropagate through
    chunk_simple_gla with a gate ``g``, and gated_backward_ok: fla can do that here (``fla_gated_backward_ok``);
    deterministic: torch.use_deterministic_algorithms is on (the kernels make no such promise). fla_available and
    gated_backward_ok are only consulted when everything else allows fla: pass callables to defer the import and
    the probe."""
    if mode == "torch" or device_type != "cuda" or exporting or deterministic or seq_len == 0 or float64_state:
        return "torch"
    if _kernel_dtype(dtypes) is None or min(head_dims) < FLA_MIN_HEAD_DIM:
        return "torch"
    if max_head_dim is not None and max(head_dims) > max_head_dim:
        return "torch"
    if not _call(fla_available) or (gated_backward and not _call(gated_backward_ok)):
        return "torch"
    return "fla"


def choose_scan(*, device_type: str, dtypes, seq_len: int, state_size: int, batched_A: bool, batched_D: bool,
                initial_state: bool, reset: bool, final_state_grad: bool, mode: str = "auto",
                mamba_available: bool = False, exporting: bool = False, deterministic: bool = False) -> str:
    """"mamba_ssm" or "torch" for a selective_scan call. dtypes: of u, dt, B, C. final_state_grad: the final state
    is returned while autograd records (its gradient would be dropped by mamba_ssm); deterministic:
    torch.use_deterministic_algorithms is on (the kernel's backward accumulates with atomic adds)."""
    if mode == "torch" or device_type != "cuda" or exporting or deterministic or seq_len == 0:
        return "torch"
    if _kernel_dtype(dtypes) is None or state_size > MAMBA_MAX_STATE:
        return "torch"
    if batched_A or batched_D or initial_state or reset or final_state_grad:
        return "torch"
    return "mamba_ssm" if _call(mamba_available) else "torch"


def choose_ssd(*, device_type: str, dtypes, seq_len: int, state_size: int, head_dim: int, mode: str = "auto",
               mamba_available: bool = False, exporting: bool = False, deterministic: bool = False) -> str:
    """"mamba_ssm" or "torch" for Mamba-2's SSD (``ssd``). dtypes: of u, dt, B, C (and the initial state);
    mamba_available is consulted last (a callable defers the import)."""
    if mode == "torch" or device_type != "cuda" or exporting or deterministic or seq_len == 0:
        return "torch"
    if _kernel_dtype(dtypes) is None or max(state_size, head_dim) > SSD_MAX_DIM:
        return "torch"
    return "mamba_ssm" if _call(mamba_available) else "torch"


# ---------------------------------------------------------------------------------------------------------------------
# gated linear attention on fla


def _segments(reset: Tensor, B: int, T: int):
    """Documents of the B rows flattened into one row of B * T tokens: a new one at every row start and reset.

    Returns (cu_seqlens int64 [n + 1] on the CPU, first [B] and last [B]: the index of each row's first and last
    document, on reset's device). One device-to-host copy of reset.
    """
    starts = reset.expand(B, T).to("cpu", torch.bool).clone()
    starts[:, 0] = True
    per_row = starts.sum(1)
    ends = per_row.cumsum(0)
    cu = torch.cat([starts.reshape(-1).nonzero().squeeze(1), torch.tensor([B * T])]).to(torch.int64)
    return cu, (ends - per_row).to(reset.device), (ends - 1).to(reset.device)


def gla(q: Tensor, k: Tensor, v: Tensor, log_a: Tensor | None, kind: str, *, initial_state: Tensor | None = None,
        reset: Tensor | None = None, output_final_state: bool = True) -> tuple[Tensor, Tensor | None] | None:
    """linlm.ops.gla.gla on fla, or None when ``choose_gla`` says torch. Arguments already checked (shapes as in
    linlm.ops.gla; kind: "none", "head", "scalar" or "vector")."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, log_a, initial_state))
    choice = choose_gla(device_type=_device_type(q), dtypes=[q.dtype, k.dtype, v.dtype], head_dims=(K, V),
                        seq_len=T, mode=mode(), fla_available=lambda: available("fla"),
                        exporting=torch.compiler.is_exporting(),
                        float64_state=any(t is not None and t.dtype == torch.float64 for t in (log_a, initial_state)),
                        gated_backward=grad and _simple_gla_gate(kind, log_a),
                        gated_backward_ok=lambda: fla_gated_backward_ok(q.device.index or 0),
                        deterministic=torch.are_deterministic_algorithms_enabled())
    if choice != "fla":
        return None
    return _run_fla(_fla(), q, k, v, log_a, kind, initial_state, reset, output_final_state)


def _simple_gla_gate(kind: str, log_a: Tensor | None) -> bool:
    """Whether the call goes to chunk_simple_gla with a gate g (not g_gamma, not gateless): a scalar gate, or a
    constant one that needs a gradient."""
    return kind == "scalar" or (kind == "head" and torch.is_grad_enabled() and log_a.requires_grad)


def _run_fla(fla, q, k, v, log_a, kind, initial_state, reset, output_final_state):
    """The fla call itself (fla: the namespace of ``_fla()``, or a stand-in in tests)."""
    B, T, H, K = q.shape
    V, out_dtype = v.shape[-1], v.dtype
    dt = _kernel_dtype([q.dtype, k.dtype, v.dtype])
    q, k, v = (x.to(dt) for x in (q, k, v))
    h0 = None if initial_state is None else initial_state.to(torch.float32)  # fla asserts a float32 state
    g = None if log_a is None else log_a.to(torch.float32)
    if kind in ("scalar", "vector"):  # a gate per token is cut into documents with q, k, v
        seq, last, (q, k, v, g), h0 = _documents(reset, B, T, h0, q, k, v, g)
    else:
        seq, last, (q, k, v), h0 = _documents(reset, B, T, h0, q, k, v)
    common = dict(scale=1.0, initial_state=h0, output_final_state=bool(output_final_state), **seq)
    if kind == "vector":
        o, ht = fla.chunk_gla(q, k, v, g=g, **common)
    elif kind == "head":
        if _simple_gla_gate(kind, log_a):  # g_gamma gets no gradient from fla
            Bg, Tg = q.shape[:2]
            o, ht = fla.chunk_simple_gla(q, k, v, g=g.view(1, 1, H).expand(Bg, Tg, H), **common)
        else:
            o, ht = fla.chunk_simple_gla(q, k, v, g_gamma=g, **common)
    else:  # "scalar" ([B, T, H] or flattened) or "none" (neither g nor g_gamma: plain linear attention)
        o, ht = fla.chunk_simple_gla(q, k, v, g=g, **common)
    return _from_documents(o, ht, last, B, T, out_dtype, output_final_state)


def _documents(reset, B: int, T: int, h0, *per_token):
    """fla's varlen form of packed rows (``reset`` None: everything as it is). The rows are flattened into one row
    of B * T tokens cut at every row start and reset; a row's first document starts from that row's initial state
    (zeros where the row itself starts with a reset). per_token: tensors [B, T, ...] (or None) to flatten.
    Returns (fla's cu_seqlens keywords, last: each row's last document or None, the flattened tensors, h0)."""
    if reset is None:
        return {}, None, per_token, h0
    cu, first, last = _segments(reset, B, T)
    flat = tuple(None if x is None else x.reshape(1, B * T, *x.shape[2:]) for x in per_token)
    if h0 is not None:
        kept = torch.where(reset.expand(B, T)[:, 0].view(B, 1, 1, 1), 0.0, h0)
        h0 = h0.new_zeros(len(cu) - 1, *h0.shape[1:]).index_copy(0, first, kept)
    device = per_token[0].device
    return {"cu_seqlens": cu.to(device), "cu_seqlens_cpu": cu}, last, flat, h0


def _from_documents(o, ht, last, B: int, T: int, out_dtype, output_final_state):
    """o back to [B, T, H, V] in out_dtype; the final state of each row is its last document's."""
    o = o.reshape(B, T, *o.shape[2:]).to(out_dtype)
    if ht is not None and last is not None:
        ht = ht.index_select(0, last)
    return o, (ht if output_final_state else None)


# ---------------------------------------------------------------------------------------------------------------------
# the delta rule on fla


def delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None, log_a: Tensor | None, *,
               initial_state: Tensor | None = None, reset: Tensor | None = None, output_final_state: bool = True,
               scale: float = 1.0, qk_l2norm: bool = False) -> tuple[Tensor, Tensor | None] | None:
    """linlm.ops.delta_rule.delta_rule on fla, or None when ``choose_gla`` says torch. Arguments already checked
    (shapes as in linlm.ops.delta_rule)."""
    K, V = q.shape[-1], v.shape[-1]
    choice = choose_gla(device_type=_device_type(q), dtypes=[q.dtype, k.dtype, v.dtype], head_dims=(K, V),
                        seq_len=q.shape[1], mode=mode(), fla_available=lambda: available("fla"),
                        exporting=torch.compiler.is_exporting(),
                        float64_state=any(t is not None and t.dtype == torch.float64
                                          for t in (beta, log_a, initial_state)),
                        deterministic=torch.are_deterministic_algorithms_enabled(),
                        max_head_dim=FLA_MAX_DELTA_HEAD_DIM)
    if choice != "fla":
        return None
    return _run_fla_delta(_fla(), q, k, v, beta, log_a, initial_state, reset, output_final_state, scale, qk_l2norm)


def _run_fla_delta(fla, q, k, v, beta, log_a, initial_state, reset, output_final_state, scale, qk_l2norm):
    """The fla call itself (fla: the namespace of ``_fla()``, or a stand-in in tests)."""
    B, T, H, _ = q.shape
    out_dtype = v.dtype
    dt = _kernel_dtype([q.dtype, k.dtype, v.dtype])
    q, k, v = (x.to(dt) for x in (q, k, v))
    beta = q.new_ones(B, T, H) if beta is None else beta.to(dt)
    g = None if log_a is None else log_a.to(torch.float32)
    h0 = None if initial_state is None else initial_state.to(torch.float32)  # fla asserts a float32 state
    seq, last, (q, k, v, beta, g), h0 = _documents(reset, B, T, h0, q, k, v, beta, g)
    common = dict(scale=float(scale), initial_state=h0, output_final_state=bool(output_final_state),
                  use_qk_l2norm_in_kernel=bool(qk_l2norm), **seq)
    if g is None:
        o, ht = fla.chunk_delta_rule(q, k, v, beta, **common)
    else:
        o, ht = fla.chunk_gated_delta_rule(q, k, v, g, beta, **common)
    return _from_documents(o, ht, last, B, T, out_dtype, output_final_state)


# ---------------------------------------------------------------------------------------------------------------------
# the selective scan on mamba_ssm


def selective_scan(u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, *,
                   initial_state: Tensor | None = None, reset: Tensor | None = None, output_final_state: bool = True,
                   dt_softplus: bool = False) -> tuple[Tensor, Tensor | None] | None:
    """linlm.ops.selective_scan.selective_scan on mamba_ssm, or None when ``choose_scan`` says torch. Arguments
    already checked (shapes as in linlm.ops.selective_scan; lengths already turned into dt = 0, C = 0)."""
    tensors = [t for t in (u, dt, A, B, C, D, initial_state) if t is not None]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    choice = choose_scan(device_type=_device_type(u), dtypes=[u.dtype, dt.dtype, B.dtype, C.dtype],
                         seq_len=u.shape[1], state_size=A.shape[-1], batched_A=A.dim() == 3,
                         batched_D=D is not None and D.dim() == 2, initial_state=initial_state is not None,
                         reset=reset is not None, final_state_grad=bool(output_final_state) and grad, mode=mode(),
                         mamba_available=lambda: available("mamba_ssm"), exporting=torch.compiler.is_exporting(),
                         deterministic=torch.are_deterministic_algorithms_enabled())
    if choice != "mamba_ssm":
        return None
    return _run_mamba(_mamba(), u, dt, A, B, C, D, output_final_state, dt_softplus)


def _run_mamba(mamba, u, dt, A, B, C, D, output_final_state, dt_softplus):
    """The mamba_ssm call itself (mamba: the namespace of ``_mamba()``, or a stand-in in tests)."""
    it = _kernel_dtype([u.dtype, dt.dtype, B.dtype, C.dtype])
    time_last = lambda t: t.to(it).transpose(1, 2).contiguous()  # noqa: E731  [Bt, T, X] -> [Bt, X, T]
    out = mamba.selective_scan_fn(
        time_last(u), time_last(dt), A.to(torch.float32).contiguous(), time_last(B), time_last(C),
        None if D is None else D.to(torch.float32).contiguous(),
        delta_softplus=bool(dt_softplus), return_last_state=bool(output_final_state),
    )
    y, last = out if output_final_state else (out, None)
    y = y.transpose(1, 2).to(u.dtype).contiguous()
    # last is a view into the scan's saved intermediates: a copy of its own, in float32 as linlm returns states
    return y, (None if last is None else last.to(torch.float32).clone())


# ---------------------------------------------------------------------------------------------------------------------
# Mamba-2's SSD on mamba_ssm


def ssd(u: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, *, initial_state: Tensor | None = None,
        reset: Tensor | None = None, output_final_state: bool = True,
        chunk_size: int = 64) -> tuple[Tensor, Tensor | None] | None:
    """Mamba-2's recurrence h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t^T, y_t = h_t^T C_t (per head; no D) on
    mamba_ssm, or None when ``choose_ssd`` says torch (the caller then computes it as gla with q = C, k = B,
    v = dt u, log a = dt A). u [B, T, H, P]; dt [B, T, H]; A [H]; B, C [B, T, G, N]; initial_state [B, H, N, P];
    reset [B, T] or [1, T] bool. Returns (y [B, T, H, P] in u's dtype, final state [B, H, N, P] float32 or None)."""
    tensors = [t for t in (u, dt, B, C, initial_state) if t is not None]
    choice = choose_ssd(device_type=_device_type(u), dtypes=[t.dtype for t in tensors], seq_len=u.shape[1],
                        state_size=B.shape[-1], head_dim=u.shape[-1], mode=mode(),
                        mamba_available=lambda: available("mamba_ssm.ssd"), exporting=torch.compiler.is_exporting(),
                        deterministic=torch.are_deterministic_algorithms_enabled())
    if choice != "mamba_ssm":
        return None
    return _run_mamba_ssd(_mamba_ssd(), u, dt, A, B, C, initial_state, reset, output_final_state, chunk_size)


def _run_mamba_ssd(mamba, u, dt, A, B, C, initial_state, reset, output_final_state, chunk_size):
    """The mamba_ssm call itself (mamba: the namespace of ``_mamba_ssd()``, or a stand-in in tests)."""
    it = _kernel_dtype([u.dtype, B.dtype, C.dtype])
    Bt, T = u.shape[:2]
    h0, seq_idx = None, None
    if initial_state is not None:
        h0 = initial_state.to(torch.float32).transpose(-1, -2).contiguous()  # [B, H, P, N]
    if reset is not None:
        rows = reset.expand(Bt, T)
        seq_idx = rows.to(torch.int32).cumsum(1, dtype=torch.int32).contiguous()
        if h0 is not None:  # a row that starts with a reset starts from zeros
            h0 = torch.where(rows[:, 0].view(Bt, 1, 1, 1), 0.0, h0)
    out = mamba.mamba_chunk_scan_combined(
        u.to(it).contiguous(), dt.to(torch.float32).contiguous(), A.to(torch.float32).contiguous(),
        B.to(it).contiguous(), C.to(it).contiguous(), int(chunk_size), initial_states=h0, seq_idx=seq_idx,
        return_final_states=bool(output_final_state))
    y, last = out if output_final_state else (out, None)
    return y.to(u.dtype), (None if last is None else last.to(torch.float32).transpose(-1, -2).contiguous())
