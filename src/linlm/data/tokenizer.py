"""Tokenizers: a thin wrapper around Hugging Face ``tokenizers``.

``Tokenizer.train`` makes a byte-level BPE (GPT-2 style pre-tokenisation, no normaliser, no prefix space) with one
special token, ``<|endoftext|>``, that ends every document. Byte-level BPE covers every byte, so
``decode(encode(s)) == s`` for any string: whitespace, control characters and emoji included. The text
``<|endoftext|>`` inside a document is encoded as ordinary text, never as the special token, so a document cannot
forge a document boundary.

``Tokenizer.from_pretrained`` loads a ``tokenizer.json`` file, a directory holding one, a directory holding only
transformers' other tokenizer files (``tokenizer.model``, ``vocab.json``, ...; needs ``transformers``), or (when
``transformers`` is installed and the hub is reachable) a fast tokenizer by hub name. The end-of-text token of a
pretrained tokenizer comes from ``eos_token=``, else from ``tokenizer_config.json`` (then
``special_tokens_map.json``), else from a list of usual names.

The beginning-of-sequence (BOS) rule, the same for every command that reads text with a model (generation, the
zero-shot tasks, perplexity, NIAH, the lm-eval adapter): a tokenizer has a BOS when ``tokenizer_config.json`` (or
``special_tokens_map.json``) names a ``bos_token`` it holds. It *adds* it (``add_bos``) when the config's
``add_bos_token`` says so, or, without that key, when the ``tokenizer.json`` post-processor puts it first: what
transformers' default encoding does, which is how lm-eval's HF wrapper encodes (``add_bos_token`` unset).
:meth:`Tokenizer.encode_input` is the text as a model reads it (the BOS first when added); :attr:`prefix_id` is
the token before a text scored from its first token (the BOS, else the end-of-text token: lm-eval's
``prefix_token_id``). :meth:`Tokenizer.save` names no BOS, because linlm's data has none: linlm's own
tokenizers, and a model trained with one, work exactly as before (no BOS; the end-of-text token as the prefix).

:func:`tokenizer_for_model` is the one resolution every model command uses.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Iterable, Optional, Sequence

from linlm import outputs
from linlm.errors import TokenizerError

log = logging.getLogger("linlm.data")

EOS_TOKEN = "<|endoftext|>"
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>", "[SEP]")
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
# transformers' tokenizer files besides tokenizer.json: a directory with one of them loads through AutoTokenizer
TRANSFORMERS_FILES = (TOKENIZER_CONFIG_FILE, "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")


class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus the id that ends a document and, for a pretrained one, its BOS rule."""

    def __init__(self, backend, eos_token: str = EOS_TOKEN, *, bos_token: Optional[str] = None,
                 add_bos: bool = False):
        self._tok = backend
        if hasattr(backend, "encode_special_tokens"):
            backend.encode_special_tokens = True  # "<|endoftext|>" in a document is text, not a boundary
        eos_id = backend.token_to_id(eos_token)
        if eos_id is None:
            raise TokenizerError(f"the tokenizer has no token {eos_token!r} to end documents; pass eos_token= "
                                 "with one of its special tokens")
        self.eos_token = eos_token
        self.eos_id: int = eos_id
        self.vocab_size: int = max(backend.get_vocab(with_added_tokens=True).values()) + 1
        self.bos_id: Optional[int] = None if bos_token is None else backend.token_to_id(bos_token)
        if bos_token is not None and self.bos_id is None:
            raise TokenizerError(f"the tokenizer has no token {bos_token!r} to begin sequences; name one of its "
                                 "tokens as bos_token")
        self.bos_token = bos_token
        self.add_bos: bool = bool(add_bos) and self.bos_id is not None
        self._fingerprint: Optional[str] = None

    def __repr__(self) -> str:
        bos = f", bos={self.bos_token!r}:{self.bos_id}{' (added)' if self.add_bos else ''}" if self.bos_token else ""
        return f"Tokenizer(vocab_size={self.vocab_size}, eos={self.eos_token!r}:{self.eos_id}{bos})"

    # ---- construction --------------------------------------------------------------------------------------

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2,
              show_progress: bool = False) -> "Tokenizer":
        """Train a byte-level BPE with ``vocab_size`` entries (256 bytes + ``<|endoftext|>`` + merges)."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        if not isinstance(vocab_size, int) or vocab_size < 257:
            raise TokenizerError(f"BPE vocab_size {vocab_size!r} is too small: a byte-level BPE needs at least 257 "
                                 "entries (256 bytes and <|endoftext|>); use e.g. bpe:8192")
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=[EOS_TOKEN], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=show_progress)
        tok.train_from_iterator(texts, trainer)
        out = cls(tok, EOS_TOKEN)
        if out.vocab_size < vocab_size:
            log.info("BPE stopped at %d of %d entries: the training text has no more merges", out.vocab_size,
                     vocab_size)
        return out

    @classmethod
    def from_pretrained(cls, path_or_name: str | Path, *, eos_token: Optional[str] = None) -> "Tokenizer":
        """Load a ``tokenizer.json`` file, a directory with one (with its ``tokenizer_config.json`` and
        ``special_tokens_map.json``), a directory of transformers' other tokenizer files, or a hub name (these two
        need ``transformers``)."""
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path_or_name).expanduser()
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if path.is_dir() and not file.is_file():
            if any((path / name).is_file() for name in TRANSFORMERS_FILES):
                return cls._from_transformers(str(path), eos_token, _named_tokens(path))
            raise TokenizerError(f"{path}: directory has no {TOKENIZER_FILE} (nor transformers' tokenizer files); "
                                 "point at a tokenizer.json file or a directory saved by Tokenizer.save / "
                                 "transformers' save_pretrained")
        if not file.is_file() and _looks_like_path(str(path_or_name)):
            raise TokenizerError(f"tokenizer {str(path_or_name)!r}: no such file or directory; give a tokenizer.json "
                                 "file, a directory holding one, a hub name, or bpe:VOCAB_SIZE to train one")
        if file.is_file():
            try:
                backend = HFTokenizer.from_file(str(file))
            except Exception as e:  # tokenizers raises plain Exception on bad JSON
                raise TokenizerError(f"{file}: not a valid tokenizers JSON file ({e})") from e
            named = _named_tokens(file.parent)
            return cls._with_named(backend, eos_token or _find_eos(backend, named, str(file)), named)
        return cls._from_transformers(str(path_or_name), eos_token, {})

    @classmethod
    def _with_named(cls, backend, eos_token: str, named: dict) -> "Tokenizer":
        """The tokenizer with the BOS rule of the module doc (``named``: what the config files state)."""
        bos = named.get("bos_token")
        bos_id = backend.token_to_id(bos) if bos else None
        if bos_id is None:
            return cls(backend, eos_token)
        add = named.get("add_bos_token")
        if add is None:  # the post-processor decides, as in transformers' default encoding
            plain = backend.encode("a", add_special_tokens=False).ids
            full = backend.encode("a", add_special_tokens=True).ids
            add = len(full) > len(plain) and full[0] == bos_id
        return cls(backend, eos_token, bos_token=bos, add_bos=add)

    @classmethod
    def _from_transformers(cls, name: str, eos_token: Optional[str], named: dict) -> "Tokenizer":
        """A local directory of transformers' tokenizer files (``named`` read from it), or a hub name."""
        local = Path(name).is_dir()
        where = "is a directory without tokenizer.json" if local else "is not a file or directory"
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            raise TokenizerError(f"tokenizer {name!r} {where}, and loading it needs transformers: pip install "
                                 "'linlm[hf]' (or add the tokenizer.json that transformers' save_pretrained writes)"
                                 ) from e
        try:
            hf = AutoTokenizer.from_pretrained(name, local_files_only=local)
        except Exception as e:  # transformers reading files it cannot use raises many kinds, over many lines
            how = "from its files" if local else "by name (is the hub reachable? is the name right?)"
            raise TokenizerError(f"tokenizer {name!r} {where}, and transformers could not load it {how}: "
                                 f"{' '.join(str(e).split())}") from e
        if not getattr(hf, "is_fast", False):
            raise TokenizerError(f"tokenizer {name!r} has no fast (tokenizers) version; only those are supported")
        backend = hf.backend_tokenizer
        named = {"bos_token": hf.bos_token, **named}  # what the files state wins
        return cls._with_named(backend, eos_token or hf.eos_token or _find_eos(backend, {}, name), named)

    # ---- use -----------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_input(self, text: str) -> list[int]:
        """The ids of ``text`` at the start of a model's input: the BOS first when the tokenizer adds one (see the
        module doc), then :meth:`encode`."""
        ids = self.encode(text)
        return [self.bos_id, *ids] if self.add_bos else ids

    @property
    def prefix_id(self) -> int:
        """The token before a text scored from its first token: the BOS when there is one, else end-of-text."""
        return self.eos_id if self.bos_id is None else self.bos_id

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts; uses the tokenizers thread pool unless ``TOKENIZERS_PARALLELISM=false``."""
        fast = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        return [e.ids for e in fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def to_str(self) -> str:
        """The serialised tokenizer (tokenizers JSON)."""
        return self._tok.to_str()

    def fingerprint(self) -> str:
        """sha256 of the serialised tokenizer and its end-of-text token."""
        if self._fingerprint is None:
            self._fingerprint = hashlib.sha256((self.to_str() + "\0" + self.eos_token).encode()).hexdigest()
        return self._fingerprint

    def save(self, directory: str | Path) -> Path:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (readable by transformers) into ``directory``.

        Both go through :mod:`linlm.outputs`, and both are checked first: a file of the user's at either name is
        refused (OutputError) before anything is written, never replaced."""
        directory = Path(directory)
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": self.eos_token,
                  "clean_up_tokenization_spaces": False}
        files = {TOKENIZER_FILE: self.to_str(), TOKENIZER_CONFIG_FILE: outputs.dumps(config)}
        for name in files:
            outputs.check_file(directory / name, "tokenizer")
        for name, text in files.items():
            outputs.write_text(directory / name, text, "tokenizer")
        return directory / TOKENIZER_FILE

    def ensure_fits(self, model_vocab_size: int) -> None:
        """Raise TokenizerError when some token id would not fit a model with ``model_vocab_size`` embeddings."""
        if self.vocab_size > model_vocab_size:
            raise TokenizerError(f"the tokenizer has {self.vocab_size} token ids but the model's vocab_size is "
                                 f"{model_vocab_size}; use the model's own tokenizer, or set the model's vocab_size "
                                 f"to at least {self.vocab_size} "
                                 f"(linlm train: --set model.overrides.vocab_size={_round_up(self.vocab_size, 64)})")


