"""The settings of a ``linlm reproduce`` job (--set, --scaling-dir, --data-dir, --seeds): as a command gives
them, as the job runs with them, and their checks before any work.

A job that has not finished can be corrected by giving a setting again: a new value is taken when no section it
changes has finished (the sections that name it in their ``settings``), and refused, naming those sections, when
one has (a finished section is never recomputed with other settings, nor kept beside sections computed with
others). Not given, a setting keeps the job's value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from linlm.errors import ConfigError
from linlm.reproduce import sections

# The job's settings and their flags.
FLAGS = {"overrides": "--set", "scaling_dir": "--scaling-dir", "data_dir": "--data-dir", "seeds": "--seeds"}


def affects(key: str) -> tuple[str, ...]:
    """The sections whose numbers the setting ``key`` changes (those that name it in their ``settings``)."""
    return sections.affected_by(key)


def _shown_setting(key: str, value: Any) -> str:
    if key == "overrides":
        return " ".join(f"--set {k}={v}" for k, v in _flat(value or {})) or "no --set"
    if key == "scaling_dir":
        return value or "the job's own sweep (DIR/scaling)"
    if key == "seeds":
        return f"--seeds {value}" if value else "the recipe's seeds"
    return value or "no --data-dir"


def _flat(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in tree.items():
        out += _flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [(f"{prefix}{k}", v)]
    return out


# Training keys a ladder sets for each of its runs: a --set of one would be overwritten or would train another model
# under the ladder's name, so it is refused by name (the recipe's ladders and tokens are where they change).
LADDER_KEYS = {"steps": "each run's steps come from its rung's tokens (change the tokens in the recipe)",
               "out_dir": "each run's directory is the job's (DIR/NAME/runs/RUN)",
               "model.arch": "the ladders name the architectures",
               "model.preset": "the rungs set the model's size",
               **{f"model.overrides.{k}": "the rungs set the model's shape"
                  for k in ("d_model", "n_layers", "n_heads", "head_dim", "glu_dim")}}


def check_overrides(overrides: Optional[dict]) -> None:
    """Refuse a --set of a key the ladders own (:data:`LADDER_KEYS`), naming it."""
    for key, _ in _flat(overrides or {}):
        owned = next((k for k in LADDER_KEYS if key == k or key.startswith(k + ".")), None)
        if owned is not None:
            raise ConfigError(f"--set {key}: {LADDER_KEYS[owned]}; a --set applies to every training run and may "
                              "not change what the ladders decide. Drop it (nothing was changed)")


def given_settings(out: Path, data_dir: Optional[str | Path], overrides: Optional[dict],
                   scaling_dir: Optional[str | Path], seeds: Optional[int] = None) -> dict:
    """The settings a command gives, as the marker stores them (None: not given). Paths are made absolute, and
    --scaling-dir DIR/scaling is the job's own sweep, as if not given; --seeds out of range and a --set of a key
    the ladders own are refused."""
    from linlm.reproduce.seeds import seed_count

    check_overrides(overrides)
    if seeds is not None:
        seed_count({"seeds": seeds}, "--seeds")
    sweep = str(Path(scaling_dir).expanduser().resolve()) if scaling_dir else None
    if sweep == str((out / "scaling").resolve()):
        sweep = None
    return {"overrides": overrides or None, "scaling_dir": sweep,
            "data_dir": str(Path(data_dir).expanduser().resolve()) if data_dir else None, "seeds": seeds}


def resolve_settings(out: Path, marker: Optional[dict], given: dict, finished: list[str]) -> tuple[dict, list[str]]:
    """The settings the job runs with, and a note for each one that changes. A setting not given keeps the job's;
    one given anew is taken when none of the sections it changes has finished, and refused otherwise."""
    if marker is None:
        return dict(given), []
    settings, notes = {}, []
    for key, flag in FLAGS.items():
        old, new = marker.get(key) or None, given[key]
        if new is None or new == old:
            settings[key] = old
            continue
        done = [s for s in affects(key) if s in finished]
        if done:
            raise ConfigError(f"{flag}: the job in {out} runs with {_shown_setting(key, old)}, and its finished "
                              f"sections {', '.join(done)} were computed with it; a finished section is never "
                              f"recomputed with other settings. Give the job's {flag} again (or drop it), or "
                              "--overwrite to start the job over (nothing was changed)")
        settings[key] = new
        notes.append(f"{flag}: the job ran with {_shown_setting(key, old)}; from now on {_shown_setting(key, new)} "
                     f"(none of the sections it changes, {', '.join(affects(key))}, has finished)")
    return settings, notes


def check_settings(job, finished: list[str], *, replace: bool, from_marker: dict) -> None:
    """Refuse, changing nothing, settings the job could not run with: a --set the training config does not
    take, a --scaling-dir that is no sweep of the recipe's ladder (or missing, or inside --out), a --data-dir
    without task files, a sweep whose runs were started otherwise or that another process trains in. Only the
    settings of sections still to run are checked (each section's own ``check``); ``replace``: the job's own
    sweeps are about to be removed."""
    from linlm.scaling.sweepdir import check_sweep_dir

    todo = [s for s in sections.SECTIONS if s.name not in finished]

    def kept(key: str) -> str:  # a setting the command did not give comes from the job: say so, and how to fix it
        return " (kept from the job's reproduce.json: give it again to correct it)" if from_marker.get(key) else ""

    if job.scaling_dir is not None and any("scaling_dir" in s.settings for s in todo):
        sweep, out = job.scaling_dir.resolve(), job.out.resolve()
        if sweep == out or out in sweep.parents or sweep in out.parents:
            raise ConfigError(f"--scaling-dir: {sweep} and --out {out} are inside one another; give a sweep "
                              "directory outside the job (or drop --scaling-dir for the job's own DIR/scaling) "
                              "(nothing was changed)")
        check_sweep_dir(job.scaling_dir, job.scaling_ladder(), "--scaling-dir" + kept("scaling_dir"),
                        must_exist=True)
    for section in todo:
        if section.check is not None:
            section.check(job, kept, replace)


def job_settings(settings: dict) -> dict:
    """The Job fields of the settings a job runs with."""
    return {"data_dir": settings["data_dir"], "overrides": settings["overrides"] or {},
            "scaling_dir": Path(settings["scaling_dir"]) if settings["scaling_dir"] else None,
            "seeds": settings.get("seeds")}
