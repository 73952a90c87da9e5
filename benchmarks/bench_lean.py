"""Lean decoding's prefill (linlm.infer.lean) by piece length and allocator: tokens/s and peak memory.

    python benchmarks/bench_lean.py [--model DIR ...] [--threads 1,2] [--pieces 64,256,1024] [--tokens 2048]
                                    [--rounds 3]

Each (model, threads, piece, allocator) runs in a process of its own (its peak resident set is the engine's), in
rounds that alternate the order: load the model, prefill a warm-up prompt of 300 tokens, then time a prefill of
``--tokens`` seeded random ids (wall clock; at 1 thread the CPU clock too). "allocator" is linlm's mallopt settings
(linlm.runtime.tune_allocator, what LeanMamba applies) or glibc's own (``LINLM_ALLOCATOR=system``). Without
``--model`` it saves a Mamba of mamba-130m's shape (random weights, vocabulary 32,000) in float32 and int8 under
``--work``. Writes benchmarks/results/bench_lean.json; benchmarks/bench_llamacpp.py sets lean decoding beside
llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, write_json  # noqa: E402

CHILD = r"""
import json, sys, time
import numpy as np
import linlm.infer.lean as lean
path, threads, piece, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lean.PIECE = piece
engine = lean.LeanMamba(path, threads=threads)
ids = np.random.default_rng(0).integers(0, engine.sizes["V"], tokens).tolist()
engine.prefill(ids[:300])
engine.reset()
wall, cpu = time.perf_counter(), time.process_time()
engine.prefill(ids)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
peak = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
print(json.dumps({"tokens_per_s_wall": tokens / wall, "tokens_per_s_cpu": tokens / cpu, "peak_rss_bytes": peak,
                  "torch_imported": "torch" in sys.modules}))
"""


def default_models(work: Path) -> list[Path]:
    """A Mamba of mamba-130m's shape saved in float32 and in int8 (made once)."""
    import torch

    import linlm
    from linlm.models.quant import quantize_model

    paths = [work / "mamba-130m-fp32", work / "mamba-130m-int8"]
    if not all((p / "config.json").is_file() for p in paths):
        torch.manual_seed(0)
        model = linlm.create_model("mamba", d_model=768, n_layers=24, vocab_size=32000,
                                   options={"d_state": 16, "expand": 2, "d_conv": 4})
        model.save(paths[0], overwrite=True)
        quantize_model(model).save(paths[1], overwrite=True)
    return paths


def run_child(path: Path, threads: int, piece: int, tokens: int, allocator: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if allocator == "system":
        env["LINLM_ALLOCATOR"] = "system"
    else:
        env.pop("LINLM_ALLOCATOR", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(threads), str(piece), str(tokens)],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"the lean child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="*", default=None, help="saved Mamba directories (default: made under --work)")
    ap.add_argument("--work", default=str(Path(__file__).resolve().parent / "results" / "lean_models"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--pieces", default="64,256,1024")
    ap.add_argument("--allocators", default="linlm,system")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json-name", default="bench_lean")
    args = ap.parse_args()
    models = [Path(m) for m in args.model] if args.model else default_models(Path(args.work))
    cases = [(m, int(t), int(p), a) for m in models for t in args.threads.split(",") for p in args.pieces.split(",")
             for a in args.allocators.split(",")]
    runs: dict[tuple, list[dict]] = {c: [] for c in cases}
    for r in range(args.rounds):
        for case in (cases if r % 2 == 0 else cases[::-1]):
            runs[case].append(run_child(*case[:3], args.tokens, case[3]))
    rows = []
    for (m, t, p, a), rs in runs.items():
        clock = "cpu" if t == 1 else "wall"
        rates = [x[f"tokens_per_s_{clock}"] for x in rs]
        rows.append({"model": m.name, "threads": t, "piece": p, "allocator": a, "clock": clock,
                     "tokens_per_s": statistics.median(rates), "tokens_per_s_rounds": rates,
                     "peak_rss_mib": statistics.median(x["peak_rss_bytes"] for x in rs) / 2**20,
                     "torch_imported": any(x["torch_imported"] for x in rs)})
    print_table(["model", "threads", "piece", "allocator", f"prefill tok/s @{args.tokens}", "rounds", "peak MiB",
                 "torch"],
                [[r["model"], r["threads"], r["piece"], r["allocator"], r["tokens_per_s"],
                  " / ".join(f"{x:.0f}" for x in r["tokens_per_s_rounds"]), r["peak_rss_mib"], r["torch_imported"]]
                 for r in rows])
    payload = {"meta": meta(), "tokens": args.tokens, "rounds": args.rounds, "rows": rows}
    print(f"wrote {write_json(args.json_name, payload)}")


if __name__ == "__main__":
    main()
