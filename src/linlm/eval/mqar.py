"""MQAR, multi-query associative recall (Arora et al., Zoology, 2023): a synthetic test of how much a token mixer can
store in its state and retrieve on demand.

A sequence holds ``num_kv`` key-value pairs, then ``num_queries`` of those keys again, each followed by its value::

    k1 v1 k2 v2 ... kN vN | q1 a1 q2 a2 ... qM aM          (a_j is the value paired with key q_j)

Keys are drawn without replacement from ids 1..K and values from K+1..V-1 (K = (V - 1) // 2; id 0 is never used),
uniformly and independently per sequence, so nothing can be memorised across sequences: the model must recall a_j
from the context. Only the answers are targets (``targets[t] = a_j`` at the position t of q_j, -100 elsewhere);
accuracy is the fraction of answers that are the argmax of the model's prediction (and the fraction of sequences
with every answer right).

A state of constant size holds only so many pairs: that is the point. The experiment (:func:`run_experiment`,
``linlm mqar``) trains small models of every architecture on the same stream and reports accuracy against the width
and the decoding state's size (floats per sequence, ``ModelState.nbytes``), e.g. MossNet with E SSM experts against
a Mamba of equal active size, the direct test of MossNet's multi-head argument.

Batches are a pure function of (seed, split, step, rank): :class:`MQARStream` resumes exactly from
``state_dict()``, and :func:`mqar_data` plugs it into the Trainer (``Trainer(cfg, data=mqar_data(mcfg))``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from linlm.errors import ConfigError, DataError

IGNORE = -100


@dataclass(frozen=True)
class MQARConfig:
    vocab_size: int = 128
    num_kv: int = 8
    num_queries: int = 0  # 0: every key is queried once (num_queries = num_kv)

    @property
    def queries(self) -> int:
        return self.num_queries or self.num_kv

    @property
    def num_keys(self) -> int:
        return (self.vocab_size - 1) // 2

    @property
    def seq_len(self) -> int:
        return 2 * (self.num_kv + self.queries)

    def validate(self) -> "MQARConfig":
        if self.num_kv < 1:
            raise ConfigError(f"mqar num_kv: must be >= 1, got {self.num_kv}")
        if self.num_keys < self.num_kv:
            raise ConfigError(f"mqar vocab_size: {self.vocab_size} gives {self.num_keys} distinct keys, fewer than "
                              f"num_kv={self.num_kv}; use vocab_size >= {2 * self.num_kv + 1}")
        if not 0 <= self.num_queries <= self.num_kv:
            raise ConfigError(f"mqar num_queries: must be in 0..num_kv={self.num_kv}, got {self.num_queries}")
        return self

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps({"mqar": asdict(self)}, sort_keys=True).encode()).hexdigest()[:16]


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & ((1 << 63) - 1)


def mqar_batch(cfg: MQARConfig, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """ids, targets: LongTensor [batch, cfg.seq_len] (see the module doc)."""
    n, m, K = cfg.num_kv, cfg.queries, cfg.num_keys
    keys = torch.rand(batch, K, generator=generator).argsort(-1)[:, :n] + 1
    values = torch.randint(K + 1, cfg.vocab_size, (batch, n), generator=generator)
    pick = torch.rand(batch, n, generator=generator).argsort(-1)[:, :m]
    q_keys, q_values = keys.gather(1, pick), values.gather(1, pick)
    ids = torch.cat([torch.stack([keys, values], -1).flatten(1), torch.stack([q_keys, q_values], -1).flatten(1)], 1)
    targets = torch.full_like(ids, IGNORE)
    targets[:, 2 * n::2] = q_values
    return ids, targets


def mqar_batches(cfg: MQARConfig, n_batches: int, batch: int, seed: int, split: str) -> list:
    """A fixed list of batches (validation or test sets), one generator per batch."""
    out = []
    for i in range(n_batches):
        g = torch.Generator().manual_seed(_seed(seed, split, cfg.fingerprint(), i))
        out.append(mqar_batch(cfg, batch, g))
    return out


class MQARStream:
    """An endless, resumable stream of training batches: batch ``step`` of process ``rank`` depends only on
    (seed, step, rank); ``state_dict()``/``load_state_dict()`` carry the position."""

    def __init__(self, cfg: MQARConfig, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1):
        self.cfg = cfg.validate()
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.step = 0

    def __iter__(self) -> "MQARStream":
        return self

    def batch(self, step: int):
        g = torch.Generator().manual_seed(_seed(self.seed, "train", self.cfg.fingerprint(), step, self.rank))
        return mqar_batch(self.cfg, self.batch_size, g)

    def __next__(self):
        out = self.batch(self.step)
        self.step += 1
        return out

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.seed, "fingerprint": self.cfg.fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("fingerprint") != self.cfg.fingerprint() or state.get("seed") != self.seed:
            raise DataError("MQAR stream: the saved position belongs to another MQAR config or seed; resume with "
                            "the config the run started with")
        self.step = int(state["step"])


def mqar_data(cfg: MQARConfig, *, val_batches: int = 2, val_batch_size: int = 64, seed: int = 0):
    """The Trainer's ``data=`` factory: ``Trainer(train_cfg, data=mqar_data(MQARConfig(...)))``.

    The model's vocab_size comes from ``cfg.vocab_size``; train_cfg.data.seq_len is not used (sequences are
    ``cfg.seq_len`` long)."""
    cfg = cfg.validate()

    def factory(train_cfg, rank: int, world_size: int):
        from linlm.train import TrainData

        stream = MQARStream(cfg, train_cfg.micro_batch(world_size), seed=_seed(train_cfg.seed, seed) % (1 << 31),
                            rank=rank, world_size=world_size)
        return TrainData(train=stream, val=mqar_batches(cfg, val_batches, val_batch_size, seed, "val"),
                         vocab_size=cfg.vocab_size, tokenizer=None, directory=None,
                         fingerprint="mqar-" + cfg.fingerprint() + f"-seed{seed}")

    return factory


@torch.no_grad()
def mqar_accuracy(model, batches) -> dict:
    """Per-answer and per-sequence accuracy of greedy predictions on ``batches`` of (ids, targets)."""
    was_training = model.training
    model.eval()
    right = total = seq_right = seqs = 0
    try:
        for ids, targets in batches:
            ids, targets = ids.to(model.device), targets.to(model.device)
            pred = model(ids).argmax(-1)
            mask = targets != IGNORE
            ok = (pred == targets) & mask
            right += int(ok.sum())
            total += int(mask.sum())
            seq_right += int((ok.sum(1) == mask.sum(1)).sum())
            seqs += ids.shape[0]
    finally:
        model.train(was_training)
    return {"accuracy": right / max(total, 1), "sequence_accuracy": seq_right / max(seqs, 1), "answers": total}


def state_floats(model, seq_len: int) -> int:
    """Numbers held by the decoding state of one sequence after ``seq_len`` tokens (LLaMA: its KV cache)."""
    ids = torch.ones(1, seq_len, dtype=torch.long, device=model.device)
    with torch.no_grad():
        state = model(ids, return_state=True).state
    return sum(t.numel() for t in _state_tensors(state))


def _state_tensors(state):
    from linlm.layers.state import _tensors

    return list(_tensors([state.layers, state.extra]))


# ---- the experiment ----------------------------------------------------------------------------------------------

@dataclass
class MQARRun:
    """One model of the experiment: an architecture, a width, and model config overrides."""

    arch: str
    d_model: int
    label: str = ""
    overrides: Optional[dict] = None

    def name(self) -> str:
        return self.label or f"{self.arch}-d{self.d_model}"


def default_runs(widths=(32, 64), experts: int = 4, archs=("llama", "tnl", "hgrn2", "cosformer2", "mamba")
                 ) -> list[MQARRun]:
    """Every architecture at each width, plus the MossNet pair: ``experts`` SSM experts with k = 1 and one dense MLP
    expert, against the same model with a single SSM expert (a Mamba block plus that MLP: a single-head SSM of the
    same active size, the router aside)."""
    runs = []
    for d in widths:
        runs.extend(MQARRun(arch, d) for arch in archs)
        for e in (1, experts):
            runs.append(MQARRun("mossnet", d, f"mossnet-E{e}-d{d}",
                                {"ssm_experts": e, "ssm_top_k": 1, "mlp_experts": 1, "mlp_top_k": 1}))
    return runs


def run_experiment(runs: list[MQARRun], cfg: MQARConfig, out_dir, *, steps: int = 300, batch_size: int = 32,
                   lr: float = 3e-3, n_layers: int = 2, head_dim: int = 16, seed: int = 0, test_sequences: int = 512,
                   threads: int = 0, overwrite: bool = False, hooks_factory=None) -> list[dict]:
    """Train each run on MQAR with the Trainer (out_dir/NAME) and measure its test accuracy."""
    from pathlib import Path

    from linlm import load
    from linlm.models.counting import count
    from linlm.models.presets import preset_config
    from linlm.train import Trainer, build_config

    cfg = cfg.validate()
    out_dir = Path(out_dir)
    test = mqar_batches(cfg, max(1, test_sequences // 64), 64, seed, "test")
    rows = []
    for run in runs:
        model_over = {"d_model": run.d_model, "n_layers": n_layers, "n_heads": max(1, run.d_model // head_dim),
                      "glu_dim": 2 * run.d_model, "max_seq_len": max(64, cfg.seq_len), "chunk_size": 16,
                      "vocab_size": cfg.vocab_size, **(run.overrides or {})}
        train_cfg = build_config(None, {
            "model": {"arch": run.arch, "preset": None, "overrides": model_over},
            "out_dir": str(out_dir / run.name()), "steps": steps, "batch_size": batch_size, "seed": seed,
            "optim": {"lr": lr, "weight_decay": 0.1}, "schedule": {"kind": "cosine", "warmup_steps": min(50, steps // 10)},
            "eval": {"every": steps, "batches": 2}, "checkpoint": {"every": steps, "keep": 1},
            "data": {"seq_len": cfg.seq_len}, "samples": {"prompts": []}, "log_every": max(1, steps // 5),
            "threads": threads,
        })
        hooks = hooks_factory(run) if hooks_factory else None
        result = Trainer(train_cfg, overwrite=overwrite, hooks=hooks, verbose=False, live=False,
                         data=mqar_data(cfg, seed=seed)).run()
        model = load(result.checkpoint)
        acc = mqar_accuracy(model, test)
        counts = count(preset_config(run.arch, None, **model_over), batch=1, seq_len=cfg.seq_len)
        rows.append({"name": run.name(), "arch": run.arch, "d_model": run.d_model, "n_layers": n_layers,
                     "params": counts["non_embedding_params"], "active_params": counts["active_non_embedding_params"],
                     "state_floats": state_floats(model, cfg.seq_len), "steps": steps, "final_loss": result.loss,
                     "seconds": result.seconds, **acc})
    return rows


def plot_experiment(rows: list[dict], path) -> None:
    """Accuracy against state size (left) and against width (right), one line per architecture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    labels = sorted({r["name"].rsplit("-d", 1)[0] for r in rows})
    for label in labels:
        pts = sorted((r for r in rows if r["name"].rsplit("-d", 1)[0] == label), key=lambda r: r["d_model"])
        axes[0].plot([r["state_floats"] for r in pts], [r["accuracy"] for r in pts], "o-", label=label)
        axes[1].plot([r["d_model"] for r in pts], [r["accuracy"] for r in pts], "o-", label=label)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("decoding state (floats per sequence)")
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("model width d")
    for ax in axes:
        ax.set_ylabel("MQAR accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
