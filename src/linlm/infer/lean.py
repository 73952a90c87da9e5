"""Decoding a saved Mamba model on linlm's C kernels alone, in a process that never imports torch.

Why: torch's own resident memory is more than a whole 130M-parameter model in int8 (benchmarks/bench_llamacpp.py:
with torch loaded a decoding process of mamba-130m's shape peaked at 1.54x llama.cpp's in float32 and 2.14x in
int8 on an AMD EPYC Zen 5; through this module at 0.96x and 1.00x). A process that only decodes a Mamba runs every
step in one call of the kernel library's ``mamba_model_step`` anyway (what ``model.step`` runs for such a model,
linlm.models.fused_step), so here the runtime around that call is numpy:

- the model's files are read with linlm.models.files (config checksum, optionally the weights' sha256, the
  safetensors layout), and the weights are views of one private memory map of the file, as linlm.load holds them;
- a step is one call of ``mamba_model_step`` (batch 1), its state in two preallocated buffers used in turn;
- a prefill runs layer by layer in pieces of PIECE tokens: the RMSNorms in numpy, the float32 projections as numpy
  matrix products (BLAS, at ``threads`` threads), the int8 ones on linlm's int8 kernel (``gemv_q8``, Q8_MAX_ROWS
  rows a call, as linlm.models.quant.prefill_tokens does), the causal conv, the scan and the gate on the kernels
  that linlm's forward runs them on (``conv_fwd``, ``scan_fwd`` from the state and to the state, ``silu_mul_fwd``).

Constructing one applies linlm's allocator settings to the process (linlm.runtime.tune_allocator, as linlm's
commands do; ``LINLM_ALLOCATOR=system`` keeps glibc's): with glibc's own, each piece's fresh activations are new
pages to fault in (benchmarks/bench_lean.py, Zen 5, 2 threads, pieces of 256: 777 tokens/s against 1,072 in
float32, 1,030 against 1,372 in int8).

It computes what linlm's model computes for such a model (the tests check the logits of prefill and steps against
``model.prefill`` and ``model.step``, float32 and int8), for what the one-call step takes: arch "mamba" with RMSNorm
and no attention layers, float32 or int8 (``linlm quantize --to int8``) weights, a state size the scan kernel takes
(at most MAX_STATE); anything else is refused with a one-line error. benchmarks/bench_llamacpp.py times it against
llama.cpp, peak resident memory included.

    engine = LeanMamba("runs/mamba-int8", threads=1)
    logits = engine.prefill(prompt_ids)           # [V] after the last prompt token
    ids = engine.generate(prompt_ids, 32)         # greedy
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from linlm.errors import CheckpointError, ConfigError
from linlm.io_utils import sha256_file
from linlm.models.files import CONFIG, WEIGHTS, read_meta, tensor_layout
from linlm.models.sampling import check_sampling
from linlm.ops import kernel_library
from linlm.runtime import tune_allocator
from linlm.ops.kernel_entries import (CKPT, CONV_TB, GATE_ROWS, GEMV_ROWS, MAX_STATE, Q8_MAX_K, Q8_MAX_ROWS,
                                      STEP_FIELDS, TILE, ConvFwd, GemvQ8, MambaModelStep, ScanFwd, SiluMulFwd)

__all__ = ["PIECE", "LeanMamba"]

# Tokens per prefill piece: a piece's activations (about 40 KiB a token at mamba-130m's shape) are what a prefill
# holds beside the weights, and longer pieces gain little past a few hundred tokens. benchmarks/bench_lean.py, AMD
# EPYC Zen 5, that shape, 2,048 tokens, 2 threads: float32 835 tokens/s in pieces of 64, 1,072 of 256, 1,107 of
# 1,024, peak resident set 488, 496 and 531 MiB; int8 1,286, 1,372 and 1,343 tokens/s, 190, 198 and 232 MiB.
PIECE = 256
_NUMPY = {"F32": np.float32, "I8": np.int8}


def _sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator) -> int:
    """One id from logits [V]: the argmax at temperature 0; else softmax(logits / T) restricted to the top k ids
    and then to the smallest set of most likely ids whose probability reaches top_p (the most likely always
    stays), drawn with ``rng``."""
    if temperature == 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if 0 < top_k < z.size:
        z[z < np.partition(z, -top_k)[-top_k]] = -np.inf
    if top_p < 1:
        order = np.argsort(-z, kind="stable")
        p = np.exp(z[order] - z[order[0]])
        p /= p.sum()
        z[order[(np.cumsum(p) - p) >= top_p]] = -np.inf  # the ids ranked after the nucleus is reached
    p = np.exp(z - z.max())
    return int(rng.choice(z.size, p=p / p.sum()))


class LeanMamba:
    """A saved Mamba model (float32 or int8) decoded on the C kernels, with numpy around them: see the module's
    docstring. One sequence; :meth:`prefill` and :meth:`step` carry its state, :meth:`reset` starts a new one."""

    def __init__(self, path, *, threads: int = 1, verify: bool = True):
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"threads must be a positive integer, got {threads!r}")
        if kernel_library.backend() == "torch" or kernel_library.library() is None:
            raise ConfigError("lean decoding runs on linlm's C kernels, which are switched off "
                              "(LINLM_SCAN_BACKEND=torch) or could not be built (no C compiler); unset the variable "
                              "or install gcc, or decode with linlm generate")
        tune_allocator()  # the process's allocator settings, as linlm's commands take them (see its docstring)
        self.path, self.threads = Path(path), threads
        self._kernel_threads = threads
        runs = sorted((self.path / "checkpoints").glob("step_*")) if not (self.path / CONFIG).exists() else []
        if runs:
            raise CheckpointError(f"{self.path}: is a training run; lean decoding reads one checkpoint directory, "
                                  f"e.g. its newest: {runs[-1]}")
        meta = read_meta(self.path)
        cfg = meta.get("config", {})
        self._check_config(cfg, meta.get("quantization"))
        wfile = self.path / WEIGHTS
        if not wfile.is_file():
            raise CheckpointError(f"{self.path}: no {WEIGHTS} found; the checkpoint is incomplete")
        if verify and meta.get("weights_sha256") is not None and sha256_file(wfile) != meta["weights_sha256"]:
            raise CheckpointError(f"{wfile}: checksum mismatch (truncated or modified file); restore it or save again")
        self._tensors = self._map(wfile)
        self.eps = float(cfg["norm_eps"])
        self._read_weights(cfg["n_layers"])
        self._allocate()
        self.reset()

    # ------------------------------------------------------------------------------------------------ loading

    def _check_config(self, cfg: dict, quantization) -> None:
        where = self.path / CONFIG
        if cfg.get("arch") != "mamba":
            raise ConfigError(f"{where}: lean decoding runs plain Mamba models; this is a {cfg.get('arch')!r} model: "
                              f"decode it with linlm generate")
        if cfg.get("norm_type", "auto") not in ("auto", "rms") or cfg.get("attn_layers") or cfg.get("attn_every"):
            raise ConfigError(f"{where}: lean decoding runs Mamba blocks with RMSNorm and no attention layers; this "
                              f"model has norm_type={cfg.get('norm_type')!r}, attn_layers={cfg.get('attn_layers')!r}, "
                              f"attn_every={cfg.get('attn_every')!r}: decode it with linlm generate")
        for key, types in (("n_layers", int), ("norm_eps", (int, float))):
            if isinstance(cfg.get(key), bool) or not isinstance(cfg.get(key), types):
                raise CheckpointError(f"{where}: the model config's {key} is {cfg.get(key)!r}, not a number of the "
                                      f"kind linlm saves; the file is corrupt, save the model again")
        if quantization is not None and (not isinstance(quantization, dict) or quantization.get("method") != "int8"):
            raise ConfigError(f"{where}: lean decoding reads float32 or int8 weights; this model's quantization is "
                              f"{quantization!r}: decode it with linlm generate")

    def _map(self, wfile: Path) -> dict[str, np.ndarray]:
        layout = tensor_layout(wfile)
        if layout is None:
            raise CheckpointError(f"{wfile}: cannot be read as safetensors; the file is corrupt or truncated")
        odd = sorted(f"{name} ({dtype})" for name, (dtype, _, _) in layout.items() if dtype not in _NUMPY)
        if odd:
            raise ConfigError(f"{wfile}: lean decoding reads float32 or int8 weights; {', '.join(odd[:3])} is not: "
                              f"decode it with linlm generate")
        with open(wfile, "rb") as f:  # private (copy on write): the file is never changed
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        out = {}
        for name, (dtype, shape, offset) in layout.items():
            count = int(np.prod(shape, dtype=np.int64))
            out[name] = np.frombuffer(self._mmap, dtype=_NUMPY[dtype], count=count, offset=offset).reshape(shape)
        return out

    def _take(self, name: str, shape: Optional[tuple] = None, dtype=np.float32) -> np.ndarray:
        t = self._tensors.get(name)
        if t is None:
            raise CheckpointError(f"{self.path / WEIGHTS}: tensor {name!r} is missing; the weights do not match a "
                                  f"Mamba model")
        if t.dtype != dtype or (shape is not None and t.shape != shape):
            raise CheckpointError(f"{self.path / WEIGHTS}: tensor {name!r} is {t.dtype} {list(t.shape)}; a Mamba of "
                                  f"this model's sizes needs {np.dtype(dtype)} {list(shape or t.shape)}")
        self._used.add(name)
        return t

    def _projection(self, name: str, rows: int, cols: int) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """(weight, row scales or None): float32 [rows, cols], or int8 with float32 scales [rows]."""
        w = self._tensors.get(name)
        if w is not None and w.dtype == np.int8:
            if cols > Q8_MAX_K:
                raise ConfigError(f"{self.path}: {name} reads {cols} features, more than the int8 kernel's "
                                  f"{Q8_MAX_K}; decode it with linlm generate")
            return self._take(name, (rows, cols), np.int8), self._take(name + "_scale", (rows,))
        return self._take(name, (rows, cols)), None

    def _read_weights(self, n_layers: int) -> None:
        self._used: set[str] = set()
        if n_layers < 1:
            raise ConfigError(f"{self.path}: lean decoding needs at least one layer; this model has {n_layers}")
        first = "layers.0.mixer."
        (Din, N), R = self._take(first + "A_log").shape, self._take(first + "dt_weight").shape[1]
        K = self._take(first + "conv.weight").shape[1]
        emb = self._tensors.get("embed.weight")
        if emb is None or emb.ndim != 2:
            raise CheckpointError(f"{self.path / WEIGHTS}: no embedding table 'embed.weight' [V, d]")
        V, d = emb.shape
        if N > MAX_STATE or K < 2:
            raise ConfigError(f"{self.path}: lean decoding needs d_state <= {MAX_STATE} (the scan kernel's) and "
                              f"d_conv >= 2; this model has {N} and {K}: decode it with linlm generate")
        self.sizes = dict(d=d, Din=Din, N=N, R=R, K=K, V=V, L=n_layers)
        self.embed = self._projection("embed.weight", V, d)
        self.final_w = self._take("norm.weight", (d,))
        self.head = self._projection("head.weight", V, d) if "head.weight" in self._tensors else self.embed
        self.layers = []
        for i in range(n_layers):
            p = f"layers.{i}.mixer."
            conv_w = self._take(p + "conv.weight", (Din, K))
            conv_b = self._take(p + "conv.bias", (Din,)) if p + "conv.bias" in self._tensors else None
            self.layers.append(dict(
                norm=self._take(f"layers.{i}.norm1.weight", (d,)),
                w_in=self._projection(p + "in_proj.weight", 2 * Din, d),
                # the step reads the taps as [Din, K] with an optional bias, the prefill's conv as [K, Din] with one
                conv_w=conv_w, conv_b=conv_b, conv_wt=np.ascontiguousarray(conv_w.T),
                conv_bias=conv_b if conv_b is not None else np.zeros(Din, np.float32),
                w_x=self._projection(p + "x_proj.weight", R + 2 * N, Din),
                dt_w=self._take(p + "dt_weight", (Din, R)), dt_b=self._take(p + "dt_bias", (Din,)),
                A=-np.exp(self._take(p + "A_log", (Din, N))), D=self._take(p + "D", (Din,)),
                w_out=self._projection(p + "out_proj.weight", d, Din)))
        unknown = sorted(set(self._tensors) - self._used)
        if unknown:
            raise ConfigError(f"{self.path / WEIGHTS}: lean decoding runs plain Mamba blocks; this model also holds "
                              f"{', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}: decode it with "
                              f"linlm generate")

    def _allocate(self) -> None:
        s = self.sizes
        d, Din, N, R, K, V, L = (s[k] for k in ("d", "Din", "N", "R", "K", "V", "L"))
        # each layer's conv window and scan state, twice: a step reads one and writes the other
        self._conv = np.zeros((2, L, 1, K - 1, Din), np.float32)
        self._ssm = np.zeros((2, L, 1, Din, N), np.float32)
        self._h = np.zeros((1, d), np.float32)
        self._logits = np.zeros((1, V), np.float32)
        work = np.empty(2 * d + 4 * Din + R + 2 * N, np.float32)
        self._int8 = any(w[1] is not None for w in [self.head] + [p for lay in self.layers
                                                                 for p in (lay["w_in"], lay["w_x"], lay["w_out"])])
        xq = np.empty((self.threads, max(d, Din) if self._int8 else 1), np.int8)
        self._step_calls = []
        for parity in (0, 1):
            rows = []
            for i, lay in enumerate(self.layers):
                st, new_st = self._conv[parity, i], self._conv[1 - parity, i]
                s_in, s_out = self._ssm[parity, i], self._ssm[1 - parity, i]
                values = dict(norm=lay["norm"], w_in=lay["w_in"][0], sc_in=lay["w_in"][1], b_in=None,
                              conv_w=lay["conv_w"], conv_b=lay["conv_b"], w_x=lay["w_x"][0], sc_x=lay["w_x"][1],
                              b_x=None, dt_w=lay["dt_w"], dt_b=lay["dt_b"], A=lay["A"], D=lay["D"],
                              w_out=lay["w_out"][0], sc_out=lay["w_out"][1], b_out=None, st=st, ss=st[0].size,
                              s=s_in, new_st=new_st, s_out=s_out)
                rows.append([v if isinstance(v, int) else 0 if v is None else kernel_library.address(v)
                             for v in (values[f] for f in STEP_FIELDS)])
            tab = np.array(rows, dtype=np.int64)
            call = MambaModelStep(h=self._h, tab=tab, L=L, final_w=self.final_w, w_head=self.head[0],
                                  sc_head=self.head[1], work=work, xq=xq, logits=self._logits, Bt=1, d=d, Din=Din,
                                  N=N, R=R, K=K, V=V, eps=self.eps)
            # one work item whose stages the C code splits over the whole team itself
            self._step_calls.append((tab, self._runner(MambaModelStep, call, 1, team=True)))
        self._keep = (work, xq)

    def _runner(self, entry, call, nitems: int, team: bool = False):
        """A function of no arguments that runs ``call`` over ``nitems`` work items: NAME_par over min(threads,
        nitems) threads (``team``: all ``threads``, for an entry point that splits its one item's stages over them)
        where the library has OpenMP and more than one thread is asked for, else NAME on this thread. Within a
        float32 prefill ``threads`` is 1 (see :meth:`prefill`)."""
        threads = self._kernel_threads if team else min(self._kernel_threads, nitems)
        if threads > 1 and kernel_library.library().openmp:
            fn, args = kernel_library.function(entry, "f32", parallel=True), call.par_args() + [nitems, threads]
        else:
            fn, args = kernel_library.function(entry, "f32"), call.c_args() + [0, nitems]
        return lambda: fn(*args)

    # ------------------------------------------------------------------------------------------------ decoding

    def reset(self) -> None:
        """Start a new sequence: zero states."""
        self._conv.fill(0.0)
        self._ssm.fill(0.0)
        self._parity = 0
        self.position = 0

    def state_nbytes(self) -> int:
        """Bytes of the sequence's state: every layer's conv window and scan state (constant in the context)."""
        return self._conv[0].nbytes + self._ssm[0].nbytes

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        w, sc = self.embed
        return w[ids].astype(np.float32) * sc[ids, None] if sc is not None else w[ids].astype(np.float32)

    def _ids(self, ids) -> np.ndarray:
        arr = np.asarray(ids)
        V = self.sizes["V"]
        if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
            raise ConfigError(f"token ids must be a non-empty sequence of integers, got shape {arr.shape} "
                              f"of {arr.dtype}")
        if arr.min() < 0 or arr.max() >= V:
            raise ConfigError(f"token ids must lie in [0, {V}) (the model's vocabulary); got {int(arr.min())} .. "
                              f"{int(arr.max())}")
        return arr.astype(np.int64)

    def step(self, token: int) -> np.ndarray:
        """Logits [V] after one more token (a view of the engine's buffer: copy it to keep it past the next call)."""
        self._h[:] = self._embed(self._ids([token]))
        _, run = self._step_calls[self._parity]
        run()
        self._parity = 1 - self._parity
        self.position += 1
        return self._logits[0]

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Run the tokens ``ids`` from the current state (the prompt, or more of it); logits [V] after the last.

        Threads: numpy's BLAS (OpenBLAS) and the kernels' OpenMP are two thread pools, and each keeps its threads
        waiting actively for a while after a call, so that running both on the same cores slows both. With float32
        weights the projections, most of the work, run at ``threads`` BLAS threads and the kernels between them on
        one; with int8 weights the kernels (the products among them) run at ``threads`` and BLAS (the small dt
        product) on one."""
        ids = self._ids(ids)
        blas = 1 if self._int8 else self.threads
        self._kernel_threads = self.threads if blas == 1 else 1
        try:
            with threadpool_limits(limits=blas, user_api="blas"):
                for start in range(0, len(ids), PIECE):
                    h = self._embed(ids[start:start + PIECE])
                    for i, lay in enumerate(self.layers):
                        h += self._mixer(h, i, lay)
                    self._parity = 1 - self._parity
                    self.position += len(h)
        finally:
            self._kernel_threads = self.threads
        last = self._rms(h[-1:], self.final_w)
        return self._product(last, self.head)[0]

    def generate(self, ids: Sequence[int], max_new_tokens: int, stop: Optional[int] = None) -> list[int]:
        """Greedy continuation of ``ids`` from a fresh state: up to ``max_new_tokens`` new ids (ending at ``stop``)."""
        return list(self.stream(ids, max_new_tokens, temperature=0.0, eos_id=stop))

    def stream(self, ids: Sequence[int], max_new_tokens: int, *, temperature: float = 0.8, top_k: int = 40,
               top_p: float = 1.0, seed: Optional[int] = 0, eos_id: Optional[int] = None) -> Iterator[int]:
        """Yield the new ids after ``ids`` one by one, from a fresh state, sampled as ``linlm generate`` samples
        (greedy at temperature 0, else softmax(logits / T) within the top k and the top-p nucleus), with numpy's
        generator seeded by ``seed``; stops after ``eos_id``. An empty prompt starts from ``eos_id``."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise ConfigError(f"max_new_tokens: must be a whole number >= 0, got {max_new_tokens!r}")
        check_sampling(temperature, top_k, top_p, max_new_tokens)
        ids = list(ids) or ([eos_id] if eos_id is not None else [])
        self.reset()
        if max_new_tokens == 0:
            return
        rng = np.random.default_rng(seed)
        logits = self.prefill(ids)
        for i in range(max_new_tokens):
            token = _sample(logits, temperature, top_k, top_p, rng)
            yield token
            if token == eos_id or i + 1 == max_new_tokens:
                return
            logits = self.step(token)

    # ------------------------------------------------------------------------------------------------ the prefill

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(self.eps)) * w

    def _product(self, x: np.ndarray, proj) -> np.ndarray:
        """x [M, K] (W)^T for a projection (float32 weight, None) or (int8 weight, row scales): the int8 kernel
        takes Q8_MAX_ROWS rows of x a call, each weight row summed against all of them."""
        w, sc = proj
        if sc is None:
            return x @ w.T
        x = np.ascontiguousarray(x, dtype=np.float32)
        (M, Kf), Nw = x.shape, w.shape[0]
        y = np.empty((M, Nw), np.float32)
        items = -(-Nw // GEMV_ROWS)
        xq = np.empty((max(1, min(self._kernel_threads, items)), min(M, Q8_MAX_ROWS) * Kf), np.int8)
        for r0 in range(0, M, Q8_MAX_ROWS):
            r1 = min(M, r0 + Q8_MAX_ROWS)
            call = GemvQ8(x=x[r0:r1], q=w, s=sc, b=None, y=y[r0:r1], xq=xq, R=r1 - r0, N=Nw, K=Kf)
            self._runner(GemvQ8, call, items)()
        return y

    def _mixer(self, h: np.ndarray, i: int, lay: dict) -> np.ndarray:
        """The mixer's output for the piece h [T, d] (not yet added to h); layer i's states move to the other
        buffer."""
        s = self.sizes
        Din, N, R, K = s["Din"], s["N"], s["R"], s["K"]
        T, cur, nxt = len(h), self._parity, 1 - self._parity
        xz = self._product(self._rms(h, lay["norm"]), lay["w_in"])  # [T, 2 Din]: u, then the gate z
        # the causal depthwise conv with its SiLU, reading u in place (rows 2 Din apart) after the conv window
        u = np.empty((T, Din), np.float32)
        conv = ConvFwd(x=xz, state=self._conv[cur, i], wt=lay["conv_wt"], bias=lay["conv_bias"], since=None, out=u,
                       Bt=1, T=T, C=Din, K=K, xs=2 * Din)
        self._runner(ConvFwd, conv, -(-T // CONV_TB))()
        window = np.concatenate([self._conv[cur, i, 0], xz[-(K - 1):, :Din]])  # T < K - 1 keeps older inputs
        self._conv[nxt, i, 0] = window[-(K - 1):]
        xp = self._product(u, lay["w_x"])
        dt = xp[:, :R] @ lay["dt_w"].T + lay["dt_b"]  # the pre-activation: the kernel applies softplus
        b, c = np.ascontiguousarray(xp[:, R:R + N]), np.ascontiguousarray(xp[:, R + N:])
        y = np.empty((T, Din), np.float32)
        scan = ScanFwd(u=u, dt=np.ascontiguousarray(dt), A=lay["A"], a_bstride=0, Bm=b, Cm=c, D=lay["D"],
                       d_bstride=0, reset=None, lengths=None, dt_sp=1, Bt=1, T=T, Din=Din, N=N, K=CKPT,
                       init=self._ssm[cur, i], y=y, final=self._ssm[nxt, i], ckpt=None)
        self._runner(ScanFwd, scan, -(-Din // TILE))()
        gated = np.empty((T, Din), np.float32)  # y silu(z), z read in place
        gate = SiluMulFwd(g=xz[:, Din:], gs=2 * Din, u=y, us=Din, out=gated, M=T, F=Din)
        self._runner(SiluMulFwd, gate, -(-T // GATE_ROWS))()
        return self._product(gated, lay["w_out"])
