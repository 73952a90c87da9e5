"""``linlm generate`` (sample text from a trained model) and ``linlm profile`` (inference speed and memory)."""

from __future__ import annotations

import argparse
import sys
from typing import Optional


def register(subparsers) -> None:
    from linlm.cli_ranges import RANGES, NumberList

    p = subparsers.add_parser("generate", help="generate text from a model",
                              description="Continue PROMPT with a model from a run directory (its newest valid "
                                          "checkpoint), a checkpoint directory, or a directory from model.save().")
    p.add_argument("--model", "--checkpoint", dest="model", required=True, metavar="DIR",
                   help="run directory, checkpoint directory or saved model directory (old spelling: "
                        "--checkpoint)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="text to continue (default: empty, start a new document)")
    src.add_argument("--prompt-file", default=None, metavar="FILE", help="read the prompt from FILE ('-': stdin)")
    p.add_argument("--max-new-tokens", type=RANGES["new_tokens"], default=100)
    p.add_argument("--temperature", type=RANGES["temperature"], default=0.8, help="0 is greedy")
    p.add_argument("--top-k", type=RANGES["top_k"], default=40, help="0 keeps every token")
    p.add_argument("--top-p", type=RANGES["top_p"], default=1.0, help="nucleus sampling: keep the most likely tokens whose "
                                                             "probability reaches P (1 keeps every token)")
    p.add_argument("--seed", type=RANGES["seed"], default=0)
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="print tokens as they are decoded (the default; --no-stream prints the text once it is "
                        "done). Ctrl-C stops decoding and keeps what was printed")
    p.add_argument("--truncate-prompt", action="store_true",
                   help="drop the start of a prompt longer than the model's limit instead of refusing it")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.json or its directory (default: the one beside the weights, linlm's own or "
                        "a transformers one)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--compile", action="store_true",
                   help="decode through a torch.compile'd step (CausalLM.compile_step): less time per token beside "
                        "the weights' reads, after a first step that compiles (tens of seconds, cached on disk); "
                        "models whose state grows (a KV cache) decode eagerly")
    p.add_argument("--lean", action="store_true",
                   help="decode a saved Mamba (float32 or int8) on linlm's C kernels in a process that never imports "
                        "torch (linlm.infer.lean): less memory (no torch runtime); --model names the saved model or "
                        "checkpoint directory, the device is the CPU")
    p.set_defaults(func=cmd_generate)

    p = subparsers.add_parser("profile", help="prefill and decode speed, memory and state size against context",
                              description="Profile inference of each architecture at each context length (batch 1), "
                                          "beside transformers' LlamaForCausalLM of the same shape (hf-llama).")
    p.add_argument("--archs", default=None,
                   help="comma-separated architectures (default: every registered one, see `linlm archs`); add "
                        "hf-llama for transformers' Llama (added beside llama unless --no-hf)")
    p.add_argument("--preset", default="paper-70m", help="size preset (see `linlm archs`)")
    p.add_argument("--contexts", type=NumberList(RANGES["tokens"]), default="512,2048,8192,32768",
                   help="comma-separated context lengths")
    p.add_argument("--decode-tokens", type=RANGES["decode_tokens"], default=16,
                   help="tokens decoded per context (median latency)")
    p.add_argument("--batch", type=NumberList(RANGES["batch"]), default="1", metavar="N[,N]",
                   help="sequences decoded together, e.g. 1,8,32: one row each, with aggregate tokens/s and memory")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=RANGES["threads"], default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-hf", action="store_true", help="do not profile transformers' Llama")
    p.add_argument("--exported", default="", metavar="FMT[,FMT]",
                   help="also time each linlm architecture's exported step: onnx (onnxruntime), pt2 (torch.export), "
                        "or both; CPU only")
    p.add_argument("--compile", action="store_true",
                   help="also time each architecture's compiled step (model.compile_step(): not LLaMA, whose KV "
                        "cache grows), after an untimed step that compiles")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model config field, e.g. --set vocab_size=8192 (repeatable)")
    p.add_argument("--json", default=None, metavar="OUT",
                   help="write the rows as JSON to the file OUT (a new file, or one linlm wrote)")
    p.add_argument("--plot", default=None, metavar="OUT.png",
                   help="plot latency and memory against context into the PNG file OUT.png")
    p.set_defaults(func=cmd_profile)

    p = subparsers.add_parser("quantize", help="write a copy of a model with 8-bit weights",
                              description="Quantize MODEL's weights to int8 (one scale per output channel) into the "
                                          "new model directory OUT, which every command that loads a model takes "
                                          "as it is. See docs/inference.md.")
    p.add_argument("model", metavar="MODEL", help="saved model, checkpoint or run directory")
    p.add_argument("--to", required=True, choices=["int8"], help="the weights' format")
    p.add_argument("--out", required=True, metavar="DIR", help="the quantized model's directory (new or empty)")
    p.add_argument("--overwrite", action="store_true", help="replace a model directory linlm wrote at OUT")
    p.set_defaults(func=cmd_quantize)

    p = subparsers.add_parser("serve", help="an OpenAI-compatible HTTP server for a model",
                              description="Serve MODEL over HTTP: /v1/completions and /v1/chat/completions (with a "
                                          "chat template), streaming, requests decoded in one batch. Needs the "
                                          "serve extra. See docs/inference.md.")
    p.add_argument("model", metavar="MODEL", help="saved model, checkpoint or run directory")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=RANGES["port"], default=8000)
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: the one beside the weights)")
    p.add_argument("--max-batch", type=RANGES["requests"], default=32, help="requests decoded together at most")
    p.add_argument("--max-tokens", type=RANGES["decode_tokens"], default=4096,
                   help="the largest max_tokens a request may ask for")
    p.set_defaults(func=cmd_serve)

    p = subparsers.add_parser("export", help="export prefill and one-token step with the state as explicit tensors",
                              description="Write OUT.prefill.FMT, OUT.step.FMT and OUT.json: torch.export programs "
                                          "(pt2) or ONNX graphs (onnx; needs the export extra). See "
                                          "docs/inference.md.")
    p.add_argument("--model", required=True, metavar="DIR", help="saved model, checkpoint or run directory")
    p.add_argument("--format", default="pt2", choices=["pt2", "onnx"])
    p.add_argument("--out", required=True, metavar="STEM",
                   help="file stem of the outputs, not a directory: writes STEM.prefill.FMT, STEM.step.FMT and "
                        "STEM.json (a trailing .pt2, .onnx or .json is dropped), e.g. --out exports/tnl")
    p.add_argument("--batch-size", "--batch", dest="batch", type=RANGES["batch"], default=1,
                   help="batch size of the exported programs (old spelling: --batch)")
    p.add_argument("--prefill-len", type=RANGES["tokens"], default=16, help="prompt length of the exported prefill")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the files of an earlier export that linlm wrote (a file it did not write is never "
                        "replaced)")
    p.add_argument("--check", type=RANGES["checks"], default=0, metavar="STEPS",
                   help="then run the written files (onnxruntime for onnx) against the eager model for the prefill "
                        "and STEPS decoding steps; fail if logits or state differ by more than --tolerance")
    p.add_argument("--tolerance", type=RANGES["tolerance"], default=1e-4, help="largest absolute difference --check accepts")
    p.set_defaults(func=cmd_export)


