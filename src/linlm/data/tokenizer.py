"""Tokenizers: a thin wrapper around Hugging Face ``tokenizers``.

``Tokenizer.train`` makes a byte-level BPE (GPT-2 style pre-tokenisation, no normaliser, no prefix space) with one
special token, ``<|endoftext|>``, that ends every document. Byte-level BPE covers every byte, so
``decode(encode(s)) == s`` for any string: whitespace, control characters and emoji included. The text
``<|endoftext|>`` inside a document is encoded as ordinary text, never as the special token, so a document cannot
forge a document boundary.

``Tokenizer.from_pretrained`` loads a ``tokenizer.json`` file, a directory holding one, or (when ``transformers``
is installed and the hub is reachable) a fast tokenizer by hub name. The end-of-text token of a pretrained
tokenizer comes from ``eos_token=``, else from ``tokenizer_config.json``, else from a list of usual names.
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
CONFIG_FILE = "tokenizer_config.json"


class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus the id that ends a document."""

    def __init__(self, backend, eos_token: str = EOS_TOKEN):
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
        self._fingerprint: Optional[str] = None

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, eos={self.eos_token!r}:{self.eos_id})"

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
        """Load a ``tokenizer.json`` file, a directory with one, or a hub name (needs ``transformers``)."""
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path_or_name).expanduser()
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if path.is_dir() and not file.is_file():
            raise TokenizerError(f"{path}: directory has no {TOKENIZER_FILE}; point at a tokenizer.json file or a "
                                 "directory saved by Tokenizer.save / transformers' save_pretrained")
        if not file.is_file() and _looks_like_path(str(path_or_name)):
            raise TokenizerError(f"tokenizer {str(path_or_name)!r}: no such file or directory; give a tokenizer.json "
                                 "file, a directory holding one, a hub name, or bpe:VOCAB_SIZE to train one")
        if file.is_file():
            try:
                backend = HFTokenizer.from_file(str(file))
            except Exception as e:  # tokenizers raises plain Exception on bad JSON
                raise TokenizerError(f"{file}: not a valid tokenizers JSON file ({e})") from e
            return cls(backend, eos_token or _find_eos(backend, file.parent / CONFIG_FILE, str(file)))
        return cls._from_hub(str(path_or_name), eos_token)

    @classmethod
    def _from_hub(cls, name: str, eos_token: Optional[str]) -> "Tokenizer":
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            raise TokenizerError(f"tokenizer {name!r} is not a file or directory, and loading it by name needs "
                                 "transformers: pip install 'linlm[hf]'") from e
        try:
            hf = AutoTokenizer.from_pretrained(name)
        except (OSError, ValueError) as e:
            raise TokenizerError(f"tokenizer {name!r} is not a file or directory here, and transformers could not "
                                 f"load it by name (is the hub reachable? is the name right?): {e}") from e
        if not getattr(hf, "is_fast", False):
            raise TokenizerError(f"tokenizer {name!r} has no fast (tokenizers) version; only those are supported")
        backend = hf.backend_tokenizer
        return cls(backend, eos_token or hf.eos_token or _find_eos(backend, None, name))

    # ---- use -----------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

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
        files = {TOKENIZER_FILE: self.to_str(), CONFIG_FILE: outputs.dumps(config)}
        for name in files:
            outputs.check_file(directory / name, "tokenizer")
        for name, text in files.items():
            outputs.write_text(directory / name, text, "tokenizer")
        return directory / TOKENIZER_FILE

    def ensure_fits(self, model_vocab_size: int) -> None:
        """Raise TokenizerError when some token id would not fit a model with ``model_vocab_size`` embeddings."""
        if self.vocab_size > model_vocab_size:
            raise TokenizerError(f"the tokenizer has {self.vocab_size} token ids but the model's vocab_size is "
                                 f"{model_vocab_size}; set the model's vocab_size to at least {self.vocab_size} "
                                 f"(linlm train: --set model.overrides.vocab_size={_round_up(self.vocab_size, 64)})")


def _looks_like_path(text: str) -> bool:
    """Hub names look like ``name`` or ``org/name``; paths that cannot be one are refused without a hub lookup."""
    return (text.startswith((".", "/", "~", "\\")) or text.endswith(".json") or text.count("/") > 1
            or (len(text) > 1 and text[1] == ":"))


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _find_eos(backend, config: Optional[Path], where: str) -> str:
    if config is not None and config.is_file():
        try:
            eos = json.loads(config.read_text()).get("eos_token")
        except (OSError, ValueError) as e:
            raise TokenizerError(f"{config}: cannot read ({e})") from e
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and backend.token_to_id(eos) is not None:
            return eos
    for candidate in EOS_CANDIDATES:
        if backend.token_to_id(candidate) is not None:
            return candidate
    raise TokenizerError(f"{where}: cannot tell which token ends a document (no eos_token in {CONFIG_FILE}, none "
                         f"of {', '.join(EOS_CANDIDATES)}); pass eos_token=")


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
