"""The fused functions of linlm.ops.fused, and the compiled passes of a Mamba block (linlm.ops.conv_kernel's conv +
SiLU, linlm.ops.gate_kernel's output gate, layers.mamba's rank-R dt product with its own backward, the MoE read-back's gather-sum),
against their composite torch references (embedding_bag for the read-back), forward + backward.

Shapes are those of one paper-70m layer (LLaMA: d_model 512, 4 heads of 128, SwiGLU width 1536, vocab 8192; Mamba:
inner width 1024, conv width 4) at B=1, T=2048, float32; the dt row is the demo's Mamba (inner width 256, rank 8:
paper-70m's rank 32 takes autograd's backward, see layers.mamba.NARROW_RANK). The Mamba and read-back rows need the
compiled kernel. Each pair runs in this process, warmed up, timed in interleaved rounds (medians). Prints a table and
writes benchmarks/results/bench_fused.json. These are the element-wise parts of a training step; the step itself is
timed by bench_train_step.py.

    python benchmarks/bench_fused.py [--seq-len 2048] [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, time_fn, write_json  # noqa: E402

import torch.nn.functional as F  # noqa: E402

from linlm.layers.mamba import dt_preactivation, output_gate  # noqa: E402
from linlm.ops import conv_kernel, fused, kernel_library, routing  # noqa: E402


def rope_reference_qkv(qkv, cos, sin):
    """The composite path the attention layer used before rope_qkv: views, then RoPE on q and k."""
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return fused.rope_reference(q, cos, sin), fused.rope_reference(k, cos, sin), v


def conv_silu_reference(x, w, b):
    """silu of the causal depthwise conv1d (x [B, T, C], w [C, K]) by torch's conv1d."""
    T, K = x.shape[1], w.shape[1]
    out = F.conv1d(x.transpose(1, 2), w[:, None, :], b, padding=K - 1, groups=x.shape[2])[..., :T]
    return F.silu(out.transpose(1, 2))


def mamba_cases(T: int, din: int = 1024, K: int = 4, dt_din: int = 256, rank: int = 8):
    g = torch.Generator().manual_seed(1)
    y, z = torch.randn(1, T, din, generator=g), torch.randn(1, T, din, generator=g)
    x, w, b = torch.randn(1, T, din, generator=g), torch.randn(din, K, generator=g) / 2, torch.randn(din, generator=g)
    low, wd = torch.randn(1, T, rank, generator=g), torch.randn(dt_din, rank, generator=g)
    bd = torch.randn(dt_din, generator=g)
    return {
        "mamba output gate": (lambda a, c: (output_gate(a, c),), lambda a, c: (a * F.silu(c),), (y, z)),
        "mamba conv + silu": (lambda a, c, e: (conv_kernel.conv_silu(a, None, c, e, None),),
                              lambda a, c, e: (conv_silu_reference(a, c, e),), (x, w, b)),
        f"mamba dt (rank {rank}, inner {dt_din})": (lambda a, c, e: (dt_preactivation(a, c, e),),
                                                   lambda a, c, e: (F.linear(a, c, e),), (low, wd, bd)),
    }


