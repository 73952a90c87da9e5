"""The ``zeroshot`` section: the recipe's multiple-choice tasks, from the JSON Lines files of --data-dir, for the
largest model of each architecture of the scaling sweep and every run (each seed) of the comparison, with the
commonsense average's spread over the seeds. Without --data-dir it is skipped (and runs once one is given); when
no model scored any task it failed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

from linlm.errors import ConfigError, DataError
from linlm.reproduce.section import (Blocks, Section, Tick, group_spreads, heading, largest_models, seeded_models,
                                    setting, spread_blocks)


@dataclass
class ZeroshotSettings:
    """The recipe's ``zeroshot:``."""

    tasks: Union[str, list[str]] = setting("commonsense,lambada,wikitext2",
                                           "the tasks (names or groups, linlm.eval.tasks): the paper's commonsense "
                                           "columns, LAMBADA and WikiText-2")
    limit: Optional[int] = setting(None, "items scored per task (null: every item)")

    def validate(self) -> "ZeroshotSettings":
        from linlm.eval.tasks import resolve_tasks

        resolve_tasks(self.tasks)
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit: {self.limit}; give at least 1 item per task, or null for every item")
        return self

    def items(self) -> str:
        return "every item of each task" if self.limit is None else f"at most {self.limit} items per task"


def check_task_dir(data_dir: str | Path, tasks, what: str = "--data-dir") -> tuple[Path, list[str], list[str]]:
    """(the directory, the tasks whose files it holds, those it lacks); refuses (ConfigError, changing nothing) a
    path that is not a directory or holds none of the task files, so a mistyped --data-dir is caught before any
    work."""
    from linlm.eval.tasks import TASKS, resolve_tasks

    root = Path(data_dir).expanduser()
    names = resolve_tasks(tasks or "commonsense")
    if not root.is_dir():
        raise ConfigError(f"{what} {root}: is not a directory; give the directory of the zero-shot task files "
                          "(JSON Lines, see docs/evaluation.md) (nothing was changed)")
    present = [n for n in names if (root / TASKS[n].filename).is_file()]
    if not present:
        raise ConfigError(f"{what} {root}: holds none of the task files "
                          f"({', '.join(TASKS[n].filename for n in names)}); give the directory that holds them "
                          "(nothing was changed)")
    return root, present, [n for n in names if n not in present]


def measure(models: dict[str, dict], data_dir: Optional[str], tasks, limit: Optional[int], tick: Tick) -> dict:
    """Each model on the recipe's tasks from ``data_dir``. A task one model cannot take is named (``not_scored``)
    and the others go on; when no model scored any task, the section failed (DataError), not finished."""
    from linlm.eval.evaluator import evaluate
    from linlm.infer.generate import load_for_generation

    if not data_dir:
        return {"not_run": "no --data-dir was given: the zero-shot tasks need their JSON Lines files (`linlm eval "
                           "fetch --tasks commonsense --out DIR` writes them; see docs/evaluation.md)"}
    root, present, missing_tasks = check_task_dir(data_dir, tasks)
    from linlm.errors import LinlmError
    from linlm.eval.scoring import config_max_length
    from linlm.eval.tasks import commonsense_average
    from linlm.models.format import read_config

    # Every model reads the same inputs: contexts cut from the left to the shortest window among the models (LLaMA's
    # max_seq_len; the linear models have none), and documents whose answer alone is longer left out for all. The
    # windows come from the configs; the models are loaded one at a time below.
    limits = [x for x in (config_max_length(read_config(Path(m["checkpoint"]))[0]) for m in models.values())
              if x is not None]
    window = min(limits) if limits else None
    out = {"data_dir": str(root), "limit": limit, "missing_tasks": missing_tasks, "models": {}, "not_scored": {},
           "max_length": window}
    for i, (label, m) in enumerate(models.items()):
        model, tok = load_for_generation(m["checkpoint"])
        tasks = {}
        for name in present:  # one task at a time: a task this model cannot take costs that task, not the rest
            try:
                tasks.update(evaluate(model, tok, [name], root, limit=limit, max_length=window,
                                      drop_overlong=True)["tasks"])
            except LinlmError as e:
                out["not_scored"].setdefault(name, str(e))
        out["models"][label] = {"arch": m["arch"], "group": m.get("group") or m["arch"], "seed": m.get("seed"),
                                "params": m["params"], "tasks": tasks, "commonsense_avg": commonsense_average(tasks)}
        tick((i + 1) / len(models))
    if not any(t.get("n", 0) > 0 for m in out["models"].values() for t in m["tasks"].values()):
        why = "; ".join(f"{name}: {e}" for name, e in out["not_scored"].items()) or "no task had items to score"
        raise DataError(f"zero-shot: no task was scored for any model from --data-dir {root} ({why}); fix the task "
                        "files, or give a corrected --data-dir, and run the command again")
    scores = {k: {"group": m["group"], "score": (m["commonsense_avg"] or {}).get("score")}
              for k, m in out["models"].items()}
    out["spread"] = group_spreads(scores, "score")
    return out


