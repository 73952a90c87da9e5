"""Do the instruction-set switches take effect? The same fp32 computations in three modes, each in its own process:

- native: what torch picks on this CPU (AVX-512 where the CPU has it);
- avx2: ``ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2``, which makes an AVX-512
  machine compute as an AVX2 one (torch's own kernels, MKL's BLAS and oneDNN alike);
- default: ``ATEN_CPU_CAPABILITY=default``, torch's kernels without explicit vectorisation.

    python benchmarks/bench_isa_modes.py [--repeat 7]

Each child reports torch's CPU capability, a hash of each result's bits and the median time of each computation.
The table shows, per mode, which results differ in their bits from the native ones (the last bits: the largest
relative difference is printed too) and the time against native. A mode whose capability is not the one asked for,
or whose every result is bit-identical to native on a CPU with AVX-512, did not take effect. The test suite's
numerics-sensitive folders run in the avx2 mode in CI (.ci/run), so that a test which passes only with one CPU's
rounding fails there too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

MODES = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default"},
}


def _computations():
    """name -> a function of no arguments returning a tensor, on fixed seeded inputs (drawn by numpy: torch's own
    normal sampler is vectorised too, and would give each mode other inputs)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(0)

    def randn(*shape):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32))

    x = randn(1024, 1024)
    a, b = randn(257, 513), randn(513, 129)
    w = randn(3, 1024)
    return {
        "exp": lambda: torch.exp(x),
        "tanh": lambda: torch.tanh(x),
        "silu": lambda: torch.nn.functional.silu(x),
        "log_softmax": lambda: torch.log_softmax(x, -1),
        "logsumexp": lambda: torch.logsumexp(x, -1),
        "cumsum": lambda: x.cumsum(-1),
        "rms_norm": lambda: torch.nn.functional.rms_norm(x, (1024,)),
        "matmul (BLAS)": lambda: a @ b,
        "conv1d (oneDNN)": lambda: torch.nn.functional.conv1d(x[None, :3], w[:, None].expand(3, 1, 1024)[:, :, :4],
                                                             groups=3),
    }


def child(repeat: int, out_dir: str) -> dict:
    """Run every computation in this process's mode; save each result as OUT_DIR/NAME.npy; return the record."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    out = {"capability": torch.backends.cpu.get_cpu_capability(), "results": {}}
    for i, (name, fn) in enumerate(_computations().items()):
        y = fn().contiguous().numpy()
        np.save(os.path.join(out_dir, f"{i}.npy"), y)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out["results"][name] = {"sha": hashlib.sha256(y.tobytes()).hexdigest()[:16], "file": f"{i}.npy",
                                "s": statistics.median(times)}
    return out


def run_mode(mode: str, repeat: int, out_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in MODES["avx2"]}
    env.update(MODES[mode])
    os.makedirs(out_dir)
    done = subprocess.run([sys.executable, __file__, "--child", "--repeat", str(repeat), "--out", out_dir],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _max_rel(a, b) -> float:
    """The largest |a - b| / max(|a|, |b|) over all elements."""
    import numpy as np

    a, b = a.astype(np.float64), b.astype(np.float64)
    return float((np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-30)).max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.repeat, args.out)))
        return 0

    import tempfile

    import numpy as np

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _common import meta, print_table, write_json

    with tempfile.TemporaryDirectory() as tmp:
        runs = {mode: run_mode(mode, args.repeat, os.path.join(tmp, mode)) for mode in MODES}
        native = runs["native"]["results"]
        rows, summary = [], {}
        for mode, run in runs.items():
            for name, r in run["results"].items():
                r["max_rel_diff"] = _max_rel(np.load(os.path.join(tmp, mode, r["file"])),
                                             np.load(os.path.join(tmp, "native", native[name]["file"])))
        for mode, run in runs.items():
            differ = [n for n, r in run["results"].items() if r["sha"] != native[n]["sha"]]
            summary[mode] = {"capability": run["capability"], "differ_from_native": differ,
                             "time_vs_native": {n: r["s"] / native[n]["s"] for n, r in run["results"].items()}}
            rows += [[mode, run["capability"], name, "same" if r["sha"] == native[name]["sha"] else "differ",
                      r["max_rel_diff"], r["s"] * 1e3, r["s"] / native[name]["s"]]
                     for name, r in run["results"].items()]
    print_table(["mode", "capability", "computation", "bits vs native", "max rel diff", "ms", "x native"], rows)
    for run in runs.values():
        for r in run["results"].values():
            del r["file"]
    path = write_json("bench_isa_modes", {"meta": meta(), "modes": MODES, "runs": runs, "summary": summary})
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
