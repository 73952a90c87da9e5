"""The training config: a tree of dataclasses, built from YAML files and dotted overrides.

``load_train_config(path, overrides)`` merges (in this order) the dataclass defaults, a YAML file and dotted
``key=value`` overrides, then validates the whole tree before any work is done: an unknown key, a wrong type or
an impossible value raises :class:`~linlm.errors.ConfigError` naming the key (and, for keys from a YAML file,
the file and line; for overrides, "set on the command line"). Types are checked by pydantic (see
:mod:`linlm.config`); the rules between keys are in :meth:`TrainConfig.validate`.

Which keys may change when a run is resumed is recorded on the fields themselves (``RESUMABLE``, field
metadata ``{"resumable": True}``); :func:`is_resumable_change` reads it.

See docs/training.md for every key.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

import yaml

from linlm.config import (config_error, deep_merge, error_keys, from_dict, has_key, key_lines, load_yaml,
                          parse_overrides, rekey)
from linlm.errors import ConfigError

DEFAULT_PROMPTS = ["ROMEO:", "To be, or not to be", "The king"]

# Field metadata: a key (or, on a section, every key below it) that may change when a run is resumed, because
# it does not change what the run computes. See is_resumable_change.
RESUMABLE = {"resumable": True}


@dataclass
class ModelSection:
    arch: str = "llama"
    # A size preset (see `linlm archs`); None builds ModelConfig defaults.
    preset: Optional[str] = None
    # Any ModelConfig field. vocab_size, when absent, is the tokenizer's rounded up to a multiple of 64.
    overrides: dict = field(default_factory=dict)


@dataclass
class DataSection:
    # A text source for linlm.data.prepare ("shakespeare", a file, a directory, a glob, "hf:NAME").
    source: str = "shakespeare"
    # "bpe:N" trains a byte-level BPE of N entries; a path loads a tokenizer.json.
    tokenizer: str = "bpe:4096"
    # A directory written by linlm.data.prepare; None prepares source+tokenizer into the linlm cache.
    dir: Optional[str] = field(default=None, metadata=RESUMABLE)
    seq_len: int = 256
    # Fraction of the source held out for validation when the data is prepared here.
    val_fraction: float = 0.01
    # Packed documents do not see each other: the model gets a reset at each document's first token.
    document_resets: bool = False


@dataclass
class OptimSection:
    lr: float = 3e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    # Applied to the matrices of linear layers only; norms, biases, embeddings and other parameters get none.
    weight_decay: float = 0.1
    # Max global gradient norm; 0 disables clipping (the norm is still measured and logged).
    grad_clip: float = 1.0


@dataclass
class ScheduleSection:
    kind: Literal["cosine", "constant", "wsd"] = "cosine"
    warmup_steps: int = 100
    # The learning rate at the end of cosine / WSD decay, as a fraction of optim.lr.
    min_lr_ratio: float = 0.1
    # WSD: the fraction of all steps spent in the final linear decay.
    decay_fraction: float = 0.2


@dataclass
class EvalSection:
    # Validation loss every this many steps (and at the last step); 0 disables it.
    every: int = field(default=100, metadata=RESUMABLE)
    # How many validation batches (of batch_size sequences) make the fixed validation set.
    batches: int = 4


@dataclass
class CheckpointSection:
    # A checkpoint every this many steps (and at the last step); 0 writes only the last one.
    every: int = field(default=100, metadata=RESUMABLE)
    # How many checkpoints to keep (the newest ones).
    keep: int = field(default=3, metadata=RESUMABLE)


@dataclass
class SamplesSection:
    # Prompts generated from at the end of the run (printed and saved to samples.txt).
    prompts: list[str] = field(default_factory=lambda: list(DEFAULT_PROMPTS))
    max_new_tokens: int = 64
    temperature: float = 0.8
    top_k: int = 40


@dataclass
class DistributedSection:
    # ddp replicates the model; fsdp shards parameters, gradients and optimizer state (FSDP2, fully_shard).
    strategy: Literal["ddp", "fsdp"] = "ddp"
    # "auto": nccl on CUDA, gloo on CPU.
    backend: Literal["auto", "gloo", "nccl"] = "auto"


@dataclass
class DebugSection:
    # Steps (1-based) whose loss is replaced by NaN: exercises the non-finite guard.
    nan_steps: list[int] = field(default_factory=list)


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    eval: EvalSection = field(default_factory=EvalSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    samples: SamplesSection = field(default_factory=SamplesSection, metadata=RESUMABLE)
    distributed: DistributedSection = field(default_factory=DistributedSection, metadata=RESUMABLE)
    debug: DebugSection = field(default_factory=DebugSection, metadata=RESUMABLE)
    out_dir: str = field(default="runs/default", metadata=RESUMABLE)
    # Optimizer steps.
    steps: int = field(default=1000, metadata=RESUMABLE)
    # Global batch: sequences per optimizer step, over all processes and accumulation micro-steps.
    batch_size: int = 16
    grad_accum: int = 1
    # bf16 runs the forward pass under torch.autocast(bfloat16) (CPU and CUDA); weights and optimizer stay fp32.
    # auto: bf16 where the device computes it natively (CUDA with bf16, a CPU with AVX-512 or AMX), else fp32;
    # resolved in each process (the log says which).
    precision: Literal["fp32", "bf16", "auto"] = "fp32"
    compile: bool = field(default=False, metadata=RESUMABLE)
    # Recompute each block's activations in the backward pass (torch.utils.checkpoint).
    activation_checkpointing: bool = field(default=False, metadata=RESUMABLE)
    # Consecutive non-finite steps (loss or gradient) after which the run stops.
    max_bad_steps: int = field(default=5, metadata=RESUMABLE)
    seed: int = 0
    # "auto" (cuda if available, else cpu), "cpu", "cuda" or "cuda:N".
    device: str = field(default="auto", metadata=RESUMABLE)
    # torch.use_deterministic_algorithms(True) (and the cuDNN / cuBLAS settings it needs).
    deterministic: bool = field(default=False, metadata=RESUMABLE)
    # torch.set_num_threads; 0 keeps torch's default.
    threads: int = field(default=0, metadata=RESUMABLE)
    # Peak FLOP/s per device for MFU; None measures a matmul once at start.
    peak_flops: Optional[float] = field(default=None, metadata=RESUMABLE)
    # A log line (and progress update) every this many steps.
    log_every: int = field(default=10, metadata=RESUMABLE)
    # A checkpoint (or run directory) whose weights start this run; optimizer, schedule and data start afresh.
    init_from: Optional[str] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainConfig":
        return from_dict(cls, data).validate()

    def micro_batch(self, world_size: int) -> int:
        """Sequences per process per micro-step."""
        return self.batch_size // (self.grad_accum * world_size)

    def validate(self) -> "TrainConfig":
        def need(ok: bool, key: str, msg: str, *related: str) -> None:
            if not ok:
                raise config_error(key, msg, related=related)

        need(self.steps > 0, "steps", f"must be a positive integer, got {self.steps}")
        need(self.batch_size > 0, "batch_size", f"must be a positive integer, got {self.batch_size}")
        need(self.grad_accum > 0, "grad_accum", f"must be a positive integer, got {self.grad_accum}")
        need(self.batch_size % self.grad_accum == 0, "batch_size",
             f"{self.batch_size} is not divisible by grad_accum={self.grad_accum}; the global batch is split into "
             "grad_accum equal micro-batches", "grad_accum")
        need(self.max_bad_steps > 0, "max_bad_steps", f"must be a positive integer, got {self.max_bad_steps}")
        need(self.log_every > 0, "log_every", f"must be a positive integer, got {self.log_every}")
        need(self.threads >= 0, "threads", f"must be >= 0 (0 keeps torch's default), got {self.threads}")
        need(self.peak_flops is None or self.peak_flops > 0, "peak_flops", "must be positive (FLOP/s) or null")
        need(bool(re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device)), "device",
             f"{self.device!r} is not one of 'auto', 'cpu', 'cuda', 'cuda:N'")
        need(bool(str(self.out_dir).strip()), "out_dir", "must not be empty")
        need(self.init_from is None or bool(self.init_from.strip()), "init_from",
             "must be a checkpoint path or null")
        # data
        need(self.data.seq_len > 0, "data.seq_len", f"must be a positive integer, got {self.data.seq_len}")
        need(0.0 <= self.data.val_fraction < 1.0, "data.val_fraction",
             f"must be in [0, 1), got {self.data.val_fraction}")
        need(bool(self.data.source) or self.data.dir is not None, "data.source", "give a source or data.dir",
             "data.dir")
        # optim
        o = self.optim
        need(o.lr > 0, "optim.lr", f"must be positive, got {o.lr}")
        need(len(o.betas) == 2 and all(0.0 <= b < 1.0 for b in o.betas), "optim.betas",
             f"must be two numbers in [0, 1), got {o.betas}")
        need(o.eps > 0, "optim.eps", f"must be positive, got {o.eps}")
        need(o.weight_decay >= 0, "optim.weight_decay", f"must be >= 0, got {o.weight_decay}")
        need(o.grad_clip >= 0, "optim.grad_clip", f"must be >= 0 (0 disables clipping), got {o.grad_clip}")
        # schedule
        s = self.schedule
        need(s.warmup_steps >= 0, "schedule.warmup_steps", f"must be >= 0, got {s.warmup_steps}")
        need(0.0 <= s.min_lr_ratio <= 1.0, "schedule.min_lr_ratio", f"must be in [0, 1], got {s.min_lr_ratio}")
        need(0.0 < s.decay_fraction <= 1.0, "schedule.decay_fraction", f"must be in (0, 1], got {s.decay_fraction}")
        # eval / checkpoint / samples
        need(self.eval.every >= 0, "eval.every", f"must be >= 0 (0 disables evaluation), got {self.eval.every}")
        need(self.eval.batches > 0, "eval.batches", f"must be a positive integer, got {self.eval.batches}")
        need(self.checkpoint.every >= 0, "checkpoint.every", f"must be >= 0, got {self.checkpoint.every}")
        need(self.checkpoint.keep > 0, "checkpoint.keep", f"must be a positive integer, got {self.checkpoint.keep}")
        need(self.samples.max_new_tokens >= 0, "samples.max_new_tokens", "must be >= 0")
        need(self.samples.temperature >= 0, "samples.temperature", "must be >= 0 (0 is greedy)")
        need(self.samples.top_k >= 0, "samples.top_k", "must be >= 0 (0 keeps every token)")
        need(all(n > 0 for n in self.debug.nan_steps), "debug.nan_steps", "steps are numbered from 1")
        self.model_config(vocab_size=self.model.overrides.get("vocab_size", 256))
        return self

    def model_config(self, vocab_size: Optional[int] = None):
        """The ModelConfig this run trains; ``vocab_size`` fills in a missing model.overrides.vocab_size."""
        from linlm.models.registry import get_arch

        cfg = model_config_of(self.model, vocab_size)
        if get_arch(cfg.arch).position_limit and self.data.seq_len > cfg.max_seq_len:
            raise config_error("data.seq_len", f"{self.data.seq_len} is longer than the model's max_seq_len="
                               f"{cfg.max_seq_len} ({cfg.arch}); lower data.seq_len or set "
                               f"model.overrides.max_seq_len={self.data.seq_len}",
                               related=["model.overrides.max_seq_len", "model.preset"])
        return cfg

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def model_config_of(section: ModelSection, vocab_size: Optional[int] = None):
    """The ModelConfig of a ``model:`` section; errors name ``model.arch``, ``model.preset`` or
    ``model.overrides.FIELD``. ``vocab_size`` fills in a missing ``overrides.vocab_size``."""
    from linlm.models.presets import preset_config

    over = dict(section.overrides)
    if "vocab_size" not in over and vocab_size is not None:
        over["vocab_size"] = vocab_size
    try:
        return preset_config(section.arch, section.preset, **over)
    except ConfigError as e:
        key = getattr(e, "key", None)
        raise rekey(e, "model." if key in ("arch", "preset") else "model.overrides.") from None


def is_resumable_change(key: str) -> bool:
    """Whether the dotted config key ``key`` may differ when a run is resumed: the field (or a section above it)
    carries ``RESUMABLE`` metadata. Unknown keys, and every key under model.overrides, may not."""
    cls: Any = TrainConfig
    parts = re.sub(r"\[\d+\]", "", key).split(".")
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(cls):
            return False
        found = {f.name: f for f in dataclasses.fields(cls)}.get(part)
        if found is None:
            return False
        cls = typing.get_type_hints(cls).get(part)
        if found.metadata.get("resumable"):
            return i == len(parts) - 1 or dataclasses.is_dataclass(cls)  # a section marks every key below it
    return False


# ---- building a config from files and overrides ------------------------------------------------------------


def yaml_line(path: str | Path, dotted: str) -> Optional[int]:
    """The 1-based line of ``dotted`` (``optim.lr``) in a YAML file, or None."""
    return key_lines(path).get(dotted)


def _closest_line(lines: dict, dotted: str) -> Optional[int]:
    """The line of ``dotted`` or of its nearest parent in the file (``a.b[2].c`` -> ``a.b[2]`` -> ``a.b``)."""
    while dotted:
        if dotted in lines:
            return lines[dotted]
        cut = max(dotted.rfind("."), dotted.rfind("["))
        dotted = dotted[:cut] if cut > 0 else ""
    return None


def locate(err: ConfigError, path: Optional[str | Path], from_file: Mapping, overrides: Mapping) -> ConfigError:
    """``err`` with where its keys were set: the first key the user set (its own key first, then the keys of a
    cross-field rule) gives the ``file:line:`` prefix or the ``(set on the command line)`` suffix; every other
    key the user set follows in brackets, so a rule between two keys points at both."""
    keys = error_keys(err)
    if not keys:
        return err
    lines = key_lines(path) if path is not None and from_file else {}

    def origin(key: str) -> Optional[str]:
        if has_key(overrides, key):
            return "set on the command line"
        if path is not None and has_key(from_file, key):
            line = _closest_line(lines, key)
            return f"{path}:{line}" if line else str(path)
        return None

    found = [(k, origin(k)) for k in keys]
    found = [(k, o) for k, o in found if o is not None]
    if not found:
        return err
    where = found[0][1]
    text = f"{err} (set on the command line)" if where == "set on the command line" else f"{where}: {err}"
    others = found[1:] if found[0][0] == keys[0] else found
    if others:
        text += " [" + "; ".join(f"{k} {'set on the command line' if o == 'set on the command line' else 'at ' + o}"
                                 for k, o in others) + "]"
    out = ConfigError(text)
    out.key, out.detail, out.related = err.key, err.detail, err.related  # type: ignore[attr-defined]
    return out


def _misplaced_model_keys(tree: Mapping) -> None:
    """The other commands' old spelling ``vocab_size=`` for ``model.overrides.vocab_size=``: name the new one."""
    from linlm.models.config import model_keys

    model_fields = model_keys()
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for key, value in tree.items():
        if key in model_fields and key not in train_fields:
            hint = "model.arch" if key == "arch" else f"model.overrides.{key}"
            raise config_error(key, f"unknown key {key!r}; model fields are set as {hint}={_yaml_text(value)} in every "
                                    "linlm command (see docs/training.md, \"Overrides\")")


