"""The decoding loop behind ``linlm serve``: requests join one batch of recurrent states and leave it when done.

One thread owns the model. Each turn it admits the waiting requests (each prompt is prefilled alone, its first token
sampled, its state joined to the batch with ``ModelState.join``), then advances every live request by one token
with one ``model.step`` over the batch, samples each row with that request's own settings and generator, and drops
the rows that finished (``ModelState.select``): a length limit, the end-of-text token, a stop string, or a client
that went away. A model whose state has positions (LLaMA's KV cache) only batches requests of equal length, so there
each request runs alone, one after another.

Text leaves as it is decoded: a request's text so far is decoded from its ids, and the part that cannot yet be part
of a stop string (the last ``max(len(stop)) - 1`` characters) or that ends in an incomplete UTF-8 character is
held back until the next token.
"""

from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from linlm.layers.state import ModelState
from linlm.models.generation import sample_token


@dataclass
class Request:
    """One completion: prompt ids and settings in; ``emit(text, finish_reason)`` is called from the loop's thread
    with each new piece of text, and once more with the finish reason ("stop" or "length") and the last piece."""

    prompt_ids: list[int]
    max_tokens: int
    emit: Callable[[str, Optional[str]], None]
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    cancelled: threading.Event = field(default_factory=threading.Event)
    ids: list[int] = field(default_factory=list)
    sent: int = 0  # characters of the text already emitted
    generator: Optional[torch.Generator] = None


class Batcher:
    def __init__(self, model, tokenizer, *, max_batch: int = 32):
        self.model, self.tokenizer, self.max_batch = model.eval(), tokenizer, max_batch
        self.batches = model.config.per_row_positions
        self.waiting: "queue.Queue[Request]" = queue.Queue()
        self.live: list[Request] = []
        self.state: Optional[ModelState] = None
        self.next_tokens: list[int] = []
        self._ids = itertools.count()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="linlm-batcher", daemon=True)
        self.thread.start()

    def submit(self, request: Request) -> None:
        request.generator = torch.Generator()
        request.generator.manual_seed(next(self._ids) if request.seed is None else int(request.seed))
        self.waiting.put(request)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)

    # ------------------------------------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._turn()
            except Exception as e:  # a bug in one turn ends its requests with an error, never the server
                for r in self.live:
                    r.emit(f"[linlm: internal error: {type(e).__name__}: {e}]", "error")
                self.live, self.state, self.next_tokens = [], None, []

    @torch.no_grad()
    def _turn(self) -> None:
        room = self.max_batch - len(self.live) if self.batches or not self.live else 0
        while room > 0:
            try:
                request = self.waiting.get(timeout=0.05 if not self.live else 0)
            except queue.Empty:
                break
            self._admit(request)
            room -= 1
        if not self.live:
            return
        tokens = torch.tensor(self.next_tokens)
        logits, self.state = self.model.step(tokens, self.state)
        self.next_tokens = [int(sample_token(logits[i:i + 1], r.temperature, r.top_k, r.generator, r.top_p)[0])
                            for i, r in enumerate(self.live)]
        self._advance()

    def _admit(self, r: Request) -> None:
        if r.cancelled.is_set():
            return
        if r.max_tokens == 0:
            r.emit("", "length")
            return
        logits, state = self.model.prefill(torch.tensor([r.prompt_ids]))
        first = int(sample_token(logits, r.temperature, r.top_k, r.generator, r.top_p)[0])
        self.live.append(r)
        self.next_tokens.append(first)
        self.state = state if self.state is None else ModelState.join([self.state, state])
        self._advance(only=[len(self.live) - 1])

    def _advance(self, only: Optional[list[int]] = None) -> None:
        """Give each live row (or those of ``only``) its sampled token; drop the rows that finished."""
        done = []
        for i in (range(len(self.live)) if only is None else only):
            if self._push(self.live[i], self.next_tokens[i]):
                done.append(i)
        if done:
            keep = [i for i in range(len(self.live)) if i not in done]
            self.live = [self.live[i] for i in keep]
            self.next_tokens = [self.next_tokens[i] for i in keep]
            self.state = self.state.select(keep) if keep else None

    def _push(self, r: Request, token: int) -> bool:
        """Append ``token`` to ``r``; emit what can be shown; True when ``r`` is finished."""
        if r.cancelled.is_set():
            return True
        finish = None
        if token == self.tokenizer.eos_id:
            finish = "stop"
        else:
            r.ids.append(token)
            if len(r.ids) >= r.max_tokens:
                finish = "length"
        text = self.tokenizer.decode(r.ids)
        cuts = [text.find(s) for s in r.stop if s and s in text]
        if cuts:
            cut = min(cuts)
            text, finish = text[:cut], "stop"
        if finish is not None:
            r.emit(text[r.sent:], finish)
            return True
        hold = max((len(s) - 1 for s in r.stop), default=0)
        show = len(text) - hold
        if text.endswith("\ufffd"):
            show = min(show, text.rfind("\ufffd"))
        if show > r.sent:
            r.emit(text[r.sent:show], None)
            r.sent = show
        return False
