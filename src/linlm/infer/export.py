"""On-device export: the prefill and the one-token step as graphs with the decoding state as explicit tensors.

``prefill(input_ids [B, T]) -> (logits [B, V], *state)`` and
``step(token_ids [B], position [] int64, *state) -> (logits [B, V], *state')``: the state is linlm's
:class:`~linlm.layers.state.ModelState` flattened into its tensors in a fixed order (``state_names`` gives one
name per tensor, e.g. ``layers.0.ssm``), and ``position`` is the number of tokens already in the state (RoPE's and
LRPE's offset; the models without positions ignore it). LLaMA's cache length is dynamic in the step.

Every architecture exports. MossNet's routing takes a static-shape form while torch.export traces (the routed
experts' subsequences are padded to the prompt length, the MoE MLP gathers each token's k experts' weights), with
the same result. The prefill is exported for the prompt length it was traced with (``prefill_len``; feed longer
prompts in pieces through the step, or export again); the step's shapes are fixed except LLaMA's growing cache.

Formats, each writing the two programs beside each other with ``OUT.json`` describing inputs and outputs:
- ``pt2`` (``torch.export``): ``OUT.prefill.pt2``, ``OUT.step.pt2``; load with ``torch.export.load``.
- ``onnx`` (``torch.onnx.export``, the dynamo exporter, opset 18; needs the ``export`` extra: onnx, onnxscript, and
  onnxruntime to run them): ``OUT.prefill.onnx``, ``OUT.step.onnx``, each one self-contained file. ONNX names are
  unique, so the state inputs are ``past.NAME`` and the state outputs ``present.NAME``.

:func:`check` runs the written files (onnxruntime for ONNX) against the eager model and reports the largest
differences of logits and state over several steps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from torch import nn
from torch.utils import _pytree as pytree

from linlm.errors import ConfigError, OutputError
from linlm.layers.state import ModelState

FORMATS = ("pt2", "onnx")
ONNX_OPSET = 18
# One ONNX file holds at most 2 GiB (protobuf); the export refuses models whose weights come near it.
ONNX_MAX_BYTES = 2**31 - 2**26


def _names(tree, prefix="") -> list[str]:
    if isinstance(tree, torch.Tensor):
        return [prefix.rstrip(".")]
    if isinstance(tree, dict):
        return [n for k, v in tree.items() for n in _names(v, f"{prefix}{k}.")]
    if isinstance(tree, (list, tuple)):
        return [n for i, v in enumerate(tree) for n in _names(v, f"{prefix}{i}.")]
    return []


def _grows(model, name: str) -> bool:
    """Whether the state leaf ``name`` ("layers.3.0") grows with the context: every leaf of an architecture whose
    state grows (a KV cache), and a hybrid's caches of full attention (a windowed cache holds window - 1 positions
    once the prefill is that long, which export requires)."""
    if not model.spec.constant_state:
        return True
    parts = name.split(".")
    cfg = model.config
    return (parts[0] == "layers" and int(parts[1]) in cfg.attention_layers and cfg.attn_window is None)


class _Prefill(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        out = self.model(input_ids, return_state=True, logits_to_keep=1)
        return (out.logits[:, -1], *flat_state(out.state))


class _Step(nn.Module):
    def __init__(self, model, spec, signature):
        super().__init__()
        self.model, self.spec, self.signature = model, spec, signature

    def forward(self, token_ids, position, *state):
        tree = pytree.tree_unflatten(list(state), self.spec)
        st = ModelState(tree["layers"], position, tree["extra"], self.signature)
        out = self.model(token_ids.view(-1, 1), state=st, return_state=True)
        return (out.logits[:, -1], *flat_state(out.state))


def export_programs(model, batch: int = 1, prefill_len: int = 16):
    """(prefill ExportedProgram, step ExportedProgram, state names) for ``model`` (kept in eval mode)."""
    model = model.eval()
    ids = torch.randint(0, model.config.vocab_size, (batch, prefill_len), device=model.device)
    with torch.no_grad():
        _, state = model.prefill(ids)
    tree = {"layers": state.layers, "extra": state.extra}
    leaves, spec = pytree.tree_flatten(tree)
    names = _names(tree)
    prefill = torch.export.export(_Prefill(model), (ids,), strict=False)
    S = torch.export.Dim("S", min=2, max=model.config.max_seq_len - 1)
    state_shapes = [{2: S} if _grows(model, name) else None for name in names]
    growing = any(shape is not None for shape in state_shapes)
    token = ids[:, -1]
    position = torch.tensor(prefill_len, dtype=torch.int64)
    step = torch.export.export(_Step(model, spec, model.state_signature()), (token, position, *leaves),
                               dynamic_shapes=(None, None, tuple(state_shapes)) if growing else None, strict=False)
    return prefill, step, names


def _require_onnx(run: bool = False) -> None:
    import importlib.util

    need = ["onnx", "onnxscript"] + (["onnxruntime"] if run else [])
    missing = [m for m in need if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"format 'onnx': {', '.join(missing)} not installed; pip install 'linlm[export]'")


def paths_for(out: str | Path, fmt: str) -> list[Path]:
    """[prefill file, step file, json] that ``export(model, out, fmt)`` writes: ``out`` is a file stem (a
    trailing .pt2, .onnx or .json is dropped)."""
    out = Path(out).expanduser()
    stem = out.with_suffix("") if out.suffix in (".pt2", ".onnx", ".json") else out
    return [stem.with_name(f"{stem.name}.prefill.{fmt}"), stem.with_name(f"{stem.name}.step.{fmt}"),
            stem.with_name(stem.name + ".json")]


def check_outputs(out: str | Path, fmt: str, overwrite: bool = False, what: Optional[str] = None) -> list[Path]:
    """:func:`paths_for`, each checked before any work (nothing is written here):

    - ``out`` names a file stem, so an existing directory there, or a name ending in ``/``, is refused (a name
      inside it is what was meant);
    - each file must be free or one linlm wrote and nobody changed (:func:`linlm.outputs.check_file`: a user's
      file, a path under a file or an unwritable place is refused in one line);
    - files linlm wrote are replaced only with ``overwrite``.
    ``what`` names the flag in a refusal, e.g. ``--out``."""
    from linlm import outputs

    named = f"{what} {out}" if what else str(out)
    if Path(out).expanduser().is_dir() or str(out).endswith("/"):
        stem = Path(out) / "model"
        raise OutputError(f"{named}: names a directory, and the export's output is a file stem; give a name inside it, "
                          f"e.g. {stem} (writes {stem}.prefill.{fmt}, {stem}.step.{fmt} and {stem}.json)")
    paths = paths_for(out, fmt)
    for path in paths:
        outputs.check_file(path, what)
    existing = [str(p) for p in paths if p.exists()]
    if existing and not overwrite:
        raise OutputError(f"{named}: {', '.join(existing)} already exist (written by linlm); pass --overwrite to "
                          "replace them, or choose another stem (nothing was written)")
    return paths


def io_names(names: list[str], fmt: str) -> tuple[list[str], list[str], list[str]]:
    """(prefill outputs, step inputs, step outputs) as the files name them."""
    past = [f"past.{n}" for n in names] if fmt == "onnx" else names
    present = [f"present.{n}" for n in names] if fmt == "onnx" else names
    return ["logits", *present], ["token_ids", "position", *past], ["logits", *present]


def _write_onnx(program, path: Path, input_names: list[str], output_names: list[str]) -> None:
    import logging
    import warnings

    # The exporter logs a line per optional op library it lacks (torchvision) and warns about its own internals.
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(program, f=str(path), input_names=input_names, output_names=output_names,
                              opset_version=ONNX_OPSET, dynamo=True, external_data=False, verbose=False)
    finally:
        quiet.setLevel(level)


def _write_pt2(program, path: Path) -> None:
    """torch.export.save into an open file: given a path, it warns unless the name ends in .pt2, and linlm's
    temporary name (beside the target, renamed into place once written) does not."""
    with open(path, "wb") as f:
        torch.export.save(program, f)


def export(model, out: str | Path, fmt: str = "pt2", batch: int = 1, prefill_len: int = 16,
           overwrite: bool = False, what: Optional[str] = None) -> list[Path]:
    """Write the prefill and step programs of ``model`` and their description: ``OUT.prefill.FMT``,
    ``OUT.step.FMT``, ``OUT.json`` for the file stem ``out`` (see the module docstring).

    Every output is checked before tracing (:func:`check_outputs`): linlm's own earlier files are replaced only
    with ``overwrite``, a user's file never. Each file is written through linlm.outputs (a temporary file beside
    it, fsynced, renamed into place, recorded as linlm's)."""
    from linlm import outputs

    if fmt not in FORMATS:
        raise ConfigError(f"format: {fmt!r} is not supported; valid choices are {', '.join(map(repr, FORMATS))}")
    if batch < 1 or prefill_len < 1:
        raise ConfigError(f"batch ({batch}) and prefill_len ({prefill_len}) must be >= 1")
    if model.spec.position_limit and prefill_len >= model.config.max_seq_len:
        raise ConfigError(f"prefill_len: {prefill_len} leaves no room to decode within max_seq_len="
                          f"{model.config.max_seq_len}")
    from linlm.models.memory import inference_floor
    from linlm.resources import check_memory

    check_memory(inference_floor(model.config, batch, prefill_len, next(model.parameters()).dtype.itemsize),
                 f"prefill_len {prefill_len} x batch {batch}: tracing a prefill of {batch * prefill_len:,} tokens",
                 "give a shorter --prefill-len or a smaller --batch-size", model.device)
    window = model.config.attn_window
    if window is not None and prefill_len < window - 1:
        raise ConfigError(f"prefill_len: {prefill_len} is shorter than the attention window's cache (attn_window - 1 "
                          f"= {window - 1} positions); export with a prefill of at least {window - 1} tokens, so that "
                          "the step's cache has one shape")
    if fmt == "onnx":
        _require_onnx()
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        if nbytes > ONNX_MAX_BYTES:
            raise ConfigError(f"format 'onnx': the weights take {nbytes / 2**30:.2f} GiB, over one ONNX file's 2 GiB "
                              f"limit; export with --format pt2")
    paths = check_outputs(out, fmt, overwrite, what)
    prefill, step, names = export_programs(model, batch=batch, prefill_len=prefill_len)
    prefill_out, step_in, step_out = io_names(names, fmt)
    meta = {
        "format": "linlm-export", "file_format": fmt, "arch": model.config.arch, "config": model.config.to_dict(),
        "batch": batch, "state_names": names,
        "prefill": {"file": paths[0].name, "inputs": {"input_ids": [batch, prefill_len]}, "outputs": prefill_out},
        "step": {"file": paths[1].name, "inputs": step_in, "outputs": step_out},
    }
    if fmt == "onnx":
        writers = (lambda p: _write_onnx(prefill, p, ["input_ids"], prefill_out),
                   lambda p: _write_onnx(step, p, step_in, step_out))
    else:
        writers = (lambda p: _write_pt2(prefill, p), lambda p: _write_pt2(step, p))
    outputs.write_via(paths[0], writers[0], what)
    outputs.write_via(paths[1], writers[1], what)
    outputs.write_json(paths[2], meta, what)
    return paths


