"""transformers models for linlm: ``PreTrainedModel`` + ``GenerationMixin`` per architecture, and a ``Cache``.

Each architecture's class is registered with ``AutoModelForCausalLM`` when it is made (importing :mod:`linlm.hf`
makes them all). ``LinlmForCausalLM.model`` is the linlm :class:`~linlm.models.lm.CausalLM` itself, so the weights are the same
tensors under a ``model.`` prefix and ``generate()`` runs linlm's own prefill and one-token step.

The cache (:class:`LinlmCache`) holds linlm's decoding state: the recurrent and conv states of the linear models,
the KV cache of LLaMA. It is created by the model on the first forward with ``use_cache``.

``from_pretrained`` refuses a config.json that contradicts the weights (a layer count or a width other than theirs,
tensors missing or left over) with a CheckpointError, instead of transformers' freshly initialised or dropped
tensors. ``generate()`` refuses sampling settings out of range (``top_p`` outside (0, 1], a negative ``top_k`` or
temperature, ``do_sample`` with temperature 0) by linlm's own checks (``check_sampling``) before any work.

Left-padded batches (``attention_mask`` with zeros before each row's prompt): the prefill marks each row's first
real token as a document start (linlm's ``reset``), so the recurrent states, conv windows and expert states restart
there and the padding never enters them; LLaMA masks the padded keys for the rest of the generation. Each row then
decodes as if it were alone. Padding anywhere else than on the left is refused.
"""

from __future__ import annotations

import logging
from typing import Mapping, Optional

import torch
from transformers import AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from linlm.errors import CheckpointError, ConfigError, ShapeError
from linlm.hf.configuration import CONFIG_CLASSES, LinlmConfig, PerArch, hf_config_for
from linlm.layers.mixer import has_init_buffers
from linlm.layers.state import ModelState
from linlm.models.generation import check_sampling
from linlm.models.lm import CausalLM


class LinlmCache(Cache):
    """transformers' cache interface around a linlm :class:`ModelState` (None before the prefill)."""

    def __init__(self, state: Optional[ModelState] = None):
        super().__init__(layers=[])
        self.state = state

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.state is None else self.state.offset

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    @property
    def batch_size(self) -> int:
        size = None if self.state is None else self.state.batch_size
        return -1 if size is None else size

    @property
    def is_initialized(self) -> bool:
        return self.state is not None

    def nbytes(self) -> int:
        return 0 if self.state is None else self.state.nbytes()

    def _map(self, fn) -> None:
        if self.state is None:
            return
        self.state = self.state.map(fn)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def reset(self) -> None:
        self.state = None

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a linlm recurrent state cannot be cropped; restart the generation instead")

    def __len__(self) -> int:
        return 0 if self.state is None else len(self.state.layers)

    def __repr__(self) -> str:
        return f"LinlmCache(offset={self.get_seq_length()}, bytes={self.nbytes()})"


def _resets_from_left_padding(attention_mask: torch.Tensor, T: int) -> Optional[torch.Tensor]:
    """reset [B, T]: True at each row's first real token, or None when no row is padded. Refuses other padding."""
    mask = attention_mask[:, -T:].bool()
    if bool(mask.all()):
        return None
    # Left padding: once a row's tokens start, they never stop.
    started = mask.cummax(dim=1).values
    if bool((started & ~mask).any()):
        raise ShapeError("attention_mask: linlm models take left padding only (zeros before each prompt, none after); "
                         "set tokenizer.padding_side = 'left'")
    if not bool(mask[:, -1].all()):
        raise ShapeError("attention_mask: a row is all padding; drop it from the batch")
    first = mask & ~torch.nn.functional.pad(mask, (1, 0))[:, :-1]
    return first


