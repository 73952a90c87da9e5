"""Fused pieces of the transformer-style blocks: RoPE on a packed q|k|v projection, the GLU on a packed gate|up
projection, RMSNorm, and the tied LM head with its cross-entropy.

Each one computes exactly its composite PyTorch expression (the ``*_reference`` functions here, which tests compare
it against, values and every gradient). What changes is the cost. Autograd's generic backward for the composite
expressions allocates a fresh tensor per intermediate and re-assembles split tensors with a concatenation; on a CPU,
where these passes are memory-bound, each function here instead writes its result, and its gradient, straight into
one output buffer with in-place and ``out=`` ops.

- ``rope_qkv(qkv, cos, sin)``: qkv [B, T, 3, H, D] (the output of one fused projection); rotates the q and k slots by
  the half-split RoPE convention (as in transformers' Llama), passes v through, and returns [3, B, H, T, D].
  cos, sin: [T, D / 2]. The backward is the same rotation by the opposite angle.
- ``glu(h, activation)``: h [..., 2 F] holding [gate | up]; returns act(gate) * up, act "silu" (SwiGLU) or None
  (SGLU). The gradient comes back as one [..., 2 F] tensor, with no concatenation.
  On the CPU in float32, float64 and bfloat16, SwiGLU runs on the compiled gate kernel
  (``linlm.ops.gate_kernel.glu_silu``: one pass each way, only h saved).
- ``rms_norm(x, weight, eps)``: x / sqrt(mean(x^2) + eps) * weight over the last dim; weight may be None
  (SRMSNorm). The mean square is one reduction (a vector norm), with no x^2 tensor.
- ``linear_cross_entropy(h, weight, targets)``: mean cross-entropy of h @ weight^T, a chunk of tokens at a time,
  with the gradient computed in the same pass, so that the [N, V] logits never exist at once.
- ``target_logprobs(h, targets, weight)``: per token, log p(target) under softmax(h @ weight^T) and whether the
  target's logit is the largest (greedy); a cache-sized chunk of tokens at a time (the scorer's head).

benchmarks/bench_fused.py times each against its reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from linlm.ops import gate_kernel, step_kernel
from linlm.ops.grad import needs_grad


# ---------------------------------------------------------------------------------------------------------- RoPE


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype,
                inv_freq: torch.Tensor | None = None):
    """cos and sin of the RoPE angles, [T, head_dim / 2]: position p, pair i turns by p * theta^(-2 i / head_dim)
    (or by p * inv_freq[i] when the frequencies are given, e.g. rescaled for long contexts)."""
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The composite form. x: [..., T, D]; cos, sin: [T, D / 2]."""
    half = x.shape[-1] // 2
    cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _rotate_qk(src: torch.Tensor, dst: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> None:
    """dst = src with slots 0 and 1 turned by +angle (sign 1) or -angle (sign -1) and slot 2 copied; both are
    [B, T, 3, H, D] (views), cos and sin [T, D / 2]."""
    half = src.shape[-1] // 2
    c, s = cos[:, None, None, :], sin[:, None, None, :]
    x1, x2 = src[:, :, :2, :, :half], src[:, :, :2, :, half:]
    o1, o2 = dst[:, :, :2, :, :half], dst[:, :, :2, :, half:]
    torch.mul(x1, c, out=o1)
    o1.addcmul_(x2, s, value=-sign)
    torch.mul(x2, c, out=o2)
    o2.addcmul_(x1, s, value=sign)
    dst[:, :, 2].copy_(src[:, :, 2])


def _bthd_view(x: torch.Tensor) -> torch.Tensor:
    """[3, B, H, T, D] seen as [B, T, 3, H, D]."""
    return x.permute(1, 3, 0, 2, 4)


def _rope_qkv_forward(qkv, cos, sin):
    B, T, _, H, D = qkv.shape
    out = torch.empty((3, B, H, T, D), dtype=qkv.dtype, device=qkv.device)
    _rotate_qk(qkv, _bthd_view(out), cos, sin, 1.0)
    return out


class _RopeQKV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rope_qkv_forward(qkv, cos, sin)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        _, B, H, T, D = grad.shape
        d_qkv = torch.empty((B, T, 3, H, D), dtype=grad.dtype, device=grad.device)
        _rotate_qk(_bthd_view(grad), d_qkv, cos, sin, -1.0)
        return d_qkv, None, None


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """qkv [B, T, 3, H, D] -> [3, B, H, T, D]: RoPE applied to q and k, v passed through.

    The result is laid out head-major, so each of q, k, v is a contiguous [B, H, T, D], the layout attention
    takes; the transposition costs nothing extra, since the rotation writes every element anyway.
    """
    if qkv.dim() != 5 or qkv.shape[2] != 3 or qkv.shape[-1] % 2:
        raise ValueError(f"rope_qkv: qkv must be [B, T, 3, H, D] with D even, got {tuple(qkv.shape)}")
    T, half = qkv.shape[1], qkv.shape[-1] // 2
    if cos.shape != (T, half) or sin.shape != (T, half):
        raise ValueError(f"rope_qkv: cos and sin must be [T, D/2] = [{T}, {half}], got {tuple(cos.shape)}, {tuple(sin.shape)}")
    cos, sin = cos.to(qkv.dtype), sin.to(qkv.dtype)
    if not needs_grad(qkv, cos, sin):
        return _rope_qkv_forward(qkv, cos, sin)
    return _RopeQKV.apply(qkv, cos, sin)


# ----------------------------------------------------------------------------------------------------------- GLU


def glu_reference(h: torch.Tensor, activation: str | None) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    if activation == "silu":
        gate = F.silu(gate)
    return gate * up


def _glu_forward(h, silu: bool):
    """(act(gate) * up, act(gate))."""
    n = h.shape[-1] // 2
    gate, up = h[..., :n], h[..., n:]
    if silu:
        act = F.silu(gate)
        return act * up, act
    return gate * up, gate


class _GLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, silu: bool):
        out, act = _glu_forward(h, silu)
        ctx.silu = silu
        ctx.save_for_backward(h, act)
        return out

    @staticmethod
    def backward(ctx, grad):
        h, act = ctx.saved_tensors
        n = h.shape[-1] // 2
        gate, up = h[..., :n], h[..., n:]
        dh = torch.empty(h.shape, dtype=h.dtype, device=h.device)
        d_gate, d_up = dh[..., :n], dh[..., n:]
        torch.mul(grad, act, out=d_up)
        torch.mul(grad, up, out=d_gate)
        if ctx.silu:
            torch.ops.aten.silu_backward.grad_input(d_gate, gate, grad_input=d_gate)
        return dh, None


