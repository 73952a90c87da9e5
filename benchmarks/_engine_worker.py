"""One engine's measurements for benchmarks/bench_llamacpp.py, in a process of its own (its peak resident set is the
engine's alone): ``python _engine_worker.py linlm MODEL_DIR ...`` under linlm's environment, or
``python _engine_worker.py lean MODEL_DIR ...`` (linlm.infer.lean: no torch in the process) or
``python _engine_worker.py llamacpp MODEL.gguf ...`` under llama.cpp's (benchmarks/_llamacpp_env.py). Prints one
JSON object on its last line of output.

The same protocol for both engines, at batch 1 and the given threads:
1. load the model;
2. greedy tokens: a seeded random prompt of ``--greedy-prompt`` ids, then ``--greedy-tokens`` argmax steps;
3. for each context n of ``--contexts`` (ascending): prefill a seeded random prompt of n ids (timed: tokens/s), then
   decode ``--decode-tokens`` tokens one at a time, each the argmax of the last logits (timed, after one untimed
   step: the median per token);
4. the process's peak resident set (VmHWM), which includes the interpreter and the engine's runtime;
5. with ``--batches``, batched decoding, after the peak above is read (a batch's prefill would raise it): for each B,
   B sequences, each a seeded random prompt of ``--batch-prompt`` ids, are prefilled (each on its own), then decoded
   together, one token per sequence per step, each the argmax of its own logits; the aggregate tokens/s is B over
   the median step time (after one untimed step). linlm steps a [B] batch of tokens through ``model.step``;
   llama.cpp decodes a batch of B tokens, one per sequence id, in a context of B sequence slots (``n_seq_max``: a
   recurrent state each), through its C API (llama-cpp-python's ``Llama`` class holds one sequence).

Each timing is taken on the wall clock and on the process's CPU clock. At one thread the CPU clock is the robust
number on a shared machine (time spent descheduled is not counted); at more threads the wall clock is the latency.
Token ids are drawn from [0, vocab) with numpy's seeded generator, the same ids for both engines.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

import numpy as np


class Clock:
    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def peak_rss() -> int:
    """This process's peak resident set, VmHWM (ru_maxrss would carry over the parent's peak through fork)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def prompt_ids(n: int, vocab: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, size=n).tolist()


class LinlmEngine:
    def __init__(self, path: str, threads: int, compile_step: bool = False):
        import torch

        from linlm.infer.generate import load_model
        from linlm.runtime import tune_allocator

        tune_allocator()
        torch.set_num_threads(threads)
        self.torch = torch
        self.model, _ = load_model(path)
        self.vocab = self.model.config.vocab_size
        self.state = None
        self.compile_s = None
        if compile_step:
            if not self.model.compile_step():
                raise SystemExit(f"{path}: this model's step cannot be compiled (its state grows)")
            clock = Clock()
            self.prefill([0])
            self.step(0)  # compiles
            self.compile_s = clock.stop()[0]
            if not self.model.step_compiled:
                raise SystemExit(f"{path}: the compiled step failed (see the warning above)")

    def prefill(self, ids: list[int]) -> int:
        logits, self.state = self.model.prefill(self.torch.tensor([ids]))
        return int(logits[0].argmax())

    def step(self, token: int) -> int:
        logits, self.state = self.model.step(self.torch.tensor([token]), self.state)
        return int(logits[0].argmax())

    def state_bytes(self):
        return self.state.nbytes()

    def batch_prefill(self, prompts: list[list[int]]) -> list[int]:
        """All prompts at once ([B, n]: they are of one length); the argmax after each."""
        logits, self.state = self.model.prefill(self.torch.tensor(prompts))
        return logits.argmax(-1).tolist()

    def batch_step(self, tokens: list[int]) -> list[int]:
        logits, self.state = self.model.step(self.torch.tensor(tokens), self.state)
        return logits.argmax(-1).tolist()


class LeanEngine:
    """linlm's lean decoding (linlm.infer.lean.LeanMamba) of the same saved model: the C kernels with numpy around
    them, no torch in the process (the worker reports whether it was imported)."""

    def __init__(self, path: str, threads: int):
        from linlm.infer.lean import LeanMamba

        self.engine = LeanMamba(path, threads=threads)
        self.vocab = self.engine.sizes["V"]

    def prefill(self, ids: list[int]) -> int:
        self.engine.reset()
        return int(np.argmax(self.engine.prefill(ids)))

    def step(self, token: int) -> int:
        return int(np.argmax(self.engine.step(token)))

    def state_bytes(self):
        return self.engine.state_nbytes()


class LlamaCppEngine:
    def __init__(self, path: str, threads: int, n_ctx: int):
        from llama_cpp import Llama

        self.llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
        self.vocab = self.llm.n_vocab()

    def _argmax(self) -> int:
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.vocab,))
        return int(logits.argmax())

    def prefill(self, ids: list[int]) -> int:
        self.llm.reset()
        self.llm.eval(ids)
        return self._argmax()

    def step(self, token: int) -> int:
        self.llm.eval([token])
        return self._argmax()

    def state_bytes(self):
        return None


