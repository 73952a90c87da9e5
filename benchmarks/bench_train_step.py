"""Training-step throughput: tokens/s of forward + backward + AdamW, every model of a phase in interleaved rounds.

Phases (one per shape, precision and sequence length; each builds its models first, then times them in interleaved
rounds after a warm-up, medians; a model's round is back-to-back steps for about --round-seconds, at least one, and
counts their mean, so that short steps are not timed one at a time):
- "demo": the shape of `linlm demo --archs A` (d 128, 4 layers, glu 384, vocab 2048, batch 16 x 128 tokens) in bf16
  autocast on 1 thread, as the demo trains where bf16 is native (on a CPU without AVX-512 or AMX the default is fp32,
  as the demo's `precision: auto` trains there: a bf16 matmul would time torch's slow fallback);
- "paper": the paper-70m preset, vocabulary 8192, batch 1, at each --seq-lens, in fp32 and/or bf16 autocast.
MossNet runs once per --ssm-kernels choice ("mossnet" is the default s6, "mossnet (ssd)" the other); at paper-70m
the presets give Mamba and MossNet the active parameters of LLaMA, so the Mamba row is "Mamba of the same active
parameter count". "hf" (fp32 paper phases, unless --no-hf) runs our LLaMA against transformers' LlamaForCausalLM.

Ratios are taken within a phase (the same interleaved rounds): every row against our LLaMA, and MossNet rows against
Mamba; they are checked against the targets listed in TARGETS (written to the JSON with pass/fail). Each check also
gives the ratio the two rows would have at equal model-FLOPs utilisation (the baseline's FLOPs per token over the
row's) and the row's MFU against the baseline's: a target above the equal-MFU ratio needs the row to use the CPU
better than its baseline does (MossNet at the demo shape has about 1.9x Mamba's FLOPs per token).
Model-FLOPs utilisation is against a matmul ceiling per (dtype, threads): the best of several square matmuls, at the
start and at the end of the run, so that a slow moment can only lower MFU, never inflate it.

Each library's step is its training path: ours calls ``model(ids, targets=...)`` (the chunked fused head and
cross-entropy that linlm's trainer uses); transformers' model returns logits and the loss is
``F.cross_entropy(logits, targets)``. The row "llama (logits + CE)" is our LLaMA through that same logits path.

    python benchmarks/bench_train_step.py [--shapes demo paper] [--demo-dtype bf16|fp32] [--dtypes fp32 bf16]
                                          [--seq-lens 2048 8192]
                                          [--archs ...] [--ssm-kernels s6 ssd] [--repeat 5] [--round-seconds 2]
                                          [--no-hf]
                                          [--clock wall|cpu] [--json-name NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, time_fn, write_json  # noqa: E402

from linlm import create_model  # noqa: E402
from linlm.devices import native_bf16  # noqa: E402
from linlm.train.train_config import OptimSection  # noqa: E402
from linlm.train.optim import build_optimizer  # noqa: E402
from linlm.models.cost import training_flops  # noqa: E402
from linlm.models.counting import count  # noqa: E402
from linlm.models.registry import arch_names  # noqa: E402


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# The demo's model (src/linlm/configs/demo.yaml) with its tokenizer's vocabulary; batch 16 x 128 tokens, 1 thread.
DEMO = dict(overrides=dict(n_layers=4, d_model=128, n_heads=2, glu_dim=384, chunk_size=64, max_seq_len=1024,
                           vocab_size=2048), batch=16, seq=128, threads=1)
# The targets: (phase shape, dtype or None for any, seq or None, row, baseline row, minimum ratio).
TARGETS = [
    ("demo", None, None, "mamba", "llama", 0.5),
    ("demo", None, None, "mossnet", "mamba", 0.5),
    ("paper", None, 2048, "mamba", "llama", 1.0),
    ("paper", None, 8192, "mamba", "llama", 1.4),
    ("paper", None, None, "mossnet", "mamba", 0.8),
    ("paper", None, None, "mossnet (ssd)", "mamba", 0.8),
    ("paper", "fp32", 2048, "gated_deltanet", "llama", 1.1),
    ("paper", "fp32", 8192, "gated_deltanet", "llama", 1.8),
    # The linear family researchers use now: each at 1.2x LLaMA at 2048 and 2x at 8192, as TNL and HGRN2 train; a
    # hybrid with one attention layer in 8 (HYBRID) at 1.1x at 8192.
    *[("paper", None, n, arch, "llama", target) for arch in ("mamba2", "gla", "retnet")
      for n, target in ((2048, 1.2), (8192, 2.0))],
    ("paper", None, 8192, "mamba2 (hybrid 1 in 8)", "llama", 1.1),
]
# A hybrid row "ARCH (hybrid 1 in 8)": the architecture's preset with attention at every 8th layer (--hybrids).
HYBRID = dict(attn_every=8)


def matmul_flops_per_s(dtype=torch.float32, n: int = 2048, tries: int = 7, clock: str = "wall") -> float:
    """The fastest of several square matmuls: the ceiling MFU is measured against (a slow outlier would inflate MFU).
    By the same clock as the steps (with --clock cpu, FLOPs per CPU second)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    timer = cpu_seconds if clock == "cpu" else (lambda fn: time_fn(fn, warmup=0, repeat=1))
    t = min(timer(lambda: a @ b) for _ in range(tries))
    return 2 * n**3 / t