def _looks_like_path(text: str) -> bool:
    """Hub names look like ``name`` or ``org/name``; paths that cannot be one are refused without a hub lookup."""
    return (text.startswith((".", "/", "~", "\\")) or text.endswith(".json") or text.count("/") > 1
            or (len(text) > 1 and text[1] == ":"))


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _named_tokens(directory: Path) -> dict:
    """``bos_token``, ``eos_token`` and ``add_bos_token`` as ``tokenizer_config.json`` states them, with
    ``special_tokens_map.json`` filling in a token the config does not name ({} when neither file is there)."""
    named: dict = {}
    for name in (TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE):
        file = directory / name
        if not file.is_file():
            continue
        try:
            data = json.loads(file.read_text())
        except (OSError, ValueError) as e:
            raise TokenizerError(f"{file}: cannot read ({e})") from e
        if not isinstance(data, dict):
            raise TokenizerError(f"{file}: expected a JSON object, got {type(data).__name__}")
        for key in ("bos_token", "eos_token"):
            value = data.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str) and key not in named:
                named[key] = value
        if name == TOKENIZER_CONFIG_FILE and isinstance(data.get("add_bos_token"), bool):
            named["add_bos_token"] = data["add_bos_token"]
    return named


def _find_eos(backend, named: dict, where: str) -> str:
    eos = named.get("eos_token")
    if eos is not None and backend.token_to_id(eos) is not None:
        return eos
    for candidate in EOS_CANDIDATES:
        if backend.token_to_id(candidate) is not None:
            return candidate
    raise TokenizerError(f"{where}: cannot tell which token ends a document (no eos_token in "
                         f"{TOKENIZER_CONFIG_FILE}, none of {', '.join(EOS_CANDIDATES)}); pass eos_token=")


