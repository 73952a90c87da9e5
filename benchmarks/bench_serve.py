"""`linlm serve` under load: requests/s and latency percentiles at 1, 8 and 32 concurrent clients.

    python benchmarks/bench_serve.py [--arch mamba] [--preset paper-70m] [--clients 1,8,32] [--requests 64]

A model of the architecture and preset (random weights; a tokenizer trained on a small text) is served by linlm's
server (FastAPI on uvicorn, in this process, on 127.0.0.1 and a free port). For each client count, that many
threads send ``--requests`` completions in all (greedy, ``--max-tokens`` tokens, prompts of a few words), each
waiting for its answer before sending the next. Reports requests/s, generated tokens/s and the 50th/90th/99th
percentile latency; writes benchmarks/results/bench_serve.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from _common import apply_runtime_settings, meta, print_table, write_json


def _percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="mamba")
    ap.add_argument("--preset", default="paper-70m")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    args = ap.parse_args()
    apply_runtime_settings()
    torch.set_num_threads(args.threads)
    import httpx
    import uvicorn

    from linlm import create_model
    from linlm.data.tokenizer import Tokenizer
    from linlm.infer.serve import Server, make_app

    words = "the king and queen of a land far away ride north to meet their old friend at dawn".split()
    g = torch.Generator().manual_seed(0)
    texts = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (40,), generator=g)) for _ in range(50)]
    tok = Tokenizer.train(texts, 300)
    torch.manual_seed(0)
    model = create_model(args.arch, preset=args.preset, vocab_size=320).eval()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(model, tok, Path(tmp), name=args.arch, max_batch=max(int(c) for c in args.clients.split(",")))
        uv = uvicorn.Server(uvicorn.Config(make_app(server), host="127.0.0.1", port=0, log_level="error"))
        thread = threading.Thread(target=uv.run, daemon=True)
        thread.start()
        while not uv.started:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{uv.servers[0].sockets[0].getsockname()[1]}/v1/completions"
        try:
            for clients in (int(c) for c in args.clients.split(",")):
                latencies, tokens, lock = [], [0], threading.Lock()
                todo = iter(range(args.requests))

                def client():
                    with httpx.Client(timeout=600) as http:
                        while True:
                            with lock:
                                i = next(todo, None)
                            if i is None:
                                return
                            body = {"prompt": texts[i % len(texts)][:30], "temperature": 0,
                                    "max_tokens": args.max_tokens, "stop": ["\x00"]}
                            t0 = time.perf_counter()
                            r = http.post(url, json=body)
                            dt = time.perf_counter() - t0
                            r.raise_for_status()
                            with lock:
                                latencies.append(dt)
                                tokens[0] += r.json()["usage"]["completion_tokens"]

                t0 = time.perf_counter()
                workers = [threading.Thread(target=client) for _ in range(clients)]
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
                wall = time.perf_counter() - t0
                rows.append({"clients": clients, "requests": len(latencies), "wall_s": wall,
                             "requests_per_s": len(latencies) / wall, "tokens_per_s": tokens[0] / wall,
                             "p50_s": _percentile(latencies, 50), "p90_s": _percentile(latencies, 90),
                             "p99_s": _percentile(latencies, 99), "mean_s": statistics.mean(latencies)})
                print(rows[-1], flush=True)
        finally:
            uv.should_exit = True
            thread.join(timeout=30)
            server.batcher.close()
    print_table(["clients", "requests/s", "tokens/s", "p50 s", "p90 s", "p99 s"],
                [[r["clients"], r["requests_per_s"], r["tokens_per_s"], r["p50_s"], r["p90_s"], r["p99_s"]]
                 for r in rows])
    payload = {"meta": meta(), "arch": args.arch, "preset": args.preset, "max_tokens": args.max_tokens,
               "torch_threads": args.threads, "rows": rows}
    print(f"wrote {write_json('bench_serve', payload)}")


if __name__ == "__main__":
    main()
