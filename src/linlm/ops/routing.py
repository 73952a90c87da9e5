"""Top-k routing for mixtures of experts: router, auxiliary losses, and grouped dispatch/combine.

Tokens are grouped by expert with one stable sort, never by a Python loop over tokens. A caller runs each expert once on
its contiguous slice of the sorted rows:

    weights, indices, probs = top_k_route(router_logits, k)          # [N, k], [N, k], [N, E]
    x_sorted, order, counts = dispatch(x, indices, E)                 # rows of x grouped by expert
    y_sorted = torch.cat([expert[e](part) for e, part in enumerate(x_sorted.split(counts.tolist()))])
    y = combine(y_sorted, order, weights, num_tokens=x.shape[0])      # [N, D]
    aux = load_balance_loss(probs, indices, E) + z_coef * router_z_loss(router_logits)

Row j of x_sorted is assignment order[j] of the flattened [N, k] (token, slot) grid, i.e. token order[j] // k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linlm.errors import ConfigError, ShapeError
from linlm.ops import gather_sum_kernel, kernel_library
from linlm.ops.grad import needs_grad

__all__ = [
    "combine", "dispatch", "gather_rows", "group_by_expert", "invert_order", "load_balance_loss", "matmul_row_quantum",
    "pad_groups", "read_back", "router_z_loss", "top_k_route",
]


def _check_k(k, num_experts: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= num_experts:
        raise ConfigError(
            f"top_k_route: `k` (top_k, experts per token) must be an int in [1, {num_experts}] "
            f"(the number of experts), got {k!r}"
        )


def _check_indices(fn: str, indices: Tensor, num_experts: int) -> None:
    if indices.dim() != 2:
        raise ShapeError(f"{fn}: `indices` must be [N, k], got shape {list(indices.shape)}")
    if indices.dtype not in (torch.int64, torch.int32):
        raise ShapeError(f"{fn}: `indices` must be an integer tensor, got dtype {indices.dtype}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ConfigError(f"{fn}: `num_experts` must be a positive int, got {num_experts!r}")
    # The range check reads the values: skipped while torch.compile or torch.export traces (a graph has no values
    # to read; inside the models the indices come from top-k over num_experts, so they are in range).
    if torch.compiler.is_compiling():
        return
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= num_experts):
        raise ShapeError(
            f"{fn}: `indices` must lie in [0, {num_experts - 1}] for num_experts = {num_experts}, "
            f"got values in [{int(indices.min())}, {int(indices.max())}]"
        )


def top_k_route(logits: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Softmax router with top-k selection.

    logits [N, E] -> (weights [N, k]: the chosen probabilities renormalised to sum to 1 per token,
    indices [N, k] long: k distinct experts per token, in decreasing probability, probs [N, E]: the full softmax).
    Weights and probs are float32 (float64 for float64 logits) and carry gradients to the logits.
    """
    if not isinstance(logits, Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        shape = list(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ShapeError(f"top_k_route: `logits` must be a floating-point [N, E] tensor, got {shape}")
    _check_k(k, logits.shape[1])
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    probs = torch.softmax(logits.to(dtype), dim=-1)
    top, indices = probs.topk(k, dim=-1)
    weights = top / top.sum(dim=-1, keepdim=True)
    return weights, indices, probs


def load_balance_loss(probs: Tensor, indices: Tensor, num_experts: int) -> Tensor:
    """Switch-Transformer balance loss E * sum_e f_e P_e.

    f_e: fraction of the N * k assignments that go to expert e (counted, no gradient); P_e: mean router probability of
    e over the N tokens (carries the gradient). Uniform routing (f_e = P_e = 1/E) gives exactly 1.0; routing that piles
    tokens onto the experts the router also favours gives more.
    """
    fn = "load_balance_loss"
    _check_indices(fn, indices, num_experts)
    if probs.dim() != 2 or list(probs.shape) != [indices.shape[0], num_experts]:
        raise ShapeError(
            f"{fn}: `probs` must be [N, E] = {[indices.shape[0], num_experts]} (N from `indices`), "
            f"got {list(probs.shape)}"
        )
    counts = torch.bincount(indices.reshape(-1), minlength=num_experts).to(probs.dtype)
    f = counts / max(indices.numel(), 1)
    P = probs.mean(dim=0)
    return num_experts * (f * P).sum()


def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE router z-loss: mean over tokens of logsumexp(logits)^2. logits [N, E] (or [..., E])."""
    if not isinstance(logits, Tensor) or logits.dim() < 1 or not logits.is_floating_point():
        raise ShapeError("router_z_loss: `logits` must be a floating-point [N, E] tensor")
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return torch.logsumexp(logits.to(dtype), dim=-1).square().mean()


def group_by_expert(indices: Tensor, num_experts: int) -> tuple[Tensor, Tensor]:
    """Group the flattened (token, slot) assignments of indices [N, k] by expert.

    Returns (order [N * k] long: a stable sort of the assignments by expert, so within an expert tokens keep their
    order; counts [E] long: assignments per expert). Assignment j is token j // k, slot j % k.
    """
    _check_indices("group_by_expert", indices, num_experts)
    flat = indices.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=num_experts)
    return order, counts


def dispatch(x: Tensor, indices: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    """Gather the rows of x [N, D] by expert: returns (x_sorted [N * k, D], order [N * k], counts [E]).

    Rows for expert e are x_sorted[counts[:e].sum() : counts[:e + 1].sum()].
    """
    _check_indices("dispatch", indices, num_experts)
    if x.dim() != 2 or x.shape[0] != indices.shape[0]:
        raise ShapeError(
            f"dispatch: `x` must be [N, D] with N = {indices.shape[0]} (from `indices`), got {list(x.shape)}"
        )
    order, counts = group_by_expert(indices, num_experts)
    k = indices.shape[1]
    x_sorted = gather_rows(x, order // k, invert_order(order, k))
    return x_sorted, order, counts


def invert_order(order: Tensor, k: int) -> Tensor:
    """[N, k]: the position in ``order`` of each (token, slot) assignment, i.e. which sorted row holds it."""
    return torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device)).view(-1, k)


# Rows that a routed matmul dimension is rounded up to where the matmuls run in bfloat16 on the CPU (see
# matmul_row_quantum).
BF16_ROW_QUANTUM = 16


def matmul_row_quantum(x: Tensor) -> int:
    """Rows to round a data-dependent matmul size up to (an expert's group of rows, the length of MossNet's expert
    rows), so that the matmuls' shapes repeat from step to step: BF16_ROW_QUANTUM where x's matmuls run in bfloat16
    on the CPU (x bfloat16, or bfloat16 autocast), else 1 (no rounding).

    Why: torch runs CPU bfloat16 matmuls on oneDNN, which JIT-compiles a primitive for every new shape and keeps
    1024 of them in an LRU cache. Routed sizes take hundreds of values (an expert's rows at paper-70m, seq 2048:
    about 380 to 660), so a MossNet step kept compiling primitives, each a compile and freshly touched pages.
    float32 matmuls (MKL) compile nothing, and rounding there would only add work."""
    if x.device.type != "cpu":
        return 1
    bf16 = x.dtype == torch.bfloat16 or (torch.is_autocast_enabled("cpu")
                                          and torch.get_autocast_dtype("cpu") == torch.bfloat16)
    return BF16_ROW_QUANTUM if bf16 else 1


def pad_groups(order: Tensor, counts: Tensor, k: int, quantum: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """The assignments sorted by expert (``order``, ``counts`` from group_by_expert) laid out in rows, each expert's
    group padded at its end to a multiple of ``quantum`` rows (matmul_row_quantum).

    Returns (src [S]: the token each row reads, token 0 for a padding row; rows [N, k]: the row of each (token, slot)
    assignment; ends [E]: the end of each expert's padded group, the offsets of a grouped matmul). With quantum 1
    there is no padding: src = order // k, rows = invert_order(order, k), ends = cumsum(counts). Padding rows are
    read by no assignment: gather_rows(x, src, rows) gives them no gradient, and read_back never reads them."""
    rows = invert_order(order, k)
    ends = torch.cumsum(counts, 0)
    if quantum == 1:
        return order // k, rows, ends
    padded = (counts + quantum - 1) // quantum * quantum
    padded_ends = torch.cumsum(padded, 0)
    shift = (padded_ends - padded) - (ends - counts)  # how far each expert's group moves
    expert = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)  # of each sorted row
    place = torch.arange(order.numel(), device=order.device) + shift[expert]  # sorted row -> padded row
    size = int(padded_ends[-1]) if counts.numel() else 0
    src = torch.zeros(size, dtype=order.dtype, device=order.device).index_copy_(0, place, order // k)
    return src, place[rows], padded_ends


class _GatherRows(torch.autograd.Function):
    """x.index_select(0, src) whose backward is a gather-sum over the rows that read each x row (`reads`), not a
    scatter-add of every gathered row: a scatter-add must allow any row to be hit any number of times, which
    makes it the slower of the two."""

    @staticmethod
    def forward(ctx, x, src, reads):
        ctx.save_for_backward(reads)
        return x.index_select(0, src)

    @staticmethod
    def backward(ctx, grad):
        (reads,) = ctx.saved_tensors
        return F.embedding_bag(reads, grad.reshape(grad.shape[0], -1), mode="sum").view(-1, *grad.shape[1:]), None, None


def gather_rows(x: Tensor, src: Tensor, reads: Tensor) -> Tensor:
    """x.index_select(0, src) for x [N, ...], where reads [N, m] lists, for every row n of x, the m positions of src
    that read it (src[reads[n, j]] == n) and whose gradient it receives. Positions of src that no row lists (padding)
    get no gradient back. Every row is read the same number of times m: k for top-k routing, E for MossNet's dense
    policy."""
    if not needs_grad(x):
        return x.index_select(0, src)
    return _GatherRows.apply(x, src, reads)


def read_back(src: Tensor, idx: Tensor, weights: Tensor) -> Tensor:
    """out[n] = sum_j weights[n, j] * src[idx[n, j]]: each token's gate-weighted sum of its expert slots, for src
    [S, D], idx [N, m] and weights [N, m], differentiable in src and weights. Returns src's dtype, summed in float32
    at least (float64 for float64 src), the weights taken and their gradient computed in that precision too. No row
    of src may be read twice (each slot is one token's): the backward stores each row's gradient. The compiled
    kernel on the CPU for float32, float64 and bfloat16 rows (bfloat16 read and written in place), else
    embedding_bag in the summing precision, whose weighted backward sorts the indices first (it allows a row to be
    read any number of times). benchmarks/bench_fused.py measures the two, forward + backward."""
    w = weights.to(kernel_library.compute_dtype(src.dtype))
    if gather_sum_kernel.gather_sum_takes(src, w):
        return gather_sum_kernel.weighted_gather_sum(src, idx, w)
    return F.embedding_bag(idx, src.to(w.dtype), per_sample_weights=w, mode="sum").to(src.dtype)


def combine(y_sorted: Tensor, order: Tensor, weights: Tensor, num_tokens: int, rows: Tensor | None = None) -> Tensor:
    """Scatter-add the expert outputs back to their tokens, weighted: out[n] = sum_slot weights[n, slot] * y[n, slot].

    y_sorted [N * k, D] in the order of `dispatch`; order [N * k]; weights [N, k]. Returns [num_tokens, D] in the
    dtype of y_sorted (accumulated in float32 at least). Differentiable in y_sorted and weights. ``rows``:
    invert_order(order, k) when the caller has it already, or the rows of a padded layout (pad_groups), where
    y_sorted has rows beyond the N * k assignments that nothing reads.
    """
    if weights.dim() != 2 or weights.shape[0] != num_tokens:
        raise ShapeError(
            f"combine: `weights` must be [N, k] with N = num_tokens = {num_tokens}, got {list(weights.shape)}"
        )
    n_assign = weights.numel()
    n_rows = y_sorted.shape[0] if y_sorted.dim() == 2 else -1
    if (n_rows != n_assign and (rows is None or n_rows < n_assign)) or list(order.shape) != [n_assign]:
        raise ShapeError(
            f"combine: `y_sorted` must be [N * k, D] (more rows only with `rows`) and `order` [N * k] with "
            f"N * k = {n_assign}, got {list(y_sorted.shape)} and {list(order.shape)}"
        )
    # rows[n, slot]: the row of y_sorted holding token n's slot (order inverted); then one weighted gather-sum, which
    # forward and backward takes about 0.6x the time of weighting every row and scatter-adding it to its token
    if rows is None:
        rows = invert_order(order, weights.shape[1])
    return read_back(y_sorted, rows, weights)
