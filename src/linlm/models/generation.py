"""Sampling text from a causal LM: prefill the prompt once, then decode token by token from the model's recurrent
state (or KV cache), with temperature, top-k and top-p (nucleus). Shared by training (end-of-run samples), evaluation
and ``linlm generate``.
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch

from linlm.errors import ShapeError
# the checks and the text pieces, torch-free (linlm.infer.lean uses them too); check_sampling is re-exported
from linlm.models.sampling import check_sampling, text_pieces  # noqa: F401

def sample_token(logits: torch.Tensor, temperature: float, top_k: int,
                 generator: Optional[torch.Generator] = None, top_p: float = 1.0) -> torch.Tensor:
    """Next ids [B] from logits [B, V]: greedy when temperature is 0, else softmax(logits / T) restricted to the top k
    tokens and to the smallest set of most likely tokens whose probability reaches top_p."""
    check_sampling(temperature, top_k, top_p)
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked before it already reach top_p (the most likely one always stays).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def fit_prompt(ids: list[int], max_new_tokens: int, model, truncate: bool = False) -> list[int]:
    """The prompt ids, checked against a model with a position limit (LLaMA's max_seq_len): too long raises a
    ShapeError, or with ``truncate`` keeps the prompt's last tokens so that prompt plus new tokens fit."""
    from linlm.models.registry import get_arch

    cfg = model.config
    if not get_arch(cfg.arch).position_limit or len(ids) + max_new_tokens <= cfg.max_seq_len:
        return ids
    room = cfg.max_seq_len - max_new_tokens
    if truncate and room >= 1:
        return ids[-room:]
    if truncate:
        raise ShapeError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in this {cfg.arch} model's "
                         f"max_seq_len={cfg.max_seq_len}; ask for at most {cfg.max_seq_len - 1} new tokens")
    raise ShapeError(f"the prompt ({len(ids)} tokens) plus max_new_tokens={max_new_tokens} exceed this "
                     f"{cfg.arch} model's max_seq_len={cfg.max_seq_len}; shorten the prompt, ask for fewer "
                     "tokens, or truncate the prompt's start (--truncate-prompt, truncate=True)")


@torch.no_grad()
def stream_ids(model, prompt_ids: list[int], max_new_tokens: int, *, temperature: float = 0.8, top_k: int = 40,
               top_p: float = 1.0, seed: Optional[int] = 0, eos_id: Optional[int] = None, stop_at_eos: bool = True,
               truncate: bool = False) -> Iterator[int]:
    """Yield the new token ids after ``prompt_ids`` one by one, as they are decoded (an empty prompt starts from
    ``eos_id``, the document boundary)."""
    check_sampling(temperature, top_k, top_p, max_new_tokens)
    ids = list(prompt_ids)
    if not ids:
        if eos_id is None:
            raise ShapeError("the prompt is empty and there is no end-of-text id to start from; give a prompt")
        ids = [eos_id]
    ids = fit_prompt(ids, max_new_tokens, model, truncate)
    if max_new_tokens == 0:
        return
    device = model.device
    gen = torch.Generator(device=device)
    if seed is not None:
        gen.manual_seed(int(seed))
    was_training = model.training
    model.eval()
    try:
        logits, state = model.prefill(torch.tensor([ids], dtype=torch.long, device=device))
        for i in range(max_new_tokens):
            nxt = sample_token(logits, temperature, top_k, gen, top_p)
            token = int(nxt[0])
            yield token
            if stop_at_eos and eos_id is not None and token == eos_id:
                break
            if i + 1 < max_new_tokens:
                logits, state = model.step(nxt, state)
    finally:
        model.train(was_training)


def generate_ids(model, prompt_ids: list[int], max_new_tokens: int, **kw) -> list[int]:
    """The new token ids after ``prompt_ids`` (keywords as :func:`stream_ids`)."""
    return list(stream_ids(model, prompt_ids, max_new_tokens, **kw))


def stream_text(model, tokenizer, prompt: str, max_new_tokens: int = 64, **kw) -> Iterator[str]:
    """Yield the completion of ``prompt`` in pieces as tokens are decoded (stops at the end-of-text token). The
    prompt is encoded as a model's input (``encode_input``: the BOS first when the tokenizer adds one).

    Each piece is the new text since the last one: a token that only completes a multi-byte character yields
    nothing until the character is whole.
    """
    ids = stream_ids(model, tokenizer.encode_input(prompt), max_new_tokens, eos_id=tokenizer.eos_id, **kw)
    return text_pieces(tokenizer, ids)


def generate(model, tokenizer, prompt: str, max_new_tokens: int = 64, *, temperature: float = 0.8,
             top_k: int = 40, top_p: float = 1.0, seed: Optional[int] = 0, truncate: bool = False) -> str:
    """The completion of ``prompt`` (text after the prompt; stops at the end-of-text token)."""
    new = generate_ids(model, tokenizer.encode_input(prompt), max_new_tokens, temperature=temperature, top_k=top_k,
                       top_p=top_p, seed=seed, eos_id=tokenizer.eos_id, truncate=truncate)
    if new and new[-1] == tokenizer.eos_id:
        new = new[:-1]
    return tokenizer.decode(new)
