"""One entry point for every layout: :func:`convert` a checkpoint directory into a linlm model directory, or a
linlm model into a directory of another library's layout (``to=``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from linlm import outputs
from linlm.conversion.layout import Layout, found
from linlm.conversion.registry import LAYOUTS, layout_names
from linlm.conversion.source import CONFIG, tokenizer_files, read_config, read_weights
from linlm.errors import CheckpointError, ConfigError
from linlm.models.format import FORMAT, WEIGHTS, check_save_target, save_model
from linlm.models.lm import CausalLM


def _choices(names) -> str:
    return ", ".join(names)


def get_layout(name: str) -> Layout:
    if name not in LAYOUTS:
        raise ConfigError(f"--from/--to: unknown layout {name!r}; valid choices are {_choices(layout_names())}")
    return LAYOUTS[name]


def detect(src) -> Optional[Layout]:
    """The layout of the checkpoint directory ``src`` (None for a linlm model); a CheckpointError naming what was
    found when it is none linlm converts."""
    config = read_config(Path(src))
    if config.get("format") == FORMAT:
        return None
    hits = [layout for layout in LAYOUTS.values() if layout.matches(config)]
    if not hits:
        raise CheckpointError(f"{Path(src) / CONFIG}: describes {found(config)}, which linlm cannot convert; it "
                              f"converts {_choices(layout_names())} (pass --from to name one)")
    return hits[0]


def load_foreign(src, layout: Optional[str] = None) -> CausalLM:
    """The linlm model of a checkpoint directory of another library (its layout detected, or ``layout``)."""
    src = Path(src)
    chosen = detect(src) if layout is None else get_layout(layout)
    config = read_config(src)
    if chosen is None or config.get("format") == FORMAT:
        raise CheckpointError(f"{src}: is a linlm model already; load it with linlm.load, or pass --to to convert "
                              f"it into another layout")
    if not chosen.matches(config):
        raise CheckpointError(f"{src / CONFIG}: describes {found(config)}, not the {chosen.name} layout "
                              f"({chosen.description}); leave out --from to detect the layout")
    tensors = read_weights(src)
    try:
        return chosen.to_linlm(config, tensors)
    except RuntimeError as e:  # tensors of other sizes than config.json's, met while re-arranging them
        raise CheckpointError(f"{src}: the weights do not fit config.json ({str(e).splitlines()[0]}); they belong to "
                              f"another model") from None


def _write_foreign(config: dict, tensors: dict, out: Path, overwrite: bool, files) -> Path:
    """config.json and model.safetensors of another library's layout at ``out``, atomically, through linlm.outputs."""
    from safetensors.torch import save_file

    outputs.check_dir(out, "--out")
    held = [p.name for p in out.iterdir() if not outputs.bookkeeping(p.name)] if out.is_dir() else []
    if held and not overwrite:
        raise CheckpointError(f"{out}: holds files already ({outputs.shown(sorted(held))}); pass --overwrite to "
                              f"replace them, or choose a new directory (nothing was written)")
    foreign = sorted(outputs.foreign_entries(out)) if held else []
    if foreign:
        raise CheckpointError(f"{out}: holds files linlm did not write, or that were changed since "
                              f"({outputs.shown(foreign)}); move them out or choose a new directory, since "
                              f"--overwrite replaces the directory whole (nothing was written)")
    tmp = outputs.temp_dir_beside(out)
    try:
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(outputs.dumps(config, indent=2), encoding="utf-8")
        for f in files:
            (tmp / f.name).write_bytes(f.read_bytes())
        outputs.commit_dir(tmp, out)
    except BaseException:
        outputs.discard(tmp)
        raise
    return out


def convert(src, out, *, layout: Optional[str] = None, to: Optional[str] = None, overwrite: bool = False) -> Path:
    """Convert the checkpoint directory ``src`` into a linlm model directory at ``out`` (its layout detected from
    config.json, or ``layout``: one of :data:`LAYOUTS`), or, with ``to``, the linlm model at ``src`` into a directory
    of that layout. The source's tokenizer files are copied as they are. ``out`` must be new or empty, or, with
    ``overwrite``, a directory linlm wrote; nothing is written when any check fails."""
    from linlm.models.io import load

    src, out = Path(src), Path(out)
    files = tokenizer_files(src) if src.is_dir() else []
    if to is not None:
        target = get_layout(to)
        if target.from_linlm is None:
            raise ConfigError(f"--to: {to} converts one way only, into linlm; valid targets are "
                              f"{_choices(n for n, l in LAYOUTS.items() if l.from_linlm is not None)}")
        outputs.check_dir(out, "--out")
        model = load(src)
        if model.config.arch != target.arch:
            raise ConfigError(f"--to: {to} holds {target.arch!r} models; {src} is a {model.config.arch!r} model")
        config, tensors = target.from_linlm(model)
        return _write_foreign(config, tensors, out, overwrite, files)
    check_save_target(out, overwrite, tuple(f.name for f in files))
    model = load_foreign(src, layout)
    return save_model(model, out, overwrite=overwrite, files=tuple(files))
