"""``linlm check``: build every architecture at a small size, check that incremental decoding matches one full
forward pass, and print parameters, FLOPs per token and decoding-state sizes."""

from __future__ import annotations

from typing import Optional, Sequence

from linlm.cli_ranges import RANGES
from linlm.errors import ShapeError

SAMPLE = "Linear attention keeps a fixed-size state, so decoding costs the same at every position."


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="build every architecture, check decoding against a full pass, "
                                            "print a table")
    p.add_argument("--archs", nargs="*", default=None,
                   help="architectures to include, comma- or space-separated (default: every registered one, "
                        "see `linlm archs`)")
    p.add_argument("--preset", default="tiny", help="size preset (see `linlm archs`)")
    p.add_argument("--attn-every", type=RANGES["attn_every"], default=0, metavar="K",
                   help="check each architecture as a hybrid with attention at every K-th layer (0: none)")
    p.add_argument("--attn-window", type=RANGES["tokens"], default=None, metavar="W",
                   help="with --attn-every: sliding-window attention of W tokens")
    p.set_defaults(func=cmd_check)


def cmd_check(args) -> int:
    from linlm.cli_args import comma_lists

    archs = comma_lists(args.archs, "--archs")
    for name, status in kernel_report().items():
        print(f"{name}: {status}")
    hybrid = {"attn_every": args.attn_every} if args.attn_every else {}
    if args.attn_window is not None:
        hybrid["attn_window"] = args.attn_window
    run_check(archs=archs, preset=args.preset, **hybrid)
    return 0


def kernel_report() -> dict[str, str]:
    """Which compiled kernels this process runs on: linlm's C kernels (scan, conv, gates, gather-sum, and a decoding
    step's matrix-vector products, float32 and int8, and element-wise work), fbgemm's int8 GEMM of quantized models
    (9 to 64 rows), the instructions of the int8 kernel's sums, and the CPU capability torch dispatches to."""
    import torch

    from linlm.models.quant import kernels_available
    from linlm.ops import gemv_kernel, kernel_library

    backend = kernel_library.backend()
    if kernel_library.available():
        c = f"active ({'OpenMP' if kernel_library.openmp() else 'no OpenMP: Python threads'})"
    elif backend == "torch":
        c = "off (LINLM_SCAN_BACKEND=torch): the pure-torch ops run"
    else:
        c = "not built here (no C compiler, or its build failed: see the warning): the pure-torch ops run"
    form = gemv_kernel.q8_form()
    return {
        "C kernels": c,
        "int8 GEMM (fbgemm)": "available" if kernels_available() else "not in this torch build: int8 models "
                                                                    "do not load",
        "int8 decoding sums": f"{form} (linlm's kernel, up to {gemv_kernel.Q8_MAX_ROWS} rows)" if form else
                              "the C kernels are off: torch's int8 paths",
        "torch CPU capability": torch.backends.cpu.get_cpu_capability(),
    }


def decode_check(model, ids, prefill: int) -> tuple[float, int]:
    """Max |logit difference| between prefill + token-by-token steps and one full pass (ids [1, T]), and state
    bytes; a state that differs from what the mixers' state_spec says is a ShapeError naming the layer."""
    import torch

    from linlm.layers.mixer import spec_mismatch

    with torch.no_grad():
        full = model(ids)
        out = model(ids[:, :prefill], return_state=True)
        pieces, state = [out.logits], out.state
        for t in range(prefill, ids.shape[1]):
            step = model(ids[:, t : t + 1], state=state, return_state=True)
            pieces.append(step.logits)
            state = step.state
        inc = torch.cat(pieces, dim=1)
    spec = model.state_spec(ids.shape[0], ids.shape[1])
    wrong = spec_mismatch(spec.layers + [spec.extra], state.layers + [state.extra], "layer")
    if wrong is not None:
        raise ShapeError(f"{model.config.arch}: its decoding state breaks the token-mixer contract: {wrong} "
                         "(layer[n_layers] is the embeddings' state); fix state_spec() or the state forward returns")
    return float((inc - full).abs().max()), state.nbytes()


def run_check(archs: Optional[Sequence[str]] = None, preset: str = "tiny", seed: int = 0, **hybrid) -> list[dict]:
    """Build each architecture at ``preset`` (``hybrid``: attn_every / attn_window, checked as any model config),
    check its decoding against a full pass and print a table."""
    import torch

    from linlm.models.counting import count
    from linlm.models.lm import create_model
    from linlm.models.registry import arch_names
    from linlm.render import print_table

    archs = list(archs or arch_names())
    ids = torch.tensor([list(SAMPLE.encode("utf-8"))], dtype=torch.long)
    rows, results = [], []
    for arch in archs:
        torch.manual_seed(seed)
        model = create_model(arch, preset=preset, vocab_size=256, **hybrid).eval()
        counts = count(model.config, batch=1, seq_len=ids.shape[1])
        diff, state_bytes = decode_check(model, ids, prefill=ids.shape[1] // 2)
        results.append(dict(arch=arch, params=counts["total_params"],
                            counted_flops_per_token=counts["counted_flops_per_token"], max_logit_diff=diff,
                            state_bytes=state_bytes))
        rows.append([arch, f"{counts['total_params']:,}", f"{counts['counted_flops_per_token']:.3g}", f"{diff:.2e}",
                     f"{state_bytes:,}"])
    print_table(["arch", "params", "train FLOPs/token", "max |logit diff|", "state bytes/seq"], rows,
                title=f"linlm check: preset {preset!r}, {ids.shape[1]}-token sample, prefill half then decode")
    worst = max(r["max_logit_diff"] for r in results)
    print(f"incremental decoding matches the full pass for every architecture (worst |diff| {worst:.1e})"
          if worst < 1e-3 else f"WARNING: decoding differs from the full pass by up to {worst:.2e}")
    return results