def _read_prompt(args) -> str:
    from linlm.errors import DataError

    if args.prompt_file is None:
        return args.prompt or ""
    try:
        if args.prompt_file == "-":
            return sys.stdin.read()
        with open(args.prompt_file, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"--prompt-file {args.prompt_file}: cannot be read as UTF-8 text ({e})") from None


def cmd_generate(args) -> int:
    if args.lean:
        return _generate_lean(args)
    from linlm.devices import resolve_device
    from linlm.infer.generate import check_sampling, load_for_generation, stream_text

    # Checked before the model is loaded: a bad flag fails at once.
    check_sampling(args.temperature, args.top_k, args.top_p, args.max_new_tokens)
    resolve_device(args.device)
    prompt = _read_prompt(args)
    model, tok = load_for_generation(args.model, tokenizer=args.tokenizer, device=args.device)
    if args.compile and not model.compile_step():
        print(f"--compile: this {model.config.arch} model keeps a KV cache that grows each step; decoding eagerly",
              file=sys.stderr)
    pieces = stream_text(model, tok, prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, seed=args.seed, truncate=args.truncate_prompt)
    print_generation(prompt, pieces, args.stream)
    return 0


def _generate_lean(args) -> int:
    """``linlm generate --lean``: the same prompt, sampling settings and printing, decoded by linlm.infer.lean
    (nothing here imports torch)."""
    from linlm.data.tokenizer import tokenizer_for_model
    from linlm.errors import ConfigError
    from linlm.infer.lean import LeanMamba
    from linlm.models.sampling import check_sampling, text_pieces

    check_sampling(args.temperature, args.top_k, args.top_p, args.max_new_tokens)
    if args.device != "cpu" or args.compile:
        raise ConfigError(f"--lean decodes on the CPU with linlm's C kernels; drop "
                          f"{'--compile' if args.compile else f'--device {args.device}'}")
    prompt = _read_prompt(args)
    engine = LeanMamba(args.model)
    tok = tokenizer_for_model(engine.path, args.tokenizer, engine.sizes["V"])
    ids = engine.stream(tok.encode_input(prompt), args.max_new_tokens, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed, eos_id=tok.eos_id)
    print_generation(prompt, text_pieces(tok, ids), args.stream)
    return 0


