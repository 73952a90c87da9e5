"""MossNet's two mixtures, forward + backward, each against its own baseline in this one process.

1. Time mixer, E = 8 SSM experts, k = 2: policy "routed" (each expert scans only its tokens) against "dense"
   (every expert scans every token). Target: routed <= 0.5 x dense. Both S6 and SSD kernels are measured.
2. Channel mixer: the MoE of 8 SwiGLU experts, k = 2, against a dense SwiGLU with the same active parameters
   (hidden = k * expert_dim). Target: MoE <= 1.5 x dense.

Default sizes: d = 512 (expand 2, Din = 1024, N = 16), T = 2048, batch 1 for the time mixer and 2 for the MLP,
float32, the model's own init (router weights N(0, 0.02): a near-uniform router, as at the start of training).
Every timing is the median of --repeat runs after --warmup runs, the two sides interleaved run by run;
loss = sum(y * gy) + aux.

    python benchmarks/bench_mossnet.py [--seq-len 2048] [--d-model 512] [--repeat 3] [--threads N]

Writes benchmarks/results/bench_mossnet.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, time_fn, write_json  # noqa: E402

from linlm.layers.glu import GLU  # noqa: E402
from linlm.layers.moe import MoEMLP  # noqa: E402
from linlm.layers.mossnet import MossNetMixer  # noqa: E402
from linlm.models.presets import preset_config  # noqa: E402


def fwd_bwd(module, x):
    x = x.clone().requires_grad_(True)
    gy = torch.randn_like(x)

    def run():
        module.zero_grad(set_to_none=True)
        x.grad = None
        out = module(x)
        y, aux = (out[0], out[-1]) if isinstance(out, tuple) else (out, None)
        loss = (y * gy).sum()
        if aux is not None:
            loss = loss + aux
        loss.backward()

    return run


def compare(fns: dict, warmup: int, repeat: int) -> dict:
    """Median seconds of each function, the runs interleaved (a, b, a, b, ...) so that a change in machine load
    during the measurement hits both sides alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            samples[name].append(time_fn(fn, warmup=0, repeat=1))
    return {name: statistics.median(v) for name, v in samples.items()}


def init_like_model(module, std: float = 0.02):
    """The init CausalLM.reset_parameters gives: N(0, std) for every Linear (the router included)."""
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, 0.0, std)
    return module


def occupancy(mixer: MossNetMixer, x: torch.Tensor) -> float:
    """Longest expert subsequence over T: the routed scan's padded length (k / E when perfectly balanced)."""
    with torch.no_grad():
        idx = mixer.router(x).topk(mixer.top_k, dim=-1).indices
    counts = torch.zeros(x.shape[0], mixer.n_experts, dtype=torch.long).scatter_add_(
        1, idx.flatten(1), torch.ones_like(idx.flatten(1)))
    return float(counts.max()) / x.shape[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--mixer-batch", type=int, default=1)
    ap.add_argument("--mlp-batch", type=int, default=2)
    ap.add_argument("--kernels", nargs="+", default=["s6", "ssd"])
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    d, T, E, k = args.d_model, args.seq_len, args.experts, args.top_k
    rows, results = [], {"time_mixer": [], "mlp": None}

    # 1. time mixer: routed vs dense, same weights
    x = torch.randn(args.mixer_batch, T, d)
    for kernel in args.kernels:
        mixers = {}
        for policy in ("dense", "routed"):
            cfg = preset_config("mossnet", None, d_model=d, n_heads=1, ssm_experts=E, ssm_top_k=k,
                                ssm_policy=policy, ssm_kernel=kernel)
            torch.manual_seed(1)
            mixers[policy] = init_like_model(MossNetMixer(cfg, 0))
        mixers["routed"].load_state_dict(mixers["dense"].state_dict())
        times = compare({p: fwd_bwd(m, x) for p, m in mixers.items()}, args.warmup, args.repeat)
        print(f"  time mixer {kernel}: {times}", flush=True)
        ratio = times["routed"] / times["dense"]
        occ = occupancy(mixers["routed"], x)
        results["time_mixer"].append(dict(kernel=kernel, dense_s=times["dense"], routed_s=times["routed"],
                                          ratio=ratio, target=0.5, routed_occupancy=occ, ideal_occupancy=k / E))
        rows.append([f"time mixer ({kernel}), B={args.mixer_batch}", "routed vs dense", f"{times['routed']:.3f}",
                     f"{times['dense']:.3f}", f"{ratio:.2f}x", "<= 0.50x", "ok" if ratio <= 0.5 else "MISSED"])
        del mixers

    # 2. MoE MLP vs a dense SwiGLU of the same active parameters
    cfg = preset_config("mossnet", "paper-70m")
    h = cfg.glu_hidden // k  # per-expert width whose k experts hold the dense GLU's parameters
    moe = init_like_model(MoEMLP(d, E, k, h, 0))
    dense = init_like_model(GLU(d, k * h))
    xm = torch.randn(args.mlp_batch, T, d)
    times = compare({"moe": fwd_bwd(moe, xm), "dense": fwd_bwd(dense, xm)}, args.warmup, args.repeat)
    t_moe, t_dense = times["moe"], times["dense"]
    active_moe = moe.active_params() - moe.router.weight.numel()
    assert active_moe == sum(p.numel() for p in dense.parameters())
    ratio = t_moe / t_dense
    results["mlp"] = dict(moe_s=t_moe, dense_s=t_dense, ratio=ratio, target=1.5, expert_dim=h, dense_hidden=k * h,
                          active_expert_params=active_moe, router_params=moe.router.weight.numel())
    rows.append([f"MoE MLP E={E} k={k} h={h}, B={args.mlp_batch}", f"vs SwiGLU g={k * h}", f"{t_moe:.3f}",
                 f"{t_dense:.3f}", f"{ratio:.2f}x", "<= 1.50x", "ok" if ratio <= 1.5 else "MISSED"])

    print_table(["what", "compared with", "time (s)", "baseline (s)", "ratio", "target", ""], rows)
    sizes = dict(d_model=d, d_inner=2 * d, d_state=16, seq_len=T, experts=E, top_k=k,
                 mixer_batch=args.mixer_batch, mlp_batch=args.mlp_batch, dtype="float32",
                 warmup=args.warmup, repeat=args.repeat)
    path = write_json("bench_mossnet", dict(meta=meta(), sizes=sizes, results=results))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    from _common import apply_runtime_settings

    apply_runtime_settings()
    sys.exit(main())