# ------------------------------------------------------------------------------------------------------ running

class ExportedStep:
    """The step program of a written export, run on flat state tensors: ``(logits, flat') = s(token, position, flat)``.

    ONNX files run in onnxruntime on the CPU (``threads`` intra-op threads; default torch's count), pt2 files as the
    loaded torch.export module. Inputs and outputs are torch tensors either way."""

    def __init__(self, path: str | Path, threads: int | None = None):
        path = Path(path)
        self.fmt = "onnx" if path.suffix == ".onnx" else "pt2"
        if self.fmt == "onnx":
            _require_onnx(run=True)
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads or torch.get_num_threads()
            opts.log_severity_level = 3
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            self.input_names = [i.name for i in self.session.get_inputs()]
        else:
            self.module = torch.export.load(path).module()

    def __call__(self, token: torch.Tensor, position: int, flat: list[torch.Tensor]):
        pos = torch.tensor(position, dtype=torch.int64)
        if self.fmt == "pt2":
            with torch.no_grad():
                logits, *new = self.module(token, pos, *flat)
            return logits, new
        feed = dict(zip(self.input_names, [t.detach().cpu().numpy() for t in (token, pos, *flat)]))
        logits, *new = self.session.run(None, feed)
        return torch.from_numpy(logits), [torch.from_numpy(t) for t in new]


