"""Typed configs: dataclasses validated by pydantic, read from YAML files and dotted command-line overrides.

The configs stay plain :mod:`dataclasses` (``ModelConfig``, ``TrainConfig`` and its sections). :func:`from_dict`
validates a dict against one with a pydantic ``TypeAdapter`` in strict mode:

* an unknown key is refused (with the valid keys and the closest match);
* no silent conversions: ``"5"`` is not an integer, ``5.0`` is not an integer, ``"true"`` is not a boolean
  (an integer is accepted where a number is expected);
* a number that is not finite (``nan``, ``inf``, YAML's ``.inf``) is refused wherever a float is configured.

Every failure raises :class:`linlm.errors.ConfigError` whose ``key`` attribute is the dotted key (built from
pydantic's error ``loc``, never parsed out of message text), so callers can say where that key was set.

YAML is read with one loader (:class:`YamlLoader`) everywhere: in files and in ``key=value`` overrides. It is
PyYAML's safe loader plus two rules: ``1e-3`` is a number (YAML 1.2; YAML 1.1 reads it as a string) and a key
given twice in one mapping is refused, naming both lines.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import yaml

from linlm.errors import ConfigError, choices_text

# ---- errors that know their key ----------------------------------------------------------------------------


def config_error(key: str, detail: str, *, related: Iterable[str] = ()) -> ConfigError:
    """A ConfigError about ``key`` ("key: detail"); ``related`` names other keys the problem involves (a
    cross-field rule), so that the caller can point at wherever the user set any of them."""
    err = ConfigError(f"{key}: {detail}")
    err.key, err.detail, err.related = key, detail, tuple(related)  # type: ignore[attr-defined]
    return err


def error_keys(err: ConfigError) -> tuple[str, ...]:
    """The keys a ConfigError is about (its key first), or () for an error that names none."""
    key = getattr(err, "key", None)
    return (key, *getattr(err, "related", ())) if key else ()


def rekey(err: ConfigError, prefix: str) -> ConfigError:
    """The same error with every key under ``prefix`` (``vocab_size`` -> ``model.overrides.vocab_size``)."""
    if not error_keys(err):
        return config_error(prefix.rstrip("."), str(err))
    return config_error(prefix + err.key, err.detail, related=[prefix + k for k in err.related])


# ---- validation --------------------------------------------------------------------------------------------

# strict: no str -> int, float -> int or str -> bool conversions; forbid: unknown keys are errors.
_PYDANTIC_CONFIG = {"strict": True, "extra": "forbid", "allow_inf_nan": False}


@lru_cache(maxsize=None)
def _adapter(cls: type):
    from pydantic import ConfigDict, TypeAdapter

    # A stdlib dataclass takes its pydantic settings from this attribute; nested dataclasses inherit them.
    if "__pydantic_config__" not in vars(cls):
        cls.__pydantic_config__ = ConfigDict(**_PYDANTIC_CONFIG)
    return TypeAdapter(cls)


def _plain(value: Any, key: str) -> Any:
    """``value`` as JSON data (the adapter validates JSON: strict JSON mode accepts an object for a dataclass)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value), key)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise config_error(key or "config", f"{value!r} ({type(value).__name__}) is not a config value; use a "
                                        "number, string, boolean, list or mapping")


_EXPECTED = {
    "int_type": "an integer", "int_from_float": "an integer", "float_type": "a number",
    "finite_number": "a finite number", "bool_type": "true or false", "string_type": "a string",
    "dict_type": "a mapping", "list_type": "a list", "none_required": "null",
}