def glu(h: torch.Tensor, activation: str | None = "silu") -> torch.Tensor:
    if activation not in ("silu", None):
        raise ValueError(f"glu: activation must be 'silu' or None, got {activation!r}")
    if h.shape[-1] % 2:
        raise ValueError(f"glu: the last dim holds [gate | up] and must be even, got {h.shape[-1]}")
    if activation == "silu" and gate_kernel.gate_takes(h):
        return gate_kernel.glu_silu(h)  # one pass each way in compiled code (CPU: float32, float64, bfloat16)
    if not needs_grad(h):
        return _glu_forward(h, activation == "silu")[0]
    return _GLU.apply(h, activation == "silu")


# ------------------------------------------------------------------------------------------------------- RMSNorm


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def _rstd(x: torch.Tensor, eps: float) -> torch.Tensor:
    d = x.shape[-1]
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return torch.rsqrt(norm.square_().div_(d).add_(eps))


def _rms_norm_forward(x, weight, eps):
    """(x * rstd * weight, rstd)."""
    rstd = _rstd(x, eps)
    y = x * rstd
    if weight is not None:
        y.mul_(weight)
    return y, rstd


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        y, rstd = _rms_norm_forward(x, weight, eps)
        ctx.save_for_backward(x, rstd, weight)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        xhat = x * rstd
        d_weight = None
        if weight is not None:
            if ctx.needs_input_grad[1]:
                d_weight = (grad * xhat).reshape(-1, x.shape[-1]).sum(0)
            gw = grad * weight
        else:
            gw = grad.clone()
        # d x = rstd * (g w - xhat * mean(g w xhat))
        c = torch.linalg.vecdot(gw, xhat, dim=-1).unsqueeze(-1).div_(x.shape[-1])
        xhat.mul_(c)
        gw.sub_(xhat).mul_(rstd)
        return gw, d_weight, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    if weight is not None and weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")
    if not needs_grad(x, weight):
        if step_kernel.rms_rows_takes(x, weight):  # a decoding step's rows: one call instead of seven ops
            return step_kernel.rms_rows(x, weight, eps)
        return _rms_norm_forward(x, weight, eps)[0]
    return _RMSNorm.apply(x, weight, eps)


# ---------------------------------------------------------------------------------- LM head + cross-entropy