def read_back_cases(T: int):
    """The mixtures of experts' read-back (linlm.ops.routing.read_back: the compiled gather-sum) against
    embedding_bag with per-sample weights, for T tokens of k = 2 slots: MossNet's time mixer at the demo (256 wide)
    and at paper-70m (1024 wide), E = 4 rows of padded slots (6 % padding, as training's packed layout has), and the
    MoE MLP's combine at paper-70m (d 512, a permutation of the slots, no padding)."""
    g = torch.Generator().manual_seed(2)
    out = {}
    for name, width, n_src in (("mixer read-back, demo", 256, 2 * T * 17 // 16),
                               ("mixer read-back, paper-70m", 1024, 2 * T * 17 // 16),
                               ("mlp combine, paper-70m", 512, 2 * T)):
        idx = torch.randperm(n_src, generator=g)[: 2 * T].view(T, 2).sort(0).values  # per-expert streams, in order
        src, w = torch.randn(n_src, width, generator=g), torch.rand(T, 2, generator=g)
        out[f"{name} ({2 * T} of {n_src} x {width})"] = (
            lambda a, c, i=idx: (routing.read_back(a, i, c),),
            lambda a, c, i=idx: (F.embedding_bag(i, a, per_sample_weights=c, mode="sum"),), (src, w))
    return out


def cases(T: int, d: int = 512, H: int = 4, hidden: int = 1536, V: int = 8192):
    """name -> (fused fn, reference fn, inputs); each fn maps the inputs to a tuple of outputs."""
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(1, T, 3, H, d // H, generator=g)
    cos, sin = fused.rope_angles(torch.arange(T), d // H, 10000.0, torch.float32)
    h = torch.randn(1, T, 2 * hidden, generator=g)
    x = torch.randn(1, T, d, generator=g)
    w = torch.rand(d, generator=g) + 0.5
    hh = torch.randn(T, d, generator=g)
    head = torch.randn(V, d, generator=g) * 0.02
    t = torch.randint(0, V, (T,), generator=g)
    return {
        "rope_qkv": (lambda a: tuple(fused.rope_qkv(a, cos, sin).unbind(0)),
                     lambda a: rope_reference_qkv(a, cos, sin), (qkv,)),
        "glu (silu)": (lambda a: (fused.glu(a, "silu"),), lambda a: (fused.glu_reference(a, "silu"),), (h,)),
        "rms_norm": (lambda a, b: (fused.rms_norm(a, b, 1e-6),),
                     lambda a, b: (fused.rms_norm_reference(a, b, 1e-6),), (x, w)),
        "linear_cross_entropy": (lambda a, b: (fused.linear_cross_entropy(a, b, t),),
                                 lambda a, b: (fused.linear_cross_entropy_reference(a, b, t),), (hh, head)),
    }


def fwd_bwd(fn, inputs):
    leaves = [x.detach().requires_grad_() for x in inputs]
    grads = None

    def run():
        nonlocal grads
        outs = fn(*leaves)
        if grads is None:
            grads = [torch.randn_like(o) for o in outs]
        torch.autograd.backward(outs, grads)
        for leaf in leaves:
            leaf.grad = None

    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    results = []
    all_cases = cases(args.seq_len)
    if kernel_library.available():
        all_cases.update(mamba_cases(args.seq_len))
        all_cases.update(read_back_cases(args.seq_len))
    else:
        print("no compiled kernel (no C compiler): the Mamba and read-back rows are skipped")
    for name, (fast, ref, inputs) in all_cases.items():
        runs = {"fused": fwd_bwd(fast, inputs), "reference": fwd_bwd(ref, inputs)}
        times = {k: [] for k in runs}
        for run in runs.values():
            run()
        for i in range(args.repeat):
            for k, run in (list(runs.items()) if i % 2 == 0 else list(runs.items())[::-1]):
                times[k].append(time_fn(run, warmup=0, repeat=1))
        fused_s, ref_s = statistics.median(times["fused"]), statistics.median(times["reference"])
        results.append(dict(op=name, seq_len=args.seq_len, fused_seconds=fused_s, reference_seconds=ref_s,
                            speedup=ref_s / fused_s, fused_times=times["fused"], reference_times=times["reference"]))
    print_table(["op (fwd + bwd)", "fused ms", "reference ms", "reference / fused"],
                [[r["op"], f"{1e3 * r['fused_seconds']:.2f}", f"{1e3 * r['reference_seconds']:.2f}",
                  f"{r['speedup']:.2f}x"] for r in results])
    write_json("bench_fused", dict(meta=meta(), results=results))
    return 0


if __name__ == "__main__":
    from _common import apply_runtime_settings

    apply_runtime_settings()
    sys.exit(main())