def _dotted(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith(("function-", "nullable[")) and str(part) not in ("int", "float", "str",
                                                                                         "bool", "list", "dict"):
            out += f".{part}" if out else str(part)
    return out


def _fields_at(cls: type, loc: Iterable[Any]) -> Optional[type]:
    """The dataclass reached by following ``loc`` (keys only) from ``cls``, or None."""
    for part in loc:
        if not isinstance(part, str) or not dataclasses.is_dataclass(cls):
            return None
        hint = _field_type(cls, part)
        if hint is None:
            return None
        cls = hint
    return cls if dataclasses.is_dataclass(cls) else None


def _field_type(cls: type, name: str) -> Optional[type]:
    tp = typing.get_type_hints(cls).get(name)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Union and len(args) == 1:
        tp = args[0]
    return tp


def _show(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    text = json.dumps(value) if isinstance(value, (dict, list)) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _from_pydantic(cls: type, error: dict, prefix: str) -> ConfigError:
    loc, kind = tuple(error["loc"]), error["type"]
    key = prefix + _dotted(loc)
    if kind == "unexpected_keyword_argument":
        parent = _fields_at(cls, loc[:-1])
        names = [f.name for f in dataclasses.fields(parent) if f.init] if parent else []
        close = difflib.get_close_matches(str(loc[-1]), names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return config_error(key, f"unknown key {loc[-1]!r}; {hint}valid keys here are: {choices_text(names)}")
    got = _show(error.get("input"))
    if kind == "literal_error":
        return config_error(key, f"expected one of {error.get('ctx', {}).get('expected', '')}, got {got}")
    if kind in ("dataclass_type", "dataclass_exact_type", "model_type"):
        section = _fields_at(cls, loc)
        what = f"a mapping of {section.__name__} keys" if section else "a mapping"
        return config_error(key, f"expected {what}, got {got}")
    expected = _EXPECTED.get(kind)
    if expected is None:  # anything else pydantic reports: its own message
        return config_error(key, f"{error['msg'][0].lower() + error['msg'][1:]}, got {got}")
    extra = " (nan and inf are refused)" if kind == "finite_number" else ""
    if kind == "string_type" and isinstance(error.get("input"), (bool, int, float)):
        what = {bool: "a boolean", int: "an integer", float: "a number"}[type(error["input"])]
        extra = f"; YAML reads {got} as {what}: quote it to pass text ('\"{got}\"')"
    return config_error(key, f"expected {expected}, got {got}{extra}")


def from_dict(cls: type, data: Mapping[str, Any], *, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, validated by pydantic (see the module doc). Keys absent from
    ``data`` keep the dataclass defaults. A failure raises ConfigError with ``.key`` set (under ``prefix``)."""
    from pydantic import ValidationError

    if not isinstance(data, Mapping):
        raise config_error(prefix.rstrip(".") or cls.__name__,
                           f"got {_show(data)}, expected a mapping of {cls.__name__} keys")
    plain = _plain(data, prefix.rstrip("."))
    try:
        return _adapter(cls).validate_json(json.dumps(plain, allow_nan=True))
    except ValidationError as e:
        raise _from_pydantic(cls, e.errors(include_url=False)[0], prefix) from None


def to_dict(obj: Any) -> dict:
    out = dataclasses.asdict(obj)
    for k, v in list(out.items()):
        if isinstance(v, Path):
            out[k] = str(v)
    return out


# ---- YAML --------------------------------------------------------------------------------------------------


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, with YAML 1.2 numbers (``1e-3``) and duplicate keys refused."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in seen:
                raise DuplicateKey(key, seen[key], line)
            if isinstance(key, typing.Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, second: int):
        super().__init__(f"key {key!r} is given twice, on lines {first} and {second}")
        self.key, self.first, self.second = key, first, second


# YAML 1.1 needs a dot in a float ("1.0e-3"); YAML 1.2 (and every user) reads 1e-3 as a number too.
YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
# nan and inf as numbers too (YAML spells them .nan and .inf), so that norm_eps=nan is refused as not finite
# rather than read as the string "nan".
YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:nan|NaN|NAN|inf|Inf|INF|infinity|Infinity)$"), list("-+nNiI"))


def yaml_value(text: str) -> Any:
    """One value written as YAML (an override's right-hand side)."""
    return yaml.load(text, Loader=YamlLoader)


def read_yaml_text(path: str | Path) -> str:
    """The text of a YAML file; ConfigError when it is missing or not UTF-8."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; pass the path of a YAML file")
    raw = p.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(f"{p}:{line}: the file is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                          f"{e.start}); save it as UTF-8") from None


def load_yaml(path: str | Path) -> dict:
    """A YAML config file as a dict (see :class:`YamlLoader`); ConfigError for anything unreadable."""
    p = Path(path)
    text = read_yaml_text(p)
    try:
        data = yaml.load(text, Loader=YamlLoader)
    except DuplicateKey as e:
        raise ConfigError(f"{p}:{e.second}: key {e.key!r} is given twice (lines {e.first} and {e.second}); "
                          "keep one of them") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of keys to values")
    return data


def key_lines(path: str | Path) -> dict[str, int]:
    """The 1-based line of every dotted key in a YAML file: ``{"optim": 3, "optim.lr": 4, ...}``."""
    try:
        root = yaml.compose(read_yaml_text(path), Loader=YamlLoader)
    except (ConfigError, yaml.YAMLError):
        return {}
    out: dict[str, int] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                dotted = f"{prefix}.{key.value}" if prefix else str(key.value)
                out.setdefault(dotted, key.start_mark.line + 1)
                walk(value, dotted)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                out.setdefault(f"{prefix}[{i}]", item.start_mark.line + 1)
                walk(item, f"{prefix}[{i}]")

    walk(root, "")
    return out


# ---- overrides ---------------------------------------------------------------------------------------------

_OVERRIDE_KEY = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*")


def is_override(item: str) -> bool:
    """Whether a command-line word is a ``dotted.key=value`` override."""
    return "=" in item and bool(_OVERRIDE_KEY.fullmatch(item.split("=", 1)[0].strip()))


def parse_overrides(items: Optional[Iterable[str]]) -> dict:
    """Turn ``["model.arch=tnl", "optim.lr=3e-4"]`` into a nested dict; values are read as YAML
    (:class:`YamlLoader`: ``1e-3`` is a number, ``[0.9,0.99]`` a list, ``'"5"'`` the string "5")."""
    nested: dict = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (for example optim.lr=1e-3)")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not _OVERRIDE_KEY.fullmatch(key):
            raise ConfigError(f"override {item!r}: {key!r} is not a dotted key (for example optim.lr=1e-3)")
        try:
            value = yaml_value(raw) if raw.strip() != "" else ""
        except DuplicateKey as e:
            raise ConfigError(f"override {item!r}: key {e.key!r} is given twice") from None
        except yaml.YAMLError:
            value = raw
        node = nested
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p!r} is set to a value on the command line and is not "
                                  "a section")
        node[parts[-1]] = value
    return nested


def deep_merge(base: dict, update: Mapping) -> dict:
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def has_key(tree: Any, dotted: str) -> bool:
    """Whether the nested dict ``tree`` sets ``dotted`` (list indices ignored)."""
    for part in re.sub(r"\[\d+\]", "", dotted).split("."):
        if not isinstance(tree, Mapping) or part not in tree:
            return False
        tree = tree[part]
    return True