def print_generation(prompt: str, pieces, stream: bool, out=None) -> None:
    """Print the prompt and each decoded piece: as it comes (``stream``), or all at once at the end. Ctrl-C stops
    decoding and keeps the text: what was streamed stays, and without streaming what was decoded is printed; the
    KeyboardInterrupt then goes on (linlm exits 130)."""
    out = out or sys.stdout
    done: list[str] = []
    try:
        if stream:
            out.write(prompt)
            out.flush()
        for piece in pieces:
            done.append(piece)
            if stream:
                out.write(piece)
                out.flush()
    except KeyboardInterrupt:
        out.write(("" if stream else prompt + "".join(done)) + "\n")
        out.flush()
        raise
    out.write(("" if stream else prompt + "".join(done)) + "\n")
    out.flush()


def profile_archs(text: Optional[str]) -> list[str]:
    """The architectures of ``--archs``: the comma-separated names, or every registered architecture."""
    from linlm.cli_args import comma_list
    from linlm.models.registry import arch_names

    return comma_list(text, "--archs", empty_ok=True) if text is not None else arch_names()


def cmd_profile(args) -> int:
    from linlm.cli_args import check_numbers, check_output_files

    # Every check that can refuse runs before any model is built or timed.
    check_numbers(("--threads", args.threads, 1, False), ("--decode-tokens", args.decode_tokens, 1, False))
    contexts = args.contexts
    args.batches = args.batch
    check_output_files(args, "--json", "--plot")
    if args.threads is None:
        return _profile(args, contexts)
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _profile(args, contexts)
    finally:
        torch.set_num_threads(previous)


