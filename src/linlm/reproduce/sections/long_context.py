"""The ``long_context`` section: SCROLLS and the recall tasks (:mod:`linlm.eval.long_tasks`, run by
lm-evaluation-harness through linlm's adapter) for the largest model of each architecture of the scaling sweep,
each input cut from the left to that model's training context, as the paper cut them. The gpu and paper recipes
list the tasks; the others list none and the section says so (these tasks' inputs run to tens of thousands of
tokens, beyond what a CPU recipe's budget scores). Data the hub cannot give (offline, not cached) leave the section
not run, named in the report, tried again next time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from linlm.errors import ConfigError
from linlm.reproduce.section import Blocks, Section, Tick, fmt, heading, largest_models, setting


@dataclass
class LongContextSettings:
    """The recipe's ``long_context:``."""

    tasks: Union[str, list[str]] = setting([],
                                           "lm-eval's long-context tasks or groups (scrolls, recall); none: the "
                                           "section does not run")
    limit: Optional[int] = setting(None, "documents per task (null: every document)")

    def validate(self) -> "LongContextSettings":
        from linlm.cli_args import comma_list
        from linlm.eval.long_tasks import LONG_GROUPS, METRICS, split_tasks

        names = self.tasks if isinstance(self.tasks, list) else comma_list(self.tasks, "tasks", empty_ok=True)
        own, _ = split_tasks(names)
        if own:
            raise ConfigError(f"tasks: {', '.join(own)} are not long-context tasks; give {', '.join(METRICS)} or "
                              f"the groups {', '.join(LONG_GROUPS)}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit: {self.limit}; give at least 1 document per task, or null for every one")
        return self

    def names(self) -> list[str]:
        from linlm.cli_args import comma_list
        from linlm.eval.long_tasks import split_tasks

        names = self.tasks if isinstance(self.tasks, list) else comma_list(self.tasks, "tasks", empty_ok=True)
        return split_tasks(names)[1]


def run(job, tick: Tick) -> Optional[dict]:
    s = job.recipe.long_context
    names = s.names()
    if not names:
        return {"not_run": _why_none(job)}
    models = largest_models(job, "scaling")
    if not models:
        return None
    from linlm.errors import DataError
    from linlm.eval.long_tasks import run_long_tasks
    from linlm.infer.generate import load_for_generation

    out = {"tasks": names, "limit": s.limit, "models": {}}
    for i, (label, m) in enumerate(models.items()):
        model, tok = load_for_generation(m["checkpoint"])
        try:
            res = run_long_tasks(model, tok, names, limit=s.limit, max_context=m.get("seq_len"))
        except DataError as e:
            return {"not_run": str(e)}
        out["models"][label] = {"arch": m["arch"], "params": m["params"], **res}
        tick((i + 1) / len(models))
    return out


def _why_none(job) -> str:
    """Why a recipe that lists no tasks runs none, and, where its models' context says it, what the tasks could
    have said at its scale (nothing: no training runs here, so it costs nothing)."""
    from linlm.eval.long_tasks import RULER_ANSWER_TOKENS

    why = "this recipe lists no long-context tasks (the gpu and paper recipes do)"
    models = largest_models(job, "scaling") if hasattr(job, "sweep") else {}
    ctx = max((m.get("seq_len") or 0 for m in (models or {}).values()), default=0)
    if 0 < ctx <= RULER_ANSWER_TOKENS:
        why += (f": its largest models were trained on {ctx}-token contexts, which RULER's {RULER_ANSWER_TOKENS} "
                f"answer tokens alone fill, and of SCROLLS' inputs (thousands of tokens) the cut would keep the last "
                f"{ctx}, so no score of these tasks could order the architectures at this scale")
    return why


def render(job, pending: list[str]) -> Blocks:
    b, r = heading(job, "Long context: SCROLLS and recall (lm-evaluation-harness)", pending, "long_context")
    if r is None:
        return b
    from linlm.eval.long_tasks import METRICS

    cols = [(t, m) for t in r["tasks"] for m in METRICS[t]]
    rows = []
    for label, v in r["models"].items():
        c = v["cut"]
        rows.append([label, *[fmt(v["tasks"].get(t, {}).get(m), ".2f") for t, m in cols],
                     fmt(v.get("scrolls_avg"), ".2f"), f"{c['cut']}/{c['requests']} to {c['window']}"])
    b.append(("p", "lm-eval's own tasks and metrics (ROUGE, F1, EM on its 0-100 scale; `contains` for recall, "
                   "RULER's string match `acc` for its NIAH variants, 0-1, prompts made for the training context), "
                   "greedy answers from the recurrent state; each input cut from the left to the model's training "
                   "context (the question at the end stays), the count of cut requests beside."))
    b.append(("table", ["model", *[f"{t.replace('scrolls_', '')} {m}" for t, m in cols], "SCROLLS avg (13)",
                        "cut"], rows))
    values = [v["tasks"].get(t, {}).get(m) for v in r["models"].values() for t, m in cols]
    if values and all(x == 0 for x in values if x is not None):
        b.append(("p", "Not measurable at this scale: every model scores 0 on every task."))
    return b


SECTION = Section("long_context", run, 0.05, needs=("scaling",), settings=("overrides", "scaling_dir"),
                  render=render, report_rank=7, key="long_context", options=LongContextSettings,
                  plan=lambda p: (f"long context: {', '.join(p.long_context.names())} through lm-eval, cut to each "
                                  "largest model's training context" if p.long_context.names()
                                  else "long context: no tasks in this recipe"))
