"""The shape studies, on retrieval: ``aspect`` (MQAR at several shapes of one size) and ``context`` (MQAR with the
pairs and queries ever further apart), each in DIR/NAME.

The paper's aspect-ratio and context-length claims are about retrieval (its aspect study: cosFormer2's collapses
at the shallowest shape; its context study: the linear models' retrieval depends on the training context), so
both studies measure MQAR accuracy, not validation loss. ``aspect`` trains each architecture at shapes
(d_model, n_layers) of about equal parameters, each of at least 3 layers; ``context`` at one shape with a gap of
filler tokens between the pairs and the queries (linlm.eval.mqar). The spread of accuracy across the shapes (the
contexts), per seed, is what the claims compare. Each architecture trains at the learning rate the ``mqar``
section's sweep chose for it (the recipe's lr without a sweep there).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Optional

from linlm.errors import ConfigError
from linlm.eval.mqar import MQARConfig, pairs_text
from linlm.reproduce.section import Blocks, Section, Tick, fmt, heading, setting
from linlm.reproduce.sections.mqar_training import TrainSettings, runs_blocks, seconds, train

STUDY_ARCHS = ["llama", "cosformer2"]


def _check_archs(archs: list[str]) -> None:
    from linlm.models.registry import arch_names

    unknown = [a for a in archs if a not in arch_names()]
    if not archs or unknown:
        raise ConfigError(f"archs: {archs}; give registered architectures ({', '.join(arch_names())})")


@dataclass
class AspectSettings(TrainSettings):
    """The recipe's ``aspect:`` ([] shapes: not run)."""

    task: MQARConfig = setting(MQARConfig(vocab_size=128, num_kv=16), "the task (as mqar's)")
    archs: list[str] = setting(STUDY_ARCHS, "architectures of the study")
    shapes: list[list[int]] = setting([], "[d_model, n_layers] of each shape: about equal parameters, each of at "
                                          "least 3 layers ([]: the study is not run)")

    def validate(self) -> "AspectSettings":
        self.task.validate()
        self.check_training()
        _check_archs(self.archs)
        if self.shapes:
            bad = [s for s in self.shapes if len(s) != 2 or s[1] < 3 or s[0] < 1 or s[0] % self.head_dim]
            if len(self.shapes) < 2 or bad:
                raise ConfigError(f"shapes: {self.shapes}; give 2 or more [d_model, n_layers], each of at least 3 "
                                  f"layers (the paper's are 8 to 32) with d_model a multiple of head_dim "
                                  f"{self.head_dim}")
        return self

    def configs(self) -> list:
        from linlm.experiments.mqar_grid import MQARRun

        return [MQARRun(a, d, f"{a}-l{n}-d{d}", {"n_layers": n}, study={"shape": f"d{d}-l{n}"})
                for a in self.archs for d, n in self.shapes]


@dataclass
class ContextSettings(TrainSettings):
    """The recipe's ``context:`` ([] gaps: not run)."""

    task: MQARConfig = setting(MQARConfig(vocab_size=128, num_kv=16), "the task without its gap (as mqar's)")
    archs: list[str] = setting(STUDY_ARCHS, "architectures of the study")
    width: int = setting(64, "d_model of every model")
    gaps: list[int] = setting([], "filler tokens between the pairs and the queries, one context each ([]: not run)")

    def validate(self) -> "ContextSettings":
        self.task.validate()
        self.check_training()
        _check_archs(self.archs)
        if self.width < 1 or self.width % self.head_dim:
            raise ConfigError(f"width: {self.width}; give a multiple of head_dim {self.head_dim}")
        if self.gaps and (len(set(self.gaps)) < 2 or min(self.gaps) < 0):
            raise ConfigError(f"gaps: {self.gaps}; give 2 or more different gaps >= 0")
        for g in self.gaps:
            self.task_at(g).validate()
        return self

    def task_at(self, gap: int) -> MQARConfig:
        return dataclasses.replace(self.task, gap=gap)

    def configs(self, gap: int) -> list:
        from linlm.experiments.mqar_grid import MQARRun

        ctx = self.task_at(gap).seq_len
        return [MQARRun(a, self.width, f"{a}-ctx{ctx}-d{self.width}", study={"context": ctx}) for a in self.archs]


def chosen_lr(job, arch: str) -> Optional[float]:
    """The learning rate the mqar section's sweep chose for ``arch`` at its largest width (None: no sweep)."""
    m = job.results.get("mqar") or {}
    sweep, widths = m.get("lr_sweep") or {}, [r["d_model"] for r in m.get("runs") or []]
    found = sweep.get(f"{arch}-d{max(widths)}") if widths else None
    return found["chosen"] if found else None


