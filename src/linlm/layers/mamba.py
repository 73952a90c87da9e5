"""The Mamba-1 token mixer (the SSM baseline), and the pieces MossNet shares with it.

One block, for x of width d and inner width Din = expand * d:

    (u, z) = in_proj(x)                          u, z in R^Din
    u      = silu(causal depthwise conv1d(u))    kernel d_conv
    (dt~, B, C) = x_proj(u)                      dt~ in R^R (R = dt_rank), B, C in R^N (N = d_state)
    dt     = softplus(dt_proj(dt~) + bias)       per channel
    y      = selective_scan(u, dt, A = -exp(A_log), B, C, D)
    out    = out_proj(y * silu(z))

The decoding state is the last d_conv - 1 conv inputs and the scan state [Din, N]: constant in the context length.
Packed sequences (``reset``) are exact: the conv drops the taps that would read across a document boundary, and
the scan zeroes its state at a document's first token.

The dt projection, A_log and D are plain parameters (not ``nn.Linear``), so that the model-wide
``CausalLM.reset_parameters`` (normal init of every Linear, zero biases) keeps Mamba's dt and S4D-real inits.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from linlm.layers.linear import decode_weights, has_hooks
from linlm.layers.mixer import TokenMixer, float32_at_least, meta
from linlm.layers.shell import computed
from linlm.ops import conv_kernel, gate_kernel, kernel_library, step_kernel
from linlm.ops.grad import needs_grad
from linlm.ops.selective_scan import scan_step_unchecked, selective_scan

# Mamba's dt initialisation: dt log-uniform in [DT_MIN, DT_MAX], floored at DT_FLOOR, stored as softplus^{-1}(dt).
DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4


def dt_rank(cfg) -> int:
    """options.dt_rank, or Mamba's default ceil(d_model / 16) when it is 0."""
    return cfg.options.dt_rank or math.ceil(cfg.d_model / 16)


def inner_dim(cfg) -> int:
    return cfg.options.expand * cfg.d_model


def dt_bias_init_(bias: torch.Tensor) -> torch.Tensor:
    """Fill ``bias`` (any shape) with softplus^{-1}(dt), dt log-uniform in [DT_MIN, DT_MAX] (Mamba's dt init); a
    meta tensor has no values to fill (see linlm.layers.shell)."""
    if bias.is_meta:
        return bias
    with torch.no_grad():
        bias.uniform_(math.log(DT_MIN), math.log(DT_MAX))
        dt = bias.exp().clamp_min(DT_FLOOR)
        bias.copy_(dt + torch.log(-torch.expm1(-dt)))
    return bias


def dt_weight_init_(weight: torch.Tensor, rank: int) -> torch.Tensor:
    """Mamba's dt_proj weight init: uniform in [-R^-1/2, R^-1/2] ("random" init, dt_scale = 1)."""
    with torch.no_grad():
        std = rank**-0.5
        weight.uniform_(-std, std)
    return weight


def s4d_real_log(*lead: int, d_state: int) -> torch.Tensor:
    """A_log for the S4D-real init A[..., n] = -(n + 1), shape [*lead, d_state]."""
    return computed((*lead, d_state), lambda: torch.log(torch.arange(1, d_state + 1, dtype=torch.float32))
                    .expand(*lead, d_state).clone(), dtype=torch.float32)


