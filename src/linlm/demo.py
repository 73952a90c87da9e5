"""``linlm demo``: train a small model on the built-in Shakespeare corpus in a few minutes on a CPU, then print
samples and where the loss curve and checkpoint are (configs/demo.yaml).

``linlm check``: build every architecture at a small size, check that incremental decoding matches one full
forward pass, and print parameters, FLOPs per token and decoding-state sizes."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from linlm.models.counting import count
from linlm.models.lm import create_model
from linlm.models.registry import ARCHITECTURES

SAMPLE = "Linear attention keeps a fixed-size state, so decoding costs the same at every position."


def decode_check(model, ids: torch.Tensor, prefill: int) -> tuple[float, int]:
    """Max |logit difference| between prefill + token-by-token steps and one full pass, and state bytes."""
    with torch.no_grad():
        full = model(ids)
        out = model(ids[:, :prefill], return_state=True)
        pieces, state = [out.logits], out.state
        for t in range(prefill, ids.shape[1]):
            step = model(ids[:, t : t + 1], state=state, return_state=True)
            pieces.append(step.logits)
            state = step.state
        inc = torch.cat(pieces, dim=1)
    return float((inc - full).abs().max()), state.nbytes()


def run_check(archs: Optional[Sequence[str]] = None, preset: str = "tiny", seed: int = 0) -> list[dict]:
    from linlm.infer.report import print_table

    archs = list(archs or ARCHITECTURES)
    ids = torch.tensor([list(SAMPLE.encode("utf-8"))], dtype=torch.long)
    rows, results = [], []
    for arch in archs:
        torch.manual_seed(seed)
        model = create_model(arch, preset=preset, vocab_size=256).eval()
        counts = count(model.config, batch=1, seq_len=ids.shape[1])
        diff, state_bytes = decode_check(model, ids, prefill=ids.shape[1] // 2)
        results.append(dict(arch=arch, params=counts["total_params"], flops_per_token=counts["flops_per_token"],
                            max_logit_diff=diff, state_bytes=state_bytes))
        rows.append([arch, f"{counts['total_params']:,}", f"{counts['flops_per_token']:.3g}", f"{diff:.2e}",
                     f"{state_bytes:,}"])
    print_table(["arch", "params", "train FLOPs/token", "max |logit diff|", "state bytes/seq"], rows,
                title=f"linlm check: preset {preset!r}, {ids.shape[1]}-token sample, prefill half then decode")
    worst = max(r["max_logit_diff"] for r in results)
    print(f"incremental decoding matches the full pass for every architecture (worst |diff| {worst:.1e})"
          if worst < 1e-3 else f"WARNING: decoding differs from the full pass by up to {worst:.2e}")
    return results


def unigram_entropy(data_dir, split: str = "train") -> float:
    """Entropy (nats/token) of the split's unigram distribution: the loss of a model that ignores context."""
    import numpy as np

    from linlm.data.loader import TokenDataset

    ds = TokenDataset(data_dir, split)
    counts = np.zeros(ds.vocab_size, dtype=np.int64)
    step = 1 << 22
    for start in range(0, ds.num_tokens, step):
        counts += np.bincount(ds.read(start, min(step, ds.num_tokens - start)), minlength=ds.vocab_size)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def run_demo(archs: Optional[Sequence[str]] = None, preset: Optional[str] = None, out_dir: Optional[str] = None,
             steps: Optional[int] = None, overrides: Optional[Sequence[str]] = None):
    """Train configs/demo.yaml (the first of ``archs`` replaces its architecture) into ``out_dir``."""
    import time

    from linlm.config import load_yaml, parse_overrides
    from linlm.errors import ConfigError
    from linlm.train.config import build_config, preset_path
    from linlm.train.loop import prepared_data_dir, train

    path = preset_path("demo")
    if path is None:
        raise ConfigError("configs/demo.yaml was not found beside the linlm sources; run the demo from a source "
                          "checkout, or use `linlm train --config FILE`")
    base = load_yaml(path)
    if archs:
        base["model"]["arch"] = archs[0]
    if preset:  # a preset replaces the demo's own shape
        base["model"].update(preset=preset, overrides={})
    if out_dir:
        base["out_dir"] = out_dir
    if steps:
        base["steps"] = steps
    cfg = build_config(None, parse_overrides(list(overrides or [])), base=base)
    started = time.perf_counter()
    result = train(cfg, overwrite=True)
    data_dir = cfg.data.dir or prepared_data_dir(cfg)
    entropy = unigram_entropy(data_dir)
    val = f"{result.val_loss:.3f}" if result.val_loss is not None else "n/a"
    loss = f"{result.loss:.3f}" if result.loss is not None else "n/a"
    print(f"\nlinlm demo: {cfg.model.arch}, {result.step} steps in {time.perf_counter() - started:.0f} s "
          f"(data preparation included)")
    print(f"  final train loss {loss}, validation loss {val} nats/token; the unigram entropy of the "
          f"data is {entropy:.3f} (a model that ignores context)")
    print(f"  loss curve: {result.plot}")
    print(f"  checkpoint: {result.checkpoint}")
    print(f"  samples:    {result.out_dir / 'samples.txt'}")
    print(f"  more text:  linlm generate --checkpoint {result.out_dir} --prompt 'ROMEO:'")
    return result
