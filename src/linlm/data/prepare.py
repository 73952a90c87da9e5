"""Tokenise a source into memory-mapped shards with a train/validation split.

The output directory and meta.json are laid out as :mod:`linlm.data.shards` defines (the shards are written by its
:class:`~linlm.data.shards.SplitWriter`); this module decides what goes into them, and resumes.

Token stream: every document is encoded on its own and followed by the end-of-text id.

Split rule: documents are cut into pieces, each of which goes to training or validation, as
:mod:`linlm.data.pieces` defines. The end-of-text id follows the last piece of a document, whichever split it
lands in. A tokenizer trained here (``bpe:N``) sees only training pieces.

Resuming: after each completed shard the state (pieces consumed, shards written, each split's pending tail)
is committed to ``.progress``. A re-run with the same source, tokenizer and settings skips the consumed pieces
without tokenising them and produces byte-identical output to an uninterrupted run.

Ownership: every file is written through :mod:`linlm.outputs` (a temporary name, fsynced, renamed, recorded in
the directory's ledger). What is linlm's is read from the ledgers, never from a name: ``overwrite``, the cleanup
of what a killed run left after its last commit, and the removal of ``.progress`` take only files linlm wrote
(unchanged since) and directories it made, once empty. A user's file anywhere in the directory stays; one at a
name prepare writes (``meta.json``, ``train/000003.bin``, ``.progress/state.json``, ...) refuses the command
before anything is removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from linlm import outputs
from linlm.data.pieces import DEFAULT_SPLIT_CHARS, is_val_piece, iter_pieces, split_offset
from linlm.data.shards import (FORMAT, META_FILE, PROGRESS_DIR, PROGRESS_FILE, SPLITS, STATE_FILE, SplitWriter,
                               is_format_path, shard_size_problem, token_dtype)
from linlm.data.sources import Source, SourceLike, open_source
from linlm.data.tokenizer import TOKENIZER_FILE, Tokenizer, resolve_tokenizer
from linlm.errors import ConfigError, DataError, LinlmError, StorageError
from linlm.locking import DirLock
from linlm.progress import ProgressBar

log = logging.getLogger("linlm.data")

DEFAULT_SHARD_TOKENS = 1 << 25  # 32 Mi tokens: 64 MiB per uint16 shard
BPE_MIN_FREQUENCY = 2
_BATCH_CHARS = 1 << 21  # characters per encode_batch call
WHAT = "output"  # how messages name the directory (the --out of `linlm data prepare`, or a cache entry)

ShardHook = Callable[[str, dict], None]


def prepare(source: SourceLike, tokenizer: "str | Path | Tokenizer", out_dir: str | Path, *,
            val_fraction: float = 0.005, seed: int = 0, shard_tokens: int = DEFAULT_SHARD_TOKENS,
            split_chars: int = DEFAULT_SPLIT_CHARS, text_field: str = "text", num_workers: int = 2,
            overwrite: bool = False, progress: bool = True, bpe_train_chars: Optional[int] = 1 << 30,
            hf_kwargs: Optional[dict] = None, on_shard: Optional[ShardHook] = None,
            wait_for_lock: bool = True) -> dict:
    """Tokenise ``source`` into ``out_dir`` and return the metadata (also written to ``out_dir/meta.json``).

    ``source``: see :mod:`linlm.data.sources` (``hf_kwargs`` go to ``datasets.load_dataset``).
    ``tokenizer``: ``"bpe:N"`` trains a byte-level BPE of N entries on the training pieces (the first
    ``bpe_train_chars`` characters of them, None for all); a path/name loads a pretrained one; a
    :class:`Tokenizer` is used as is. ``num_workers``: 1 encodes on one core; more use the tokenizers (Rust)
    thread pool, whose size is fixed when it first starts (``RAYON_NUM_THREADS``, set here to ``num_workers``
    if unset; else all cores). That beat a pool of processes in benchmarks/bench_data.py.
    ``on_shard(split, shard)`` is called after each shard is committed (progress reporting, tests).
    ``out_dir`` is locked while it is written (``out_dir/.lock``): a second process preparing the same directory
    waits for the first (``wait_for_lock``; else LockedError naming the holder), then finds it complete.

    A complete ``out_dir`` with the same source, tokenizer and settings is returned as is; an incomplete one
    is resumed; one made from anything else is refused (DataError) unless ``overwrite=True``.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"val_fraction={val_fraction!r}: expected a number in [0, 1)")
    counts = {"shard_tokens": shard_tokens, "split_chars": split_chars, "num_workers": num_workers}
    if bpe_train_chars is not None:  # None: all the text; 0 is not "the default", it is refused
        counts["bpe_train_chars"] = bpe_train_chars
    for key, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key}={value!r}: expected a positive integer")
    out = Path(out_dir).expanduser()
    existed = out.exists()
    src = open_source(source, text_field=text_field, hf_kwargs=hf_kwargs)
    tok, bpe_vocab = resolve_tokenizer(tokenizer)
    config: dict[str, Any] = {
        "format": FORMAT, "source_fingerprint": src.fingerprint(), "text_field": text_field,
        "tokenizer": ({"bpe": bpe_vocab, "min_frequency": BPE_MIN_FREQUENCY, "train_chars": bpe_train_chars}
                      if tok is None else {"fingerprint": tok.fingerprint()}),
        "val_fraction": float(val_fraction), "seed": int(seed), "shard_tokens": shard_tokens,
        "split_chars": split_chars}

    _refuse_foreign(out, overwrite)  # before the directory is locked: a refusal leaves it as it was
    created = _make_dir(out)
    lock = DirLock(out, WHAT).acquire(wait=wait_for_lock)
    fresh = False
    try:
        state = _open_out_dir(out, config, overwrite)
        if state is None:  # complete, same config
            return json.loads((out / META_FILE).read_text())
        fresh = state["next_piece"] == 0 and not any(state["splits"][s]["shards"] for s in SPLITS)
        spec = os.fspath(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else "Tokenizer object"
        with _parallelism(num_workers):
            if tok is None:
                tok = _bpe_for(out, state, src, bpe_vocab, val_fraction, seed, split_chars, bpe_train_chars)
            else:
                tok.save(out)
            return _tokenise(out, state, config, src, tok, tokenizer_spec=spec, progress=progress,
                             on_shard=on_shard)
    except StorageError:
        raise  # a full disk or a lost permission: the prepared data so far is kept, and a rerun resumes it
    except LinlmError:
        if fresh or not existed:  # a mistake in the input, in a run that started from nothing: leave nothing
            with contextlib.suppress(LinlmError):  # (the error to report is the one above)
                outputs.remove_tree(out, WHAT, held=[out])
        if not existed:
            outputs.remove_if_unused(created)
        raise
    except OSError as e:
        raise StorageError(f"output {out}: cannot write ({e.strerror or e}); the prepared data so far is kept and a "
                        "rerun resumes it. Free disk space or fix the permissions, or choose another directory") \
            from None
    finally:
        lock.release()


# ---- output directory ------------------------------------------------------------------------------------


def _make_dir(out: Path) -> list[Path]:
    """Create ``out`` (and missing parents, each recorded as linlm's); returns the directories made, deepest
    first. One-line errors."""
    if out.exists() and not out.is_dir():
        raise DataError(f"output {out} is a file; choose a directory")
    return outputs.make_dir(out, WHAT)


def _refuse_foreign(out: Path, overwrite: bool) -> None:
    """A directory holding files linlm did not write, and no data of linlm's, is refused unless ``overwrite``
    (which then writes beside the user's files, keeping them)."""
    if overwrite or not out.is_dir() or any(outputs.owns_file(out / rel) for rel in (META_FILE, PROGRESS_FILE)):
        return
    foreign = outputs.foreign_entries(out)
    if foreign:
        raise DataError(f"output {out} holds other files ({outputs.shown(foreign)}) and was not made by `linlm data "
                        "prepare`; choose a new or empty directory, or pass overwrite=True / --overwrite to write "
                        "into it (its files are kept)")


def _open_out_dir(out: Path, config: dict, overwrite: bool) -> Optional[dict]:
    """None when ``out`` is complete with ``config``; else the (fresh or resumed) state."""
    meta_path, state_path = out / META_FILE, out / PROGRESS_FILE
    previous = None
    if outputs.owns_file(meta_path):
        try:
            previous = json.loads(meta_path.read_text()).get("config") or {}
        except (ValueError, AttributeError):
            previous = {}
        if previous == config:
            _check_complete(out)
            _remove_progress(out)  # a kill between meta.json and cleanup
            log.info("%s is already complete with this source, tokenizer and settings", out)
            return None
    elif outputs.owns_file(state_path):
        try:
            state = json.loads(state_path.read_text())
        except ValueError as e:
            raise DataError(f"{state_path}: unreadable progress file ({e}); rerun with overwrite=True / "
                            "--overwrite to start again") from e
        if state.get("config") == config:
            log.info("resuming %s from piece %d", out, state["next_piece"])
            outputs.check_removal(out, WHAT, held=[out], blocks=is_format_path)
            _remove_strays(out, state)
            return state
        previous = state.get("config", {})
    else:
        _refuse_foreign(out, overwrite)
    if previous is not None and not overwrite:
        differ = sorted(k for k in set(config) | set(previous) if previous.get(k) != config.get(k))
        raise DataError(f"output {out} holds data prepared with a different {', '.join(differ)} "
                        f"(was {_brief({k: previous.get(k) for k in differ})}, now "
                        f"{_brief({k: config.get(k) for k in differ})}); choose another directory or pass "
                        "overwrite=True / --overwrite to replace it")
    if out.exists() and not out.is_dir():
        raise DataError(f"output {out} is a file; choose a directory")
    # What linlm wrote goes (meta.json first, so that the directory stops looking complete); a user's file at a
    # name written below refuses the command before anything is removed.
    outputs.check_removal(out, WHAT, held=[out], blocks=is_format_path, refuse_edited=True)
    outputs.remove_file(meta_path, WHAT)
    outputs.remove_tree(out, WHAT, held=[out], blocks=is_format_path, refuse_edited=True)
    outputs.make_dir(out, WHAT)
    state = {"config": config, "next_piece": 0, "checkpoint": 0, "tokenizer_fingerprint": None,
             "splits": {s: {"shards": [], "pieces": 0, "pending": None, "pending_tokens": 0} for s in SPLITS}}
    _commit_state(out, state)
    return state


def _brief(d: dict) -> str:
    def show(value: Any) -> str:
        if isinstance(value, dict) and "bpe" in value:
            return f"bpe:{value['bpe']}"
        if isinstance(value, dict) and "fingerprint" in value:
            return f"pretrained {value['fingerprint'][:12]}"
        if isinstance(value, str) and len(value) == 64:
            return value[:12]
        return repr(value)

    return ", ".join(f"{k}={show(v)}" for k, v in d.items())


def _remove_progress(out: Path) -> None:
    """Remove ``.progress`` once the directory is complete: what linlm wrote there (a user's file stays)."""
    outputs.remove_tree(out / PROGRESS_DIR, WHAT, keep_root=False)


def _remove_strays(out: Path, state: dict) -> None:
    """Drop what a killed run wrote after its last checkpoint: linlm's temporary files and the shards and tails
    it wrote but never committed to the state. Only linlm's files go (the ledger says which); a user's stay."""
    keep = {out / sh["file"] for s in SPLITS for sh in state["splits"][s]["shards"]}
    keep |= {out / PROGRESS_DIR / state["splits"][s]["pending"] for s in SPLITS if state["splits"][s]["pending"]}
    keep.add(out / PROGRESS_DIR / STATE_FILE)
    for folder in (*SPLITS, PROGRESS_DIR):
        if (out / folder).is_dir():
            for path in sorted((out / folder).iterdir()):
                if path not in keep:
                    outputs.remove_file(path, WHAT)


def _check_complete(out: Path) -> None:
    meta = json.loads((out / META_FILE).read_text())
    for split in meta["splits"].values():
        for shard in split["shards"]:
            path = out / shard["file"]
            if shard_size_problem(path, shard["tokens"], meta["dtype"]):
                raise DataError(f"{path}: missing or truncated shard of a completed directory; rerun with "
                                "overwrite=True / --overwrite (a shard that was changed is not linlm's any more: "
                                "move it away first)")


def _commit_state(out: Path, state: dict) -> None:
    outputs.write_json(out / PROGRESS_DIR / STATE_FILE, state, WHAT)


# ---- tokenizer ---------------------------------------------------------------------------------------------


def _bpe_for(out: Path, state: dict, src: Source, vocab: int, val_fraction: float, seed: int, split_chars: int,
             train_chars: Optional[int]) -> Tokenizer:
    """Train the BPE, or reload the one an interrupted run already trained into ``out``."""
    if state["tokenizer_fingerprint"] is not None and (out / TOKENIZER_FILE).is_file():
        tok = Tokenizer.from_pretrained(out)
        if tok.fingerprint() == state["tokenizer_fingerprint"]:
            return tok
    offset = split_offset(seed)

    def training_text() -> Iterator[str]:
        seen = 0
        for j, (piece, _) in enumerate(iter_pieces(src, split_chars)):
            if train_chars is not None and seen >= train_chars:
                return
            if not is_val_piece(j, val_fraction, offset):
                seen += len(piece)
                yield piece

    started = time.perf_counter()
    tok = Tokenizer.train(training_text(), vocab, min_frequency=BPE_MIN_FREQUENCY)
    log.info("trained a %d-entry BPE in %.1f s", tok.vocab_size, time.perf_counter() - started)
    tok.save(out)
    state["tokenizer_fingerprint"] = tok.fingerprint()
    _commit_state(out, state)
    return tok


@contextlib.contextmanager
def _parallelism(num_workers: int):
    saved = {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")}
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if num_workers > 1 else "false"
    if num_workers > 1 and saved["RAYON_NUM_THREADS"] is None:
        os.environ["RAYON_NUM_THREADS"] = str(num_workers)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- tokenising --------------------------------------------------------------------------------------------


def _batches(pieces: Iterator[tuple[int, str, bool]], limit: int) -> Iterator[list[tuple[int, str, bool]]]:
    batch, chars = [], 0
    for item in pieces:
        batch.append(item)
        chars += len(item[1])
        if chars >= limit:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _tokenise(out: Path, state: dict, config: dict, src: Source, tok: Tokenizer, *, tokenizer_spec: str,
              progress: bool, on_shard: Optional[ShardHook]) -> dict:
    dtype = token_dtype(tok.vocab_size)
    if state["tokenizer_fingerprint"] not in (None, tok.fingerprint()):
        raise DataError(f"{out}: the progress state was made with another tokenizer; rerun with overwrite=True")
    state["tokenizer_fingerprint"] = tok.fingerprint()
    writers = {s: SplitWriter(out, s, dtype, config["shard_tokens"], state["splits"][s], WHAT) for s in SPLITS}
    val_fraction, offset, eos = config["val_fraction"], split_offset(config["seed"]), tok.eos_id
    resume_at = state["next_piece"]
    numbered = ((j, piece, last) for j, (piece, last) in enumerate(iter_pieces(src, config["split_chars"])))

    total = src.total_bytes
    with ProgressBar(f"tokenising {src.spec}", total, count="bytes", transient=False,
                     enabled=None if progress else False) as bar:
        # A batch of about shard_tokens characters (a fraction of a shard) keeps the checkpoints close to the
        # shard boundaries; 2 Mi characters is plenty to keep the tokenizer's threads busy.
        limit = min(_BATCH_CHARS, max(config["shard_tokens"], 4096))
        for batch in _batches((j_piece for j_piece in numbered if j_piece[0] >= resume_at), limit):
            encoded = tok.encode_batch([piece for _, piece, _ in batch])
            per_split: dict[str, list[list[int]]] = {s: [] for s in SPLITS}
            for (j, _, last), ids in zip(batch, encoded):
                split = "val" if is_val_piece(j, val_fraction, offset) else "train"
                if last:
                    ids.append(eos)
                per_split[split].append(ids)
                state["splits"][split]["pieces"] += 1
            written = []
            for split, lists in per_split.items():
                if lists:
                    flat = np.concatenate([np.asarray(ids, dtype=dtype) for ids in lists])
                    written += [(split, shard) for shard in writers[split].add(flat)]
            state["next_piece"] = batch[-1][0] + 1
            if written:
                _checkpoint(out, state, writers)
                for split, shard in written:
                    if on_shard is not None:
                        on_shard(split, shard)
            bar.update(src.bytes_read)
        bar.update(total if total is not None else src.bytes_read)

    for split in SPLITS:
        for shard in writers[split].finish():
            if on_shard is not None:
                on_shard(split, shard)
    if src.stats.replacements:
        log.warning("%s: %d invalid UTF-8 sequences were replaced by U+FFFD", src.spec, src.stats.replacements)
    splits = {s: {"tokens": sum(sh["tokens"] for sh in state["splits"][s]["shards"]),
                  "pieces": state["splits"][s]["pieces"], "shards": state["splits"][s]["shards"]} for s in SPLITS}
    if config["val_fraction"] > 0 and splits["val"]["tokens"] == 0:
        log.warning("%s: the validation split is empty (%d pieces x val_fraction %g < 1); raise val_fraction or "
                    "lower split_chars", out, splits["train"]["pieces"], config["val_fraction"])
    meta = {
        "format": FORMAT, "dtype": dtype.name, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id,
        "tokenizer": {"file": TOKENIZER_FILE, "spec": tokenizer_spec, "fingerprint": tok.fingerprint()},
        "source": {"spec": src.spec, "fingerprint": src.fingerprint(), "documents": src.stats.documents,
                   "empty_documents": src.stats.empty_documents, "bytes": src.stats.bytes,
                   "utf8_replacements": src.stats.replacements},
        "config": config, "splits": splits,
    }
    outputs.write_json(out / META_FILE, meta, WHAT)
    _remove_progress(out)
    return meta


def _checkpoint(out: Path, state: dict, writers: dict[str, SplitWriter]) -> None:
    state["checkpoint"] += 1
    old = [writers[s].save_pending(state["checkpoint"]) for s in SPLITS]
    _commit_state(out, state)
    for name in old:
        if name:
            outputs.remove_file(out / PROGRESS_DIR / name, WHAT)
