"""Sampling text from a causal LM: prefill the prompt once, then decode token by token from the model's recurrent
state (or KV cache), with temperature and top-k. Shared by training (end-of-run samples) and ``linlm generate``.
"""

from __future__ import annotations

from typing import Optional

import torch

from linlm.errors import ConfigError, ShapeError


def sample_token(logits: torch.Tensor, temperature: float, top_k: int,
                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Next ids [B] from logits [B, V]: greedy when temperature is 0, else softmax(logits / T) over the top k."""
    if temperature < 0 or top_k < 0:
        raise ConfigError(f"temperature ({temperature}) and top_k ({top_k}) must be >= 0")
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate_ids(model, prompt_ids: list[int], max_new_tokens: int, *, temperature: float = 0.8, top_k: int = 40,
                 seed: Optional[int] = 0, eos_id: Optional[int] = None, stop_at_eos: bool = True) -> list[int]:
    """The new token ids after ``prompt_ids`` (an empty prompt starts from ``eos_id``, the document boundary)."""
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    ids = list(prompt_ids)
    if not ids:
        if eos_id is None:
            raise ShapeError("the prompt is empty and there is no end-of-text id to start from; give a prompt")
        ids = [eos_id]
    cfg = model.config
    from linlm.models.registry import get_arch

    if get_arch(cfg.arch).position_limit and len(ids) + max_new_tokens > cfg.max_seq_len:
        raise ShapeError(f"the prompt ({len(ids)} tokens) plus max_new_tokens={max_new_tokens} exceed this "
                         f"{cfg.arch} model's max_seq_len={cfg.max_seq_len}; shorten the prompt or ask for fewer "
                         "tokens")
    if max_new_tokens == 0:
        return []
    device = model.device
    gen = torch.Generator(device=device)
    if seed is not None:
        gen.manual_seed(int(seed))
    was_training = model.training
    model.eval()
    try:
        logits, state = model.prefill(torch.tensor([ids], dtype=torch.long, device=device))
        out: list[int] = []
        for i in range(max_new_tokens):
            nxt = sample_token(logits, temperature, top_k, gen)
            token = int(nxt[0])
            out.append(token)
            if stop_at_eos and eos_id is not None and token == eos_id:
                break
            if i + 1 < max_new_tokens:
                logits, state = model.step(nxt, state)
    finally:
        model.train(was_training)
    return out


def generate(model, tokenizer, prompt: str, max_new_tokens: int = 64, *, temperature: float = 0.8,
             top_k: int = 40, seed: Optional[int] = 0) -> str:
    """The completion of ``prompt`` (text after the prompt; stops at the end-of-text token)."""
    new = generate_ids(model, tokenizer.encode(prompt), max_new_tokens, temperature=temperature, top_k=top_k,
                       seed=seed, eos_id=tokenizer.eos_id)
    if new and new[-1] == tokenizer.eos_id:
        new = new[:-1]
    return tokenizer.decode(new)
