"""Needle in a haystack: can a model find one fact placed anywhere in a long context?

A haystack (the first tokens of any text source, documents joined by blank lines) is cut to fit each context
length L of the grid; a needle sentence holding a random value (by default a 7-digit number; ``alphabet`` and
``value_length`` choose others) is inserted at depth d (0 % = the start of the context, 100 % = just before the
question); the question follows. Each cell is scored from one prefill with
:func:`linlm.eval.scoring.score_requests` (no sampling), in one of two ways (``scoring``):

- ``greedy``: right when greedy decoding after the question reproduces the number exactly (every token the argmax).
  Chance is a guess of the value (1 / (9 x 10^6) for 7 digits): a model that has not learned to retrieve scores
  0, and so does every model too small to copy a multi-token answer whole.
- ``choice``: the true value and ``candidates - 1`` other values of its length and alphabet are ranked by their summed
  log-likelihood after the question; right when the true one ranks first (a tie of k numbers for first earns 1/k,
  a tie broken at random). Chance is 1 / candidates. With a one-character value the ranking reads out exactly
  the retrieval step (which character follows the question); with longer ones, a model that merely recognizes
  the value's later characters from its earlier ones (copying within the value) gains too.

The alphabet matters for small models: digits are rare in many training corpora (the built-in Shakespeare has
about one in 1,400 characters), and a model cannot copy a token it has barely learned; ``alphabet: letters``
(capital letters A-Z) draws the value from tokens such a corpus does hold.

Every result carries its chance level and ``chance_band``, chance plus two binomial standard errors over the items
scored (cells x trials): a mean accuracy at or below the band is indistinguishable from guessing
(``above_chance`` false).

Two modes (arXiv 2406.16690):

- ``standard``: only the answer is in the context: the needle is "The special magic number is N." and the question
  at the end is "What is the special magic number? Answer:"; the model has to connect the two.
- ``easy``: the question and the answer both are: the needle is "What is the special magic number? Answer: N." and
  the same question ends the context, so copying what followed its earlier occurrence suffices.

The paper's grid (the defaults): 35 context lengths spaced linearly from 1,000 to 16,000 tokens (its
``linspace(1000, 16000, 35)``, rounded to whole tokens) x 35 depths from 0 % to 100 %, in easy and standard modes.

Scores (:mod:`linlm.eval.niah_scores` gives their definitions and sources): the per-cell accuracy, the accuracy at
or below each length, the mean, the weighted average (long contexts and deep needles weigh more; the paper's
published "NIAH weighted avg") and the score with linlm's penalty (a skipped cell counts as a miss).

Why exact match: the paper asked a judge model to rate each answer from 1 to 10 and binarised the rating. No judge
model is available offline, and for a needle whose answer is a random value the binarised judgement reduces to
"is the value right", which exact match decides without a judge's noise; so ``greedy`` (exact match of the whole
value) is the default, and ``choice`` is there for models too small to produce a multi-token value at all.

Lengths beyond a position-limited model's max_seq_len (LLaMA) are skipped and reported, never truncated silently.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from linlm.cli_args import comma_list
from linlm.errors import ConfigError, DataError
from linlm.eval.niah_scores import cell_weights, cumulative_accuracy, penalized_score, weighted_average
from linlm.eval.scoring import Request, model_max_length, score_requests

log = logging.getLogger("linlm.eval")

MODES = ("standard", "easy")
SCORINGS = ("greedy", "choice")
# The characters of a needle's value: (its first character, the others).
ALPHABETS = {"digits": ("123456789", "0123456789"),
             "letters": ("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")}
QUESTION = "What is the special magic number? Answer:"
NEEDLES = {"standard": "The special magic number is {n}.", "easy": QUESTION + " {n}."}


def linear_lengths(lo: int, hi: int, n: int) -> list[int]:
    """The paper's spacing: ``n`` lengths from ``lo`` to ``hi`` in equal steps, rounded to whole tokens."""
    if n == 1:
        return [lo]
    return sorted({round(lo + (hi - lo) * i / (n - 1)) for i in range(n)})


def geometric_lengths(lo: int, hi: int, n: int) -> list[int]:
    if n == 1:
        return [lo]
    return sorted({round(lo * (hi / lo) ** (i / (n - 1))) for i in range(n)})


def linear_depths(n: int) -> list[float]:
    return [100.0 * i / (n - 1) for i in range(n)] if n > 1 else [50.0]