def run(job, tick: Tick) -> Optional[dict]:
    models = {**largest_models(job, "scaling"), **seeded_models(job, "compare", prefix="compare-")}
    if not models:
        return None
    z = job.recipe.zeroshot
    return measure(models, job.data_dir, z.tasks, z.limit, tick)


def check(job, kept: Callable[[str], str], replace: bool) -> None:
    if job.data_dir:
        check_task_dir(job.data_dir, job.recipe.zeroshot.tasks, "--data-dir" + kept("data_dir"))


def render(job, pending: list[str]) -> Blocks:
    b, z = heading(job, "Zero-shot tasks", pending, "zeroshot")
    if z is None:
        return b
    from linlm.eval.tasks import TASKS

    scored = {t for m in z["models"].values() for t in m["tasks"]}
    tasks = sorted(t for t in scored if t not in PERPLEXITY_TASKS)
    rows = []
    for label, m in z["models"].items():
        cells = [f"{m['tasks'][t][m['tasks'][t]['metric']]:.3f}" if t in m["tasks"] else "-" for t in tasks]
        avg = m.get("commonsense_avg")
        rows.append([label, *cells, f"{avg['score']:.3f}" if avg else "-"])
    metric = {t: next(m["tasks"][t]["metric"] for m in z["models"].values() if t in m["tasks"]) for t in tasks}
    items = ZeroshotSettings(limit=z["limit"]).items()
    b.append(("p", f"From {z['data_dir']}, {items}; each task's metric is the paper's "
                   "(acc or acc_norm)." + (f" Missing task files: {', '.join(z['missing_tasks'])}."
                                          if z["missing_tasks"] else "")))
    b.append(("table", ["model", *[f"{t} ({metric[t]})" for t in tasks], "commonsense avg"], rows))
    if scored & set(PERPLEXITY_TASKS):
        b += perplexity_blocks(z["models"])
    if z.get("max_length"):
        first = next(iter(z["models"].values()), {"tasks": {}})["tasks"]
        counts = ", ".join(f"{t} {first[t]['n']} scored, {first[t].get('dropped_docs', 0)} left out"
                           for t in tasks if t in first)
        b.append(("p", f"Every model read the same inputs: contexts cut from the left to {z['max_length']} tokens (the "
                       "shortest window among these models), and items whose answer alone is longer left out for "
                       f"all ({counts})."))
    for name, why in (z.get("not_scored") or {}).items():
        b.append(("p", f"{name} was not scored: {why}"))
    if z.get("spread"):
        b += spread_blocks(z["spread"], "commonsense average", ".3f")
    return b


# The paper's perplexity columns (WikiText-2 and LAMBADA), shown in a table of their own.
PERPLEXITY_TASKS = ("wikitext2", "lambada")
PERPLEXITY_COLUMNS = (("wikitext2", "word_perplexity", "WikiText-2 word ppl", ".2f"),
                      ("wikitext2", "byte_perplexity", "WikiText-2 byte ppl", ".4f"),
                      ("wikitext2", "bits_per_byte", "WikiText-2 bits/byte", ".4f"),
                      ("lambada", "perplexity", "LAMBADA ppl", ".2f"), ("lambada", "acc", "LAMBADA acc", ".3f"))


def perplexity_blocks(models: dict) -> Blocks:
    """The paper's perplexity table: WikiText-2 (lm-eval's wikitext: word and byte perplexity, bits per byte over
    whole articles) and LAMBADA (perplexity of the last word, greedy accuracy), one row per model."""
    cols = [c for c in PERPLEXITY_COLUMNS if any(c[0] in m["tasks"] for m in models.values())]
    rows = [[label, *[format(m["tasks"][t][k], spec) if t in m["tasks"] and k in m["tasks"][t] else "-"
                      for t, k, _, spec in cols]] for label, m in models.items()]
    return [("p", "Perplexities, as the paper reports them: WikiText-2's test articles scored whole and counted as "
                  "lm-evaluation-harness' wikitext task counts them, and LAMBADA's last word (lower is better; "
                  "LAMBADA acc: greedy decoding reproduces the word)."),
            ("table", ["model", *[c[2] for c in cols]], rows)]


SECTION = Section("zeroshot", run, 0.05, needs=("scaling", "compare"),
                  settings=("overrides", "scaling_dir", "data_dir", "seeds"), check=check, render=render, report_rank=4,
                  key="zeroshot", options=ZeroshotSettings,
                  plan=lambda p: f"zero-shot: with --data-dir, {p.zeroshot.items()}, for the scaling sweep's largest "
                                 "models and every seed of the comparison")