class ShortConv(nn.Module):
    """Causal depthwise conv1d over time, with a carried state and document-boundary masking.

    out[t] = bias + sum_j weight[:, j] * x[t - (K - 1 - j)] (the tap layout of ``nn.Conv1d`` with
    padding K - 1; ``bias=False``: no bias). The state holds the last K - 1 inputs, [B, K - 1, C]; a missing
    state means zeros.
    With ``reset`` (bool [B, T], True at a document's first token) a tap that would read an input of an
    earlier document is dropped, and inputs of a finished document are zeroed in the returned state.
    """

    def __init__(self, channels: int, kernel: int, bias: bool = True):
        super().__init__()
        self.channels, self.kernel = channels, kernel
        self.weight = nn.Parameter(torch.empty(channels, kernel))
        self.bias = nn.Parameter(torch.empty(channels)) if bias else None
        bound = 1.0 / math.sqrt(kernel)  # nn.Conv1d's default for a depthwise conv (fan_in = kernel)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if bias:
                self.bias.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, reset: torch.Tensor | None = None,
                silu: bool = False):
        """(out, new_state); with silu=True, out = silu(conv), through the compiled kernel on the CPU when it is
        available (linlm.ops.conv_kernel: one pass each way, the backward recomputes the conv)."""
        B, T, C = x.shape
        K = self.kernel
        if reset is not None:
            pos = torch.arange(T, device=x.device)
            # Position of the latest document start at or before t; far in the past when none.
            last = torch.where(reset, pos, -(T + K)).cummax(dim=1).values  # [B, T]
        if silu and x.device.type == "cpu" and kernel_library.available():
            since = None if reset is None else pos - last
            bias = self.bias if self.bias is not None else self.weight.new_zeros(()).expand(C)  # the kernel adds one
            out = conv_kernel.conv_silu(x, state, self.weight, bias, since)
            if state is None:
                state = x.new_zeros(B, K - 1, C)
            tail = torch.cat([state.to(x.dtype), x[:, max(0, T - (K - 1)):]], dim=1)  # K - 1 + min(T, K - 1)
            new_state = tail[:, min(T, K - 1):]  # the last K - 1 inputs (some from the old state when T < K - 1)
            return out, self._mask_state(new_state, reset, last if reset is not None else None, T)
        out, new_state = self._conv(x, state, reset, last if reset is not None else None)
        return (F.silu(out) if silu else out), new_state

    def step(self, x: torch.Tensor, state: torch.Tensor, silu: bool = False):
        """One token per row, the decoding form of :meth:`forward`: x [B, C], state [B, K - 1, C] (the last K - 1
        inputs) -> (out [B, C], new_state [B, K - 1, C]). Four tensor ops where the general form takes about ten:
        the window [B, K, C] is the state followed by x, out = sum_j window[:, j] * weight[:, j] (+ bias), and the
        new state is the window's last K - 1 rows (a view of it: no copy). In float32 without a gradient: one call
        of linlm.ops.step_kernel.conv_step, which returns a fresh window."""
        w, b = self.weight, self.bias
        if step_kernel.conv_step_takes(x, state, w, b):  # the same values in one call (float32, no gradient)
            return step_kernel.conv_step(x, state, w, b, silu)
        if not x.dtype == state.dtype == w.dtype:
            state, w, b = state.to(x.dtype), w.to(x.dtype), None if b is None else b.to(x.dtype)
        window = torch.cat([state, x.unsqueeze(1)], dim=1)
        out = torch.mul(window, w.t()).sum(1)
        if b is not None:
            out.add_(b)
        return (F.silu(out, inplace=True) if silu else out), window[:, 1:]

    def _mask_state(self, new_state, reset, last, T):
        """Zero the inputs of a finished document in the returned state."""
        K = self.kernel
        if reset is not None and K > 1:
            times = torch.arange(T - (K - 1), T, device=new_state.device)
            new_state = new_state * (times >= last[:, -1:]).unsqueeze(-1).to(new_state.dtype)
        return new_state

    def _conv(self, x, state, reset, last):
        B, T, C = x.shape
        K = self.kernel
        if state is None:
            state = x.new_zeros(B, K - 1, C)
        xs = torch.cat([state.to(x.dtype), x], dim=1)  # [B, K - 1 + T, C]; xs[:, i] is time i - (K - 1)
        w = self.weight.to(x.dtype)
        if self.bias is None:
            out = xs[:, K - 1 :] * w[:, K - 1]
        else:
            out = torch.addcmul(self.bias.to(x.dtype), xs[:, K - 1 :], w[:, K - 1])
        if reset is not None:
            pos = torch.arange(T, device=x.device)
            since = (pos - last).unsqueeze(-1)  # tokens since the document start, >= T + K when none
        for j in range(K - 1):
            lag = K - 1 - j
            term = xs[:, j : j + T] * w[:, j]
            if reset is not None:
                term = term * (since >= lag).to(x.dtype)
            out = out + term
        new_state = xs[:, T:]  # the last K - 1 inputs (some from the old state when T < K - 1)
        return out, self._mask_state(new_state, reset, last, T)

    def flops_per_token(self, seq_len: int) -> float:
        return 2.0 * self.channels * self.kernel

    def state_spec(self, batch: int, dtype: torch.dtype) -> torch.Tensor:
        """Its state: the last K - 1 inputs, [B, K - 1, C], in the inputs' dtype."""
        return meta(batch, self.kernel - 1, self.channels, dtype=dtype)