@dataclass
class NIAHConfig:
    lengths: list[int] = field(default_factory=lambda: linear_lengths(1000, 16000, 35))
    depths: list[float] = field(default_factory=lambda: linear_depths(35))
    mode: str = "standard"
    trials: int = 1  # needles (different numbers) per cell
    seed: int = 0
    length_ratio: float = 4.0
    depth_ratio: float = 2.0
    scoring: str = "greedy"  # or "choice": rank the true number among ``candidates`` (see the module doc)
    candidates: int = 4
    alphabet: str = "digits"  # or "letters": the characters of the needle's value (see the module doc)
    value_length: int = 7  # characters of the needle's value

    def validate(self) -> "NIAHConfig":
        if self.mode not in MODES:
            raise ConfigError(f"mode: unknown NIAH mode {self.mode!r}; valid choices are {', '.join(MODES)}")
        if self.scoring not in SCORINGS:
            raise ConfigError(f"scoring: unknown NIAH scoring {self.scoring!r}; valid choices are "
                              f"{', '.join(SCORINGS)}")
        if self.alphabet not in ALPHABETS:
            raise ConfigError(f"alphabet: unknown NIAH alphabet {self.alphabet!r}; valid choices are "
                              f"{', '.join(ALPHABETS)}")
        if not (isinstance(self.value_length, int) and 1 <= self.value_length <= 12):
            raise ConfigError(f"value_length: give a whole number of characters from 1 to 12, got "
                              f"{self.value_length!r}")
        if not (isinstance(self.candidates, int) and 2 <= self.candidates <= value_count(self)):
            raise ConfigError(f"candidates: give at least 2 values to rank, and no more than the "
                              f"{value_count(self)} values of this alphabet and length; got {self.candidates!r}")
        if not self.lengths or min(self.lengths) < 16:
            raise ConfigError(f"lengths: give context lengths of at least 16 tokens, got {self.lengths}")
        if not self.depths or not all(0.0 <= d <= 100.0 for d in self.depths):
            raise ConfigError(f"depths: give depths in percent between 0 and 100, got {self.depths}")
        if self.trials < 1 or self.length_ratio <= 0 or self.depth_ratio <= 0:
            raise ConfigError("trials must be >= 1 and the weight ratios positive")
        self.lengths = sorted(set(int(x) for x in self.lengths))
        self.depths = sorted(set(float(x) for x in self.depths))
        return self


def parse_grid(spec: str, kind: str) -> list[float]:
    """``"1000,2000,4000"``, ``"LO:HI:N"`` (N points in equal steps: the paper's spacing, for lengths and depths)
    or, for lengths, ``"LO:HI:N:geometric"`` (N points in equal ratios). N is at least 1, and so is a length
    grid's LO (a count of 0 is refused, never read as one point)."""
    if ":" not in spec:
        example = "1000,4000,16000, or LO:HI:N as in 1000:16000:35" if kind == "lengths" else \
            "0,50,100, or LO:HI:N as in 0:100:35"
        return comma_list(spec, f"--{kind}", item=float if kind == "depths" else int,
                          what="numbers" if kind == "depths" else "integers", example=example, empty_ok=True)
    try:
        lo, hi, n, *spacing = spec.split(":")
        k = int(n)
        if spacing not in ([], ["linear"], ["geometric"]) or (spacing == ["geometric"] and kind != "lengths"):
            raise ValueError(spacing)
        if k < 1 or (kind == "lengths" and int(lo) < 1):
            raise ConfigError(f"--{kind} {spec!r}: LO:HI:N needs N >= 1" + (" and LO >= 1" if kind == "lengths"
                                                                           else ""))
        if kind == "lengths":
            return (geometric_lengths if spacing == ["geometric"] else linear_lengths)(int(lo), int(hi), k)
        lo_f, hi_f = float(lo), float(hi)
        return [lo_f + (hi_f - lo_f) * i / (k - 1) for i in range(k)] if k > 1 else [lo_f]
    except ConfigError:
        raise
    except ValueError:
        raise ConfigError(f"--{kind} {spec!r}: expected a comma-separated list or LO:HI:N"
                          + (" (or LO:HI:N:geometric)" if kind == "lengths" else "")) from None


def chance_level(cfg: NIAHConfig) -> float:
    """The accuracy of a model that guesses: 1 / candidates (choice), or 1 / the count of such numbers (greedy)."""
    return 1.0 / cfg.candidates if cfg.scoring == "choice" else 1.0 / value_count(cfg)


def value_count(cfg: NIAHConfig) -> int:
    """How many distinct values a needle can hold (a number has no leading zero)."""
    first, rest = ALPHABETS[cfg.alphabet]
    return len(first) * len(rest) ** (cfg.value_length - 1)


