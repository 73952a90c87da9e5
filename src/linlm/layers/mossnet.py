"""MossNet's token mixer: a mixture of state-space experts (a reconstruction; see docs/mossnet.md).

A Mamba-style block whose in_proj, conv and out_proj are shared, with E SSM experts in the middle:

    (u, z)  = in_proj(x);  u = silu(conv(u))                       shared, as in Mamba
    g, idx  = top-k of softmax(x W_r), renormalised over the k       router on the block input x
    y^e_t   = SSM_e(u)_t   with expert e's own (dt, B, C) projections, A_e and D_e
    y_t     = sum over selected e of g_{t,e} y^e_t
    out     = out_proj(y * silu(z))

Its settings are ``cfg.options`` (models/archs/mossnet.py: Mamba's shape, the expert counts and two flags,
ssm_policy and ssm_kernel):

- policy "dense": every expert's state sees every token; only the outputs are gated (gated linear multi-head
  attention). "routed": an expert's state advances only on the tokens routed to it, so the scan work scales with
  k / E and a decoding step updates k states.
- kernel "s6": per-channel decay exp(dt_t[c] A_e[c, n]) (Mamba-1's selective scan, low-rank dt of rank R).
  "ssd": a scalar decay exp(dt_t A_e) per expert, with a scalar dt_t = softplus(u_t . w_e + b_e), run on the
  chunkwise gated-linear-attention op with q = C_t, k = dt_t B_t, v = u_t.

How the experts run: every (expert, batch row) pair gets the subsequence of the row's tokens routed to that expert,
in time order, gathered into a padded tensor of expert rows. Where a state comes in or goes out (prefill, chunked
decoding) each pair has a row of its own, [E * B, L, ...] (L = the longest subsequence; "dense" selects every
token, so L = T). In training (no state either way) each expert has one row, [E, L, ...], holding its B
subsequences one after the other with a reset at each start (L = the busiest expert's total): less padding, since
the balance over a whole batch is better than within each row (unless the CPU has more threads than those rows
have work items for the scan kernel). The experts' projections are batched matmuls over E and ONE scan runs over
all the rows, with per-row A and D. Padding sits at the end of a row (it repeats the last token's inputs): the S6
scan skips it (lengths) and "ssd" gives it dt = 0, so the state passes through unchanged.
Each token's output is the gate-weighted sum of its k slots, read back in one weighted gather (routing.read_back).
Packed documents: an expert's subsequence resets at the first of its tokens that belongs to a new document, and a
state left over from a finished document is zeroed before it is returned.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers.linear_attention import gla_flops_per_token, run_gla
from linlm.layers.mamba import (
    ShortConv,
    decay_rate,
    dt_bias_init_,
    dt_preactivation,
    dt_rank,
    dt_weight_init_,
    inner_dim,
    output_gate,
    s4d_real_log,
    scan_flops_per_token,
)
from linlm.layers.mixer import TokenMixer, float32_at_least, meta
from linlm.layers.moe import router_aux_loss, router_logits
from linlm.ops import scan_kernel
from linlm.ops.routing import gather_rows, matmul_row_quantum, read_back, top_k_route
from linlm.ops.selective_scan import selective_scan, selective_scan_step

POLICIES = ("dense", "routed")
KERNELS = ("s6", "ssd")
# SSD experts: A_e = -exp(A_log_e) drawn uniformly in [-SSD_A_MAX, -SSD_A_MIN] (Mamba-2's init).
SSD_A_MIN, SSD_A_MAX = 1.0, 16.0


class MossNetMixer(TokenMixer):
    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        o = cfg.options
        d, Din, N, E = cfg.d_model, inner_dim(cfg), o.d_state, o.ssm_experts
        self.d_model, self.d_inner, self.d_state = d, Din, N
        self.n_experts, self.top_k = E, o.ssm_top_k
        self.policy, self.kernel, self.chunk_size = o.ssm_policy, o.ssm_kernel, cfg.chunk_size
        self.balance_coef, self.z_coef = o.balance_loss_coef, o.router_z_loss_coef
        # Low-rank dt for S6; a single dt column for SSD.
        self.dt_rank = dt_rank(cfg) if self.kernel == "s6" else 1
        self.proj_dim = self.dt_rank + 2 * N  # per expert: [dt~ (R), B (N), C (N)]

        self.in_proj = nn.Linear(d, 2 * Din, bias=False)
        self.conv = ShortConv(Din, o.d_conv)
        self.router = nn.Linear(d, E, bias=False)
        self.x_proj = nn.Linear(Din, E * self.proj_dim, bias=False)  # expert-major: rows e*P .. (e+1)*P - 1
        if self.kernel == "s6":
            self.dt_weight = nn.Parameter(dt_weight_init_(torch.empty(E, Din, self.dt_rank), self.dt_rank))
            self.dt_bias = nn.Parameter(dt_bias_init_(torch.empty(E, Din)))
            self.A_log = nn.Parameter(s4d_real_log(E, Din, d_state=N))
        else:
            self.dt_weight = None
            self.dt_bias = nn.Parameter(dt_bias_init_(torch.empty(E)))
            a = torch.empty(E).uniform_(SSD_A_MIN, SSD_A_MAX)
            self.A_log = nn.Parameter(torch.log(a))
        self.D = nn.Parameter(torch.ones(E, Din))
        self.out_proj = nn.Linear(Din, d, bias=False)

    # ------------------------------------------------------------------------------------------------------------
    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        B, T, _ = x.shape
        logits = router_logits(self.router, x).reshape(B * T, self.n_experts)
        gates, idx, probs = top_k_route(logits, self.top_k)
        aux = router_aux_loss(logits, probs, idx, self.n_experts, self.balance_coef, self.z_coef)
        gates, idx = gates.view(B, T, self.top_k), idx.view(B, T, self.top_k)

        u, z = self.in_proj(x).chunk(2, dim=-1)
        u, conv_state = self.conv(u, None if state is None else state["conv"], reset, silu=True)
        ssm = None if state is None else state["ssm"]
        if ssm is not None and T == 1 and reset is None:
            y, ssm = self._step(u[:, 0], gates[:, 0], idx[:, 0], ssm)
            y = y[:, None]
        else:
            y, ssm = self._scan(u, gates, idx, ssm, reset, return_state)
        out = self.out_proj(output_gate(y, z))
        return out, ({"conv": conv_state, "ssm": ssm} if return_state else None), aux

    # ------------------------------------------------------------------------------------------------------------
    def _A(self) -> torch.Tensor:
        return decay_rate(self.A_log)  # s6: [E, Din, N]; ssd: [E]

    def _selection(self, idx: torch.Tensor) -> torch.Tensor:
        """[B, T, E] bool: which experts' states see each token."""
        B, T, _ = idx.shape
        if self.policy == "dense":
            return torch.ones(B, T, self.n_experts, dtype=torch.bool, device=idx.device)
        return torch.zeros(B, T, self.n_experts, dtype=torch.bool, device=idx.device).scatter_(2, idx, True)

    def _rows_keep_threads_busy(self, u) -> bool:
        """Whether E expert rows give the CPU scan kernel a work item (a row's tile of channels) per thread: where
        they do not (many threads, few experts, narrow d_inner), the per-row layout's E x B rows keep them busy."""
        if u.device.type != "cpu":
            return True
        return self.n_experts * -(-self.d_inner // scan_kernel.TILE) >= torch.get_num_threads()

    def _scan(self, u, gates, idx, ssm, reset, return_state):
        """Full-sequence form (training, prefill): gather per-expert subsequences, one scan for all, read back."""
        B, T, Din = u.shape
        E, N, P, R = self.n_experts, self.d_state, self.proj_dim, self.dt_rank
        sel = self._selection(idx)
        # Two layouts of the expert rows. "Per row" (a state comes in or goes out): one row per (expert, batch row),
        # [E * B, L], L the longest subsequence. "Packed" (training: no state either way): one row per expert,
        # [E, L], the batch rows' subsequences one after the other with a reset at each start, L the busiest
        # expert's total; it pads E x (max - mean) slots instead of E x B x (max - mean) (see docs/mossnet.md).
        packed = ssm is None and not return_state and self._rows_keep_threads_busy(u)
        n_rows = E if packed else E * B
        if packed:
            pos = (sel.view(B * T, E).cumsum(dim=0) - 1).view(B, T, E)  # slot in expert e's row (where sel)
            lengths = pos[-1, -1] + 1  # [E]: each row's count of real slots
            rows = torch.arange(E, device=u.device)  # [E]
        else:
            pos = sel.cumsum(dim=1) - 1  # slot of token t in expert e's subsequence of row b (where sel)
            lengths = (pos[:, -1] + 1).t().reshape(E * B)  # row e * B + b: the count of (b, e)
            rows = torch.arange(E, device=u.device) * B + torch.arange(B, device=u.device)[:, None, None]  # [B, 1, E]
        # The busiest row's length, rounded up to the shape quantum of bf16 matmuls (routing.matmul_row_quantum:
        # the expert projections' shapes then repeat from step to step); its bound while torch.export traces, as no
        # shape may depend on the routing there. The extra padding is skipped by the scan like any other.
        if torch.compiler.is_exporting():
            L = B * T if packed else T
        else:
            q = matmul_row_quantum(u)
            L = -(-int(lengths.max()) // q) * q
        slot = rows * L + pos  # [B, T, E]: flat slot in the [n_rows, L] layout
        token = torch.arange(B * T, device=u.device).view(B, T, 1).expand(B, T, E)
        # src[slot] = token where sel; the unselected (b, t, e) write to a spare last slot, dropped (no boolean
        # indexing: its data-dependent size could not be exported).
        src = torch.full((n_rows * L + 1,), B * T, dtype=torch.long, device=u.device)  # B * T: padding
        src = src.scatter(0, torch.where(sel, slot, n_rows * L).reshape(-1), token.reshape(-1))[:-1]
        valid = (src < B * T).view(E, -1)
        # Padding rows gather the last token instead of a zero row (no copy of u with a row appended): the scan skips
        # them (lengths; "ssd" masks their dt), their outputs are never read back and they get no gradient.
        src = src.clamp_max(B * T - 1)

        # Every token's slots: the k it is routed to (routed) or all E (dense); they read it and send its gradient
        # back, and its output is read back from them.
        reads = (slot.gather(2, idx) if self.policy == "routed" else slot).view(B * T, -1)
        # Gathered in u's dtype: the scan kernel reads and writes bfloat16 rows in place (computing in float32), the
        # GLA op of "ssd" takes them as they are.
        ug = gather_rows(u.reshape(B * T, Din), src, reads).view(E, -1, Din)
        # Each expert's (dt~, B, C) projection on its own rows only, one bmm over E, rather than every expert's
        # projection on every token (benchmarks/bench_mossnet.py times the mixer).
        xp = torch.bmm(ug, self.x_proj.weight.view(E, P, Din).transpose(1, 2))
        dt_raw, Bm, Cm = xp.split([R, N, N], dim=-1)

        # A state starts from zero at each new segment of its row: a document start and, packed, the first token of
        # each batch row. seg numbers the segments (batch row x (T + 1) + document; per row, the document).
        reset_g = seg_g = doc = None
        if reset is not None:
            doc = torch.cumsum(reset, dim=1)  # document number of each token, 0 = the one the state belongs to
        if reset is not None or (packed and B > 1):
            seg = torch.arange(B, device=u.device)[:, None] * (T + 1) if packed else 0
            seg = (seg + (0 if doc is None else doc)).expand(B, T)
            seg_g = seg.reshape(-1).index_select(0, src).view(n_rows, L)
            reset_g = valid.view(n_rows, L) & (seg_g != F.pad(seg_g[:, :-1], (1, 0)))

        A = self._A()
        D = self.D if packed else self.D.repeat_interleave(B, dim=0)  # [n_rows, Din]
        u_rows = ug.view(n_rows, L, Din)
        B_rows, C_rows = Bm.reshape(n_rows, L, N), Cm.reshape(n_rows, L, N)
        if self.kernel == "s6":
            # Padding past each row's count is skipped by the scan (lengths), so dt needs no mask there.
            dt = dt_preactivation(dt_raw, self.dt_weight, self.dt_bias)  # the scan applies softplus
            init = None if ssm is None else ssm.transpose(0, 1).reshape(E * B, Din, N)
            yg, final = selective_scan(
                u_rows, dt.view(n_rows, L, Din), A if packed else A.repeat_interleave(B, dim=0), B_rows, C_rows, D,
                initial_state=init, reset=reset_g, output_final_state=return_state, chunk_size=self.chunk_size,
                lengths=lengths, dt_softplus=True,
            )
        else:
            dt = F.softplus(dt_raw[..., 0] + self.dt_bias[:, None]) * valid  # [E, rows per expert x L]
            log_a = (dt * A[:, None]).view(n_rows, L, 1)
            dt = dt.view(n_rows, L, 1)
            init = None if ssm is None else ssm.transpose(0, 1).reshape(E * B, 1, N, Din)
            o, final = run_gla(
                C_rows[:, :, None], (dt * B_rows)[:, :, None], u_rows[:, :, None], log_a,
                state=init, reset=reset_g, return_state=return_state, chunk_size=self.chunk_size,
            )
            yg = o[:, :, 0] + D[:, None].to(o.dtype) * u_rows

        if final is not None:  # per row only
            if reset is not None:
                # An expert that saw no token of the row's last document must not carry an older one's state.
                last = (lengths - 1).clamp_min(0)[:, None]
                last_doc = torch.where(lengths[:, None] > 0, seg_g.gather(1, last), 0)
                stale = last_doc[:, 0] != doc[:, -1].repeat(E)
                final = final.masked_fill(stale.view(-1, *[1] * (final.dim() - 1)), 0.0)
            final = final.view(E, B, *final.shape[1:]).transpose(0, 1)
            final = final.reshape(B, E, *final.shape[3:]) if self.kernel == "ssd" else final.contiguous()

        # y_t = sum_j g_{t,j} yg[slot of (t, expert j)]: one weighted gather-sum (routing.read_back, summed in
        # float32 at least), each slot read by one token only.
        picked = reads if self.policy == "routed" else slot.gather(2, idx).view(B * T, self.top_k)
        y = read_back(yg.reshape(n_rows * L, Din), picked, gates.reshape(B * T, self.top_k))
        return y.view(B, T, Din).to(u.dtype), final

    def _step(self, u, gates, idx, ssm):
        """One decoding token. u [B, Din]; gates, idx [B, k]. Only the selected (routed) or all (dense) states move."""
        B, Din = u.shape
        E, N, P, R = self.n_experts, self.d_state, self.proj_dim, self.dt_rank
        act = idx if self.policy == "routed" else torch.arange(E, device=u.device).expand(B, E)
        m = act.shape[1]
        batch = torch.arange(B, device=u.device)[:, None]
        xp = torch.einsum("bd,bmpd->bmp", u, self.x_proj.weight.view(E, P, Din)[act])
        dt_raw, Bm, Cm = xp.split([R, N, N], dim=-1)
        old = ssm[batch, act]  # [B, m, ...]
        u_rows = u[:, None].expand(B, m, Din).reshape(B * m, Din)
        D = self.D[act].reshape(B * m, Din)
        if self.kernel == "s6":
            dt = F.softplus(torch.einsum("bmr,bmdr->bmd", dt_raw, self.dt_weight[act]) + self.dt_bias[act])
            y, new = selective_scan_step(
                u_rows, dt.reshape(B * m, Din), self._A()[act].reshape(B * m, Din, N),
                Bm.reshape(B * m, N), Cm.reshape(B * m, N), D, state=old.reshape(B * m, Din, N),
            )
        else:
            dt = F.softplus(dt_raw[..., 0] + self.dt_bias[act])  # [B, m]
            log_a = (dt * self._A()[act]).reshape(B * m, 1, 1)
            o, new = run_gla(
                Cm.reshape(B * m, 1, 1, N), (dt[..., None] * Bm).reshape(B * m, 1, 1, N), u_rows[:, None, None],
                log_a, state=old.reshape(B * m, 1, N, Din), reset=None, return_state=True, chunk_size=self.chunk_size,
            )
            y = o[:, 0, 0] + D.to(o.dtype) * u_rows
        new_ssm = ssm.index_put((batch.expand(B, m), act), new.view(B, m, *ssm.shape[2:]).to(ssm.dtype))
        y = y.view(B, m, Din)
        if self.policy == "routed":
            w = gates
        else:
            w = torch.zeros(B, E, dtype=gates.dtype, device=u.device).scatter_(1, idx, gates)
        return (w.to(y.dtype)[..., None] * y).sum(dim=1), new_ssm

    # ------------------------------------------------------------------------------------------------------------
    def _per_expert_params(self) -> int:
        mine = [self.x_proj.weight, self.dt_bias, self.A_log, self.D]
        if self.dt_weight is not None:
            mine.append(self.dt_weight)
        return sum(p.numel() for p in mine) // self.n_experts

    def _active_experts(self) -> int:
        return self.top_k if self.policy == "routed" else self.n_experts

    def active_params(self) -> int:
        """Shared projections, conv and router, plus the experts a token runs: k (routed) or all E (dense)."""
        shared = sum(p.numel() for m in (self.in_proj, self.conv, self.router, self.out_proj) for p in m.parameters())
        return shared + self._active_experts() * self._per_expert_params()

    def flops_per_token(self, seq_len: int) -> float:
        d, Din, N, E, R = self.d_model, self.d_inner, self.d_state, self.n_experts, self.dt_rank
        shared = 2.0 * d * 2 * Din + self.conv.flops_per_token(seq_len) + 2.0 * d * E + 2.0 * Din * d + Din
        per_expert = 2.0 * Din * self.proj_dim + 2.0 * Din  # x_proj, gated sum
        if self.kernel == "s6":
            per_expert += 2.0 * R * Din + scan_flops_per_token(Din, N)
        else:
            per_expert += gla_flops_per_token(1, N, Din, self.chunk_size) + 2.0 * Din
        return shared + self._active_experts() * per_expert

    def state_spec(self, batch: int, context: int, dtype: torch.dtype):
        """{"conv": the shared conv window, "ssm": every expert's state, [B, E, Din, N] (s6) or [B, E, N, Din]
        (ssd, the gated-linear-attention layout), in float32 at least}."""
        E, Din, N = self.n_experts, self.d_inner, self.d_state
        shape = (batch, E, Din, N) if self.kernel == "s6" else (batch, E, N, Din)
        return {"conv": self.conv.state_spec(batch, dtype), "ssm": meta(*shape, dtype=float32_at_least(dtype))}

    def extra_repr(self) -> str:
        return f"experts={self.n_experts}, top_k={self.top_k}, policy={self.policy!r}, kernel={self.kernel!r}"