class LinlmForCausalLM(PreTrainedModel, GenerationMixin):
    """A linlm model under transformers' API. Subclassed once per architecture (``LinlmTnlForCausalLM``, ...)."""

    config_class = LinlmConfig
    base_model_prefix = "linlm"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _supports_cache_class = True

    def __init__(self, config: LinlmConfig):
        super().__init__(config)
        self.model = CausalLM(config.to_linlm())
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' ``from_pretrained``, with every tensor of the model read from the weights and every tensor
        of the weights read into the model: anything else (a config.json whose layer count or widths contradict the
        weights, a tensor missing or left over) raises a CheckpointError naming the tensors, also where
        ``ignore_mismatched_sizes`` was asked for."""
        want_info = kwargs.pop("output_loading_info", False)
        kwargs["ignore_mismatched_sizes"] = True  # mismatches are collected and refused below
        log, held = logging.getLogger("transformers.modeling_utils"), _HeldLoadReport()
        log.addFilter(held)
        try:
            model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True,
                                                  **kwargs)
        except ConfigError as e:
            raise CheckpointError(f"{pretrained_model_name_or_path}: config.json: {e}") from None
        finally:
            log.removeFilter(held)
        _check_loaded(pretrained_model_name_or_path, info)
        for record in held.records:  # an accepted load keeps transformers' report
            log.handle(record)
        return (model, info) if want_info else model

    def generate(self, inputs=None, generation_config=None, **kwargs):
        """transformers' ``generate()``, after linlm's checks of the sampling settings it would use."""
        config, _ = self._prepare_generation_config(generation_config, **kwargs)
        check_generation(config)
        return super().generate(inputs, generation_config, **kwargs)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model makes its own LinlmCache

    def _init_weights(self, module) -> None:
        # linlm initialises its own parameters when built; only the computed (non-persistent) buffers, which no
        # weights file holds, must be recomputed when transformers materialises a model from the meta device. Every
        # module that has them defines init_buffers() (the token-mixer contract, linlm.layers.mixer).
        if has_init_buffers(module):
            module.init_buffers()

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def forward(self, input_ids: torch.LongTensor = None, attention_mask: Optional[torch.Tensor] = None,
                cache: Optional[Cache] = None, use_cache: Optional[bool] = None, labels: Optional[torch.Tensor] = None,
                return_dict: Optional[bool] = None, logits_to_keep: int = 0, **kwargs) -> CausalLMOutputWithPast:
        if input_ids is None:
            raise ShapeError("linlm models take input_ids (inputs_embeds are not supported)")
        if cache is None and "past_key_values" in kwargs:
            cache = kwargs.pop("past_key_values")
        if cache is not None and not isinstance(cache, LinlmCache):
            raise ShapeError(f"cache must be a LinlmCache (made by this model), got {type(cache).__name__}")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if self.training and labels is not None:
            use_cache = False
        state = None if cache is None else cache.state
        reset = None
        if attention_mask is not None and state is None:
            reset = _resets_from_left_padding(attention_mask, input_ids.shape[1])
        keep = logits_to_keep if isinstance(logits_to_keep, int) and labels is None else 0
        out = self.model(input_ids, state=state, reset=reset, return_state=bool(use_cache), return_aux=True,
                         logits_to_keep=keep)
        logits = out.logits
        if not isinstance(logits_to_keep, int):  # a tensor of positions
            logits = logits[:, logits_to_keep]
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.model.config.vocab_size, **kwargs)
        if use_cache:
            cache = cache if cache is not None else LinlmCache()
            cache.state = out.state
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache if use_cache else None)


def check_generation(config) -> None:
    """Raise ConfigError for the sampling settings of a ``GenerationConfig`` that linlm refuses: out of range as
    :func:`~linlm.models.generation.check_sampling` says (None is transformers' "not set"), or sampling at
    temperature 0 (greedy decoding is ``do_sample=False``)."""
    temperature = 1.0 if config.temperature is None else config.temperature
    if config.do_sample and temperature == 0:
        raise ConfigError("temperature: must be > 0 when do_sample=True, got 0 (greedy decoding is do_sample=False)")
    check_sampling(temperature, 0 if config.top_k is None else config.top_k,
                   1.0 if config.top_p is None else config.top_p,
                   0 if config.max_new_tokens is None else config.max_new_tokens)


class _HeldLoadReport(logging.Filter):
    """Holds back transformers' load report (a table of the tensors it re-initialised) while linlm checks the load,
    so that a refused load ends in linlm's one CheckpointError alone; an accepted load logs the report after all."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in record.getMessage():
            self.records.append(record)
            return False
        return True


def _check_loaded(path, info: dict) -> None:
    problems = [(what, sorted(info[key])) for what, key in (("missing from the weights", "missing_keys"),
                                                            ("in the weights but not in the model", "unexpected_keys"))
                if info[key]]
    if info["mismatched_keys"]:
        problems.append(("of another shape in the weights than in the model",
                         [f"{k} {tuple(ckpt)} vs {tuple(ours)}" for k, ckpt, ours in sorted(info["mismatched_keys"])]))
    if problems:
        listed = "; ".join(f"{what}: {_some(keys)}" for what, keys in problems)
        raise CheckpointError(f"{path}: config.json does not describe these weights ({listed}); a layer count or a "
                              "width in config.json differs from the checkpoint's, or the weights file is incomplete")


def _some(keys: list, shown: int = 4) -> str:
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


MODEL_CLASSES: Mapping[str, type[LinlmForCausalLM]] = PerArch(
    LinlmForCausalLM, "ForCausalLM", lambda arch: {"config_class": CONFIG_CLASSES[arch]},
    lambda cls: AutoModelForCausalLM.register(cls.config_class, cls, exist_ok=True), __name__)


def __getattr__(name: str) -> type:
    return MODEL_CLASSES.named(name)


def to_hf(model: CausalLM) -> LinlmForCausalLM:
    """The transformers model of a linlm model, sharing its weights (save_pretrained then writes them)."""
    cfg = model.config
    hf = MODEL_CLASSES[cfg.arch](hf_config_for(cfg))
    hf.model = model
    return hf.eval() if not model.training else hf


def from_hf(hf_model) -> CausalLM:
    """The linlm model inside a transformers model from :func:`to_hf` or ``from_pretrained``."""
    if not isinstance(hf_model, LinlmForCausalLM):
        raise CheckpointError(f"{type(hf_model).__name__} is not a linlm transformers model; for a Llama checkpoint "
                              "use linlm.hf.llama.from_hf_llama")
    return hf_model.model