def flat_state(state: ModelState) -> list[torch.Tensor]:
    """The state's tensors in the exported programs' order."""
    return pytree.tree_leaves({"layers": state.layers, "extra": state.extra})


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


@torch.no_grad()
def check(model, paths: list[Path], steps: int = 8, seed: int = 0, threads: int | None = None) -> dict:
    """Run a written export against ``model``: the exported prefill on a random prompt of its traced length, then
    ``steps`` greedy tokens through the exported step fed its own state. Returns the largest absolute differences
    from eager of the prefill's logits and state, and of the steps' logits and state (over all steps)."""
    meta = json.loads(Path(paths[2]).read_text())
    B, T = meta["prefill"]["inputs"]["input_ids"]
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (B, T), generator=gen)
    want, state = model.prefill(ids)
    if Path(paths[0]).suffix == ".onnx":
        _require_onnx(run=True)
        import onnxruntime as ort

        session = ort.InferenceSession(str(paths[0]), providers=["CPUExecutionProvider"])
        got, *flat = [torch.from_numpy(t) for t in session.run(None, {"input_ids": ids.numpy()})]
    else:
        got, *flat = torch.export.load(paths[0]).module()(ids)
    result = {"prefill_logits": _max_diff(got, want),
              "prefill_state": max(map(_max_diff, flat, flat_state(state)), default=0.0)}
    step = ExportedStep(paths[1], threads=threads)
    token = want.argmax(-1)
    logit_diff = state_diff = 0.0
    for i in range(steps):
        want, state = model.step(token, state)
        got, flat = step(token, T + i, flat)
        logit_diff = max(logit_diff, _max_diff(got, want))
        state_diff = max(state_diff, max(map(_max_diff, flat, flat_state(state)), default=0.0))
        token = want.argmax(-1)
    result.update(step_logits=logit_diff, step_state=state_diff, steps=steps)
    return result