def _yaml_text(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip().removesuffix("\n...").strip()


def build_config(path: Optional[str | Path] = None, overrides: Optional[Mapping] = None,
                 base: Optional[Mapping] = None) -> TrainConfig:
    """Defaults, then ``base`` (a saved run's config), then the YAML file at ``path``, then ``overrides``."""
    from_file = load_yaml(path) if path is not None else {}
    overrides = dict(overrides or {})
    merged = deep_merge(deep_merge(dict(base or {}), from_file), overrides)
    try:
        _misplaced_model_keys(merged)
        return TrainConfig.from_dict(merged)
    except ConfigError as e:
        raise locate(e, path, from_file, overrides) from None


def build_model_config(arch: str = "llama", preset: Optional[str] = None, overrides: Optional[Mapping] = None):
    """The ModelConfig of ``--arch``/``--preset`` and command-line overrides in the dialect of ``linlm train``
    (``model.arch``, ``model.preset``, ``model.overrides.FIELD``), for commands that build only a model."""
    overrides = dict(overrides or {})
    try:
        _misplaced_model_keys(overrides)
        other = sorted(set(overrides) - {"model"})
        if other:
            raise config_error(other[0], "this command builds only a model: give model.arch, model.preset or "
                                         "model.overrides.FIELD")
        tree = deep_merge({"arch": arch, "preset": preset}, overrides.get("model") or {})
        return model_config_of(from_dict(ModelSection, tree, prefix="model."))
    except ConfigError as e:
        raise locate(e, None, {}, overrides) from None


def load_train_config(path: Optional[str | Path] = None, overrides: Optional[list[str]] = None) -> TrainConfig:
    """``load_train_config("configs/demo.yaml", ["optim.lr=1e-3", "steps=200"])``."""
    return build_config(path, parse_overrides(overrides))


def preset_path(name: str) -> Optional[Path]:
    """configs/NAME.yaml in the source tree (for ``--config demo``), or None."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        return None
    here = Path(__file__).resolve()
    for root in (here.parents[3] / "configs", here.parents[1] / "configs"):
        candidate = root / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    return None


def config_diff(a: Mapping, b: Mapping, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dicts."""
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, Mapping) and isinstance(vb, Mapping) and key != "overrides":
            out += config_diff(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append(f"{prefix}{key}")
    return out
