"""What a section of ``linlm reproduce`` is: one :class:`Section` record holds everything the job needs to know
about it (its name, what it reads, the settings it depends on, how it runs, what it checks before any work, what
it writes in the job directory, and how it shows in the plan and the report). The records are listed, in the
order the job runs them, in :data:`linlm.reproduce.sections.SECTIONS`.

A section's settings are a dataclass of its own (``options``), read from the recipe's key ``key``: its fields and
their defaults are the one place they are written, and the recipe is checked against it when it loads
(:func:`load_options`), before any work. Several sections may read one key (both quality sections read
``quality``) when they name the same dataclass.

This module also holds what several sections share: the trained models of a sweep, the validation text of a
prepared data directory, and the pieces of the report (a number, a plot, why a section has nothing to show).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from linlm.errors import ConfigError, DataError

Tick = Callable[[float], None]  # fraction of the section done
Blocks = list[tuple]  # report blocks, as linlm.render renders them: ("h2", text), ("p", text), ...


@dataclass(frozen=True)
class Section:
    """One section of the job.

    ``run(job, tick)`` computes the section's numbers and returns:

    - a dict: saved as ``DIR/sections/NAME.json``; a later run of the command reads it back instead of running the
      section again. A dict holding ``"not_run"`` (the section could not run, e.g. no --data-dir) is shown in the
      report but not saved: the section runs again next time;
    - None: it cannot run yet (its training has not finished, or it waits for the cluster: it says why in
      ``job.waiting``); not saved, tried again next time, and the sections that need it wait too;
    - or it raises: the section failed. The failure goes to errors.log and the report, the job goes on, and the
      section runs again next time. A KeyboardInterrupt (Ctrl-C, SIGTERM) stops the job (exit 130).
    """

    name: str
    run: Callable[[Any, Tick], Optional[dict]]
    weight: float  # its share of a local job's time (the display's first estimate of the time left)
    needs: tuple[str, ...] = ()  # the sections whose results it reads: it waits while one has not finished
    # The job's settings (keys of linlm.reproduce.settings.FLAGS) its numbers depend on: a new value of one is
    # refused once this section has finished.
    settings: tuple[str, ...] = ()
    # Trains models: a failure that is not a LinlmError (a bug) stops the job, and a failed training section
    # holds back the sections that need it.
    training: bool = False
    # (job, kept, replace) -> None: refusals before any work, while the section is still to run. ``kept(key)``
    # says where a setting came from (for the message); ``replace``: the job's own sweeps are about to be removed.
    check: Optional[Callable[[Any, Callable[[str], str], bool], None]] = None
    # (job, pending) -> its part of the report; ``report_rank`` orders the parts (the report's order is not the
    # order the sections run in).
    render: Optional[Callable[[Any, list[str]], Blocks]] = None
    report_rank: int = 0
    plan: Optional[Callable[[Any], str]] = None  # (recipe) -> its line in `linlm reproduce --dry-run`
    # (recipe) -> at most how many seconds it trains here, timed now (--dry-run), for a section that trains models
    # outside the training sections (MQAR's)
    estimate: Optional[Callable[[Any], float]] = None
    trees: tuple[str, ...] = ()  # directories of DIR it builds from nothing (--overwrite clears them whole)
    plots: tuple[str, ...] = ()  # the names (fnmatch patterns) of its PNGs in DIR/plots
    copies: tuple[str, ...] = ()  # paths of DIR the job itself writes for it (besides sections/NAME.json)
    # Its settings: the recipe key it reads and the dataclass that key holds (None: it has none of its own).
    key: Optional[str] = None
    options: Optional[type] = None


# ---- typed settings ----------------------------------------------------------------------------------------------


def setting(default: Any, doc: str) -> Any:
    """A field of a section's settings dataclass: its default (a list or a mapping is copied for each instance)
    and what it means (docs/reproduce.md's settings table shows it)."""
    if isinstance(default, (list, dict)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata={"doc": doc})
    return dataclasses.field(default=default, metadata={"doc": doc})


def load_options(cls: type, data: Any, where: str) -> Any:
    """The settings ``cls`` from the recipe's mapping ``data`` (None: the defaults), checked: an unknown key, a
    wrong type or an impossible value is a one-line ConfigError starting with ``where`` (the recipe and its key).
    A class with ``from_recipe(data, where)`` reads the mapping itself; one with ``validate()`` is checked
    after it is built."""
    from linlm.schema import from_dict

    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__} keys, got {data!r}")
    if hasattr(cls, "from_recipe"):
        return cls.from_recipe(dict(data), where)
    try:
        value = from_dict(cls, data)
        checked = value.validate() if hasattr(value, "validate") else None
    except ConfigError as e:
        raise ConfigError(f"{where}.{e}" if getattr(e, "key", None) else f"{where}: {e}") from None
    return value if checked is None else checked


def option_rows(cls: type) -> list[tuple[str, str, str]]:
    """(field, default, meaning) of each field of a settings dataclass, as docs/reproduce.md's table shows them."""
    rows = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default = "(required)"
        if dataclasses.is_dataclass(default):
            default = {k: v for k, v in dataclasses.asdict(default).items()}
        shown = default if isinstance(default, str) and default == "(required)" else _yaml_value(default)
        rows.append((f.name, shown, f.metadata.get("doc") or f"as {cls.__name__}.{f.name} ({cls.__module__})"))
    return rows