@contextlib.contextmanager
def num_threads(n):
    was = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(was)


def make_step(model, ids, mode: str = "fused", dtype: str = "fp32"):
    """mode: "fused" (ours, targets=), "logits" (ours, logits then F.cross_entropy) or "hf" (transformers)."""
    opt = build_optimizer(model, OptimSection(lr=1e-4))  # AdamW as linlm's trainer builds it (fused, decay groups)
    targets = ids.roll(-1, dims=1)
    bf16 = dtype == "bf16"

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if mode == "fused":
                out = model(ids, targets=targets, return_aux=True)
                loss = out.loss + out.aux_loss
            else:
                out = model(ids) if mode == "hf" else model(ids, return_aux=True)
                loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())
                if mode == "logits":
                    loss = loss + out.aux_loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def row_name(arch: str, mode: str, kernel: str | None) -> str:
    if mode == "logits":
        return f"{arch} (logits + CE)"
    if mode == "hf":
        return f"{arch} (transformers)"
    if kernel == "hybrid":
        return f"{arch} (hybrid 1 in {HYBRID['attn_every']})"
    return f"{arch} ({kernel})" if kernel and kernel != "s6" else arch


def build(entry, phase: dict, args):
    arch, mode, kernel = entry
    torch.manual_seed(0)
    kw = {} if kernel is None else dict(HYBRID) if kernel == "hybrid" else {"ssm_kernel": kernel}
    if phase["shape"] == "demo":
        model = create_model(arch, **DEMO["overrides"], **kw)
        vocab = DEMO["overrides"]["vocab_size"]
    else:
        model = create_model(arch, preset="paper-70m", vocab_size=args.vocab, max_seq_len=max(phase["seq"], 8192),
                             **kw)
        vocab = args.vocab
    cfg = model.config
    if mode == "hf":
        from linlm.hf.llama import to_hf_llama

        model = to_hf_llama(model)
        model.config._attn_implementation = "sdpa"
    model.train()
    ids = torch.randint(0, vocab, (phase["batch"], phase["seq"]))
    return row_name(arch, mode, kernel), cfg, make_step(model, ids, mode, phase["dtype"])