class LlamaCppBatch:
    """llama.cpp decoding B sequences at once, through its C API: a context with B sequence slots (``n_seq_max``, a
    recurrent state each), each prompt decoded under its own sequence id, then steps of B tokens, one per id."""

    def __init__(self, path: str, threads: int, batch: int, n_prompt: int, n_ctx: int):
        import llama_cpp as lc

        self.lc = lc
        lc.llama_backend_init()
        self.model = lc.llama_model_load_from_file(path.encode(), lc.llama_model_default_params())
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        self.vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        params = lc.llama_context_default_params()
        params.n_ctx, params.n_seq_max = n_ctx * batch, batch
        params.n_batch = params.n_ubatch = max(n_prompt, batch)
        params.n_threads = params.n_threads_batch = threads
        self.ctx = lc.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise SystemExit(f"llama.cpp could not make a context of {batch} sequences")
        self.batch = lc.llama_batch_init(max(n_prompt, batch), 0, 1)
        self.pos = [0] * batch

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """entries: (token, position, sequence id, whether its logits are wanted)."""
        b = self.batch
        b.n_tokens = len(entries)
        for i, (token, pos, seq, want) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, want
            b.seq_id[i][0] = seq
        status = self.lc.llama_decode(self.ctx, b)
        if status != 0:
            raise SystemExit(f"llama_decode failed with status {status}")

    def _argmax(self, i: int) -> int:
        ptr = self.lc.llama_get_logits_ith(self.ctx, i)
        return int(np.ctypeslib.as_array(ptr, shape=(self.vocab,)).argmax())

    def batch_prefill(self, prompts: list[list[int]]) -> list[int]:
        out = []
        for seq, ids in enumerate(prompts):
            self._decode([(t, p, seq, p == len(ids) - 1) for p, t in enumerate(ids)])
            self.pos[seq] = len(ids)
            out.append(self._argmax(len(ids) - 1))
        return out

    def batch_step(self, tokens: list[int]) -> list[int]:
        self._decode([(t, self.pos[seq], seq, True) for seq, t in enumerate(tokens)])
        for seq in range(len(tokens)):
            self.pos[seq] += 1
        return [self._argmax(i) for i in range(len(tokens))]

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


def median_step(step, token, n: int) -> tuple[float, float]:
    """Median seconds, wall and CPU, of ``n`` decoding steps after one untimed step, each feeding ``step`` what the
    one before returned (the argmax token, or a batch's tokens)."""
    token = step(token)
    walls, cpus = [], []
    for _ in range(n):
        clock = Clock()
        token = step(token)
        w, c = clock.stop()
        walls.append(w)
        cpus.append(c)
    return statistics.median(walls), statistics.median(cpus)


def batched_decode(engine, batch: int, n_prompt: int, steps: int, vocab: int, seed: int) -> dict:
    """Protocol item 5 for one batch size: the first tokens after the prompts (for the agreement between engines),
    then the median step time, wall and CPU, and the aggregate tokens/s from each."""
    prompts = [prompt_ids(n_prompt, vocab, seed + 7919 * batch + i) for i in range(batch)]
    first = engine.batch_prefill(prompts)
    wall, cpu = median_step(engine.batch_step, first, steps)
    return {"first_tokens": first, "step_ms_wall": 1e3 * wall, "step_ms_cpu": 1e3 * cpu,
            "tokens_per_s_wall": batch / wall, "tokens_per_s_cpu": batch / cpu}


def time_per_call(fn, cpu: bool, min_s: float = 0.3) -> float:
    """Median seconds per call of fn over 5 rounds of back-to-back calls (each round at least min_s / 5)."""
    fn()
    rounds = []
    for _ in range(5):
        n, start = 0, (time.process_time() if cpu else time.perf_counter())
        while True:
            fn()
            n += 1
            spent = (time.process_time() if cpu else time.perf_counter()) - start
            if spent >= min_s / 5:
                break
        rounds.append(spent / n)
    return statistics.median(rounds)