def linear_cross_entropy_reference(h, weight, targets, ignore_index: int = -100):
    logits = F.linear(h, weight)
    return F.cross_entropy(_wide(logits), targets, ignore_index=ignore_index)


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def default_chunk_rows(vocab_size: int) -> int:
    # About 4M logits (16 MB in float32) per chunk: large enough for efficient matmuls, small enough that the
    # buffer is recycled by the allocator instead of being mapped fresh (and page-faulted) for every chunk.
    return max(64, (1 << 22) // max(1, vocab_size))


def _chunked_cross_entropy(h, weight, targets, ignore_index, rows, want_h, want_w):
    """Sum of the token losses, and (if asked) the gradients of that sum with respect to h and weight.

    Under autocast the matmuls run in autocast's dtype, with h and the weight cast to it once per call, not once per
    chunk and matmul: autocast casts every operand of every matmul (it caches a cast only for leaf tensors, and the
    weight arrives here through an autograd Function and as the view weight^T). At the paper-70m shape
    (V 8192 x d 512, 512-row chunks) that was 4 casts of 4M values per chunk, about a fifth of a Mamba bf16 step
    at seq 2048 on a 2-core AMD EPYC (Zen 4). The values are those of autocast's own casts (round to nearest)."""
    N = h.shape[0]
    valid = targets != ignore_index
    safe = torch.where(valid, targets, 0)
    loss = torch.zeros((), dtype=torch.float64 if h.dtype == torch.float64 else torch.float32, device=h.device)
    grad_h = torch.empty(h.shape, dtype=h.dtype, device=h.device) if want_h else None
    grad_w = torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device) if want_w else None
    all_valid = bool(valid.all())
    mm_dtype = None  # the matmuls' dtype when it differs from the inputs' (autocast)
    if torch.is_autocast_enabled(h.device.type):
        mm_dtype = torch.get_autocast_dtype(h.device.type)
    hm, wm = (h, weight) if mm_dtype is None else (h.to(mm_dtype), weight.to(mm_dtype))
    with torch.autocast(h.device.type, enabled=False):
        for start in range(0, N, rows):
            end = min(N, start + rows)
            hc, tc, vc = hm[start:end], safe[start:end, None], valid[start:end]
            log_p = torch.log_softmax(_wide(hc @ wm.t()), dim=-1)
            token_loss = log_p.gather(1, tc).squeeze(1)
            loss -= token_loss.sum() if all_valid else torch.where(vc, token_loss, 0).sum()
            if not (want_h or want_w):
                continue
            p = log_p.exp_()  # softmax, in place
            p.scatter_add_(1, tc, torch.full_like(tc, -1, dtype=p.dtype))  # d loss / d logits = softmax - onehot
            if not all_valid:
                p[~vc] = 0
            p = p.to(wm.dtype)  # the matmuls' precision (a no-op unless it is below float32)
            if mm_dtype is not None:  # results in autocast's dtype, accumulated into the inputs' dtype
                if want_h:
                    grad_h[start:end] = p @ wm
                if want_w:
                    grad_w += p.t() @ hc
                continue
            if want_h:
                torch.mm(p, wm, out=grad_h[start:end])
            if want_w:
                grad_w.addmm_(p.t(), hc)
    return loss, valid.sum(), grad_h, grad_w


class _LinearCrossEntropy(torch.autograd.Function):
    """Gradients are computed in the forward pass, chunk by chunk, so that the [N, V] logits never exist at once."""

    @staticmethod
    def forward(ctx, h, weight, targets, ignore_index, rows):
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        total, count, grad_h, grad_w = _chunked_cross_entropy(h, weight, targets, ignore_index, rows, want_h, want_w)
        scale = 1.0 / count.to(total.dtype)
        if grad_h is not None:
            grad_h.mul_(scale.to(grad_h.dtype))
        if grad_w is not None:
            grad_w.mul_(scale.to(grad_w.dtype))
        ctx.save_for_backward(grad_h, grad_w)
        return total * scale

    @staticmethod
    def backward(ctx, grad):
        grad_h, grad_w = ctx.saved_tensors
        gh = grad_h * grad.to(grad_h.dtype) if grad_h is not None else None
        gw = grad_w * grad.to(grad_w.dtype) if grad_w is not None else None
        return gh, gw, None, None, None


