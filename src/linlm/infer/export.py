"""On-device export: the prefill and the one-token step as graphs with the decoding state as explicit tensors.

``prefill(input_ids [B, T]) -> (logits [B, V], *state)`` and
``step(token_ids [B], position [] int64, *state) -> (logits [B, V], *state')``: the state is linlm's
:class:`~linlm.layers.state.ModelState` flattened into its tensors in a fixed order (``state_names`` gives one
name per tensor, e.g. ``layers.0.ssm``), and ``position`` is the number of tokens already in the state (RoPE's and
LRPE's offset; the models without positions ignore it). T is dynamic in the prefill; so is LLaMA's cache length in
the step.

Architectures: all but MossNet (its routed experts have data-dependent shapes). The prefill is exported for the
prompt length it was traced with (``prefill_len``; feed longer prompts in pieces through the step, or export
again); the step's shapes are fixed except LLaMA's growing cache.

Formats: ``pt2`` (``torch.export``; load with ``torch.export.load``). The two programs are written beside each
other as ``OUT.prefill.pt2`` and ``OUT.step.pt2``, with ``OUT.json`` describing inputs and outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from torch.utils import _pytree as pytree

from linlm.errors import ConfigError
from linlm.layers.state import ModelState

FORMATS = ("pt2",)


def _names(tree, prefix="") -> list[str]:
    if isinstance(tree, torch.Tensor):
        return [prefix.rstrip(".")]
    if isinstance(tree, dict):
        return [n for k, v in tree.items() for n in _names(v, f"{prefix}{k}.")]
    if isinstance(tree, (list, tuple)):
        return [n for i, v in enumerate(tree) for n in _names(v, f"{prefix}{i}.")]
    return []


class _Prefill(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        out = self.model(input_ids, return_state=True, logits_to_keep=1)
        return (out.logits[:, -1], *pytree.tree_leaves({"layers": out.state.layers, "extra": out.state.extra}))


class _Step(nn.Module):
    def __init__(self, model, spec, signature):
        super().__init__()
        self.model, self.spec, self.signature = model, spec, signature

    def forward(self, token_ids, position, *state):
        tree = pytree.tree_unflatten(list(state), self.spec)
        st = ModelState(tree["layers"], position, tree["extra"], self.signature)
        out = self.model(token_ids.view(-1, 1), state=st, return_state=True)
        return (out.logits[:, -1], *pytree.tree_leaves({"layers": out.state.layers, "extra": out.state.extra}))


def export_programs(model, batch: int = 1, prefill_len: int = 16):
    """(prefill ExportedProgram, step ExportedProgram, state names) for ``model`` (kept in eval mode)."""
    if model.config.arch == "mossnet":
        raise ConfigError("export: MossNet's routed experts gather a data-dependent number of tokens per expert, "
                          "which torch.export cannot trace yet; export another architecture")
    model = model.eval()
    ids = torch.randint(0, model.config.vocab_size, (batch, prefill_len), device=model.device)
    with torch.no_grad():
        _, state = model.prefill(ids)
    tree = {"layers": state.layers, "extra": state.extra}
    leaves, spec = pytree.tree_flatten(tree)
    names = _names(tree)
    prefill = torch.export.export(_Prefill(model), (ids,), strict=False)
    growing = not model.spec.constant_state
    S = torch.export.Dim("S", min=2, max=model.config.max_seq_len - 1)
    state_shapes = [{2: S} if growing else None for _ in leaves]
    token = ids[:, -1]
    position = torch.tensor(prefill_len, dtype=torch.int64)
    step = torch.export.export(_Step(model, spec, model.state_signature()), (token, position, *leaves),
                               dynamic_shapes=(None, None, tuple(state_shapes)) if growing else None, strict=False)
    return prefill, step, names


def export(model, out: str | Path, fmt: str = "pt2", batch: int = 1, prefill_len: int = 16,
           overwrite: bool = False) -> list[Path]:
    """Write the prefill and step programs of ``model`` beside ``out`` (see the module docstring).

    Existing files are refused unless ``overwrite``; each file is written to a temporary name, then renamed."""
    import os

    if fmt not in FORMATS:
        raise ConfigError(f"format: {fmt!r} is not supported; valid choices are {', '.join(map(repr, FORMATS))}")
    if batch < 1 or prefill_len < 1:
        raise ConfigError(f"batch ({batch}) and prefill_len ({prefill_len}) must be >= 1")
    if model.spec.position_limit and prefill_len >= model.config.max_seq_len:
        raise ConfigError(f"prefill_len: {prefill_len} leaves no room to decode within max_seq_len="
                          f"{model.config.max_seq_len}")
    out = Path(out)
    stem = out.with_suffix("") if out.suffix in (".pt2", ".json") else out
    paths = [stem.with_name(stem.name + ".prefill.pt2"), stem.with_name(stem.name + ".step.pt2"),
             stem.with_name(stem.name + ".json")]
    existing = [str(p) for p in paths if p.exists()]
    if existing and not overwrite:
        raise ConfigError(f"export: {', '.join(existing)} already exist; choose another --out or pass --overwrite")
    prefill, step, names = export_programs(model, batch=batch, prefill_len=prefill_len)
    meta = {
        "format": "linlm-export", "arch": model.config.arch, "config": model.config.to_dict(), "batch": batch,
        "prefill": {"inputs": {"input_ids": [batch, prefill_len]}, "outputs": ["logits", *names]},
        "step": {"inputs": ["token_ids", "position", *names], "outputs": ["logits", *names]},
    }
    stem.parent.mkdir(parents=True, exist_ok=True)
    for path, write in ((paths[0], lambda p: torch.export.save(prefill, p)),
                        (paths[1], lambda p: torch.export.save(step, p)),
                        (paths[2], lambda p: Path(p).write_text(json.dumps(meta, indent=1) + "\n"))):
        tmp = path.with_name(path.name + ".tmp")
        try:
            write(tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return paths
