"""Inference profiling: prefill throughput, decode latency, peak memory and state size against context length.

For each architecture and context n, one prompt of n random tokens (batch 1) is prefilled, then ``decode_tokens``
tokens are decoded one by one from its state; the per-token latency is the median over the decoded tokens (after
two untimed ones). transformers' ``LlamaForCausalLM`` of the same shape (arch name ``hf-llama``) runs the same
protocol with its own KV cache, in the same process, so that ratios compare like with like.

With ``exported=("onnx", "pt2")`` each linlm architecture is also exported (linlm.infer.export, into a temporary
directory) and its exported step is timed the same way beside eager: rows with ``backend`` "onnx" (onnxruntime on
the CPU, as many threads as torch) or "pt2" (the torch.export program). Their prompt is prefilled by the eager
model (the exported prefill has a fixed length), so those rows report the decode latency and the state size only.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` during the prefill; on CPU the process's peak resident set
(VmHWM, reset before each prefill through /proc/self/clear_refs), reported with the resident set before the prefill,
so that ``peak - before`` is what the prefill needed on top of the weights.
"""

from __future__ import annotations

import gc
import math
import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from linlm.errors import ConfigError

HF_LLAMA = "hf-llama"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class ProfileRow:
    arch: str
    context: int
    device: str
    dtype: str
    prefill_s: Optional[float] = None
    prefill_tokens_per_s: Optional[float] = None
    decode_ms_per_token: Optional[float] = None
    decode_tokens_per_s: Optional[float] = None
    memory_before_bytes: Optional[int] = None
    peak_memory_bytes: Optional[int] = None
    memory_kind: str = ""
    state_bytes: Optional[int] = None
    error: Optional[str] = None
    backend: str = "eager"  # an export format, or "compiled": the step that was timed
    batch: int = 1  # sequences decoded together; decode_tokens_per_s is their aggregate


# ------------------------------------------------------------------------------------------------------ memory

def _rss_peak_reset() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _proc_status(key: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"{key}:\s+(\d+) kB", f.read())
        return int(m.group(1)) * 1024 if m else None
    except OSError:
        return None


class _Memory:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.kind = "cuda_max_allocated" if self.cuda else "rss"

    def start(self) -> Optional[int]:
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return torch.cuda.memory_allocated()
        _rss_peak_reset()
        return _proc_status("VmRSS")

    def peak(self) -> Optional[int]:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        return _proc_status("VmHWM")


# ------------------------------------------------------------------------------------------------------ runners

@dataclass
class Runner:
    """prefill(ids [1, n]) -> (last logits [1, V], state); step(token [1], state) -> (logits, state)."""

    prefill: Callable
    step: Callable
    state_bytes: Callable


def linlm_runner(model) -> Runner:
    return Runner(model.prefill, model.step, lambda state: state.nbytes())


def hf_llama_runner(hf) -> Runner:
    @torch.no_grad()
    def prefill(ids):
        out = hf(ids, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1], out.cache

    @torch.no_grad()
    def step(token, cache):
        out = hf(token.view(-1, 1), cache=cache, use_cache=True)
        return out.logits[:, -1], out.cache

    def state_bytes(cache):
        return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
                   if t is not None)

    return Runner(prefill, step, state_bytes)


def exported_runner(model, fmt: str, directory: str | Path) -> Runner:
    """The step of ``model`` exported as ``fmt`` into ``directory``, with the eager prefill; the state it carries is
    (tokens so far, the flat state tensors)."""
    from linlm.infer.export import ExportedStep, export, flat_state

    paths = export(model, Path(directory) / f"{model.config.arch}", fmt, prefill_len=8, overwrite=True)
    step_fn = ExportedStep(paths[1])

    @torch.no_grad()
    def prefill(ids):
        logits, state = model.prefill(ids)
        return logits, (ids.shape[1], flat_state(state))

    def step(token, state):
        position, flat = state
        logits, flat = step_fn(token, position, flat)
        return logits, (position + 1, flat)

    return Runner(prefill, step, lambda state: sum(t.numel() * t.element_size() for t in state[1]))


def profiled_config(arch: str, preset: Optional[str], max_context: int, overrides: Optional[dict] = None):
    """The ModelConfig profiled for ``arch`` (``hf-llama``: linlm LLaMA's), long enough for ``max_context``."""
    from linlm.models.presets import preset_config

    overrides = dict(overrides or {})
    name = "llama" if arch == HF_LLAMA else arch
    if name == "llama":
        overrides["max_seq_len"] = max(max_context, overrides.get("max_seq_len", 0))
    return preset_config(name, preset, **overrides)