def profile_step(engine: LinlmEngine, cpu: bool) -> dict:
    """Where a batch-1 decoding step's time goes, in ms: the whole step; the matrix-vector products alone (every
    Linear and the head, one row through each in layer order, with the model's own weights: the part that reads the
    weights, bounded by the memory bandwidth); the dispatch floor (the step of a model of the same architecture and
    depth at width 16 and vocabulary 64, whose arithmetic is negligible: Python, module calls and per-op dispatch);
    and the rest (the element-wise work at full width: conv, gates, the state update and read-out)."""
    import torch
    from torch import nn

    from linlm.layers.linear import linear
    from linlm.models.lm import create_model
    from linlm.models.quant import QuantLinear

    model = engine.model
    token = torch.tensor([1])
    _, state = model.prefill(torch.tensor([[1, 2, 3]]))

    def step():
        nonlocal state
        _, state = model.step(token, state)

    linears = [m for m in model.modules() if isinstance(m, (nn.Linear, QuantLinear))]
    if model.head is None:  # tied: the head is the embedding matrix, through the function the model's head calls
        linears.append(lambda x: linear(x, model.embed.weight))
    rows = {}

    def matvecs():
        with torch.no_grad():
            for lin in linears:
                k = lin.in_features if hasattr(lin, "in_features") else model.config.d_model
                x = rows.get(k)
                if x is None:
                    x = rows[k] = torch.randn(1, k)
                lin(x)

    cfg = model.config
    small = create_model(cfg.arch, d_model=16, n_heads=1, n_layers=cfg.n_layers, vocab_size=64,
                         options=cfg.options).eval()
    if model.step_compiled:
        small.compile_step()
    _, small_state = small.prefill(torch.tensor([[1, 2, 3]]))

    def small_step():
        nonlocal small_state
        _, small_state = small.step(token, small_state)

    whole = time_per_call(step, cpu)
    products = time_per_call(matvecs, cpu)
    dispatch = time_per_call(small_step, cpu)
    return {"step_ms": 1e3 * whole, "matvec_ms": 1e3 * products, "dispatch_ms": 1e3 * dispatch,
            "rest_ms": 1e3 * (whole - products - dispatch)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("engine", choices=["linlm", "lean", "llamacpp"])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--contexts", default="128,2048")
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--greedy-prompt", type=int, default=32)
    ap.add_argument("--greedy-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", default="", help="batched decoding at these batch sizes (protocol item 5)")
    ap.add_argument("--batch-prompt", type=int, default=32, help="the prompt of each sequence of a batch")
    ap.add_argument("--batch-steps", type=int, default=8, help="timed steps of a batch")
    ap.add_argument("--compile", action="store_true", help="linlm: decode through the compiled step")
    ap.add_argument("--profile-step", action="store_true", help="linlm: where a decoding step's time goes")
    ap.add_argument("--torch-step", action="store_true",
                    help="linlm: the eager step on torch's ops alone, none of linlm's decoding kernels (every "
                         "matrix-vector product on F.linear, the element-wise work as torch ops; for comparison)")
    args = ap.parse_args()
    if args.torch_step:
        import linlm.layers.linear
        import linlm.ops.step_kernel

        linlm.layers.linear.small_linear_takes = lambda *a: False
        for name in ("conv_step_takes", "mamba_step_takes", "rms_rows_takes", "mamba_mixer_step_takes"):
            setattr(linlm.ops.step_kernel, name, lambda *a: False)
    contexts = sorted(int(c) for c in args.contexts.split(","))
    clock = Clock()
    if args.engine == "linlm":
        engine = LinlmEngine(args.model, args.threads, args.compile)
    elif args.engine == "lean":
        engine = LeanEngine(args.model, args.threads)
    else:
        engine = LlamaCppEngine(args.model, args.threads, n_ctx=max(contexts) + args.decode_tokens + 8)
    load_wall, load_cpu = clock.stop()
    out = {"engine": args.engine, "model": args.model, "threads": args.threads, "load_wall_s": load_wall,
           "load_cpu_s": load_cpu, "contexts": {}}

    token = engine.prefill(prompt_ids(args.greedy_prompt, engine.vocab, args.seed))
    greedy = [token]
    for _ in range(args.greedy_tokens - 1):
        token = engine.step(token)
        greedy.append(token)
    out["greedy"] = greedy

    for n in contexts:
        ids = prompt_ids(n, engine.vocab, args.seed + n)
        clock = Clock()
        token = engine.prefill(ids)
        wall, cpu = clock.stop()
        step_wall, step_cpu = median_step(engine.step, token, args.decode_tokens)
        out["contexts"][str(n)] = {
            "prefill_wall_s": wall, "prefill_cpu_s": cpu,
            "prefill_tokens_per_s_wall": n / wall, "prefill_tokens_per_s_cpu": n / cpu,
            "decode_ms_wall": 1e3 * step_wall, "decode_ms_cpu": 1e3 * step_cpu,
            "state_bytes": engine.state_bytes(),
        }
    out["peak_rss_bytes"] = peak_rss()
    out["torch_imported"] = "torch" in sys.modules
    if args.engine == "linlm":
        out["compile_s"] = engine.compile_s
        if args.profile_step:
            out["step_profile"] = profile_step(engine, cpu=args.threads == 1)
    out["batched"] = {}
    for b in sorted(int(x) for x in filter(None, args.batches.split(","))):
        if args.engine == "linlm":
            runner = engine
        else:
            runner = LlamaCppBatch(args.model, args.threads, b, args.batch_prompt,
                                   n_ctx=args.batch_prompt + args.batch_steps + 8)
        out["batched"][str(b)] = batched_decode(runner, b, args.batch_prompt, args.batch_steps, engine.vocab,
                                                args.seed)
        if runner is not engine:
            runner.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
