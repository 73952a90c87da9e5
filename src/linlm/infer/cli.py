"""``linlm generate``: sample text from a trained model."""

from __future__ import annotations

import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate text from a model",
                              description="Continue PROMPT with a model from a run directory (its newest valid "
                                          "checkpoint), a checkpoint directory, or a directory from model.save().")
    p.add_argument("--model", "--checkpoint", dest="model", required=True, metavar="DIR",
                   help="run directory, checkpoint directory or saved model directory (--checkpoint is an alias)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="text to continue (default: empty, start a new document)")
    src.add_argument("--prompt-file", default=None, metavar="FILE", help="read the prompt from FILE ('-': stdin)")
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0 is greedy")
    p.add_argument("--top-k", type=int, default=40, help="0 keeps every token")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep the most likely tokens whose "
                                                             "probability reaches P (1 keeps every token)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stream", action="store_true", help="print tokens as they are decoded")
    p.add_argument("--truncate-prompt", action="store_true",
                   help="drop the start of a prompt longer than the model's limit instead of refusing it")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the one beside the weights)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.set_defaults(func=cmd_generate)


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
    from linlm.devices import resolve_device
    from linlm.infer.generate import check_sampling, load_for_generation, stream_text

    # Checked before the model is loaded: a bad flag fails at once.
    check_sampling(args.temperature, args.top_k, args.top_p, args.max_new_tokens)
    resolve_device(args.device)
    prompt = _read_prompt(args)
    model, tok = load_for_generation(args.model, tokenizer=args.tokenizer, device=args.device)
    pieces = stream_text(model, tok, prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, seed=args.seed, truncate=args.truncate_prompt)
    if args.stream:
        sys.stdout.write(prompt)
        sys.stdout.flush()
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    else:
        print(prompt + "".join(pieces))
    return 0
