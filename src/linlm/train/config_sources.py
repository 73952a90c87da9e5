"""Building a :class:`~linlm.train.train_config.TrainConfig` from YAML files and dotted command-line overrides.

``load_train_config(path, overrides)`` merges (in this order) the dataclass defaults, a YAML file and dotted
``key=value`` overrides, then validates the whole tree before any work is done (see :mod:`linlm.train.train_config`
for the schema and its rules). An error names the key and where it was set: for keys from a YAML file, the file
and line; for overrides, "set on the command line". ``build_model_config`` reads the same dialect for commands
that build only a model; ``config_path`` finds a named config in configs/.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from linlm.schema import config_error, deep_merge, error_keys, from_dict, has_key, key_lines, load_yaml, parse_overrides
from linlm.errors import ConfigError
from linlm.train.train_config import ModelSection, TrainConfig, model_config_of


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
    from linlm.models.model_config import model_keys

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


def config_path(name: str) -> Optional[Path]:
    """configs/NAME.yaml in the source tree (for ``--config demo``), or None."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        return None
    here = Path(__file__).resolve()
    for root in (here.parents[3] / "configs", here.parents[1] / "configs"):
        candidate = root / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    return None