def _profile(args, contexts: list[int]) -> int:
    """`linlm profile` once its flags are checked (and its threads set): profile, print, write."""
    from linlm import outputs
    from linlm.cli_args import comma_list
    from linlm.schema import parse_overrides
    from linlm.environment import environment
    from linlm.infer.profile import HF_LLAMA, plot, profile, rows_to_dicts
    from linlm.render import print_table

    archs = profile_archs(args.archs)
    if not args.no_hf and "llama" in archs and HF_LLAMA not in archs:
        archs.append(HF_LLAMA)

    def fmt(value, spec, scale=1.0):
        return "-" if value is None else format(value / scale, spec)

    def label(row):
        return row.arch if row.backend == "eager" else f"{row.arch} ({row.backend})"

    def show(row):
        if row.error:
            print(f"{label(row):>18} n={row.context:>6}: {row.error}", flush=True)
        else:
            print(f"{label(row):>18} n={row.context:>6} b={row.batch:>3}: prefill {fmt(row.prefill_tokens_per_s, '9.0f')} tok/s, "
                  f"decode {row.decode_ms_per_token:7.2f} ms/token, peak "
                  f"{fmt(row.peak_memory_bytes, '8.0f', 2**20)} MiB, state {row.state_bytes / 2**20:8.2f} MiB",
                  flush=True)

    exported = comma_list(args.exported, "--exported", empty_ok=True)
    rows = profile(archs, args.preset, contexts, device=args.device, dtype=args.dtype,
                   decode_tokens=args.decode_tokens, overrides=parse_overrides(args.overrides), on_row=show,
                   exported=exported, batches=args.batches, compiled=args.compile)
    print_table(["arch", "context", "batch", "prefill tok/s", "decode ms/step", "decode tok/s", "peak MiB",
                 "state MiB"],
                [[label(r), r.context, r.batch, *(("-",) * 5 if r.error else (
                    fmt(r.prefill_tokens_per_s, ".0f"), f"{r.decode_ms_per_token:.2f}", f"{r.decode_tokens_per_s:.1f}",
                    fmt(r.peak_memory_bytes, ".0f", 2**20), f"{r.state_bytes / 2**20:.2f}"))] for r in rows],
                title=f"{args.preset} on {args.device}, {args.dtype}"
                      + (" (an exported or compiled step's prompt is prefilled eagerly)"
                         if exported or args.compile else ""))
    if args.json is not None:
        payload = {"preset": args.preset, "dtype": args.dtype, "environment": environment(),
                   "rows": rows_to_dicts(rows)}
        print(f"wrote {outputs.write_json(args.json, payload, '--json')}")
    if args.plot is not None:
        print(f"wrote {plot(rows, args.plot, title=f'{args.preset}, {args.device}, {args.dtype}', what='--plot')}")
    return 0


def cmd_export(args) -> int:
    from linlm.cli_args import check_numbers
    from linlm.infer.export import check, check_outputs, export
    from linlm.infer.generate import load_model

    # Checked before the model loads or is traced: a refusal costs nothing and writes nothing.
    check_numbers(("--check", args.check, 0, False), ("--tolerance", args.tolerance, 0, True),
                  ("--batch-size", args.batch, 1, False), ("--prefill-len", args.prefill_len, 1, False))
    check_outputs(args.out, args.format, args.overwrite, "--out")
    model, _ = load_model(args.model)
    paths = export(model, args.out, args.format, batch=args.batch, prefill_len=args.prefill_len,
                   overwrite=args.overwrite, what="--out")
    for written in paths:
        print(f"wrote {written}")
    if not args.check:
        return 0
    diffs = check(model, paths, steps=args.check)
    worst = max(v for k, v in diffs.items() if k != "steps")
    print("max |exported - eager|: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items() if k != "steps")
          + f" (prefill, then {args.check} steps)")
    if worst > args.tolerance:
        print(f"linlm export: error: the exported programs differ from eager by {worst:.2e} > --tolerance "
              f"{args.tolerance:g}", file=sys.stderr)
        return 1
    return 0


def cmd_quantize(args) -> int:
    from linlm.infer.quantize import quantize

    print(f"wrote {quantize(args.model, args.out, args.to, overwrite=args.overwrite)}")
    return 0


def cmd_serve(args) -> int:
    from linlm.cli_args import check_numbers
    from linlm.infer.serve import serve

    check_numbers(("--port", args.port, 1, False), ("--max-batch", args.max_batch, 1, False),
                  ("--max-tokens", args.max_tokens, 1, False))
    serve(args.model, host=args.host, port=args.port, tokenizer=args.tokenizer, max_batch=args.max_batch,
          max_tokens_limit=args.max_tokens)
    return 0
