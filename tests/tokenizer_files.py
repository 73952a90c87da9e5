"""A pretrained-style tokenizer on disk, as a converted checkpoint carries it (imported as a module by the tests):
``tokenizer.json`` (a small Metaspace BPE, like Llama's), ``tokenizer_config.json`` and ``special_tokens_map.json``."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Iterable, Optional

SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2


def write_pretrained_tokenizer(directory: Path, texts: Iterable[str], *, vocab_size: int = 200,
                               post_bos: bool = True, add_bos_token: Optional[bool] = True,
                               config_bos: bool = True, special_map: bool = True) -> Path:
    """Train the BPE on ``texts`` and write its files into ``directory``. ``post_bos``: the post-processor puts
    ``<s>`` first (as Llama's tokenizer.json does); ``add_bos_token``: the config key (None leaves it out);
    ``config_bos``: the config names ``<s>`` as bos_token; ``special_map``: write special_tokens_map.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    alphabet = list(string.ascii_letters + string.digits + string.punctuation)  # any ASCII text has no <unk>
    tok.train_from_iterator(list(texts), trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                                               initial_alphabet=alphabet, show_progress=False))
    if post_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", 1)])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "unk_token": "<unk>",
              "clean_up_tokenization_spaces": False}
    if config_bos:
        config["bos_token"] = "<s>"
    if add_bos_token is not None:
        config["add_bos_token"] = add_bos_token
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    if special_map:
        (directory / "special_tokens_map.json").write_text(json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    return directory
