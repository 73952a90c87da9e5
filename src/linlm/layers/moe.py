"""A top-k routed mixture of SwiGLU experts: MossNet's channel mixer.

    (g, e) = top-k of softmax(x W_r), g renormalised over the chosen k
    y      = sum_j g_j SwiGLU_{e_j}(x) + SwiGLU_shared(x)

Tokens are grouped by expert (ops.routing.group_by_expert: one stable sort), never by a loop over tokens. Three
ways to run the experts on their groups, same math:
- grouped (on the CPU, in float32 / bfloat16, where torch has ``torch._grouped_mm``): one grouped matmul per
  weight over the sorted rows, each expert on its contiguous slice; no padding in float32, and in bfloat16 each
  slice padded to a multiple of 16 rows (ops.routing.matmul_row_quantum: oneDNN compiles a kernel per matmul shape,
  so the shapes must repeat from step to step). Measured on a 2-core AVX2 CPU it was
  within 5 % of the best of the two below at every load tried (64 to 640 rows per expert, fwd + bwd), and 1.8x
  faster than the batched path when the busiest expert had 1.25x the mean load;
- batched: the groups are gathered into a [E, capacity, d] buffer (capacity = the busiest expert's load) and all
  experts run in two bmm calls. Fast while the load is balanced (the balance loss keeps it so);
- looped: one matmul pair per expert on its contiguous slice, no padding; used when padding would cost more than
  PAD_LIMIT x the real work (a collapsed router).
- static (while torch.export traces, and in a compiled decoding step: linlm.infer.export, CausalLM.compile_step):
  no grouping, so no shape depends on the routing. Few tokens (a decoding step): each token gathers its k experts' weights; more tokens: every expert runs
  on every token and the outputs are weighted by the (mostly zero) dense gates.
``shared`` always-on experts are fused into one SwiGLU of width shared * expert_dim (the sum of S SwiGLUs of
width h is one SwiGLU of width S h), or of its own width ``shared_dim``; with ``shared_gate`` its output is scaled
per token by sigmoid(x w_s), w_s in R^d (Qwen3-Next's and Qwen2-MoE's shared expert).

The module returns (y, aux) where aux = balance_coef * Switch load-balancing loss (1.0 at a uniform routing)
+ z_coef * router z-loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers.glu import GLU
from linlm.ops.fused import glu
from linlm.ops.routing import (
    combine,
    gather_rows,
    group_by_expert,
    load_balance_loss,
    matmul_row_quantum,
    pad_groups,
    router_z_loss,
    top_k_route,
)

# The batched path pads every expert to the busiest one's load; it is used while that costs at most PAD_LIMIT x the
# work of the assignments themselves (a balanced router), and the per-expert loop takes over beyond.
PAD_LIMIT = 1.5


def grouped_mm_takes(x: torch.Tensor, *dims: int) -> bool:
    """Whether the grouped path runs for input x whose matmuls have inner sizes ``dims`` (d_model, expert_dim): a CPU
    tensor in float32 or bfloat16 (the dtypes torch._grouped_mm takes; float64 goes to the other paths), every size a
    multiple of 16 bytes in the dtype the matmuls run in (the op's stride rule), and torch._grouped_mm present in this
    torch. Kept to the CPU: on CUDA the op wants Hopper-class GPUs."""
    if not hasattr(torch, "_grouped_mm") or x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
        return False
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
    return dtype in (torch.float32, torch.bfloat16) and all(n * dtype.itemsize % 16 == 0 for n in dims)


def router_logits(router: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Router scores in float32 at least (bf16 scores would make near-ties pick experts at random)."""
    logits = router(x)
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


def router_aux_loss(logits, probs, indices, n_experts: int, balance_coef: float, z_coef: float):
    """balance_coef * Switch balance loss + z_coef * router z-loss (the z-loss is skipped when its weight is 0).

    0 while torch.export traces: an exported graph is for inference, and the balance loss counts assignments."""
    if torch.compiler.is_exporting():
        return logits.new_zeros(())
    aux = balance_coef * load_balance_loss(probs, indices, n_experts)
    if z_coef:
        aux = aux + z_coef * router_z_loss(logits)
    return aux


class MoEMLP(nn.Module):
    def __init__(self, d_model: int, n_experts: int, top_k: int, expert_dim: int, shared_experts: int = 0,
                 balance_coef: float = 0.01, z_coef: float = 0.0, init_std: float = 0.02, shared_dim: int = 0,
                 shared_gate: bool = False):
        super().__init__()
        self.d_model, self.n_experts, self.top_k, self.expert_dim = d_model, n_experts, top_k, expert_dim
        self.balance_coef, self.z_coef = balance_coef, z_coef
        self.pad_limit = PAD_LIMIT
        self.grouped = True  # the grouped matmul where it takes the input (grouped_mm_takes); False: never
        self.router = nn.Linear(d_model, n_experts, bias=False)
        # Expert e: w_in[e] = [W_gate; W_up] in R^{2h x d}, w_out[e] = W_down in R^{d x h} (nn.Linear layout).
        self.w_in = nn.Parameter(torch.empty(n_experts, 2 * expert_dim, d_model))
        self.w_out = nn.Parameter(torch.empty(n_experts, d_model, expert_dim))
        with torch.no_grad():
            self.w_in.normal_(0.0, init_std)
            self.w_out.normal_(0.0, init_std)
        width = shared_dim or shared_experts * expert_dim
        self.shared = GLU(d_model, width, activation="silu") if width else None
        self.shared_gate = nn.Linear(d_model, 1, bias=False) if shared_gate and width else None

    def _with_shared(self, y: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        """y plus the shared expert's output on the tokens ``flat`` (gated per token where it has a gate)."""
        if self.shared is None:
            return y
        s = self.shared(flat)
        return y + (s if self.shared_gate is None else torch.sigmoid(self.shared_gate(flat)) * s)

    def forward(self, x: torch.Tensor):
        shape = x.shape
        flat = x.reshape(-1, self.d_model)
        n_tokens = flat.shape[0]
        logits = router_logits(self.router, flat)
        weights, indices, probs = top_k_route(logits, self.top_k)
        # No shape may follow the routing while torch.export traces, nor in a compiled decoding step (no gradient).
        if torch.compiler.is_exporting() or (torch.compiler.is_compiling() and not torch.is_grad_enabled()):
            y = self._with_shared(self._experts_static(flat, weights, indices), flat)
            if torch.compiler.is_exporting():
                return y.view(shape), logits.new_zeros(())
            return y.view(shape), router_aux_loss(logits, probs, indices, self.n_experts, self.balance_coef,
                                                  self.z_coef)
        order, counts = group_by_expert(indices, self.n_experts)
        capacity = int(counts.max()) if counts.numel() else 0
        grouped = self.grouped and grouped_mm_takes(flat, self.d_model, self.expert_dim)
        # rows [N, k]: the row of each (token, slot) in the sorted rows; on the grouped path each expert's group is
        # padded to the shape quantum of bf16 matmuls (routing.matmul_row_quantum)
        src, rows, ends = pad_groups(order, counts, self.top_k, matmul_row_quantum(flat) if grouped else 1)
        if grouped:
            y_sorted = self._experts_grouped(flat, src, rows, ends)
        elif capacity * self.n_experts <= self.pad_limit * indices.numel():
            y_sorted = self._experts_batched(flat, indices, order, counts, capacity)
        else:
            y_sorted = self._experts_looped(flat, src, rows, counts)
        y = self._with_shared(combine(y_sorted, order, weights, n_tokens, rows=rows), flat)
        aux = router_aux_loss(logits, probs, indices, self.n_experts, self.balance_coef, self.z_coef)
        return y.view(shape), aux

    def _experts_batched(self, flat, indices, order, counts, capacity):
        """All experts in two bmm calls over a [E, capacity, d] buffer (rows past an expert's count are zeros)."""
        n_assign = indices.numel()
        starts = torch.cumsum(counts, 0) - counts
        expert = indices.reshape(-1)[order]  # the expert of each sorted assignment
        dest = expert * capacity + torch.arange(n_assign, device=flat.device) - starts[expert]
        src = torch.full((self.n_experts * capacity,), flat.shape[0], dtype=torch.long, device=flat.device)
        src[dest] = order // self.top_k  # token of each buffer row; the extra last row of `padded` is zeros
        padded = torch.cat([flat, flat.new_zeros(1, self.d_model)]).index_select(0, src)
        h = torch.bmm(padded.view(self.n_experts, capacity, -1), self.w_in.transpose(1, 2))
        out = torch.bmm(glu(h, "silu"), self.w_out.transpose(1, 2))
        return out.reshape(-1, self.d_model).index_select(0, dest)

    def _experts_static(self, flat, weights, indices):
        """The routed sum with shapes fixed by the input's (for torch.export): per-token weight gathers while they
        read fewer weights than running every expert (n_tokens * k < E), else every expert on every token."""
        w = weights.to(flat.dtype)
        if indices.numel() < self.n_experts:
            gate, up = torch.einsum("nd,nkhd->nkh", flat, self.w_in[indices]).chunk(2, dim=-1)
            return torch.einsum("nkh,nkdh,nk->nd", F.silu(gate) * up, self.w_out[indices], w)
        gate, up = torch.einsum("nd,ehd->enh", flat, self.w_in).chunk(2, dim=-1)
        out = torch.einsum("enh,edh->end", F.silu(gate) * up, self.w_out)
        dense = torch.zeros(flat.shape[0], self.n_experts, dtype=w.dtype, device=flat.device).scatter(1, indices, w)
        return torch.einsum("end,ne->nd", out, dense)

    def _experts_grouped(self, flat, src, rows, ends):
        """Two grouped matmuls over the sorted rows (pad_groups: expert e on rows ends[e-1]:ends[e], its group padded
        at the end), in autocast's dtype when autocast is on (torch._grouped_mm is not on its list). The tokens are
        cast before the gather: N rows instead of N k."""
        w_in, w_out = self.w_in, self.w_out
        if torch.is_autocast_enabled(flat.device.type):
            dt = torch.get_autocast_dtype(flat.device.type)
            flat, w_in, w_out = flat.to(dt), w_in.to(dt), w_out.to(dt)
        x_sorted = gather_rows(flat, src, rows)
        offs = ends.to(torch.int32)
        h = torch._grouped_mm(x_sorted, w_in.transpose(1, 2), offs=offs)
        return torch._grouped_mm(glu(h, "silu"), w_out.transpose(1, 2), offs=offs)

    def _experts_looped(self, flat, src, rows, counts):
        """One matmul pair per expert on its contiguous slice of the sorted rows (no padding)."""
        x_sorted = gather_rows(flat, src, rows)
        # split / unbind (not slicing or indexing) so that the backward joins the pieces with one cat / stack.
        outs = []
        for part, w_in, w_out in zip(x_sorted.split(counts.tolist()), self.w_in.unbind(0), self.w_out.unbind(0)):
            outs.append(F.linear(glu(F.linear(part, w_in), "silu"), w_out))
        return torch.cat(outs)

    def active_params(self) -> int:
        """Parameters one token uses: the router, the shared experts and k of the E routed experts."""
        per_expert = (self.w_in.numel() + self.w_out.numel()) // self.n_experts
        shared = sum(p.numel() for m in (self.shared, self.shared_gate) if m is not None for p in m.parameters())
        return self.router.weight.numel() + shared + self.top_k * per_expert

    def flops_per_token(self, seq_len: int) -> float:
        d, h = self.d_model, self.expert_dim
        shared = self.shared.hidden if self.shared is not None else 0
        routed = self.top_k * (2.0 * d * 2 * h + 2.0 * h * d + 2.0 * d)  # expert matmuls and the weighted sum
        gate = 2.0 * d if self.shared_gate is not None else 0.0
        return 2.0 * d * self.n_experts + routed + 6.0 * d * shared + gate

    def extra_repr(self) -> str:
        shared = "" if self.shared is None else f", shared_dim={self.shared.hidden}" + (
            ", shared_gate=True" if self.shared_gate is not None else "")
        return (f"d_model={self.d_model}, experts={self.n_experts}, top_k={self.top_k}, "
                f"expert_dim={self.expert_dim}{shared}")
