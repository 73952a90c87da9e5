"""The C entry points that a process without torch calls too (linlm.infer.lean: decoding on the kernels alone), and
their sizes: the S6 scan's forward, the causal conv's and the gate's forwards, the matrix-vector products and the
Mamba model's one-call step. Their kernels' modules (scan_kernel, conv_kernel, gate_kernel, gemv_kernel,
step_kernel) import them from here and wrap them for torch; this module imports no torch, so a pointer field is a
``Buffer``: a torch tensor or a numpy array (kernel_library.address), or None for NULL.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Optional

from linlm.ops.kernel_library import EntryPoint, entry_point

__all__ = ["CKPT", "CONV_TB", "GATE_ROWS", "GEMV_ROWS", "MAX_STATE", "Q8_MAX_K", "Q8_MAX_ROWS", "STEP_FIELDS", "TILE",
           "Buffer", "ConvFwd", "GemvQ8", "GemvRows", "MambaModelStep", "ScanFwd", "ScanInputs", "SiluMulFwd"]

Buffer = typing.Any  # a torch tensor or a numpy array: its data's address is passed

# the scan (_scan_kernel.c)
TILE = 64  # channels per work item; must equal TILE in the C source
CKPT = 64  # steps between saved states (the backward's segment length)
MAX_STATE = 64  # largest d_state the kernel takes: its per-item arrays (6 x N x TILE values) live on the stack

# the causal conv (_conv_kernel.c) and the gate (_gate_kernel.c)
CONV_TB = 128  # time steps per work item of the conv; must equal CONV_TB in the C source
GATE_ROWS = 16  # rows per work item of the gate; must equal GATE_ROWS in the C source

# the matrix-vector products (_gemv_kernel.c, _kernel_common.h)
GEMV_ROWS = 64  # weight rows per work item; must equal GEMV_ROWS in _kernel_common.h
# The int8 kernel sums K products of at most 127^2 in int32: exact up to this many input features. Wider inputs go
# to torch (no layer of a released model comes near it: 7B-class MLPs read 11,008 to 14,336).
Q8_MAX_K = (2**31 - 1) // 127**2
# Rows of x per call of the int8 kernel at most (Q8_MAX_ROWS in _gemv_kernel.c): decoding steps of up to 64
# sequences and short prompts. Each weight row is read once and summed against every row of x, so that no packed
# copy of the weights (fbgemm's GEMM needs one) is held beside them.
Q8_MAX_ROWS = 64

# The columns of mamba_model_step's layer table (STEP_F_* in the C source): each layer's tensors, by address
STEP_FIELDS = ("norm", "w_in", "sc_in", "b_in", "conv_w", "conv_b", "w_x", "sc_x", "b_x", "dt_w", "dt_b", "A", "D",
               "w_out", "sc_out", "b_out", "st", "ss", "s", "new_st", "s_out")


@dataclasses.dataclass(kw_only=True, slots=True)
class ScanInputs(EntryPoint):
    """What both entry points take first, in this order: the scan's inputs (A and D shared by the batch rows where
    their batch stride is 0; reset and lengths may be None) and its sizes (K: steps between checkpoints)."""

    u: Buffer
    dt: Buffer
    A: Buffer
    a_bstride: int
    Bm: Buffer
    Cm: Buffer
    D: Buffer | None
    d_bstride: int
    reset: Buffer | None
    lengths: Buffer | None
    dt_sp: int
    Bt: int
    T: int
    Din: int
    N: int
    K: int


@entry_point("scan_fwd")
class ScanFwd(ScanInputs):
    """The forward: y (with the D skip), the final state, and the state every K steps (ckpt; None: not kept)."""

    init: Buffer | None
    y: Buffer
    final: Buffer
    ckpt: Buffer | None


@entry_point("conv_fwd")
class ConvFwd(EntryPoint):
    """out = silu(conv(x) + bias); x's rows xs elements apart, every other buffer contiguous."""

    x: Buffer
    state: Buffer | None
    wt: Buffer
    bias: Buffer
    since: Buffer | None
    out: Buffer
    Bt: int
    T: int
    C: int
    K: int
    xs: int


@entry_point("silu_mul_fwd")
class SiluMulFwd(EntryPoint):
    """out = silu(g) * u over M rows of F values; g and u rows gs and us elements apart, out contiguous."""

    g: Buffer
    gs: int
    u: Buffer
    us: int
    out: Buffer
    M: int
    F: int


@entry_point("gemv_rows")
class GemvRows(EntryPoint):
    """y [R, N] from x [R, K], w [N, K] and b [N] (None: no bias)."""

    x: Buffer
    w: Buffer
    b: Optional[Buffer]
    y: Buffer
    R: int
    N: int
    K: int


@entry_point("gemv_q8", scratch="xq")
class GemvQ8(EntryPoint):
    """y [R, N] from x [R, K], int8 weights q [N, K] with row scales s [N] (float32) and b [N] (None: no bias);
    xq: per thread, R K int8 values (x quantised)."""

    x: Buffer
    q: Buffer
    s: Buffer
    b: Optional[Buffer]
    y: Buffer
    xq: Buffer
    R: int
    N: int
    K: int


@entry_point("mamba_model_step", scratch="xq")
class MambaModelStep(EntryPoint):
    """A Mamba language model's step after its embeddings: h [Bt, d] (the residual stream, updated in place), the
    layers' tensors as a table of addresses tab [L, STEP_FIELDS], the final norm's weight, the head (int8 with
    sc_head, else float32) and logits [Bt, V]; work [Bt (2 d + 4 Din + R + 2N)] and xq (per thread) are scratch."""

    h: Buffer
    tab: Buffer
    L: int
    final_w: Optional[Buffer]
    w_head: Buffer
    sc_head: Optional[Buffer]
    work: Buffer
    xq: Buffer
    logits: Buffer
    Bt: int
    d: int
    Din: int
    N: int
    R: int
    K: int
    V: int
    eps: float