def study_result(settings, task: MQARConfig, rows: list[dict], levels: list, key: str) -> dict:
    """A study section's saved result: its task and chance, the ``key`` its runs are tagged by and that key's
    ``levels``, its settings, every run and their summary."""
    from linlm.experiments.mqar_summary import summarize

    return {"task": asdict(task), "chance": task.chance, "key": key, "levels": levels, "settings": asdict(settings),
            "training": settings.how(), "runs": rows, "rows": summarize(rows)}


def run_aspect(job, tick: Tick) -> Optional[dict]:
    s = job.recipe.aspect
    if not s.shapes:
        return {"not_run": f"recipe {job.recipe.name} gives no aspect shapes (its key aspect: {{shapes: [[d, l], "
                           "...]} runs the study)"}
    rows, _ = train(s, s.task, s.configs(), job.out / "aspect", tick, lambda c: chosen_lr(job, c.arch))
    return study_result(s, s.task, rows, [f"d{d}-l{n}" for d, n in s.shapes], "shape")


def run_context(job, tick: Tick) -> Optional[dict]:
    s = job.recipe.context
    if not s.gaps:
        return {"not_run": f"recipe {job.recipe.name} gives no context gaps (its key context: {{gaps: [...]}} runs "
                           "the study)"}
    rows = []
    for i, gap in enumerate(s.gaps):
        part = lambda f, i=i: tick((i + f) / len(s.gaps))  # noqa: E731
        found, _ = train(s, s.task_at(gap), s.configs(gap), job.out / "context" / f"gap{gap}", part,
                         lambda c: chosen_lr(job, c.arch))
        rows += found
    return study_result(s, s.task, rows, [s.task_at(g).seq_len for g in s.gaps], "context")


def study_blocks(job, name: str, title: str, about: str, pending: list[str]) -> Blocks:
    b, res = heading(job, title, pending, name)
    if res is None:
        return b
    key, levels = res["key"], res["levels"]
    b.append(("p", f"{about} MQAR, {pairs_text(res['task'])}, chance {res['chance']:.3f}: {res['training']}. "
                   "Each cell: accuracy, the mean over seeds (min-max); spread: the largest minus the smallest mean "
                   "across the columns (the claim compares it per seed)."))
    rows = []
    for arch in dict.fromkeys(r["arch"] for r in res["runs"]):
        means = []
        cells = []
        for level in levels:
            acc = [r["accuracy"] for r in res["runs"] if r["arch"] == arch and (r.get("study") or {}).get(key) == level
                   and r.get("accuracy") is not None]
            means.append(sum(acc) / len(acc) if acc else None)
            cells.append(f"{means[-1]:.3f} ({min(acc):.3f}-{max(acc):.3f})" if acc else "-")
        known = [m for m in means if m is not None]
        rows.append([arch, *cells, fmt(max(known) - min(known), ".3f") if known else "-"])
    b.append(("table", ["arch", *map(str, levels), "spread"], rows))
    return b + runs_blocks(res)


ASPECT = Section("aspect", run_aspect, 0.12, needs=("mqar",), report_rank=8, trees=("aspect",), key="aspect",
                 options=AspectSettings,
                 render=lambda job, pending: study_blocks(
                     job, "aspect", "Shape: aspect ratio (retrieval)",
                     "Shapes of about equal parameters (the paper's 1B study: d/l = 1536/32 ... 3072/8).", pending),
                 plan=lambda p: (f"aspect: {', '.join(p.aspect.archs)} at shapes "
                                 f"{', '.join(f'd{d}-l{n}' for d, n in p.aspect.shapes)}; {p.aspect.how()}"
                                 if p.aspect.shapes else "aspect: not in this recipe"),
                 estimate=lambda p: seconds(p.aspect, p.aspect.task, p.aspect.configs()) if p.aspect.shapes else 0.0)
CONTEXT = Section("context", run_context, 0.08, needs=("mqar",), report_rank=9, trees=("context",), key="context",
                  options=ContextSettings,
                  render=lambda job, pending: study_blocks(
                      job, "context", "Shape: context length (retrieval)",
                      "One shape, the pairs and the queries apart by a gap of filler tokens: the columns are the "
                      "sequence lengths (the paper's 1B model at 2K, 4K and 16K).", pending),
                  plan=lambda p: (f"context: {', '.join(p.context.archs)} at sequence lengths "
                                  f"{', '.join(str(p.context.task_at(g).seq_len) for g in p.context.gaps)}; "
                                  f"{p.context.how()}" if p.context.gaps else "context: not in this recipe"),
                  estimate=lambda p: sum(seconds(p.context, p.context.task_at(g), p.context.configs(g))
                                         for g in p.context.gaps))