def random_value(rng: random.Random, cfg: NIAHConfig) -> str:
    first, rest = ALPHABETS[cfg.alphabet]
    return rng.choice(first) + "".join(rng.choice(rest) for _ in range(cfg.value_length - 1))


def chance_band(chance: float, items: int) -> float:
    """Chance plus two binomial standard errors over ``items``: a mean accuracy at or below it is not above chance."""
    return chance + 2.0 * math.sqrt(chance * (1.0 - chance) / max(1, items))


def choice_credit(logliks: list[float]) -> float:
    """1 when the first (true) continuation scores strictly highest, 1 / k when it ties with k - 1 others for the
    highest (a tie broken at random, in expectation), else 0: a model that scores every number alike gets chance."""
    top = max(logliks)
    return 1.0 / sum(v == top for v in logliks) if logliks[0] == top else 0.0


def build_haystack(tokenizer, texts: Iterable[str], n_tokens: int) -> list[int]:
    """The first ``n_tokens`` tokens of the documents joined by blank lines."""
    ids: list[int] = []
    sep = tokenizer.encode("\n\n")
    for text in texts:
        if ids:
            ids.extend(sep)
        ids.extend(tokenizer.encode(text))
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
    raise DataError(f"the haystack source holds {len(ids)} tokens, fewer than the {n_tokens} the longest context "
                    "needs; use a larger corpus or shorter --lengths")


def niah_requests(tokenizer, haystack: list[int], cfg: NIAHConfig, lengths: list[int],
                  too_short: Optional[set] = None) -> list[tuple]:
    """(length index, depth index, trial, Request) for every cell and trial; the request's first continuation is
    the true number (then, for choice scoring, the others). A length too short to hold the needle and the question
    is an error, or, given a set ``too_short``, added to it (its cells are left out)."""
    rng = random.Random(cfg.seed)
    question = tokenizer.encode("\n\n" + QUESTION)
    start = tokenizer.encode_input("")  # the BOS when the tokenizer adds one
    out = []
    for i, L in enumerate(lengths):
        for j, d in enumerate(cfg.depths):
            for t in range(cfg.trials):
                number = random_value(rng, cfg)
                others: list[str] = []
                while cfg.scoring == "choice" and len(others) < cfg.candidates - 1:
                    other = random_value(rng, cfg)
                    if other != number and other not in others:
                        others.append(other)
                needle = tokenizer.encode(" " + NEEDLES[cfg.mode].format(n=number) + " ")
                n_hay = L - len(start) - len(needle) - len(question)
                if n_hay < 1:
                    if too_short is None:
                        raise ConfigError(f"context length {L} is too short for the needle and the question "
                                          f"({len(start) + len(needle) + len(question)} tokens)")
                    too_short.add(L)
                    continue
                at = round(n_hay * d / 100.0)
                ctx = start + haystack[:at] + needle + haystack[at:n_hay] + question
                out.append((i, j, t, Request(ctx, [tokenizer.encode(" " + n) for n in (number, *others)])))
    return out


def check_niah_memory(model, cfg: NIAHConfig, batch_size: int) -> None:
    """Refuse (ResourceError, before any haystack is built) a grid whose longest context the model would run at
    but that cannot fit in memory: a pass over ``batch_size`` needles of that length (lengths past a
    position-limited model's max_seq_len are skipped, not run, and so not counted)."""
    from linlm.models.memory import inference_floor
    from linlm.resources import check_memory

    limit = model_max_length(model)
    run = [n for n in cfg.lengths if limit is None or n <= limit]
    if not run:
        return
    longest, param = max(run), next(model.parameters())
    check_memory(inference_floor(model.config, batch_size, longest, param.dtype.itemsize),
                 f"--lengths {longest}: {batch_size} haystacks of {longest:,} tokens",
                 "give shorter --lengths or a smaller --batch-size", param.device)


