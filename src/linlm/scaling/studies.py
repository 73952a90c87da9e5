"""Shape studies: a ladder whose rungs are one model size at several shapes, written as data.

A ladder file may give a ``study`` instead of ``rungs``; the study expands into rungs (so the sweep is planned,
trained, resumed and estimated exactly as a ladder is) and each rung carries ``tags`` naming its shape, which
each run's scaling.json records. Two kinds:

``aspect``: one non-embedding size at several (d_model, n_layers) shapes, every shape trained on the same tokens::

    study:
      kind: aspect
      model: {max_seq_len: 128}       # ModelConfig fields shared by every shape
      head_dim: 16                    # n_heads = d_model / head_dim for every shape (or n_heads in a shape)
      tokens: 1_000_000
      seeds: [0, 1]                   # optional: each shape trained once per seed
      shapes:
        - {d_model: 48, n_layers: 11}  # a rung "d48-l11" (with seeds: "d48-l11-s0", "d48-l11-s1")
        - {d_model: 112, n_layers: 2, train: {optim: {lr: 2.0e-3}}}   # optional: TrainConfig keys of this shape

``context``: one model trained at several context lengths on the same tokens, with the same tokens per step
(the batch is ``tokens_per_step / context`` sequences), so that every context takes the same steps::

    study:
      kind: context
      model: {n_layers: 3, d_model: 64, n_heads: 4}   # max_seq_len: the longest context unless given
      contexts: [64, 128, 256]                         # rungs "ctx64", "ctx128", "ctx256"
      tokens_per_step: 2048
      tokens: 1_000_000

Mistakes are refused when the ladder is read, before any work: a shape whose d_model does not divide into its
heads, a context longer than the model's max_seq_len, a context that does not divide tokens_per_step, repeated
shapes or contexts. A context longer than the prepared data allows is refused when the data is resolved
(:func:`linlm.scaling.data.check_contexts`), still before any run trains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from linlm.errors import ConfigError, choices_text
from linlm.schema import from_dict

KINDS = ("aspect", "context")


@dataclass
class Study:
    kind: str
    model: dict
    tokens: int
    shapes: list[dict] = field(default_factory=list)
    head_dim: int = 0
    contexts: list[int] = field(default_factory=list)
    tokens_per_step: int = 0
    seeds: list[int] = field(default_factory=lambda: [0])


def _seeded(base: dict, seeds: list[int]) -> list[dict]:
    """The rung ``base`` once per seed (its name and tags say which when there are several)."""
    if len(seeds) == 1:
        return [{**base, "train": {**base.get("train", {}), "seed": seeds[0]}, "tags": {**base["tags"],
                                                                                      "seed": seeds[0]}}]
    return [{**base, "name": f"{base['name']}-s{s}", "train": {**base.get("train", {}), "seed": s},
             "tags": {**base["tags"], "seed": s}} for s in seeds]


def _aspect_rungs(st: Study, where: str) -> list[dict]:
    if len(st.shapes) < 2:
        raise ConfigError(f"{where}: study.shapes: an aspect study needs at least 2 shapes, got {len(st.shapes)}")
    rungs = []
    for i, shape in enumerate(st.shapes):
        if not isinstance(shape, dict) or not {"d_model", "n_layers"} <= set(shape):
            raise ConfigError(f"{where}: study.shapes[{i}]: expected a mapping with d_model and n_layers, got "
                              f"{shape!r}")
        shape = dict(shape)
        train = shape.pop("train", {})
        d, layers = shape["d_model"], shape["n_layers"]
        if not (isinstance(d, int) and isinstance(layers, int) and d > 0 and layers > 0):
            raise ConfigError(f"{where}: study.shapes[{i}]: d_model and n_layers must be positive whole numbers, "
                              f"got {d!r} and {layers!r}")
        model = {**st.model, **shape}
        if st.head_dim and "n_heads" not in shape:
            if d % st.head_dim:
                raise ConfigError(f"{where}: study.shapes[{i}]: d_model {d} does not divide into heads of "
                                  f"head_dim {st.head_dim}; choose a d_model that is a multiple of {st.head_dim}, "
                                  "or give the shape its own n_heads")
            model["n_heads"] = d // st.head_dim
        heads = model.get("n_heads", 4)
        if not isinstance(heads, int) or heads < 1 or d % heads:
            raise ConfigError(f"{where}: study.shapes[{i}]: d_model {d} does not divide into n_heads={heads} heads; "
                              f"choose n_heads among {[h for h in range(1, d + 1) if d % h == 0]}")
        rungs += _seeded({"name": f"d{d}-l{layers}", "model": model, "tokens": st.tokens, "train": train,
                          "tags": {"shape": f"d{d}-l{layers}", "d_model": d, "n_layers": layers,
                                   "n_heads": heads}}, st.seeds)
    return rungs


def _context_rungs(st: Study, data: dict, where: str) -> list[dict]:
    if len(st.contexts) < 2:
        raise ConfigError(f"{where}: study.contexts: a context study needs at least 2 contexts, got {st.contexts}")
    if any(not isinstance(c, int) or c < 2 for c in st.contexts):
        raise ConfigError(f"{where}: study.contexts: expected whole numbers of tokens (2 or more), got {st.contexts}")
    limit = st.model.get("max_seq_len", max(st.contexts))
    too_long = [c for c in st.contexts if c > limit]
    if too_long:
        raise ConfigError(f"{where}: study.contexts: {too_long[0]} is longer than the model's max_seq_len={limit}; "
                          f"drop that context or raise study.model.max_seq_len to {max(st.contexts)}")
    per_step = st.tokens_per_step or int(data.get("train", {}).get("batch_size", 8)) * min(st.contexts)
    bad = [c for c in st.contexts if per_step % c]
    if bad:
        raise ConfigError(f"{where}: study.tokens_per_step: {per_step} is not a whole number of sequences of "
                          f"context {bad[0]}; choose tokens_per_step as a multiple of every context "
                          f"(e.g. {_lcm(st.contexts) * max(1, per_step // _lcm(st.contexts))})")
    rungs = []
    for c in st.contexts:
        rungs += _seeded({"name": f"ctx{c}", "model": {**st.model, "max_seq_len": limit}, "tokens": st.tokens,
                          "train": {"data": {"seq_len": c}, "batch_size": per_step // c},
                          "tags": {"context": c}}, st.seeds)
    return rungs


def _lcm(values: list[int]) -> int:
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out


def expand_study(data: dict, where: str) -> dict:
    """The ladder mapping ``data`` with its ``study`` expanded into ``rungs`` (unchanged without a study)."""
    if not isinstance(data, dict) or "study" not in data:
        return data
    if "rungs" in data:
        raise ConfigError(f"{where}: give either rungs or a study, not both")
    try:
        st = from_dict(Study, data["study"], prefix="study.")
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    if st.kind not in KINDS:
        raise ConfigError(f"{where}: study.kind: {st.kind!r} is not one of {choices_text(KINDS)}")
    if not isinstance(st.tokens, int) or st.tokens <= 0:
        raise ConfigError(f"{where}: study.tokens: expected a positive number of tokens, got {st.tokens!r}")
    if not st.seeds or len(set(st.seeds)) != len(st.seeds):
        raise ConfigError(f"{where}: study.seeds: expected distinct seeds, got {st.seeds}")
    rungs = _aspect_rungs(st, where) if st.kind == "aspect" else _context_rungs(st, data, where)
    names = [r["name"] for r in rungs]
    if len(set(names)) != len(names):
        what = "shapes" if st.kind == "aspect" else "contexts"
        raise ConfigError(f"{where}: study.{what}: each must be given once, got {names}")
    return {**data, "study": {"kind": st.kind}, "rungs": rungs}


def check_study_run(tags: dict, cfg, where: str) -> None:
    """Refuse a study's run whose settings no longer vary what its rung varies (a --set of data.seq_len in a context
    study, or of the width or depth in an aspect study, would train every rung alike)."""
    if "context" in tags and cfg.data.seq_len != tags["context"]:
        raise ConfigError(f"{where}: data.seq_len is {cfg.data.seq_len}, but this context study trains the rung at "
                          f"context {tags['context']}; drop the --set of data.seq_len (the study sets each context)")
    shape = {k: tags[k] for k in ("d_model", "n_layers") if k in tags}
    got = {k: cfg.model.overrides.get(k) for k in shape}
    if got != shape:
        raise ConfigError(f"{where}: the model is {got}, but this aspect study trains the rung at {shape}; drop the "
                          "--set of model.overrides.d_model / n_layers (the study sets each shape)")