def linear_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, chunk_rows: int | None = None
) -> torch.Tensor:
    """mean over non-ignored tokens of cross_entropy(h @ weight^T, targets), without materialising the logits.

    h: [N, d]; weight: [V, d]; targets: [N] (ignore_index marks tokens left out). Logits are widened to float32
    before the softmax, as in ``F.cross_entropy(logits.float(), ...)``; under autocast the matmuls run in its dtype.
    Chunks of ``chunk_rows`` tokens (default: about 4M logits) are processed one at a time; when a gradient is
    needed it is computed in the same pass and kept for the backward, which only scales it.
    """
    if h.dim() != 2 or weight.dim() != 2 or h.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: h must be [N, d] and weight [V, d], got {tuple(h.shape)}, {tuple(weight.shape)}")
    if targets.shape != h.shape[:1]:
        raise ValueError(f"linear_cross_entropy: targets must be [N] = [{h.shape[0]}], got {tuple(targets.shape)}")
    rows = chunk_rows or default_chunk_rows(weight.shape[0])
    if rows < 1:
        raise ValueError(f"linear_cross_entropy: chunk_rows must be >= 1, got {chunk_rows}")
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(h, weight, targets, ignore_index, rows)
    total, count, _, _ = _chunked_cross_entropy(h, weight, targets, ignore_index, rows, False, False)
    return total / count


def scoring_chunk_rows(vocab_size: int) -> int:
    # About 1M logits (4 MB in float32) per chunk: the chunk's logits are read by the log-softmax, max and gather
    # while they are still in cache.
    return max(16, (1 << 20) // max(1, vocab_size))


@torch.no_grad()
def target_logprobs(h: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor | None = None,
                    chunk_rows: int | None = None, chunk_cols: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(targets[i]) under softmax(logits[i]) (float32 [N]) and whether targets[i] holds the largest logit of
    its row (bool [N]; a tie with another token counts as greedy). logits = h @ weight^T, or h itself when weight is
    None. Equals ``-F.cross_entropy(logits.float(), targets, reduction="none")`` and
    ``logits.gather(targets) >= logits.amax(-1)``, without the [N, V] logits existing at once:

    - with a weight, a block of vocabulary columns at a time (``chunk_cols``; default about 1M logits per block)
      for all rows, keeping a running max and sum of exponentials per row (the log-sum-exp of the blocks seen so
      far, rescaled when the max grows) and picking each target's logit in the block that holds it. Each weight row
      is read once: chunking the rows instead would read the whole [V, d] weight once per chunk, which at the
      paper's vocabulary (100,280 x 512, 205 MB) is slower than the matmul itself;
    - without one, ``chunk_rows`` rows of the given logits at a time, each read while it is in cache.
    """
    if h.dim() != 2 or targets.shape != h.shape[:1]:
        raise ValueError(f"target_logprobs: h must be [N, d] and targets [N], got {tuple(h.shape)}, "
                         f"{tuple(targets.shape)}")
    if weight is not None and (weight.dim() != 2 or weight.shape[1] != h.shape[1]):
        raise ValueError(f"target_logprobs: weight must be [V, {h.shape[1]}], got {tuple(weight.shape)}")
    V = weight.shape[0] if weight is not None else h.shape[1]
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= V):
        raise ValueError(f"target_logprobs: targets must lie in [0, {V}), got {int(targets.min())}.."
                         f"{int(targets.max())}")
    if weight is not None:
        return _target_logprobs_by_columns(h, targets, weight, chunk_cols)
    N = h.shape[0]
    rows = chunk_rows or scoring_chunk_rows(h.shape[1])
    logp = torch.empty(N, dtype=torch.float32, device=h.device)
    greedy = torch.empty(N, dtype=torch.bool, device=h.device)
    for start in range(0, N, rows):
        end = min(N, start + rows)
        logits = _wide(h[start:end])
        tc = targets[start:end, None]
        greedy[start:end] = logits.gather(1, tc).squeeze(1) >= logits.amax(-1)
        logp[start:end] = torch.log_softmax(logits, dim=-1).gather(1, tc).squeeze(1)
    return logp, greedy


def _target_logprobs_by_columns(h, targets, weight, chunk_cols):
    N, V = h.shape[0], weight.shape[0]
    cols = chunk_cols or max(256, (1 << 20) // max(1, N))
    run_max = torch.full((N,), float("-inf"), dtype=torch.float32, device=h.device)
    run_sum = torch.zeros(N, dtype=torch.float32, device=h.device)
    picked = torch.zeros(N, dtype=torch.float32, device=h.device)
    for v0 in range(0, V, cols):
        logits = _wide(F.linear(h, weight[v0:v0 + cols]))
        new_max = torch.maximum(run_max, logits.amax(-1))
        run_sum = run_sum * torch.exp(run_max - new_max) + torch.exp(logits - new_max[:, None]).sum(-1)
        run_max = new_max
        # Every row reads a column of this block (clamped); rows whose target lies here keep it. No host sync.
        local = targets - v0
        here = (local >= 0) & (local < logits.shape[1])
        value = logits.gather(1, local.clamp(0, logits.shape[1] - 1)[:, None]).squeeze(1)
        picked = torch.where(here, value, picked)
    return picked - (run_max + torch.log(run_sum)), picked >= run_max