def cpu_seconds(fn) -> float:
    """CPU seconds of this process (all its threads) for one call: on a machine shared with other jobs, a 1-thread
    phase measured this way is not charged for the time the scheduler gives to others (contention for caches and
    memory bandwidth still shows)."""
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def time_rounds(entries, phase: dict, args) -> list[dict]:
    """Build every model of a phase first, then time them in interleaved rounds, so that drift in the machine's
    load (or first-touch memory costs) does not favour whichever model happens to run first."""
    n, batch = phase["seq"], phase["batch"]
    runs = [build(e, phase, args) for e in entries]
    times = {name: [] for name, _, _ in runs}
    faults = {name: [] for name, _, _ in runs}  # minor page faults per step (fresh memory touched)
    timer = cpu_seconds if args.clock == "cpu" else (lambda fn: time_fn(fn, warmup=0, repeat=1))
    warm = {}
    for _ in range(max(args.warmup, 1)):
        for name, _, step in runs:
            warm[name] = timer(step)
    # A round of a model runs back-to-back steps for about --round-seconds (one step where a step is longer), and
    # counts their mean: a single step of the demo's shape (a few tenths of a second) moves by 10-20 % on a busy
    # machine.
    per_round = {name: max(1, round(args.round_seconds / warm[name])) for name, _, _ in runs}
    for i in range(args.repeat):
        # Every other round runs in reverse order, so that no model always follows the same neighbour.
        for name, _, step in (runs if i % 2 == 0 else runs[::-1]):
            k = per_round[name]
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            times[name].append(timer(lambda: [step() for _ in range(k)]) / k)
            faults[name].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / k)
    out = []
    for name, cfg, _ in runs:
        seconds = statistics.median(times[name])
        tokens = batch * n
        c = count(cfg, batch=batch, seq_len=n)
        flops = training_flops(tokens, c["counted_flops_per_token"], c["lm_head_flops_per_token"])
        out.append(dict(arch=name, **phase, seq_len=n, clock=args.clock, seconds_per_step=seconds,
                        step_seconds=times[name], steps_per_round=per_round[name], tokens_per_s=tokens / seconds,
                        model_flops_per_step=flops,
                        page_faults_per_step=statistics.median(faults[name])))
        print(f"  [{phase['name']}] {name:>22}: {tokens / seconds:8.1f} tok/s, "
              f"{statistics.median(faults[name]):,.0f} page faults/step", flush=True)
    del runs
    gc.collect()
    return out


def add_ratios(results: list[dict]) -> None:
    for r in results:
        same = [x for x in results if x["name"] == r["name"]]
        by = {x["arch"]: x for x in same}
        if "llama" in by:
            r["ratio_vs_our_llama"] = r["tokens_per_s"] / by["llama"]["tokens_per_s"]
        if r["arch"].startswith("mossnet") and "mamba" in by:
            r["ratio_vs_mamba"] = r["tokens_per_s"] / by["mamba"]["tokens_per_s"]
            # the same ratio within each interleaved round: how steady the comparison is
            r["ratio_vs_mamba_per_round"] = [m / s for s, m in zip(r["step_seconds"], by["mamba"]["step_seconds"])]
        if r["arch"] == "mamba" and "llama" in by:
            r["ratio_vs_our_llama_per_round"] = [
                b / s for s, b in zip(r["step_seconds"], by["llama"]["step_seconds"])]
        hf_row = by.get("llama (transformers)")
        if r["arch"] in ("llama", "llama (logits + CE)") and hf_row:
            r["ratio_vs_hf_llama"] = r["tokens_per_s"] / hf_row["tokens_per_s"]
            r["ratio_vs_hf_llama_per_round"] = [h / o for o, h in zip(r["step_seconds"], hf_row["step_seconds"])]