def check_profile_memory(archs: Sequence[str], preset: Optional[str], contexts: Sequence[int], device: torch.device,
                         dtype: str, overrides: Optional[dict] = None, batches: Sequence[int] = (1,)) -> None:
    """Refuse (ResourceError), before any model is built, a context and batch whose prefill cannot fit in
    memory (the longest context at the largest batch: ``inference_floor`` grows with both)."""
    from linlm.models.memory import inference_floor
    from linlm.resources import check_memory

    longest, widest = max(contexts), max(batches)
    what = f"--contexts {longest}" + (f" --batch {widest}" if widest > 1 else "")
    tokens = f"{widest:,} x {longest:,}" if widest > 1 else f"{longest:,}"
    for arch in archs:
        cfg = profiled_config(arch, preset, longest, overrides)
        need = inference_floor(cfg, widest, longest, DTYPES[dtype].itemsize)
        check_memory(need, f"{what}: a prefill of {tokens} tokens of {arch}",
                     "give shorter contexts or a smaller batch", device)


def build(arch: str, preset: Optional[str], max_context: int, device: torch.device, dtype: torch.dtype,
          overrides: Optional[dict] = None):
    """(runner, model) for a linlm architecture or ``hf-llama`` (transformers' Llama of linlm LLaMA's shape)."""
    cfg = profiled_config(arch, preset, max_context, overrides)
    torch.manual_seed(0)
    if arch == HF_LLAMA:
        from linlm.conversion.hf_llama import hf_config_from

        hf_cfg = hf_config_from(cfg)  # without transformers: a one-line ConfigError saying what to install
        from transformers import LlamaForCausalLM

        hf_cfg._attn_implementation = "sdpa"
        model = LlamaForCausalLM(hf_cfg).to(device=device, dtype=dtype).eval()
        return hf_llama_runner(model), model
    from linlm.models.lm import CausalLM

    model = CausalLM(cfg).to(device=device, dtype=dtype).eval()
    return linlm_runner(model), model


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def profile_one(runner: Runner, vocab: int, context: int, device: torch.device, decode_tokens: int,
                batch: int = 1) -> dict:
    mem = _Memory(device)
    gen = torch.Generator().manual_seed(context)
    ids = torch.randint(0, vocab, (batch, context), generator=gen).to(device)
    before = mem.start()
    t0 = time.perf_counter()
    logits, state = runner.prefill(ids)
    _sync(device)
    prefill_s = time.perf_counter() - t0
    peak = mem.peak()
    token = logits.argmax(-1)
    times = []
    for i in range(decode_tokens + 2):
        t0 = time.perf_counter()
        logits, state = runner.step(token, state)
        token = logits.argmax(-1)
        _sync(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    per_token = statistics.median(times)
    return dict(prefill_s=prefill_s, prefill_tokens_per_s=batch * context / prefill_s,
                decode_ms_per_token=1e3 * per_token, decode_tokens_per_s=batch / per_token, memory_before_bytes=before, peak_memory_bytes=peak,
                memory_kind=mem.kind, state_bytes=runner.state_bytes(state))


def profile(archs: Sequence[str], preset: Optional[str], contexts: Sequence[int], *, device: str = "cpu",
            dtype: str = "float32", decode_tokens: int = 16, overrides: Optional[dict] = None,
            on_row: Optional[Callable[[ProfileRow], None]] = None, exported: Sequence[str] = (),
            batches: Sequence[int] = (1,), compiled: bool = False) -> list[ProfileRow]:
    """Profile each architecture (``hf-llama`` for transformers' Llama) at each context; one row per pair, and one
    more per export format in ``exported`` ("onnx", "pt2") for the linlm architectures (CPU only). ``compiled``
    adds rows with backend "compiled" for each batch: the same model decoding through ``compile_step()``, for the
    architectures whose state keeps its shape (the warm-up step compiles, untimed).

    A context that runs out of memory gives a row with ``error`` set, and the others still run.
    """
    from linlm.infer.export import FORMATS
    from linlm.devices import resolve_device, warn_slow_bf16
    from linlm.models.registry import ARCHITECTURES

    dev = resolve_device(device)
    if dtype not in DTYPES:
        raise ConfigError(f"dtype: {dtype!r} is not one of {sorted(DTYPES)}")
    for arch in archs:
        if arch != HF_LLAMA and arch not in ARCHITECTURES:
            raise ConfigError(f"archs: unknown architecture {arch!r}; valid choices are "
                              f"{', '.join(repr(a) for a in [*sorted(ARCHITECTURES), HF_LLAMA])}")
    if not contexts or any(int(n) < 1 for n in contexts):
        raise ConfigError(f"contexts: need positive context lengths, got {list(contexts)}")
    if decode_tokens < 1:
        raise ConfigError(f"decode_tokens: must be >= 1, got {decode_tokens}")
    if not batches or any(int(b) < 1 for b in batches):
        raise ConfigError(f"batches: need batch sizes >= 1, got {list(batches)}")
    bad = [f for f in exported if f not in FORMATS]
    if bad:
        raise ConfigError(f"exported: {bad[0]!r} is not an export format; valid choices are "
                          f"{', '.join(map(repr, FORMATS))}")
    if exported and dev.type != "cpu":
        raise ConfigError(f"exported: the exported steps are timed on the CPU only, not on {dev}; drop --exported "
                          f"or use --device cpu")
    check_profile_memory(archs, preset, contexts, dev, dtype, overrides, batches)
    if dtype == "bfloat16":  # the rows would measure the fallback, not the model
        warn_slow_bf16(dev, "--dtype bfloat16", "profile with --dtype float32 here, or on a CPU with AVX-512 or AMX")
    rows = []
    max_context = max(contexts) + decode_tokens + 3
    for arch in archs:
        runner, model = build(arch, preset, max_context, dev, DTYPES[dtype], overrides)
        for b in batches:
            rows += _profile_contexts(runner, model, arch, "eager", contexts, dev, dtype, decode_tokens, on_row, b)
        if compiled and arch != HF_LLAMA and model.compile_step():
            for b in batches:
                rows += _profile_contexts(runner, model, arch, "compiled", contexts, dev, dtype, decode_tokens, on_row,
                                          b)
            model.compile_step(False)
        for fmt in exported if arch != HF_LLAMA else ():
            import tempfile

            with tempfile.TemporaryDirectory(prefix="linlm-profile-") as tmp:
                runner = exported_runner(model, fmt, tmp)
                rows += _profile_contexts(runner, model, arch, fmt, contexts, dev, dtype, decode_tokens, on_row)
        del runner, model
        gc.collect()
    return rows


def _profile_contexts(runner, model, arch, backend, contexts, dev, dtype, decode_tokens, on_row,
                      batch: int = 1) -> list[ProfileRow]:
    rows = []
    vocab = model.config.vocab_size
    profile_one(runner, vocab, 8, dev, 2, batch)  # warm up kernels and allocator
    for n in contexts:
        row = ProfileRow(arch=arch, context=int(n), device=str(dev), dtype=dtype, backend=backend, batch=batch)
        try:
            for key, value in profile_one(runner, vocab, int(n), dev, decode_tokens, batch).items():
                setattr(row, key, value)
            if backend != "eager":  # the prompt went through the eager prefill: only the step is this backend's
                row.prefill_s = row.prefill_tokens_per_s = row.memory_before_bytes = row.peak_memory_bytes = None
        except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:  # the CPU allocator's is a RuntimeError
            from linlm.resources import is_out_of_memory

            if not is_out_of_memory(e):
                raise
            row.error = f"out of memory: {str(e).splitlines()[0][:200]}"
            gc.collect()
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def rows_to_dicts(rows: Sequence[ProfileRow]) -> list[dict]:
    return [asdict(r) for r in rows]


def plot_figure(rows: Sequence[ProfileRow], title: str = ""):
    """Decode latency and the prefill's memory (peak minus the resident set before it) against context length,
    one colour per architecture (an exported step's latency dashed, in its architecture's colour): a matplotlib
    Figure of its own (no pyplot: no global backend or figure registry is touched)."""
    import matplotlib
    from matplotlib.figure import Figure

    def needed(r):  # what the prefill took on top of what the process held before it
        if r.peak_memory_bytes is None or r.memory_before_bytes is None:
            return math.nan
        return (r.peak_memory_bytes - r.memory_before_bytes) / 2**20

    fig = Figure(figsize=(11, 4))
    ax1, ax2 = fig.subplots(1, 2)
    archs = list(dict.fromkeys(r.arch for r in rows))
    colors = matplotlib.colormaps["tab10" if len(archs) <= 10 else "tab20"].colors
    for arch, backend in dict.fromkeys((r.arch, getattr(r, "backend", "eager")) for r in rows):
        ok = [r for r in rows if r.arch == arch and getattr(r, "backend", "eager") == backend and r.error is None]
        xs = [r.context for r in ok]
        color = colors[archs.index(arch) % len(colors)]
        label = arch if backend == "eager" else f"{arch} ({backend} step)"
        ax1.plot(xs, [r.decode_ms_per_token for r in ok], marker="o", label=label, color=color,
                 linestyle="-" if backend == "eager" else "--")
        if backend == "eager":  # an exported step's prompt is prefilled by the eager model: no memory of its own
            ax2.plot(xs, [needed(r) for r in ok], marker="o", label=label, color=color)
    for ax, label in ((ax1, "decode latency (ms / token)"),
                      (ax2, "prefill memory: peak - before (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot(rows: Sequence[ProfileRow], path: str | Path, title: str = "", what: Optional[str] = None) -> Path:
    """Write :func:`plot_figure` as a PNG through linlm.outputs (atomic; a file linlm did not write is refused);
    ``what`` names the flag in a refusal, e.g. ``--plot``."""
    from linlm import outputs

    return outputs.save_figure(plot_figure(rows, title), path, what)