def decay_rate(A_log: torch.Tensor) -> torch.Tensor:
    """A = -exp(A_log), in float32 at least (float64 parameters stay float64)."""
    return -torch.exp(A_log if A_log.dtype in (torch.float32, torch.float64) else A_log.float())


# Ranks below this take _LowRankDt's backward; larger ones autograd's.
NARROW_RANK = 16


def _low_rank_dt(dt_low, weight, bias):
    if weight.dim() == 2:
        return F.linear(dt_low, weight, bias)
    return torch.baddbmm(bias.unsqueeze(-2), dt_low, weight.transpose(-1, -2))


class _LowRankDt(torch.autograd.Function):
    """bias + dt_low @ weight^T, whose backward computes both products transposed, with the wide dimension (Din, or
    the tokens) as the output's columns: a CPU matmul with only R output columns runs several times slower than its
    transpose when R is small. At the paper's larger ranks the transposed form was no faster than autograd's, hence
    NARROW_RANK. benchmarks/bench_fused.py times the op against F.linear at both ranks."""

    @staticmethod
    def forward(ctx, dt_low, weight, bias):
        ctx.save_for_backward(dt_low, weight)
        return _low_rank_dt(dt_low, weight, bias)

    @staticmethod
    def backward(ctx, g):
        dt_low, weight = ctx.saved_tensors
        low = dt_low
        if weight.dim() == 2:  # one weight over all tokens: [M, R] and [M, Din]
            low, g = dt_low.reshape(-1, dt_low.shape[-1]), g.reshape(-1, g.shape[-1])
        d_low = d_w = d_b = None
        if ctx.needs_input_grad[0]:
            d_low = (weight.mT @ g.mT).mT.reshape(dt_low.shape)
        if ctx.needs_input_grad[1]:
            d_w = (low.mT @ g).mT
        if ctx.needs_input_grad[2]:
            d_b = g.sum(-2)
        return d_low, d_w, d_b


