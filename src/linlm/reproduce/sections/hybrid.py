"""The hybrid question, on retrieval: does one softmax-attention layer in k give a linear model back the recall
that its fixed-size state loses? (``hybrid``, in DIR/hybrid.)

Each linear architecture of the study trains three ways on the same MQAR stream (the task the ``mqar`` section
uses, with enough pairs that a small state binds), at one width and depth: the linear model as it is; the same
stack with one attention layer in ``every`` (``attn_every``, linlm.layers.hybrid: a full causal attention layer, or
a sliding-window one with ``window``); and LLaMA, every layer attention. The three share the width, the depth, the
batch, the step budget and the plateau rule, so they train on equal tokens at nearly equal compute (each run's
FLOPs per token are recorded beside it). Each trains at the learning rate the ``mqar`` section's sweep chose for
its architecture (the hybrid at its linear model's). The claim (linlm.reproduce.claims.hybrid) reads the accuracy
of each hybrid against its linear model and against LLaMA, paired by seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from linlm.errors import ConfigError
from linlm.eval.mqar import MQARConfig, pairs_text
from linlm.reproduce.section import Blocks, Section, Tick, heading, setting
from linlm.reproduce.sections.mqar_training import TrainSettings, runs_blocks, seconds, train
from linlm.reproduce.sections.retrieval_studies import chosen_lr, study_result

LINEAR, HYBRID, ATTENTION = "linear", "hybrid", "attention"


@dataclass
class HybridSettings(TrainSettings):
    """The recipe's ``hybrid:`` ([] archs: not run)."""

    task: MQARConfig = setting(MQARConfig(vocab_size=128, num_kv=16), "the task (as mqar's)")
    archs: list[str] = setting([], "linear architectures, each trained alone and with attention layers ([]: the "
                                   "study is not run)")
    width: int = setting(64, "d_model of every model")
    every: int = setting(4, "one attention layer in this many (attn_every): layers every-1, 2 every-1, ...")
    window: int = setting(0, "the attention layers' sliding window in tokens (0: full causal attention)")

    def validate(self) -> "HybridSettings":
        from linlm.models.registry import arch_names, baseline_arch

        self.task.validate()
        self.check_training()
        if self.width < 1 or self.width % self.head_dim:
            raise ConfigError(f"width: {self.width}; give a multiple of head_dim {self.head_dim}")
        if self.archs:
            known = [a for a in arch_names() if a != baseline_arch()]
            bad = [a for a in self.archs if a not in known]
            if bad:
                raise ConfigError(f"archs: {bad} cannot take attention layers; give linear architectures "
                                  f"({', '.join(known)})")
        if self.archs and not 2 <= self.every <= self.n_layers:
            raise ConfigError(f"every: {self.every}; give 2 to n_layers ({self.n_layers}): one attention layer in "
                              "that many, and at least one linear layer")
        if self.window < 0:
            raise ConfigError(f"window: {self.window}; give 0 (full attention) or a window of 1 token or more")
        return self

    def attention(self) -> dict:
        """The model config keys that make a linear stack a hybrid."""
        return {"attn_every": self.every, **({"attn_window": self.window} if self.window else {})}

    def label(self) -> str:
        return f"attn{self.every}" + (f"w{self.window}" if self.window else "")

    def configs(self) -> list:
        from linlm.experiments.mqar_grid import MQARRun
        from linlm.models.registry import baseline_arch

        w = self.width
        runs = [MQARRun(baseline_arch(), w, study={"hybrid": ATTENTION})] if self.archs else []
        for a in self.archs:
            runs += [MQARRun(a, w, study={"hybrid": LINEAR}),
                     MQARRun(a, w, f"{a}-{self.label()}-d{w}", self.attention(), study={"hybrid": HYBRID})]
        return runs


def run(job, tick: Tick) -> Optional[dict]:
    from linlm.experiments.mqar_grid import counted

    s = job.recipe.hybrid
    if not s.archs:
        return {"not_run": f"recipe {job.recipe.name} gives no hybrid archs (its key hybrid: {{archs: [...]}} runs "
                           "the study)"}
    rows, _ = train(s, s.task, s.configs(), job.out / "hybrid", tick, lambda c: chosen_lr(job, c.arch))
    # Each configuration's training FLOPs per token of the body (forward and backward, counted from the layer shapes).
    shape = {"n_layers": s.n_layers, "head_dim": s.head_dim, "vocab_size": s.task.vocab_size,
             "seq_len": s.task.seq_len}
    flops = {c.name(): float(counted(c, shape)["counted_flops_per_token"]) for c in s.configs()}
    for r in rows:
        r["flops_per_token"] = flops.get(r["name"])
    return {**study_result(s, s.task, rows, [LINEAR, HYBRID, ATTENTION], "hybrid"), "every": s.every,
            "window": s.window}


def render(job, pending: list[str]) -> Blocks:
    b, res = heading(job, "Hybrid stacks (retrieval)", pending, "hybrid")
    if res is None:
        return b
    window = f", a sliding window of {res['window']} tokens" if res.get("window") else ", full causal attention"
    b.append(("p", f"Each linear model alone, with one attention layer in {res['every']}{window}, and LLaMA, at one "
                   f"width and depth. MQAR, {pairs_text(res['task'])}, chance {res['chance']:.3f}: "
                   f"{res['training']}. Each cell: accuracy, the mean over seeds (min-max), and the body's training "
                   "GFLOPs per 1K tokens (counted from the layer shapes)."))
    rows = []
    for name in dict.fromkeys(r["name"] for r in res["runs"]):
        mine = [r for r in res["runs"] if r["name"] == name]
        acc = [r["accuracy"] for r in mine if r.get("accuracy") is not None]
        f = mine[0].get("flops_per_token")
        rows.append([name, (mine[0].get("study") or {}).get("hybrid", "-"),
                     f"{sum(acc) / len(acc):.3f} ({min(acc):.3f}-{max(acc):.3f})" if acc else "-",
                     "-" if f is None else f"{f * 1e3 / 1e9:.3g}"])
    b.append(("table", ["configuration", "layers", "accuracy", "GFLOPs / 1K tokens"], rows))
    return b + runs_blocks(res)


def plan(p) -> str:
    s = p.hybrid
    if not s.archs:
        return "hybrid: not in this recipe"
    return (f"hybrid: {', '.join(s.archs)} alone and with one attention layer in {s.every}"
            f"{f' (window {s.window})' if s.window else ''}, and LLaMA, at d={s.width}, {s.n_layers} layers; "
            f"{s.how()}")


SECTION = Section("hybrid", run, 0.08, needs=("mqar",), report_rank=9, trees=("hybrid",), key="hybrid",
                  options=HybridSettings, render=render, plan=plan,
                  estimate=lambda p: seconds(p.hybrid, p.hybrid.task, p.hybrid.configs()) if p.hybrid.archs else 0.0)
