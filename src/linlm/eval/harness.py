"""lm-evaluation-harness adapter: the lm-eval model ``linlm`` (needs ``pip install 'linlm[eval]'``).

Importing this module registers the model, so that from Python::

    import lm_eval, linlm.eval.harness  # noqa: F401  (registers "linlm")
    results = lm_eval.simple_evaluate(model="linlm", model_args="pretrained=runs/demo", tasks=["hellaswag"])

or with an instance: ``simple_evaluate(model=LinlmLM(pretrained="runs/demo"), tasks=[...])``. lm-eval has no plugin
discovery for models, so its own ``lm_eval`` command sees ``linlm`` only after the opt-in start-up hook
(``linlm lm-eval-hook install``, :mod:`linlm.eval.lm_eval_hook`). Without the hook, this module is that command with
``linlm`` registered, taking the same arguments::

    python -m linlm.eval.harness --model linlm --model_args pretrained=DIR --tasks hellaswag,piqa
    linlm-lm-eval --model linlm --model_args pretrained=DIR --tasks hellaswag,piqa     (the same, as a script)

``pretrained`` is anything ``linlm eval --model`` takes (a run directory, a checkpoint, a model.save() directory);
other model_args: ``tokenizer`` (a tokenizer.json), ``device``, ``batch_size``, ``max_length``, ``max_context``. The tokenizer is
resolved as for every linlm command (:func:`linlm.data.tokenizer.tokenizer_for_model`); a pretrained one that adds a
BOS gets it where lm-eval's HF wrapper (``add_bos_token`` unset) puts it, so the log-likelihoods are the same.

The three request types:

- ``loglikelihood``: requests sharing a context are scored together from one prefill of that context
  (:func:`linlm.eval.scoring.score_requests`), with the harness's encoding of context/continuation pairs and its
  left truncation. The same code path serves ``linlm eval``, so the two give identical acc and acc_norm.
- ``loglikelihood_rolling``: the summed log-likelihood of each whole document, after the prefix token (the BOS,
  else end-of-text; a BOS the tokenizer adds is scored too, as lm-eval's HF wrapper does):
  stateful (exact, whole document) for models without a position limit, disjoint windows of max_length for LLaMA.
- ``generate_until``: greedy decoding from the recurrent state, stopped at the first ``until`` string, at
  ``max_gen_toks`` (default 256) or at end-of-text.

The context cut (long-context tasks: SCROLLS, the recall tasks). ``max_context`` (a model_arg; default none) is
the longest input given to the model, as the paper cut each input to its model's training context: a request's
context longer than that keeps its last tokens (cut from the left, so the question at the end of a SCROLLS or
recall prompt stays), and a generation keeps room for its ``max_gen_toks`` within it. A position-limited model's
``max_length`` cuts the same way; the shorter of the two applies. Every cut is counted in :attr:`LinlmLM.cuts`
(requests seen, requests cut, the longest input before cutting, the length cut to), never silent.
"""

from __future__ import annotations

from typing import Optional

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("the lm-evaluation-harness adapter needs lm-eval: pip install 'linlm[eval]'") from e

from linlm.eval.scoring import Request, model_max_length, score_requests
from linlm.eval.tasks import encode_pair

DEFAULT_MAX_GEN_TOKS = 256


