"""linlm against llama.cpp on one Mamba checkpoint, side by side in one run.

    python benchmarks/bench_llamacpp.py [--threads 1,2] [--rounds 3] [--contexts 128,2048]

1. The model: a Mamba at mamba-130m's shape (d 768, 24 layers, vocabulary 32,000, d_state 16, expand 2, dt rank
   48) with transformers' random initialisation (seeded), saved by transformers as a ``MambaForCausalLM``
   checkpoint, with a sentencepiece tokenizer trained here on linlm's built-in corpus (8,000 pieces; the other
   embedding rows are unused, as in real checkpoints whose vocabulary is padded).
2. It is converted twice: by ``linlm convert`` (fp32; then ``linlm quantize --to int8``) and by llama.cpp's own
   ``convert_hf_to_gguf.py`` (``--outtype f32`` and ``q8_0``). llama.cpp comes from llama-cpp-python, built from
   source into an environment of its own on first use (benchmarks/_llamacpp_env.py); nothing else needs it.
3. Both engines must give the same greedy tokens for a seeded prompt at fp32 (checked: the run exits with an error
   otherwise, after writing its JSON); for 8-bit weights the agreement with Q8_0 is reported (the two quantise
   differently).
4. Rounds: in each, every (engine, precision, threads) runs once as its own process (benchmarks/_engine_worker.py),
   the two engines of a precision back to back, in an order that alternates between rounds. Each process loads
   the model, prefills each context's prompt (tokens/s), decodes tokens after it (ms/token, median) and reports
   its peak resident set. The table gives the medians over rounds.
5. The memory bandwidth is measured in the same run (a read of a 1 GiB float32 tensor, at each thread count),
   with the floor it puts under a batch-1 step: every weight read once.
6. ``--torch-step``: linlm's fp32 model once more with its eager step on torch's ops alone, as the variant
   ``linlm-fp32-torchstep``: every matrix-vector product on ``F.linear`` and the element-wise work as torch ops,
   none of linlm's decoding kernels (linlm.ops.gemv_kernel, linlm.ops.step_kernel): what they gain, in the same run.
7. ``--hgrn2``: linlm's HGRN2 at the same shape (random weights) through the same protocol, for the
   constant-memory claim: decode latency and state size after each context.
8. Lean decoding (leave it out with ``--no-lean``): linlm's fp32 and int8 models once more through
   linlm.infer.lean, the C kernels with numpy around them in a process that never imports torch (the worker
   reports that it did not), as the variants ``linlm-fp32-lean`` and ``linlm-int8-lean``: what a decoding process
   without torch's runtime holds, against llama.cpp's.
9. Batched decoding (``--batches``, default 8 and 32; ``--batches ''`` leaves it out): in the same worker processes
   as above, after their peak RSS is read, linlm's fp32 and int8 models and llama.cpp's F32 and Q8_0 decode B
   sequences at once (each after its own prompt), and the aggregate decode tokens/s is reported per engine, with
   linlm's over llama.cpp's. llama.cpp runs them as parallel sequences of one context (``n_seq_max`` = B, a batch of
   B tokens per step, one per sequence id, through its C API). The tokens each engine picks first for each sequence
   are compared at fp32, as at batch 1.

Targets (the ratios are linlm over llama.cpp): decode ms/token fp32/F32 <= 1.0 and int8/Q8_0 <= 1.0; peak RSS
<= 1.2 at each precision; prefill tokens/s >= 2. At one thread the CPU clock is used (robust on a shared machine),
at more threads the wall clock. Writes benchmarks/results/bench_llamacpp.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from _common import apply_runtime_settings, bandwidth, meta, print_table, write_json
from _llamacpp_env import default_root, ensure

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_engine_worker.py"
SHAPE = dict(vocab_size=32000, hidden_size=768, num_hidden_layers=24, state_size=16, expand=2, conv_kernel=4,
             time_step_rank=48)
TOKENIZER_PIECES = 8000
TARGETS = {"decode_fp32": 1.0, "decode_int8": 1.0, "peak_rss": 1.2, "prefill": 2.0}


def log(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------------------------------ the models

def build_checkpoint(out: Path, env, shape: dict) -> Path:
    """A transformers MambaForCausalLM checkpoint with random weights and a trained sentencepiece tokenizer."""
    if (out / "tokenizer.model").is_file():
        return out
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    cfg = MambaConfig(**shape, use_bias=False, use_conv_bias=True, tie_word_embeddings=True)
    MambaForCausalLM(cfg).save_pretrained(out)
    from linlm.data.corpus import load_builtin_corpus

    text = out / "corpus.txt"
    text.write_text(load_builtin_corpus()[:4_000_000], encoding="utf-8")
    pieces = min(TOKENIZER_PIECES, shape["vocab_size"])
    code = ("import sentencepiece as s, sys; s.SentencePieceTrainer.train(input=sys.argv[1], model_prefix=sys.argv[2],"
            f" vocab_size={pieces}, model_type='bpe', byte_fallback=True, num_threads=1, minloglevel=2)")
    subprocess.run([env.python, "-c", code, text, out / "tokenizer"], check=True)
    text.unlink()
    (out / "tokenizer.vocab").unlink()
    return out


def convert_all(work: Path, env, shape: dict) -> dict[str, Path]:
    """{variant: path}: linlm fp32 and int8, llama.cpp F32 and Q8_0."""
    import linlm
    from linlm.infer.quantize import quantize

    hf = build_checkpoint(work / "hf-mamba", env, shape)
    paths = {"linlm-fp32": work / "linlm-fp32", "linlm-int8": work / "linlm-int8",
             "llamacpp-f32": work / "mamba-f32.gguf", "llamacpp-q8_0": work / "mamba-q8_0.gguf"}
    if not (paths["linlm-fp32"] / "config.json").is_file():
        linlm.convert(hf, paths["linlm-fp32"])
    if not (paths["linlm-int8"] / "config.json").is_file():
        quantize(paths["linlm-fp32"], paths["linlm-int8"], "int8")
    for outtype in ("f32", "q8_0"):
        target = paths[f"llamacpp-{outtype}"]
        if not target.is_file():
            partial = target.with_suffix(".partial")
            subprocess.run([env.python, env.converter, hf, "--outtype", outtype, "--outfile", partial], check=True,
                           stdout=subprocess.DEVNULL)
            partial.rename(target)
    return paths


def build_hgrn2(work: Path, shape: dict) -> Path:
    from linlm.models.lm import create_model

    out = work / "linlm-hgrn2"
    if not (out / "config.json").is_file():
        torch.manual_seed(0)
        create_model("hgrn2", preset="paper-160m", d_model=shape["hidden_size"], n_layers=shape["num_hidden_layers"],
                     vocab_size=shape["vocab_size"]).save(out)
    return out


# ------------------------------------------------------------------------------------------------ measuring

def run_worker(python: Path, engine: str, model: Path, threads: int, args, extra=()) -> dict:
    cmd = [str(python), str(WORKER), engine, str(model), "--threads", str(threads), "--contexts", args.contexts,
           "--decode-tokens", str(args.decode_tokens), *extra]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"the {engine} worker failed (exit status {done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def clock(threads: int) -> str:
    return "cpu" if threads == 1 else "wall"


BATCHED = ("linlm-fp32", "llamacpp-f32", "linlm-int8", "llamacpp-q8_0")  # the variants that also decode in batches


def summarise(runs: list[dict], contexts: list[int]) -> dict:
    """Medians over rounds of one (variant, threads)."""
    threads = runs[0]["threads"]
    c = clock(threads)
    out = {"rounds": len(runs), "clock": c, "peak_rss_bytes": statistics.median(r["peak_rss_bytes"] for r in runs)}
    profiles = [r["step_profile"] for r in runs if r.get("step_profile")]
    if profiles:
        out["step_profile"] = {k: statistics.median(p[k] for p in profiles) for k in profiles[0]}
    compiles = [r["compile_s"] for r in runs if r.get("compile_s") is not None]
    if compiles:
        out["compile_s"] = statistics.median(compiles)
    for n in contexts:
        rows = [r["contexts"][str(n)] for r in runs]
        out[f"decode_ms_{n}"] = statistics.median(r[f"decode_ms_{c}"] for r in rows)
        out[f"prefill_tokens_per_s_{n}"] = statistics.median(r[f"prefill_tokens_per_s_{c}"] for r in rows)
        out[f"state_bytes_{n}"] = rows[0]["state_bytes"]
    for b in runs[0].get("batched", {}):
        rows = [r["batched"][b] for r in runs]
        out[f"batch_{b}_step_ms"] = statistics.median(r[f"step_ms_{c}"] for r in rows)
        out[f"batch_{b}_tokens_per_s"] = statistics.median(r[f"tokens_per_s_{c}"] for r in rows)
    return out


def batched_rows(summary: dict, threads: list[int], batches: list[int]) -> list[dict]:
    """linlm against llama.cpp at each batch size: aggregate decode tokens/s of each and their ratio."""
    rows = []
    for t in threads:
        for lin, cpp in (("linlm-fp32", "llamacpp-f32"), ("linlm-int8", "llamacpp-q8_0")):
            a, b = summary.get(f"{lin}@{t}", {}), summary.get(f"{cpp}@{t}", {})
            for n in batches:
                x, y = a.get(f"batch_{n}_tokens_per_s"), b.get(f"batch_{n}_tokens_per_s")
                if x and y:
                    rows.append({"threads": t, "batch": n, "linlm": lin, "llamacpp": cpp, "linlm_tokens_per_s": x,
                                 "llamacpp_tokens_per_s": y, "ratio": x / y})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--contexts", default="128,2048", help="decode after these many tokens; the largest is also "
                                                            "the prefill")
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--work", default=None, help="where the models are written (default: <llama.cpp dir>/work)")
    ap.add_argument("--llamacpp-dir", default=None, help="llama.cpp's environment (default: $LINLM_LLAMACPP_DIR or "
                                                        "the user cache)")
    ap.add_argument("--hgrn2", action="store_true", help="also run linlm's HGRN2 at the same shape")
    ap.add_argument("--shape", default=None, help="override the shape, e.g. hidden_size=64,num_hidden_layers=2 "
                                                   "(a quick check of the script)")
    ap.add_argument("--no-compile", dest="compiled", action="store_false",
                    help="leave out linlm's compiled step (CausalLM.compile_step)")
    ap.add_argument("--torch-step", action="store_true",
                    help="also run linlm's fp32 model with its eager step on torch's ops alone, none of linlm's "
                         "decoding kernels (linlm-fp32-torchstep): what they gain, in the same run")
    ap.add_argument("--no-lean", dest="lean", action="store_false",
                    help="leave out linlm's lean decoding (linlm.infer.lean: the kernels without torch)")
    ap.add_argument("--batches", default="8,32", help="batched decoding at these batch sizes ('' for none)")
    ap.add_argument("--name", default="bench_llamacpp")
    args = ap.parse_args()
    apply_runtime_settings()
    threads = [int(t) for t in args.threads.split(",")]
    contexts = sorted(int(c) for c in args.contexts.split(","))
    batches = sorted(int(b) for b in filter(None, args.batches.split(",")))
    shape = dict(SHAPE)
    for kv in filter(None, (args.shape or "").split(",")):
        k, v = kv.split("=")
        shape[k] = int(v)
    root = Path(args.llamacpp_dir) if args.llamacpp_dir else default_root()
    env = ensure(root, log)
    tag = "-".join(f"{shape[k]}" for k in sorted(shape))
    work = Path(args.work) if args.work else root / "work" / tag
    work.mkdir(parents=True, exist_ok=True)
    paths = convert_all(work, env, shape)
    if args.hgrn2:
        paths["linlm-hgrn2"] = build_hgrn2(work, shape)
    # Bytes of weights by model file or directory name (a compiled variant reads its model's)
    weights = {p.name: sum(f.stat().st_size for f in (p.glob("*.safetensors") if p.is_dir() else [p]))
               for p in paths.values()}
    pythons = {"linlm": Path(sys.executable), "lean": Path(sys.executable), "llamacpp": env.python}
    # variant -> (engine, model, worker options): the compiled variants decode the same model through compile_step
    variants = {v: (v.split("-")[0], paths[v], ()) for v in paths}
    groups = [["linlm-fp32", "llamacpp-f32"], ["linlm-int8", "llamacpp-q8_0"]]
    if args.compiled:
        for group in groups:
            v = group[0]
            variants[f"{v}-compiled"] = ("linlm", paths[v], ("--compile",))
            group.insert(1, f"{v}-compiled")
    if args.lean:  # the same models through linlm.infer.lean, in processes without torch
        for group in groups:
            variants[f"{group[0]}-lean"] = ("lean", paths[group[0]], ())
            group.insert(1, f"{group[0]}-lean")
    if args.torch_step:
        variants["linlm-fp32-torchstep"] = ("linlm", paths["linlm-fp32"], ("--torch-step",))
        groups[0].insert(1, "linlm-fp32-torchstep")
    if args.hgrn2:
        groups.append(["linlm-hgrn2"])
    pairs = [(lin, group[-1]) for group in groups[:2] for lin in group[:-1]]
    runs: dict[tuple[str, int], list[dict]] = {}
    bw: dict[int, list[dict]] = {t: [] for t in threads}
    for r in range(args.rounds):
        for t in threads:
            bw[t].append(bandwidth(t))
            for group in groups:
                for variant in (group if r % 2 == 0 else group[::-1]):
                    engine, model, extra = variants[variant]
                    if engine == "linlm" and r == 0:  # the step's time, taken apart, once per variant
                        extra = (*extra, "--profile-step")
                    if batches and variant in BATCHED:
                        extra = (*extra, "--batches", ",".join(map(str, batches)))
                    res = run_worker(pythons[engine], engine, model, t, args, extra)
                    runs.setdefault((variant, t), []).append(res)
                    c = res["contexts"]
                    log(f"round {r + 1} threads {t} {variant:>14}: " + ", ".join(
                        f"decode@{n} {c[str(n)][f'decode_ms_{clock(t)}']:.1f} ms" for n in contexts)
                        + f", prefill@{contexts[-1]} {c[str(contexts[-1])][f'prefill_tokens_per_s_{clock(t)}']:.0f}"
                        f" tok/s, peak {res['peak_rss_bytes'] / 2**20:.0f} MiB")

    greedy = {v: runs[(v, threads[0])][0]["greedy"] for v in variants}
    # On random weights the logits are nearly tied: 8-bit weights of either engine may pick other tokens than that
    # engine's fp32 (the last two pairs say how often), so only fp32 against F32 is a check.
    checks = [(lin, cpp) for lin, cpp in pairs if lin.startswith("linlm-fp32")]
    checks += [p for p in pairs if p not in checks]
    checks += [("linlm-int8", "linlm-fp32"), ("llamacpp-q8_0", "llamacpp-f32")]
    agree = {f"{a} vs {b}": sum(x == y for x, y in zip(greedy[a], greedy[b])) / len(greedy[a]) for a, b in checks}
    summary = {f"{v}@{t}": summarise(rs, contexts) for (v, t), rs in runs.items()}
    batched = batched_rows(summary, threads, batches)
    # the first token each engine picks for each sequence of a batch, at fp32 (first round, first thread count)
    for n in batches:
        a, b = (runs[(v, threads[0])][0]["batched"][str(n)]["first_tokens"] for v in ("linlm-fp32", "llamacpp-f32"))
        agree[f"linlm-fp32 vs llamacpp-f32, batch {n}"] = sum(x == y for x, y in zip(a, b)) / n
    bandwidths = {t: {k: statistics.median(b[k] for b in bw[t]) for k in ("gb_per_s_wall", "gb_per_s_cpu")}
                  for t in threads}
    ratios = []
    n_max = contexts[-1]
    for t in threads:
        for lin, cpp in pairs:
            key = "decode_fp32" if cpp == "llamacpp-f32" else "decode_int8"
            a, b = summary[f"{lin}@{t}"], summary[f"{cpp}@{t}"]
            for n in contexts:
                ratios.append({"threads": t, "what": f"{key} after {n}", "linlm": a[f"decode_ms_{n}"],
                               "llamacpp": b[f"decode_ms_{n}"], "ratio": a[f"decode_ms_{n}"] / b[f"decode_ms_{n}"],
                               "target": f"<= {TARGETS[key]}",
                               "met": a[f"decode_ms_{n}"] / b[f"decode_ms_{n}"] <= TARGETS[key]})
            rss = a["peak_rss_bytes"] / b["peak_rss_bytes"]
            ratios.append({"threads": t, "what": f"peak_rss {lin}/{cpp}", "linlm": a["peak_rss_bytes"],
                           "llamacpp": b["peak_rss_bytes"], "ratio": rss, "target": f"<= {TARGETS['peak_rss']}",
                           "met": rss <= TARGETS["peak_rss"]})
            pf = a[f"prefill_tokens_per_s_{n_max}"] / b[f"prefill_tokens_per_s_{n_max}"]
            ratios.append({"threads": t, "what": f"prefill@{n_max} {lin}/{cpp}",
                           "linlm": a[f"prefill_tokens_per_s_{n_max}"], "llamacpp": b[f"prefill_tokens_per_s_{n_max}"],
                           "ratio": pf, "target": f">= {TARGETS['prefill']}", "met": pf >= TARGETS["prefill"]})
    floors = {t: {v: weights[Path(m).name] / (bandwidths[t]["gb_per_s_" + clock(t)] * 1e9) * 1e3
                  for v, (_, m, _) in variants.items()} for t in threads}
    print_table(["variant@threads", *[f"decode ms @{n}" for n in contexts], f"prefill tok/s @{n_max}", "peak MiB",
                 "floor ms"],
                [[k, *[s[f"decode_ms_{n}"] for n in contexts], s[f"prefill_tokens_per_s_{n_max}"],
                  s["peak_rss_bytes"] / 2**20, floors[int(k.split("@")[1])][k.split("@")[0]]]
                 for k, s in summary.items()])
    print()
    print_table(["threads", "ratio", "linlm", "llama.cpp", "linlm/llama.cpp", "target", "met"],
                [[r["threads"], r["what"], r["linlm"], r["llamacpp"], r["ratio"], r["target"], r["met"]]
                 for r in ratios])
    profiled = {k: s["step_profile"] for k, s in summary.items() if "step_profile" in s}
    if profiled:
        print()
        print_table(["variant@threads", "step ms", "matvec ms", "dispatch ms", "rest ms", "floor ms", "compile s"],
                    [[k, p["step_ms"], p["matvec_ms"], p["dispatch_ms"], p["rest_ms"],
                      floors[int(k.split("@")[1])][k.split("@")[0]], summary[k].get("compile_s", "")]
                     for k, p in profiled.items()])
    if batched:
        print()
        print_table(["threads", "batch", "linlm", "tok/s", "llama.cpp", "tok/s", "linlm/llama.cpp"],
                    [[r["threads"], r["batch"], r["linlm"], r["linlm_tokens_per_s"], r["llamacpp"],
                      r["llamacpp_tokens_per_s"], r["ratio"]] for r in batched])
    print(f"greedy agreement: {agree}; bandwidth GB/s: {bandwidths}")
    payload = {"meta": meta(), "shape": shape, "variants": {v: [e, Path(m).name, list(x)] for v, (e, m, x) in
                                                            variants.items()}, "llama_cpp_python": env.version, "contexts": contexts,
               "threads": threads, "rounds": args.rounds, "decode_tokens": args.decode_tokens,
               "weights_bytes": weights, "bandwidth": bandwidths, "floor_ms": floors, "greedy": greedy,
               "greedy_agreement": agree, "summary": summary, "ratios": ratios, "batches": batches,
               "batched": batched,
               "runs": {f"{v}@{t}": rs for (v, t), rs in runs.items()}}
    print(f"wrote {write_json(args.name, payload)}")
    if min(agree[f"{a} vs {b}"] for a, b in checks if a.startswith("linlm-fp32")) < 1:
        sys.exit("linlm fp32 and llama.cpp F32 disagree on the greedy tokens: " + json.dumps(greedy))


if __name__ == "__main__":
    main()
