"""The delta rule: DeltaNet (arXiv 2406.06484) and, with a gate, Gated DeltaNet (arXiv 2412.06464).

Per head, with state S in R^{K x V} (linlm's layout: keys index the rows, as in ``gla.py``):

    S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T        o_t = S_t^T (scale * q_t)

a_t in (0, 1] is the gate (1 for DeltaNet), b_t the writing strength beta. Unlike gated linear attention the
transition is not diagonal: each step first removes what the state holds along k_t (the prediction S^T k_t) and
then writes v_t there, so the state learns key -> value pairs instead of summing them. Equivalently

    u_t = b_t (v_t - a_t S_{t-1}^T k_t)        S_t = a_t S_{t-1} + k_t u_t^T

which is gated linear attention with the "new values" u_t: the chunk form below computes them first.

Three forms, which agree to float32 rounding:

- ``delta_rule_reference``: the definition, a loop over time. Used by tests.
- ``delta_rule_chunk``: the chunkwise-parallel form for training and prefill (``delta_chunk.py``).
- ``delta_rule_step``: one decoding step, O(K V) per head whatever the context.
``delta_rule`` picks: fla's kernels on CUDA where they apply (``linlm.ops.backends``), else the chunk form.

Conventions shared by all three (the rest as in ``gla.py``):

- q, k: [B, T, H, K]; v: [B, T, H, V]; beta: None (b = 1) or [B, T, H]; log_a: None (a = 1, DeltaNet) or
  [B, T, H], the log of the gate (Gated DeltaNet). The step form takes the same without T.
- ``qk_l2norm``: divide q and k by their L2 norms first, x / sqrt(sum x^2 + 1e-6) (fla's kernels' normalisation);
  ``scale`` then multiplies q (fla's default is K^-1/2; linlm's default is 1).
- ``reset``: None or bool [B, T] (or [1, T]), True at the first token of a document; the carried state,
  ``initial_state`` included, is discarded before that token's update. ``initial_state`` [B, H, K, V];
  ``output_final_state`` as in ``gla.py``. Work is in float32 (float64 if any input is float64); o has v's dtype.

Numerical conditions. The eigenvalue of I - b k k^T along k is 1 - b |k|^2; the recurrence is stable (no growth of
S, whatever the length) when it lies in [-1, 1], that is 0 <= b |k|^2 <= 2. The models keep it so with
L2-normalised keys (``qk_l2norm=True``) and b = sigmoid(.) in (0, 1) (or 2 sigmoid(.) in (0, 2), fla's
"negative eigenvalues"). Every form checks its inputs before any work, and refuses with a ShapeError naming the
fix:
- beta outside [0, 2], or not finite;
- log_a above 0 (a gate above 1), or NaN;
- with ``qk_l2norm=False``, a key whose squared norm exceeds 1 by more than 1 % (room for bfloat16 rounding of a
  normalised key). Keys shorter than 1 are accepted: they only damp the update.
The checks read the values, so they are skipped while torch.compile or torch.export traces (a traced graph has no
data-dependent branches); the eager call of the same model checks them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linlm.errors import ShapeError
from linlm.ops import backends
from linlm.ops.delta_chunk import chunk_forward
from linlm.ops.chunks import check_chunk_size, check_float, shape_of, work_dtype
from linlm.ops.gla import check_sequence_qkv, check_state_and_reset, check_step_qkv, step_state

__all__ = ["L2_EPS", "delta_rule", "delta_rule_chunk", "delta_rule_reference", "delta_rule_step"]

L2_EPS = 1e-6  # x / sqrt(sum x^2 + L2_EPS), as fla's l2norm
KEY_NORM_SLACK = 1.01  # squared key norms up to this pass the check (a normalised key rounded to bfloat16)


# --------------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------------


def _check_per_head(name: str, t, shape: tuple, fn: str) -> None:
    if t is None:
        return
    check_float(name, t, fn)
    if shape_of(t) != shape:
        raise ShapeError(f"{fn}: {name} has shape {shape_of(t)}; expected None or {shape}")


def check_sequence(q, k, v, beta, log_a, initial_state, reset, fn: str):
    """Validate the sequence-form arguments; return (B, T, H, K, V)."""
    B, T, H, K, V = dims = check_sequence_qkv(q, k, v, fn)
    _check_per_head("beta", beta, (B, T, H), fn)
    _check_per_head("log_a", log_a, (B, T, H), fn)
    check_state_and_reset(initial_state, reset, dims, fn)
    return dims


def _first(mask: Tensor) -> str:
    """The index of the first True entry of ``mask``, as text."""
    return str(tuple(int(i) for i in mask.nonzero()[0].tolist()))


def check_conditions(k: Tensor, beta, log_a, qk_l2norm: bool, fn: str) -> None:
    """Refuse values that break the recurrence's stability (module docstring, "Numerical conditions"). Reads the
    values (a device sync on a GPU); skipped while torch.compile or torch.export traces."""
    if torch.compiler.is_compiling():
        return
    if beta is not None:
        bad = ~((beta >= 0) & (beta <= 2))  # also NaN
        if bool(bad.any()):
            raise ShapeError(
                f"{fn}: beta must lie in [0, 2] (the update I - beta k k^T is unstable outside it), got "
                f"{beta[bad][0].item():.4g} at {_first(bad)}; produce it as sigmoid(x) (or 2 sigmoid(x))")
    if log_a is not None:
        bad = ~(log_a <= 0)
        if bool(bad.any()):
            raise ShapeError(
                f"{fn}: log_a must be <= 0 (a gate in (0, 1]), got {log_a[bad][0].item():.4g} at {_first(bad)}; "
                f"produce it as a log-sigmoid or as -softplus(x) times a positive rate")
    if not qk_l2norm:
        sq = k.detach().float().pow(2).sum(-1)
        bad = ~(sq <= KEY_NORM_SLACK)
        if bool(bad.any()):
            raise ShapeError(
                f"{fn}: key at {_first(bad)} has L2 norm {sq[bad][0].sqrt().item():.4g}; the delta rule needs "
                f"|k| <= 1 (unit keys) to stay stable: normalise the keys, or pass qk_l2norm=True")


def _l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


def prepare_qk(q: Tensor, k: Tensor, dt: torch.dtype, scale: float, qk_l2norm: bool):
    """q and k in the working dtype, normalised if asked, q times scale."""
    q, k = q.to(dt), k.to(dt)
    if qk_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    if scale != 1.0:
        q = q * scale
    return q, k


# --------------------------------------------------------------------------------------------------------------
# Step form and reference
# --------------------------------------------------------------------------------------------------------------


def _step(q: Tensor, k: Tensor, v: Tensor, beta, log_a, S: Tensor):
    """One update, S_t = a (S - b k (k^T S)) + b k v^T, in S's dtype. q, k: [B, H, K]; v: [B, H, V]; beta,
    log_a: None or [B, H]; S: [B, H, K, V]. q and k already prepared."""
    dt = S.dtype
    v = v.to(dt)
    kS = torch.matmul(k.unsqueeze(-2), S).squeeze(-2)  # S^T k, what the state recalls for k: [B, H, V]
    b = 1.0 if beta is None else beta.to(dt).unsqueeze(-1)
    if log_a is None:
        S = S + k.unsqueeze(-1) * (b * (v - kS)).unsqueeze(-2)
    else:
        a = log_a.to(dt).exp().unsqueeze(-1)
        S = a.unsqueeze(-1) * (S - k.unsqueeze(-1) * (b * kS).unsqueeze(-2)) + k.unsqueeze(-1) * (b * v).unsqueeze(-2)
    o = torch.matmul(q.unsqueeze(-2), S).squeeze(-2)
    return o, S


def delta_rule_step(q, k, v, beta=None, log_a=None, *, state=None, scale: float = 1.0,
                    qk_l2norm: bool = False) -> tuple[Tensor, Tensor]:
    """One decoding step. q, k: [B, H, K]; v: [B, H, V]; beta, log_a: None or [B, H]; state: [B, H, K, V] or None
    (zeros). Returns (o [B, H, V] in v's dtype, new state in the working dtype)."""
    fn = "delta_rule_step"
    B, H, K, V = check_step_qkv(q, k, v, fn)
    _check_per_head("beta", beta, (B, H), fn)
    _check_per_head("log_a", log_a, (B, H), fn)
    dt = work_dtype(q, k, v, beta, log_a, state)
    S = step_state(state, q, (B, H, K, V), dt, fn)
    q, k = prepare_qk(q, k, dt, scale, qk_l2norm)
    check_conditions(k, beta, log_a, qk_l2norm, fn)
    o, S = _step(q, k, v, beta, log_a, S)
    return o.to(v.dtype), S


def delta_rule_reference(q, k, v, beta=None, log_a=None, *, initial_state=None, reset=None,
                         output_final_state=True, scale: float = 1.0,
                         qk_l2norm: bool = False) -> tuple[Tensor, Tensor | None]:
    """The definition: a loop over time. Returns (o [B, T, H, V], final state [B, H, K, V] or None)."""
    fn = "delta_rule_reference"
    B, T, H, K, V = check_sequence(q, k, v, beta, log_a, initial_state, reset, fn)
    dt = work_dtype(q, k, v, beta, log_a, initial_state)
    q, k = prepare_qk(q, k, dt, scale, qk_l2norm)
    check_conditions(k, beta, log_a, qk_l2norm, fn)
    S = q.new_zeros((B, H, K, V), dtype=dt) if initial_state is None else initial_state.to(dt)
    qs, ks, vs = q.unbind(1), k.unbind(1), v.unbind(1)
    betas = [None] * T if beta is None else beta.unbind(1)
    gates = [None] * T if log_a is None else log_a.unbind(1)
    outs = []
    for t in range(T):
        if reset is not None:
            S = torch.where(reset[:, t].view(-1, 1, 1, 1), 0.0, S)
        o, S = _step(qs[t], ks[t], vs[t], betas[t], gates[t], S)
        outs.append(o)
    o = torch.stack(outs, dim=1) if outs else v.new_zeros((B, 0, H, V), dtype=dt)
    return o.to(v.dtype), (S if output_final_state else None)


# --------------------------------------------------------------------------------------------------------------
# Chunk form and the dispatcher
# --------------------------------------------------------------------------------------------------------------


def delta_rule_chunk(q, k, v, beta=None, log_a=None, *, initial_state=None, reset=None, output_final_state=True,
                     scale: float = 1.0, qk_l2norm: bool = False,
                     chunk_size: int = 64) -> tuple[Tensor, Tensor | None]:
    """Chunkwise-parallel form (``delta_chunk.py``): same arguments and results as ``delta_rule_reference``. The
    chunk is chunk_size rounded down to a power of two, or T's next power of two when T is shorter."""
    fn = "delta_rule_chunk"
    B, T, H, K, V = check_sequence(q, k, v, beta, log_a, initial_state, reset, fn)
    check_chunk_size(chunk_size, fn)
    dt = work_dtype(q, k, v, beta, log_a, initial_state)
    q, k = prepare_qk(q, k, dt, scale, qk_l2norm)
    check_conditions(k, beta, log_a, qk_l2norm, fn)
    s0 = q.new_zeros((B, H, K, V), dtype=dt) if initial_state is None else initial_state.to(dt)
    if T == 0:
        return v.new_zeros((B, 0, H, V)), (s0 if output_final_state else None)
    o, final = chunk_forward(q, k, v.to(dt), beta, log_a, s0, reset, chunk_size)
    return o.to(v.dtype), (final if output_final_state else None)


def delta_rule(q, k, v, beta=None, log_a=None, *, initial_state=None, reset=None, output_final_state=True,
               scale: float = 1.0, qk_l2norm: bool = False, chunk_size: int = 64) -> tuple[Tensor, Tensor | None]:
    """The op models call. On CUDA, flash-linear-attention's chunk_delta_rule / chunk_gated_delta_rule when fla is
    installed (``linlm.ops.backends`` says which cases; LINLM_GPU_KERNELS=torch turns them off); else, and always
    on the CPU, the chunkwise form. Same arguments and results as ``delta_rule_chunk``."""
    if backends.on_gpu(q):
        fn = "delta_rule"
        check_sequence(q, k, v, beta, log_a, initial_state, reset, fn)
        check_chunk_size(chunk_size, fn)
        check_conditions(k, beta, log_a, qk_l2norm, fn)
        out = backends.delta_rule(q, k, v, beta, log_a, initial_state=initial_state, reset=reset,
                                  output_final_state=output_final_state, scale=scale, qk_l2norm=qk_l2norm)
        if out is not None:
            return out
    return delta_rule_chunk(q, k, v, beta, log_a, initial_state=initial_state, reset=reset,
                            output_final_state=output_final_state, scale=scale, qk_l2norm=qk_l2norm,
                            chunk_size=chunk_size)
