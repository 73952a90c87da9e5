"""The GPU backend (linlm.ops.backends): the libraries' kernels against linlm's own path, on one CUDA device.

For each gla gate kind (fla) and the selective scan (mamba_ssm), forward + backward, in bfloat16 and float32, both
paths run in this process (``gpu_kernels("auto")`` and ``gpu_kernels("torch")``), warmed up, as a median of several
runs, with the relative RMS difference of their outputs. A library that is not installed is reported as such.
Prints a table and writes benchmarks/results/bench_gpu_kernels.json. Needs CUDA (exits 0 with a note without).

    python benchmarks/bench_gpu_kernels.py [--seq-len 2048] [--batch 4] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import apply_runtime_settings, meta, print_table, time_fn, write_json  # noqa: E402

from linlm.ops import backends  # noqa: E402
from linlm.ops.gla import gla  # noqa: E402
from linlm.ops.selective_scan import selective_scan  # noqa: E402


def gla_case(kind, B, T, H, K, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    x = dict(q=(r(B, T, H, K) * K**-0.5).to(dtype), k=r(B, T, H, K).to(dtype), v=r(B, T, H, K).to(dtype),
             log_a={"none": None, "head": -(2.0 ** (-8.0 * torch.arange(1, H + 1, device="cuda") / H)),
                    "scalar": -F.softplus(r(B, T, H)), "vector": F.logsigmoid(r(B, T, H, K) + 3.0)}[kind])
    # TNL's constant gate is a buffer (fla's g_gamma path); every other input is trained
    leaves = {n: t.requires_grad_(True) for n, t in x.items()
              if t is not None and not (n == "log_a" and kind == "head")}
    return (lambda: gla(**x, output_final_state=False)[0]), leaves


def scan_case(B, T, Din, N, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    A = -torch.arange(1, N + 1, device="cuda", dtype=torch.float32).expand(Din, N).contiguous()  # S4D-real
    x = dict(u=r(B, T, Din).to(dtype), dt=r(B, T, Din) - 2.0, A=A, B=r(B, T, N).to(dtype), C=r(B, T, N).to(dtype),
             D=torch.ones(Din, device="cuda"))
    leaves = {n: t.requires_grad_(True) for n, t in x.items()}
    return (lambda: selective_scan(**x, dt_softplus=True, output_final_state=False)[0]), leaves


def fwd_bwd(run, leaves):
    def step():
        for t in leaves.values():
            t.grad = None
        out = run()
        out.float().square().mean().backward()
        return out
    return step


def measure(library, run, leaves, repeat):
    """[library, status, torch ms, kernel ms, speedup, relative RMS difference of the outputs]."""
    if not backends.available(library):
        return [library, "not installed"]
    step = fwd_bwd(run, leaves)
    with backends.gpu_kernels("auto"):
        out_k = step().detach().float()
        t_k = time_fn(step, warmup=2, repeat=repeat)
    with backends.gpu_kernels("torch"):
        out_t = step().detach().float()
        t_t = time_fn(step, warmup=2, repeat=repeat)
    diff = float((out_k - out_t).square().mean().sqrt() / out_t.square().mean().sqrt())
    return [library, "ok", t_t * 1e3, t_k * 1e3, t_t / t_k, diff]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--d-inner", type=int, default=1024)
    p.add_argument("--d-state", type=int, default=16)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu_kernels: no CUDA device here; nothing measured")
        return
    apply_runtime_settings()
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        dn = str(dtype).replace("torch.", "")
        for kind in ("none", "head", "scalar", "vector"):
            run, leaves = gla_case(kind, args.batch, args.seq_len, args.heads, args.head_dim, dtype)
            rows.append([f"gla {kind} {dn}", *measure("fla", run, leaves, args.repeat)])
        run, leaves = scan_case(args.batch, args.seq_len, args.d_inner, args.d_state, dtype)
        rows.append([f"scan {dn}", *measure("mamba_ssm", run, leaves, args.repeat)])
    headers = ["op", "library", "status", "torch ms", "kernel ms", "speedup", "rel. RMS diff"]
    rows = [r + [None] * (len(headers) - len(r)) for r in rows]
    print_table(headers, rows)
    write_json("bench_gpu_kernels", {
        "meta": {**meta(), "gpu": torch.cuda.get_device_name()},
        "settings": vars(args),
        "rows": [dict(zip(headers, r)) for r in rows],
    })


if __name__ == "__main__":
    main()