def resolve_tokenizer(spec: "str | Path | Tokenizer") -> tuple[Optional["Tokenizer"], Optional[int]]:
    """``bpe:N`` -> (None, N): a BPE to train; a Tokenizer -> itself; anything else -> loaded with from_pretrained."""
    if isinstance(spec, Tokenizer):
        return spec, None
    text = str(spec)
    if text.startswith("bpe:"):
        try:
            n = int(text[4:])
        except ValueError:
            raise TokenizerError(f"tokenizer {text!r}: expected bpe:VOCAB_SIZE with an integer, "
                                 "e.g. bpe:8192") from None
        if n < 257:
            raise TokenizerError(f"tokenizer {text!r}: a byte-level BPE needs vocab size >= 257")
        return None, n
    return Tokenizer.from_pretrained(text), None


def tokenizer_for_model(model_dir: str | Path, tokenizer: "str | Path | None" = None,
                        vocab_size: Optional[int] = None) -> Tokenizer:
    """The tokenizer every command that reads text uses with the model saved in ``model_dir``, in this order:

    1. ``tokenizer`` when given (``--tokenizer``: a tokenizer.json, a directory holding one, a hub name);
    2. the ``tokenizer.json`` beside the weights: linlm's own (written by :meth:`Tokenizer.save`, its
       ``tokenizer_config.json`` naming only the end-of-text token) or a transformers one (a converted checkpoint's,
       with its ``tokenizer_config.json`` and ``special_tokens_map.json``), through the ``tokenizers`` library;
    3. transformers' other tokenizer files beside the weights (``tokenizer.model``, ``vocab.json``, ...) through
       ``transformers.AutoTokenizer`` (local files only), when transformers is installed;

    else a TokenizerError. With ``vocab_size`` (the model's), a tokenizer with more ids is refused
    (:meth:`Tokenizer.ensure_fits`)."""
    model_dir = Path(model_dir)
    if tokenizer is None and not any((model_dir / name).is_file() for name in (TOKENIZER_FILE, *TRANSFORMERS_FILES)):
        raise TokenizerError(f"{model_dir}: no tokenizer beside the weights (no {TOKENIZER_FILE}, nor transformers' "
                             "tokenizer files); pass --tokenizer PATH")
    tok = Tokenizer.from_pretrained(model_dir if tokenizer is None else tokenizer)
    if vocab_size is not None:
        tok.ensure_fits(vocab_size)
    return tok