def run_niah(model, tokenizer, texts: Iterable[str], cfg: Optional[NIAHConfig] = None, *, batch_size: int = 4,
             progress=None) -> dict:
    """Score the grid; returns accuracy[depth][length], the mean and weighted scores, and the settings."""
    cfg = (cfg or NIAHConfig()).validate()
    limit = model_max_length(model)
    lengths = [L for L in cfg.lengths if limit is None or L <= limit]
    skipped = [L for L in cfg.lengths if L not in lengths]
    if skipped:
        log.warning("NIAH: context lengths %s exceed this %s model's max_seq_len=%s and are skipped", skipped,
                    model.config.arch, limit)
    if not lengths:
        raise ConfigError(f"every context length exceeds this model's max_seq_len={limit}; give shorter --lengths")
    haystack = build_haystack(tokenizer, texts, max(lengths))
    short: set = set()
    reqs = niah_requests(tokenizer, haystack, cfg, lengths, short)
    if short:  # with this tokenizer the needle and the question alone fill these lengths
        log.warning("NIAH: context lengths %s are too short for the needle and the question with this tokenizer "
                    "and are skipped", sorted(short))
        skipped += sorted(short)
        lengths = [L for L in lengths if L not in short]
        if not lengths:
            raise ConfigError("every context length is too short for the needle and the question with this "
                              "tokenizer; give longer --lengths")
        reqs = niah_requests(tokenizer, haystack, cfg, lengths)
    if limit is not None:  # the context plus the answer must fit; a length that leaves no room is skipped
        over = {lengths[r[0]] for r in reqs if len(r[3].context) + max(map(len, r[3].continuations)) - 1 > limit}
        if over:
            log.warning("NIAH: context lengths %s leave no room for the answer within this %s model's "
                        "max_seq_len=%s and are skipped", sorted(over), model.config.arch, limit)
            skipped += sorted(over)
            lengths = [L for L in lengths if L not in over]
            if not lengths:
                raise ConfigError(f"every context length leaves no room for the answer within this model's "
                                  f"max_seq_len={limit}; give shorter --lengths")
            reqs = niah_requests(tokenizer, haystack, cfg, lengths)
    scored = score_requests(model, [r[3] for r in reqs], batch_size=batch_size, max_length=None, progress=progress)
    hits = [[0.0] * len(lengths) for _ in cfg.depths]
    for (i, j, _, _), s in zip(reqs, scored):
        hits[j][i] += float(s.greedy[0]) if cfg.scoring == "greedy" else choice_credit(s.logliks)
    acc = [[h / cfg.trials for h in row] for row in hits]
    kept = NIAHConfig(**{**asdict(cfg), "lengths": lengths}).validate()
    weighted = weighted_average(acc, cell_weights(kept))
    score = penalized_score(acc, lengths, cfg.lengths, cfg.depths, cfg.length_ratio, cfg.depth_ratio)
    mean = sum(sum(r) for r in acc) / (len(lengths) * len(cfg.depths))
    chance = chance_level(cfg)
    band = chance_band(chance, len(reqs))
    return {"mode": cfg.mode, "lengths": lengths, "depths": cfg.depths, "accuracy": acc, "mean": mean,
            "weighted": weighted, "score": score, "cumulative": cumulative_accuracy(acc),
            "requested_lengths": cfg.lengths, "weights": {"length_ratio": cfg.length_ratio, "depth_ratio": cfg.depth_ratio},
            "trials": cfg.trials, "seed": cfg.seed, "skipped_lengths": skipped, "scoring": cfg.scoring,
            "candidates": cfg.candidates if cfg.scoring == "choice" else None, "alphabet": cfg.alphabet,
            "value_length": cfg.value_length,
            "chance": chance, "items": len(reqs), "chance_band": band, "above_chance": mean > band}


def heatmap_figure(result: dict, title: str = ""):
    """The grid of :func:`run_niah`'s result as a heatmap: a matplotlib Figure of its own (no pyplot, so no global
    backend or figure registry is touched, and nothing is left open)."""
    from matplotlib.figure import Figure

    acc = result["accuracy"]
    fig = Figure(figsize=(max(5.0, 0.3 * len(result["lengths"]) + 2), max(4.0, 0.25 * len(acc) + 1.5)))
    ax = fig.subplots()
    im = ax.imshow(acc, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="lower")
    ax.set_xticks(range(len(result["lengths"])))
    ax.set_xticklabels([str(L) for L in result["lengths"]], rotation=90, fontsize=7)
    ax.set_yticks(range(len(result["depths"])))
    ax.set_yticklabels([f"{d:.0f}" for d in result["depths"]], fontsize=7)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth (%)")
    ax.set_title(title or f"NIAH ({result['mode']}): mean {result['mean']:.3f}, weighted {result['weighted']:.3f}, "
                          f"score {result.get('score', result['weighted']):.3f}")
    fig.colorbar(im, ax=ax, label="accuracy")
    fig.tight_layout()
    return fig


def plot_heatmap(result: dict, path, title: str = "", what: Optional[str] = None) -> Path:
    """Write :func:`heatmap_figure` as a PNG through linlm.outputs (atomic; a file linlm did not write is refused);
    ``what`` names the flag in a refusal, e.g. ``--plot``."""
    from linlm import outputs

    return outputs.save_figure(heatmap_figure(result, title), path, what)
