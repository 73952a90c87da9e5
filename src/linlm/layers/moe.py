"""A top-k routed mixture of SwiGLU experts: MossNet's channel mixer.

    (g, e) = top-k of softmax(x W_r), g renormalised over the chosen k
    y      = sum_j g_j SwiGLU_{e_j}(x) + SwiGLU_shared(x)

Tokens are grouped by expert (ops.routing.dispatch sorts them) and every expert runs one matmul pair on its
contiguous slice; the loop is over experts, never over tokens. ``shared`` always-on experts are fused into one
SwiGLU of width shared * expert_dim (the sum of S SwiGLUs of width h is one SwiGLU of width S h).

The module returns (y, aux) where aux = balance_coef * Switch load-balancing loss (1.0 at a uniform routing)
+ z_coef * router z-loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers.glu import GLU
from linlm.ops.routing import combine, dispatch, load_balance_loss, router_z_loss, top_k_route


def router_aux_loss(logits, probs, indices, n_experts: int, balance_coef: float, z_coef: float):
    """balance_coef * Switch balance loss + z_coef * router z-loss (the z-loss is skipped when its weight is 0)."""
    aux = balance_coef * load_balance_loss(probs, indices, n_experts)
    if z_coef:
        aux = aux + z_coef * router_z_loss(logits)
    return aux


class MoEMLP(nn.Module):
    def __init__(self, d_model: int, n_experts: int, top_k: int, expert_dim: int, shared_experts: int = 0,
                 balance_coef: float = 0.01, z_coef: float = 0.0, init_std: float = 0.02):
        super().__init__()
        self.d_model, self.n_experts, self.top_k, self.expert_dim = d_model, n_experts, top_k, expert_dim
        self.balance_coef, self.z_coef = balance_coef, z_coef
        self.router = nn.Linear(d_model, n_experts, bias=False)
        # Expert e: w_in[e] = [W_gate; W_up] in R^{2h x d}, w_out[e] = W_down in R^{d x h} (nn.Linear layout).
        self.w_in = nn.Parameter(torch.empty(n_experts, 2 * expert_dim, d_model))
        self.w_out = nn.Parameter(torch.empty(n_experts, d_model, expert_dim))
        with torch.no_grad():
            self.w_in.normal_(0.0, init_std)
            self.w_out.normal_(0.0, init_std)
        self.shared = GLU(d_model, shared_experts * expert_dim, activation="silu") if shared_experts else None

    def forward(self, x: torch.Tensor):
        shape = x.shape
        flat = x.reshape(-1, self.d_model)
        n_tokens = flat.shape[0]
        logits = self.router(flat).float()
        weights, indices, probs = top_k_route(logits, self.top_k)
        x_sorted, order, counts = dispatch(flat, indices, self.n_experts)
        outs, start = [], 0
        for e, n in enumerate(counts.tolist()):
            if n:
                gate, up = F.linear(x_sorted[start : start + n], self.w_in[e]).chunk(2, dim=-1)
                outs.append(F.linear(F.silu(gate) * up, self.w_out[e]))
            start += n
        y_sorted = torch.cat(outs) if outs else x_sorted.new_zeros(0, self.d_model)
        y = combine(y_sorted, order, weights.to(y_sorted.dtype), n_tokens)
        if self.shared is not None:
            y = y + self.shared(flat)
        aux = router_aux_loss(logits, probs, indices, self.n_experts, self.balance_coef, self.z_coef)
        return y.view(shape), aux

    def active_params(self) -> int:
        """Parameters one token uses: the router, the shared experts and k of the E routed experts."""
        per_expert = (self.w_in.numel() + self.w_out.numel()) // self.n_experts
        shared = sum(p.numel() for p in self.shared.parameters()) if self.shared is not None else 0
        return self.router.weight.numel() + shared + self.top_k * per_expert

    def flops_per_token(self, seq_len: int) -> float:
        d, h = self.d_model, self.expert_dim
        shared = self.shared.hidden if self.shared is not None else 0
        routed = self.top_k * (2.0 * d * 2 * h + 2.0 * h * d + 2.0 * d)  # expert matmuls and the weighted sum
        return 2.0 * d * self.n_experts + routed + 6.0 * d * shared

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, experts={self.n_experts}, top_k={self.top_k}, "
                f"expert_dim={self.expert_dim}")
