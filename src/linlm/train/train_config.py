"""The training config's schema: a tree of dataclasses, and the rules between their keys.

:class:`TrainConfig` and its sections hold every key with its default; :meth:`TrainConfig.from_dict` checks the
types (pydantic, see :mod:`linlm.schema`) and :meth:`TrainConfig.validate` the rules between keys, raising
:class:`~linlm.errors.ConfigError` naming the key. Reading YAML files and dotted ``key=value`` overrides, and
saying where a failing key was set, is :mod:`linlm.train.config_sources`.

Which keys may change when a run is resumed is recorded on the fields themselves (``RESUMABLE``, field
metadata ``{"resumable": True}``); :func:`is_resumable_change` reads it.

See docs/training.md for every key.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional

import yaml

from linlm.cli_ranges import RANGES
from linlm.schema import config_error, from_dict, rekey
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
    # Also write and keep, for evaluation along training, the checkpoint at every multiple of this many training
    # tokens (0: none) and at this many log-spaced steps from 1 to the last (0: none); see checkpoint.kept_steps.
    keep_every_tokens: int = field(default=0, metadata=RESUMABLE)
    keep_log: int = field(default=0, metadata=RESUMABLE)


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
        # The keys that have a flag of `linlm train` take the flag's range (linlm.cli_ranges), however they are set.
        for key, value, name in (("steps", self.steps, "steps"), ("batch_size", self.batch_size, "batch"),
                                 ("grad_accum", self.grad_accum, "micro_batches"), ("seed", self.seed, "seed"),
                                 ("data.seq_len", self.data.seq_len, "tokens"), ("optim.lr", self.optim.lr, "lr")):
            need(RANGES[name].check(value) is None, key, f"must be {RANGES[name].describe()}, got {value}")
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
        for name in ("keep_every_tokens", "keep_log"):
            value = getattr(self.checkpoint, name)
            need(value >= 0, f"checkpoint.{name}", f"must be >= 0 (0 keeps none), got {value}")
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