def _yaml_value(value: Any) -> str:
    import json

    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)) and len(value) > 6:
        return f"{len(value)} values from {value[0]:g} to {value[-1]:g}"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value).replace('"', "")
    return str(value)


# ---- the models and the text sections evaluate ----------------------------------------------------------------


def trained_models(sweep: Path, largest_only: bool) -> dict[str, dict]:
    """{label: {run, arch, seed, params, checkpoint, data_dir, seq_len, ...}} for each finished run of a sweep
    directory, labelled by run (``largest_only``: the run with the most parameters of each architecture, labelled
    by architecture)."""
    from linlm.scaling.runs import finished_runs

    found: dict[str, dict] = {}
    for row in finished_runs(sweep):
        row = {k: v for k, v in row.items() if k != "study"}
        key = row["arch"] if largest_only else row["run"]
        if key not in found or row["params"] > found[key]["params"]:
            found[key] = row
    return found


def largest_models(job, *sweeps: str) -> dict[str, dict]:
    """The largest finished model of each architecture in the job's training sections ``sweeps``: those of the
    first labelled by architecture, those of the others as ``SWEEP-ARCH``."""
    found: dict[str, dict] = {}
    for i, name in enumerate(sweeps):
        models = trained_models(job.sweep(name), largest_only=True)
        found.update(models if i == 0 else {f"{name}-{k}": v for k, v in models.items()})
    return found


def seeded_models(job, sweep: str, prefix: str = "") -> dict[str, dict]:
    """Every finished run of the training section ``sweep``, each seed of an architecture its own model: labelled
    by run (``prefix`` first), each with its ``group``, the label its seeds share (``prefix`` + architecture)."""
    return {f"{prefix}{label}": {**m, "group": f"{prefix}{m['arch']}"}
            for label, m in trained_models(job.sweep(sweep), largest_only=False).items()}


def group_spreads(models: dict[str, dict], key: str) -> dict[str, dict]:
    """{group: Spread.to_dict()} of ``key`` over the seeds of each group of ``models`` (a model without a group is
    its own)."""
    from linlm.reproduce.seeds import Spread

    values: dict[str, list[float]] = {}
    for label, m in models.items():
        if isinstance(m.get(key), (int, float)):
            values.setdefault(m.get("group") or label, []).append(float(m[key]))
    return {g: Spread(v).to_dict() for g, v in values.items()}


def validation_text(data_dir: str | Path, tokenizer, max_tokens: int) -> str:
    """The first ``max_tokens`` tokens of a prepared validation split, decoded back to text."""
    from linlm.data.loader import TokenDataset

    ds = TokenDataset(data_dir, "val")
    n = min(ds.num_tokens, max_tokens)
    if n < 2:
        raise DataError(f"{data_dir}: the validation split holds {ds.num_tokens} tokens; prepare the data with "
                        "val_fraction > 0")
    return tokenizer.decode([int(t) for t in ds.read(0, n)])


# ---- pieces of the report -------------------------------------------------------------------------------------


def fmt(x, spec: str = ".4f") -> str:
    """A number of a table, or "-" for none."""
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def image(job, name: str) -> Optional[tuple]:
    """The report block of the PNG DIR/plots/NAME, when it exists."""
    path = job.plots / name
    return ("img", f"plots/{name}", path.read_bytes()) if path.is_file() else None


def heading(job, title: str, pending: list[str], *names: str) -> tuple[Blocks, Optional[dict]]:
    """A section's part of the report begins: its heading and the results of ``names[0]``; or, when one of the
    sections ``names`` has nothing to show (or ``names[0]`` did not run: ``not_run``), the heading and why (and
    None)."""
    why = next(filter(None, (missing(job, name, pending) for name in names)), None)
    if why:
        return [("h2", title), ("p", why)], None
    res = job.results[names[0]]
    if isinstance(res, dict) and "not_run" in res:
        return [("h2", title), ("p", f"Skipped: {res['not_run']}.")], None
    return [("h2", title)], res


def missing(job, name: str, pending: list[str]) -> Optional[str]:
    """Why the section ``name`` has nothing to show (failed, waiting, not run yet), or None when it has."""
    if name in job.failures:
        return f"This section failed: {job.failures[name]} (details in errors.log; run the command again to retry)."
    if name in job.waiting:
        return f"Not run yet: {job.waiting[name]}."
    if name in pending or name not in job.results:
        return "Not run yet: its training runs have not finished (run the same command again)."
    return None


def spread_blocks(spreads: dict, what: str, spec: str = ".4f") -> Blocks:
    """The table of a number's mean and spread over seeds per group (architecture), when some group has seeds."""
    if not spreads or max(s["n"] for s in spreads.values()) < 2:
        return [("p", f"One seed per model: no spread over seeds of the {what}, so a claim about a difference "
                      "between these models cannot tell (one seed).")]
    rows = [[g, str(s["n"]), fmt(s["mean"], spec), fmt(s["std"], spec), fmt(s["min"], spec), fmt(s["max"], spec)]
            for g, s in spreads.items()]
    return [("p", f"The {what} over seeds: the mean, the sample standard deviation (n - 1) and the range (min-max); "
                  "the claims judge a difference by its interval over the seeds (paired where they share the data "
                  "order: the rule above the claims table)."),
            ("table", ["model", "seeds", "mean", "std", "min", "max"], rows)]
