"""The data of a sweep's runs: where each run's prepared data is (prepared into the linlm cache when asked), how
many training tokens it holds, the vocabulary a model will get from it, and the epochs the runs would train.

The sweep never prepares data into its own directory: a run's ``data.dir`` points into the cache (or at the
user's prepared directory), so a sweep directory holds only runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from linlm.data.shards import META_FILE as DATA_META_FILE
from linlm.errors import DataError
from linlm.scaling.ladder import Ladder, PlannedRun


@dataclass
class DataInfo:
    directory: Optional[Path]
    train_tokens: Optional[int]
    source_fingerprint: Optional[str]
    tokenizer_fingerprint: Optional[str]
    val_tokens: Optional[int] = None


def unknown_data() -> DataInfo:
    """The data of a run whose data is not prepared (or not reachable from this machine)."""
    return DataInfo(None, None, None, None)


def resolve_run_data(cfg, prepare: bool) -> DataInfo:
    """The prepared data of a run (prepared into the linlm cache when ``prepare``), with its token count."""
    from linlm.train.pipeline import prepared_data_dir, resolve_data

    if cfg.data.dir:
        directory = Path(cfg.data.dir).expanduser()
    else:
        try:
            directory = prepared_data_dir(cfg)
        except DataError:
            if prepare:
                raise
            return unknown_data()  # a plan may name a source this machine cannot reach
    if prepare and not cfg.data.dir:
        directory = resolve_data(cfg, show_progress=False)
    meta_path = directory / DATA_META_FILE
    if not meta_path.is_file():
        if cfg.data.dir:
            raise DataError(f"data.dir: {directory} holds no prepared data (no meta.json); prepare it with "
                            "`linlm data prepare`")
        return unknown_data()
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    val = meta["splits"].get("val", {}).get("tokens")
    return DataInfo(directory, int(meta["splits"]["train"]["tokens"]), meta.get("source", {}).get("fingerprint"),
                    meta.get("tokenizer", {}).get("fingerprint"), int(val) if val is not None else None)


def check_contexts(runs: list[PlannedRun], infos: dict[str, DataInfo], ladder: Ladder) -> None:
    """Refuse a run whose context (data.seq_len) the prepared data cannot fill: the training split must hold one
    sequence of it (plus the next token), and the validation split one too when it has any (a study scores every
    run on validation text at its own context)."""
    for r in runs:
        info, n = infos[r.name], r.config.data.seq_len
        for split, have in (("training", info.train_tokens), ("validation", info.val_tokens)):
            if have is not None and (split == "training" or have > 0) and have < n + 1:
                raise DataError(f"ladder {ladder.name}: run {r.name} has context {n}, longer than the {have:,} "
                                f"tokens of the {split} split of its data; use a shorter context, a larger corpus "
                                "(--set data.source=...) or a larger data.val_fraction")


def check_epochs(runs: list[PlannedRun], infos: dict[str, DataInfo], ladder: Ladder) -> None:
    over = [(r, r.tokens / infos[r.name].train_tokens) for r in runs
            if infos[r.name].train_tokens and r.tokens / infos[r.name].train_tokens > ladder.max_epochs]
    if over:
        r, ep = max(over, key=lambda x: x[1])
        need = math.ceil(r.tokens / ladder.max_epochs)
        raise DataError(f"ladder {ladder.name}: {len(over)} run(s) would see their training data more than "
                        f"max_epochs={ladder.max_epochs:g} times (worst: {r.name}, {ep:.1f} epochs of "
                        f"{infos[r.name].train_tokens:,} tokens); use a corpus of at least {need:,} training tokens "
                        "(--set data.source=...), a smaller tokenizer (more tokens per text), or fewer tokens per rung")


def vocab_guess(cfg, data: DataInfo) -> int:
    """The model's vocabulary: the override, the prepared tokenizer's, or the size a bpe:N spec asks for."""
    if "vocab_size" in cfg.model.overrides:
        return int(cfg.model.overrides["vocab_size"])
    if data.directory is not None:
        meta = json.loads((data.directory / DATA_META_FILE).read_text(encoding="utf-8"))
        return -(-int(meta["vocab_size"]) // 64) * 64
    tok = cfg.data.tokenizer
    if tok.startswith("bpe:") and tok[4:].isdigit():
        return -(-int(tok[4:]) // 64) * 64
    return 256