def dt_preactivation(dt_low: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """dt_low @ weight^T + bias, the pre-activation of dt (the scan applies softplus: dt_softplus=True), in float32
    at least and outside autocast: it is a rank-R product whose output is as large as u, and the scan reads it in
    float32 (a bfloat16 result would be rounded, then converted back, for no saving). weight [Din, R] with dt_low
    [..., L, R], or one weight per expert: weight [E, Din, R], dt_low [E, L, R], bias [E, Din]."""
    cd = torch.promote_types(weight.dtype, torch.float32)
    with torch.autocast(dt_low.device.type, enabled=False):
        args = (dt_low.to(cd), weight.to(cd), bias.to(cd))
        if weight.shape[-1] < NARROW_RANK and needs_grad(*args):
            return _LowRankDt.apply(*args)
        return _low_rank_dt(*args)  # autograd's backward; also inference and torch.export (no Function in the graph)


def output_gate(y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """y * silu(z), the block's output gate: one compiled pass each way where the gate kernel takes the pair (CPU,
    float32 / float64, one dtype; it saves y and z only), else torch's ops."""
    if gate_kernel.gate_takes(z, y):
        return gate_kernel.silu_mul(z, y)
    return y * F.silu(z)


def scan_flops_per_token(d_inner: int, d_state: int) -> float:
    """Forward FLOPs per token of the selective scan: decay exponent and product, input, update, readout, skip."""
    return 6.0 * d_inner * d_state + 2.0 * d_inner


class MambaMixer(TokenMixer):
    def __init__(self, cfg, layer_idx: int):
        super().__init__(cfg, layer_idx)
        d, Din, N, R = cfg.d_model, inner_dim(cfg), cfg.options.d_state, dt_rank(cfg)
        self.d_inner, self.d_state, self.dt_rank, self.chunk_size = Din, N, R, cfg.chunk_size
        self.in_proj = nn.Linear(d, 2 * Din, bias=False)
        self.conv = ShortConv(Din, cfg.options.d_conv)
        self.x_proj = nn.Linear(Din, R + 2 * N, bias=False)
        self.dt_weight = nn.Parameter(dt_weight_init_(torch.empty(Din, R), R))
        self.dt_bias = nn.Parameter(dt_bias_init_(torch.empty(Din)))
        self.A_log = nn.Parameter(s4d_real_log(Din, d_state=N))
        self.D = nn.Parameter(torch.ones(Din))
        self.out_proj = nn.Linear(Din, d, bias=False)

    def forward(self, x, *, state=None, reset=None, offset=0, return_state=False, ctx=None):
        T = x.shape[1]
        if state is not None and T == 1 and reset is None:
            out, new_state = self.step(x[:, 0], state)
            return out[:, None], (new_state if return_state else None)
        u, z = self.in_proj(x).chunk(2, dim=-1)
        u, conv_state = self.conv(u, None if state is None else state["conv"], reset, silu=True)
        dt_low, Bm, Cm = self.x_proj(u).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = dt_preactivation(dt_low, self.dt_weight, self.dt_bias)  # the scans apply softplus
        A = decay_rate(self.A_log)
        y, ssm = selective_scan(
            u, dt, A, Bm, Cm, self.D, initial_state=None if state is None else state["ssm"], reset=reset,
            output_final_state=return_state, chunk_size=self.chunk_size, dt_softplus=True,
        )
        out = self.out_proj(output_gate(y, z))
        return out, ({"conv": conv_state, "ssm": ssm} if return_state else None)

    def step(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One decoding step for every row: x [B, d], state {"conv": [B, d_conv - 1, Din], "ssm": [B, Din, N]} ->
        (out [B, d], the new state). The same arithmetic as :meth:`forward` on one token, on 2-D rows (no
        [B, 1, .] reshapes, no argument checks, A = -exp(A_log) cached between steps): at batch 1 a decoding step
        reads every weight once, and below the matrix-vector products the rest is per-op overhead. So in float32
        without a gradient the conv's step and the scan's step (dt projection, softplus, update, read-out, skip and
        gate) are one C call each (linlm.ops.step_kernel); otherwise about 15 tensor ops."""
        Din, N, R = self.d_inner, self.d_state, self.dt_rank
        fused = self._fused_step(x, state)
        if fused is not None:
            return fused
        xz = self.in_proj(x)  # modules, not their .weight: a quantized layer computes in int8
        if has_hooks(self.conv):  # through the module, so that its hooks run as in the full pass
            u, conv_state = self.conv(xz[:, None, :Din], state["conv"], silu=True)
            u = u[:, 0]
        else:
            u, conv_state = self.conv.step(xz[:, :Din], state["conv"], silu=True)
        xp, z, A = self.x_proj(u), xz[:, Din:], self.decay()
        if step_kernel.mamba_step_takes(u, xp, z, self.dt_weight, self.dt_bias, A, self.D, state["ssm"]):
            y, ssm = step_kernel.mamba_step(u, xp, z, self.dt_weight, self.dt_bias, A, self.D, state["ssm"])
            return self.out_proj(y), {"conv": conv_state, "ssm": ssm}
        dt_low, Bm, Cm = xp.split([R, N, N], dim=-1)
        if u.dtype == self.dt_weight.dtype == torch.float32 and not torch.is_autocast_enabled(u.device.type):
            dt = torch.addmm(self.dt_bias, dt_low, self.dt_weight.t())  # what dt_preactivation computes here
        else:
            dt = dt_preactivation(dt_low, self.dt_weight, self.dt_bias)
        y, ssm = scan_step_unchecked(u, dt, A, Bm, Cm, self.D, state["ssm"], True)
        # y * silu(z) in two ops: at one row the gate kernel's call costs more than its arithmetic.
        gated = F.silu(z).mul_(y)
        return self.out_proj(gated), {"conv": conv_state, "ssm": ssm}

    def _fused_step(self, x: torch.Tensor, state: dict):
        """The whole step in one call of linlm.ops.step_kernel.mamba_mixer_step where :meth:`kernel_args` gives its
        arguments; None otherwise."""
        args = self.kernel_args(x, state)
        if args is None:
            return None
        out, conv_state, ssm = step_kernel.mamba_mixer_step(x, *args)
        return out, {"conv": conv_state, "ssm": ssm}

    def kernel_args(self, x: torch.Tensor, state: dict):
        """The arguments after x of linlm.ops.step_kernel.mamba_mixer_step for this mixer's step on x [B, d] from
        ``state``, where the kernel takes them (float32, no gradient, at most 8 rows) and computes what the modules
        would: the three projections plain Linear layers or int8 ones (linlm.layers.linear.decode_weights) and no
        hook on them or on the conv; None otherwise. The model's one-call step (linlm.models.fused_step) reads
        them too."""
        mods, params = self._modules, self._parameters  # dict lookups: a step reads 15 tensors here
        in_proj, x_proj, out_proj = (decode_weights(mods[k]) for k in ("in_proj", "x_proj", "out_proj"))
        conv = mods["conv"]
        if in_proj is None or x_proj is None or out_proj is None or has_hooks(conv):
            return None
        conv = conv._parameters
        args = (in_proj, state["conv"], conv["weight"], conv.get("bias"), x_proj, params["dt_weight"],
                params["dt_bias"], self.decay(), params["D"], out_proj, state["ssm"])
        return args if step_kernel.mamba_mixer_step_takes(x, *args) else None

    def decay(self) -> torch.Tensor:
        """decay_rate(A_log), recomputed only when A_log changed (its version counter or storage); while torch
        traces (export, compile) it is computed in the graph."""
        if torch.compiler.is_compiling() or torch.compiler.is_exporting() or self.A_log.requires_grad and \
                torch.is_grad_enabled():
            return decay_rate(self.A_log)
        key = (self.A_log._version, self.A_log.data_ptr(), self.A_log.dtype, self.A_log.device)
        cached = getattr(self, "_decay_cache", None)
        if cached is None or cached[0] != key:
            cached = self._decay_cache = (key, decay_rate(self.A_log).detach())
        return cached[1]

    def mixing_flops_per_token(self, seq_len: int) -> float:
        # dt_proj (a plain parameter) + scan + the output gate; the Linear layers and the conv are counted by the walk.
        return 2.0 * self.dt_rank * self.d_inner + scan_flops_per_token(self.d_inner, self.d_state) + self.d_inner

    def state_spec(self, batch: int, context: int, dtype: torch.dtype):
        """{"conv": the conv window [B, d_conv - 1, Din], "ssm": the scan state [B, Din, N] in float32 at least}."""
        return {"conv": self.conv.state_spec(batch, dtype),
                "ssm": meta(batch, self.d_inner, self.d_state, dtype=float32_at_least(dtype))}