@register_model("linlm")
class LinlmLM(LM):
    """A linlm model and its tokenizer as an lm-eval ``LM``."""

    def __init__(self, pretrained: Optional[str] = None, tokenizer: Optional[str] = None, device: Optional[str] = "cpu",
                 batch_size: int | str = 16, max_length: Optional[int] = None, model=None,
                 max_context: Optional[int] = None, **kwargs) -> None:
        super().__init__()
        if model is not None:  # an already loaded (model, tokenizer)
            self.model, self.tok = model, tokenizer
        else:
            if pretrained is None:
                from linlm.errors import ConfigError

                raise ConfigError("model_args: pretrained=DIR is required (a run, checkpoint or model.save() "
                                  "directory)")
            import torch

            from linlm.infer.generate import load_for_generation

            if not device or (str(device).startswith("cuda") and not torch.cuda.is_available()):
                device = "cpu"  # lm_eval's command line asks for cuda by default
            self.model, self.tok = load_for_generation(pretrained, tokenizer=tokenizer, device=device)
        self.model.eval()
        self.batch_size = 16 if str(batch_size).startswith("auto") else _count("batch_size", batch_size)
        # None takes the model's own limit; a 0 is refused, never read as "no setting".
        self.max_length = model_max_length(self.model) if max_length is None else _count("max_length", max_length)
        self.max_context = None if max_context in (None, "", "None") else _count("max_context", max_context)
        limits = [x for x in (self.max_length, self.max_context) if x is not None]
        self.window = min(limits) if limits else None  # the longest input the model is given
        self.cuts = {"window": self.window, "requests": 0, "cut": 0, "longest_input": 0}

    def _seen(self, n_tokens: int, cut: bool) -> None:
        self.cuts["requests"] += 1
        self.cuts["cut"] += int(cut)
        self.cuts["longest_input"] = max(self.cuts["longest_input"], n_tokens)

    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def tokenizer_name(self) -> str:
        return "linlm-" + self.tok.fingerprint()[:16]

    # ---- loglikelihood ----------------------------------------------------------------------------------------

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [encode_pair(self.tok, *req.args[:2]) for req in requests]
        # Requests with the same context tokens share one prefill.
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (ctx, _) in enumerate(pairs):
            groups.setdefault(tuple(ctx), []).append(i)
        batch = [Request(list(ctx), [pairs[i][1] for i in members]) for ctx, members in groups.items()]
        for r in batch:
            n = len(r.context) + max(len(c) for c in r.continuations) - 1
            self._seen(n, self.window is not None and n > self.window)
        scored = score_requests(self.model, batch, batch_size=self.batch_size, max_length=self.window)
        out: list[Optional[tuple[float, bool]]] = [None] * len(requests)
        for members, s in zip(groups.values(), scored):
            for j, i in enumerate(members):
                out[i] = (s.logliks[j], s.greedy[j])
                self.cache_hook.add_partial("loglikelihood", requests[i].args, out[i])
        return out  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from linlm.eval.perplexity import document_logliks

        out = []
        for req in requests:
            text = req.args[0]
            ll = document_logliks(self.model, self.tok, [text], self.max_length)[0]
            out.append(ll)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), ll)
        return out

    # ---- generation -------------------------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from linlm.models.generation import generate_ids

        out = []
        for req in requests:
            context, kwargs = req.args[0], dict(req.args[1] or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
            ids = self.tok.encode_input(context) or [self.tok.prefix_id]
            n = len(ids)
            if self.window is not None:
                ids = ids[-max(1, self.window - max_new):]
            self._seen(n, len(ids) < n)
            new = generate_ids(self.model, ids, max_new, temperature=0.0, top_k=0, eos_id=self.tok.eos_id)
            if new and new[-1] == self.tok.eos_id:
                new = new[:-1]
            text = self.tok.decode(new)
            for stop in until:
                if stop and stop in text:
                    text = text[:text.index(stop)]
            out.append(text)
            self.cache_hook.add_partial("generate_until", req.args, text)
        return out


def _count(name: str, value) -> int:
    """A model_args count (an int, or the string lm-eval passes): a whole number >= 1, else a one-line error."""
    from linlm.errors import ConfigError

    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1 or str(n) != str(value).strip():
        raise ConfigError(f"model_args: {name}={value!r}; expected a whole number >= 1"
                          + (" or 'auto'" if name == "batch_size" else ""))
    return n


def main(argv=None) -> int:
    """The ``lm_eval`` command with the ``linlm`` model registered (same arguments). linlm's own errors (a missing
    ``pretrained=`` path, a corrupt checkpoint, a bad model_arg) print one line, ``linlm-lm-eval: error: ...``, and
    exit 2, as ``linlm`` does; lm-eval's own errors are left as lm-eval reports them."""
    import sys

    from lm_eval.__main__ import cli_evaluate

    from linlm.cli_args import exit_status

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    return exit_status("linlm-lm-eval", cli_evaluate)


if __name__ == "__main__":
    import sys

    sys.exit(main())