def profile_phase(entries, phase: dict, args) -> None:
    """Print the ops that take a step's time: torch.profiler over 2 steps after a warm-up step, by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    for entry in entries:
        name, _, step = build(entry, phase, args)
        step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                step()
        print(f"===== [{phase['name']}] {name}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile,
                                        max_name_column_width=40))


WARM_STEPS, COUNTED_STEPS = 3, 5


def peak_rss_child(argv) -> int:
    """Child of --memory: build one model, run WARM_STEPS steps, then COUNTED_STEPS more; print the process's peak RSS
    in bytes and the median minor page faults of the counted steps (fresh pages touched, this model alone in its
    process: a step that reuses its memory touches none)."""
    arch, kernel, shape, dtype, seq, vocab = argv
    args = argparse.Namespace(vocab=int(vocab))
    threads = DEMO["threads"] if shape == "demo" else None
    phase = dict(name="memory", shape=shape, dtype=dtype, seq=int(seq),
                 batch=DEMO["batch"] if shape == "demo" else 1)
    with num_threads(threads):
        _, _, step = build((arch, "fused", None if kernel == "-" else kernel), phase, args)
        for _ in range(WARM_STEPS):  # the optimiser's state and the allocator's heap grow over the first steps
            step()
        faults = []
        for _ in range(COUNTED_STEPS):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            step()
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, statistics.median(faults))
    return 0


def peak_rss(entries, phases, args) -> list[dict]:
    """Peak RSS of a training step, one fresh process per (model, phase), so that no model's memory hides another's.
    (Run the same command with PYTHONPATH pointing at another checkout to compare revisions.)"""
    import subprocess

    out = []
    for ph in phases:
        for arch, _, kernel in entries:
            cmd = [sys.executable, __file__, "--_peak-rss-child", arch, kernel or "-", ph["shape"], ph["dtype"],
                   str(ph["seq"]), str(args.vocab)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rss, faults = proc.stdout.strip().splitlines()[-1].split()
            rss = int(rss)
            out.append(dict(arch=row_name(arch, "fused", kernel), phase=ph["name"], peak_rss_bytes=rss,
                            page_faults_per_step=float(faults)))
            print(f"  [{ph['name']}] {out[-1]['arch']:>22}: peak RSS {rss / 2**20:,.0f} MiB, "
                  f"{float(faults):,.0f} page faults/step", flush=True)
    return out


def check_targets(results: list[dict]) -> list[dict]:
    """Each target's ratio, with the ratio at equal MFU (the baseline's model FLOPs per step over the row's, the same
    tokens) and the row's MFU over the baseline's: ratio = equal_mfu_ratio x mfu_vs_baseline."""
    checks = []
    for shape, dtype, seq, row, base, want in TARGETS:
        for r in results:
            if r["shape"] != shape or r["arch"] != row or r.get("hf"):
                continue
            if (dtype and r["dtype"] != dtype) or (seq and r["seq_len"] != seq):
                continue
            b = next((x for x in results if x["name"] == r["name"] and x["arch"] == base), None)
            if b is None:
                continue
            ratio = r["tokens_per_s"] / b["tokens_per_s"]
            checks.append(dict(phase=r["name"], row=row, baseline=base, ratio=ratio, target=want, met=ratio >= want,
                               equal_mfu_ratio=b["model_flops_per_step"] / r["model_flops_per_step"],
                               mfu_vs_baseline=r["mfu"] / b["mfu"] if "mfu" in r and "mfu" in b else None))
    return checks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", choices=["demo", "paper"], default=["demo", "paper"])
    native = native_bf16(torch.device("cpu"))
    ap.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["fp32", "bf16"] if native else ["fp32"],
                    help="precisions of the paper phases (default: fp32 and bf16 where this CPU computes bf16 "
                         "natively, else fp32)")
    ap.add_argument("--demo-dtype", choices=list(DTYPES), default="bf16" if native else "fp32",
                    help="precision of the demo phase (default: the demo's precision auto, bf16 where this CPU "
                         "computes bfloat16 natively, else fp32: there bf16 matmuls take a slow fallback)")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--archs", nargs="+", default=arch_names(),
                    help="architectures (default: every registered one, %(default)s)")
    ap.add_argument("--ssm-kernels", nargs="+", choices=["s6", "ssd"], default=["s6", "ssd"],
                    help="MossNet's ssm_kernel choices, one row each")
    ap.add_argument("--hybrids", nargs="*", default=["mamba2"],
                    help="architectures also timed as a hybrid with attention at every 8th layer (%(default)s)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per model first (at least one)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--round-seconds", type=float, default=2.0,
                    help="a round of a model times back-to-back steps for about this long (at least one), their "
                         "mean per step")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' LlamaForCausalLM")
    ap.add_argument("--memory", action="store_true",
                    help="instead of timing, the peak RSS of each model's step, each in a process of its own")
    ap.add_argument("--profile", type=int, default=0, metavar="ROWS",
                    help="instead of timing, torch.profiler over 2 steps of each model: the top ROWS ops by self CPU")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="time a step by the wall clock (default) or by the process's CPU time (the sum over its "
                         "threads: for 1-thread phases on a loaded machine; tokens/s is then per CPU second)")
    ap.add_argument("--json-name", default="bench_train_step",
                    help="results file benchmarks/results/NAME.json (a second run beside another keeps both)")
    ap.add_argument("--_peak-rss-child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._peak_rss_child:
        return peak_rss_child(args._peak_rss_child)
    archs = args.archs
    entries = [(a, "fused", k) for a in archs for k in (args.ssm_kernels if a == "mossnet" else [None])]
    entries += [(a, "fused", "hybrid") for a in args.hybrids]

    phases = []
    if "demo" in args.shapes:
        phases.append(dict(name=f"demo {args.demo_dtype}", shape="demo", dtype=args.demo_dtype, seq=DEMO["seq"],
                           batch=DEMO["batch"], threads=DEMO["threads"]))
    if "paper" in args.shapes:
        for n in args.seq_lens:  # the short sequences first, in both precisions
            for dtype in args.dtypes:
                phases.append(dict(name=f"paper-70m {dtype} {n}", shape="paper", dtype=dtype, seq=n,
                                   batch=args.batch, threads=None))
    if args.profile:
        for ph in phases:
            with num_threads(ph["threads"]):
                profile_phase(entries, ph, args)
        return 0
    if args.memory:
        rows = peak_rss(entries, phases, args)
        write_json("bench_train_step_memory", dict(meta=meta(), results=rows))
        return 0
    ceilings: dict = {}

    def measure_ceilings():
        for ph in phases:
            with num_threads(ph["threads"]) as nt:
                key = f"{ph['dtype']}/{nt} threads"
                ceilings[key] = max(ceilings.get(key, 0.0), matmul_flops_per_s(DTYPES[ph["dtype"]], clock=args.clock))

    measure_ceilings()
    results = []
    for i, ph in enumerate(phases):
        with num_threads(ph["threads"]) as nt:
            ph = {**ph, "threads": nt}
            results += time_rounds(entries, ph, args)
            if "llama" in archs and not args.no_hf and ph["shape"] == "paper" and ph["dtype"] == "fp32":
                hf_ph = {**ph, "name": ph["name"] + " (hf)", "hf": True}
                results += time_rounds([("llama", "fused", None), ("llama", "logits", None), ("llama", "hf", None)],
                                       hf_ph, args)
        if i + 1 < len(phases):  # the phases done so far survive an interrupted run
            report(results, ceilings, args, partial=True)
    # Measured again at the end, the best of both: MFU is then a lower bound, never inflated by a slow moment.
    measure_ceilings()
    report(results, ceilings, args, partial=False)
    return 0


def report(results: list[dict], ceilings: dict, args, partial: bool) -> None:
    """MFU, ratios and target checks of the rows so far: printed (unless partial) and written to the JSON."""
    for r in results:
        r["mfu"] = r["model_flops_per_step"] / r["seconds_per_step"] / ceilings[f"{r['dtype']}/{r['threads']} threads"]
    add_ratios(results)
    if partial:
        write_json(args.json_name, dict(meta=meta(), partial=True, matmul_flops_per_s=ceilings, vocab=args.vocab,
                                            demo=DEMO, results=results, target_checks=check_targets(results)))
        return
    rows = [[r["arch"], r["name"], f"{r['tokens_per_s']:.0f}",
             f"{r['ratio_vs_our_llama']:.2f}x" if "ratio_vs_our_llama" in r else "",
             f"{r['ratio_vs_mamba']:.2f}x" if "ratio_vs_mamba" in r else "",
             f"{r['ratio_vs_hf_llama']:.2f}x" if "ratio_vs_hf_llama" in r else "",
             f"{r['model_flops_per_step'] / (r['batch'] * r['seq_len']) / 1e6:.3g}",
             f"{100 * r['mfu']:.1f}%"] for r in results]
    print_table(["arch", "phase", "tokens/s", "vs our llama", "vs mamba", "vs HF llama", "MFLOP/token", "MFU"], rows)
    print("matmul ceilings measured in this run (best of 7 tries, start and end):",
          ", ".join(f"{k}: {v / 1e9:.0f} GFLOP/s" for k, v in ceilings.items()))
    checks = check_targets(results)
    for c in checks:
        print(f"target [{c['phase']}] {c['row']} / {c['baseline']}: {c['ratio']:.2f}x "
              f"(>= {c['target']}x: {'met' if c['met'] else 'NOT met'}; at equal MFU {c['equal_mfu_ratio']:.2f}x, "
              f"MFU {c['mfu_vs_baseline']:.2f}x {c['baseline']}'s)")
    for r in results:
        for key in ("ratio_vs_mamba_per_round", "ratio_vs_our_llama_per_round", "ratio_vs_hf_llama_per_round"):
            if key in r:
                per = ", ".join(f"{x:.2f}" for x in r[key])
                print(f"[{r['name']}] {r['arch']} {key.replace('_per_round', '')}, round by round: {per}")
    write_json(args.json_name, dict(meta=meta(), partial=False, matmul_flops_per_s=ceilings, vocab=args.vocab,
                                        demo=DEMO, results=results, target_checks=checks,
                                        targets={"our_llama_vs_hf": 1.0, "linear_vs_llama_2048": 1.0,
                                                 "linear_vs_llama_8192": 1.4}))


if __name__ == "__main__":
    from _common import apply_runtime_settings

    apply_runtime_settings()
    sys.exit(main())
