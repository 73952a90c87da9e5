"""``linlm generate``: sample text from a trained checkpoint."""

from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate text from a checkpoint",
                              description="Continue PROMPT with a model from a run directory (its newest valid "
                                          "checkpoint), a checkpoint directory, or a directory from model.save().")
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="run directory or checkpoint directory")
    p.add_argument("--prompt", default="", help="text to continue (empty: start a new document)")
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0 is greedy")
    p.add_argument("--top-k", type=int, default=40, help="0 keeps every token")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the one beside the weights)")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_generate)


def cmd_generate(args) -> int:
    from linlm.infer.generate import generate, load_for_generation

    model, tok = load_for_generation(args.checkpoint, tokenizer=args.tokenizer, device=args.device)
    text = generate(model, tok, args.prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                    seed=args.seed)
    print(args.prompt + text)
    return 0
