"""The losses of a shape study's sweep (:mod:`linlm.scaling.studies`): every finished run scored on its data's
validation split, and, per architecture, the loss per shape and its spread across shapes.

How a run is scored: the first ``max_tokens`` tokens of the validation split, cut into disjoint windows of a
context, each window scored as in training (every token predicted from the tokens before it in its window); the
loss is the mean over every predicted token (nats/token). An aspect study scores each run at its training context
(one for the whole study). A context study scores each run twice: at its own context, and at the study's shortest
context, which every run has trained on; the spread across contexts is taken from the second, so that it measures
what training at a context did, not the extra context a longer window gives each token.

Per architecture: each shape's loss is the mean over its seeds; ``spread`` is the largest minus the smallest of
those means; ``seed_range`` the largest (max - min over seeds) of any one shape, or None with one seed per shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from linlm.errors import DataError

DEFAULT_MAX_TOKENS = 32_768


def window_loss(model, ids, window: int, batch: int = 16) -> float:
    """Mean loss (nats/token) of ``model`` over disjoint windows of ``window`` tokens of the 1-D tensor ``ids``."""
    import torch

    k = (len(ids) - 1) // window
    if k < 1:
        raise DataError(f"the validation text holds {len(ids)} tokens, fewer than one window of {window} plus one; "
                        "use a larger data.val_fraction or a shorter context")
    inputs = ids[:k * window].view(k, window)
    targets = ids[1:k * window + 1].view(k, window)
    total = 0.0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, k, batch):
                x = inputs[i:i + batch].to(model.device)
                y = targets[i:i + batch].to(model.device)
                total += float(model(x, targets=y).loss) * len(x)
    finally:
        model.train(was_training)
    return total / k


def study_runs(root: Path) -> list[dict]:
    """The finished runs of a study's sweep directory (:func:`linlm.scaling.runs.finished_runs` of a study)."""
    from linlm.scaling.runs import finished_runs

    return [r for r in finished_runs(root) if r["study"]]


def shape_label(study: dict) -> str:
    return study["shape"] if study.get("kind") == "aspect" else f"ctx{study['context']}"


def _order(study: dict) -> tuple:
    return (study.get("d_model", 0), study.get("n_layers", 0)) if study.get("kind") == "aspect" else (
        study.get("context", 0),)


def summarize(kind: str, rows: list[dict], key: str) -> dict:
    """Per architecture: {shapes: {label: {loss, seeds, params}}, spread, seed_range, best} of the loss ``key`` of
    each row (a scored run)."""
    archs: dict[str, dict] = {}
    for row in sorted(rows, key=lambda r: (_order(r["study"]), r["study"].get("seed", 0))):
        shapes = archs.setdefault(row["arch"], {"shapes": {}})["shapes"]
        cell = shapes.setdefault(shape_label(row["study"]), {"seeds": {}, "params": row["params"]})
        cell["seeds"][str(row["study"].get("seed", 0))] = row[key]
    for a in archs.values():
        for cell in a["shapes"].values():
            vals = list(cell["seeds"].values())
            cell["loss"] = sum(vals) / len(vals)
        means = {label: c["loss"] for label, c in a["shapes"].items()}
        a["spread"] = max(means.values()) - min(means.values())
        a["best"] = min(means, key=means.get)
        ranges = [max(c["seeds"].values()) - min(c["seeds"].values()) for c in a["shapes"].values()
                  if len(c["seeds"]) > 1]
        a["seed_range"] = max(ranges) if ranges else None
    return {"kind": kind, "loss": key, "archs": archs}


def study_losses(root: str | Path, *, max_tokens: int = DEFAULT_MAX_TOKENS,
                 on_fraction: Optional[Callable[[float], None]] = None) -> Optional[dict]:
    """Every finished run of the study in ``root`` scored (see the module doc), and the summary per architecture;
    None while no run has finished."""
    import torch

    from linlm.data.loader import TokenDataset
    from linlm.infer.generate import load_for_generation

    root = Path(root)
    runs = study_runs(root)
    if not runs:
        return None
    kinds = {r["study"].get("kind") for r in runs}
    if len(kinds) != 1:
        raise DataError(f"{root}: its runs come from studies of different kinds ({sorted(map(str, kinds))}); "
                        "score each study's directory on its own")
    kind = kinds.pop()
    common = min(r["seq_len"] for r in runs)
    for i, r in enumerate(runs):
        model, _ = load_for_generation(r["checkpoint"])
        ds = TokenDataset(r["data_dir"], "val")
        ids = torch.as_tensor(ds.read(0, min(ds.num_tokens, max_tokens)), dtype=torch.long)
        r["val_loss"] = window_loss(model, ids, r["seq_len"])
        r["val_loss_common"] = r["val_loss"] if r["seq_len"] == common else window_loss(model, ids, common)
        if on_fraction is not None:
            on_fraction((i + 1) / len(runs))
    key = "val_loss_common" if kind == "context" else "val_loss"
    out = summarize(kind, runs, key)
    own = summarize(kind, runs, "val_loss")
    for arch, a in out["archs"].items():
        for label, cell in a["shapes"].items():
            cell["loss_own_context"] = own["archs"][arch]["shapes"][label]["loss"]
    out.update({"common_context": common, "max_tokens": max_tokens,
                "runs": [{k: r[k] for k in ("run", "arch", "params", "tokens", "study", "seq_len", "val_loss",
                                            "val_loss_common")} for r in runs]})
    return out


def study_downstream(root: str | Path, res: dict, *, data_dir: Optional[Path], haystack: str = "shakespeare",
                     limit: Optional[int] = None, trials: int = 4,
                     on_fraction: Optional[Callable[[float], None]] = None) -> dict:
    """The paper's tables of its shape studies: every finished run's final checkpoint scored on the downstream
    measures of :mod:`linlm.scaling.downstream` (the commonsense average, LAMBADA and WikiText-2 from
    ``data_dir``, NIAH always, each at the run's own training context), kept in ``root/downstream/RUN/`` so that
    a second call with the same settings scores nothing. Adds to ``res`` (:func:`study_losses`'s) each run's
    scores, and to each shape's cell the mean over its seeds of every measure (``downstream``); returns ``res``."""
    from linlm.scaling.downstream import MEASURES, OUT, Scorer
    from linlm.train.checkpoint import checkpoint_step

    scorer = Scorer(Path(root) / OUT, data_dir, haystack, limit, trials)
    by_run = {}
    runs = study_runs(Path(root))
    for i, r in enumerate(runs):
        ckpt = Path(r["checkpoint"])
        by_run[r["run"]], _ = scorer.scores(r["run"], checkpoint_step(ckpt), ckpt, r["seq_len"])
        if on_fraction is not None:
            on_fraction((i + 1) / len(runs))
    for row in res["runs"]:
        row["downstream"] = by_run.get(row["run"], {})
    for arch, a in res["archs"].items():
        for label, cell in a["shapes"].items():
            rows = [r["downstream"] for r in res["runs"] if r["arch"] == arch and shape_label(r["study"]) == label]
            cell["downstream"] = {m: sum(x[m] for x in rows if m in x) / n for m in MEASURES
                                  if (n := sum(m in x for x in rows))}
    res["downstream"] = {"settings": scorer.settings, "measures": [m for m in MEASURES if any(
        m in c["downstream"] for a in res["archs"].values() for c in a["shapes"].values())]}
    niah = [r["downstream"] for r in res["runs"] if "niah_band" in r["downstream"]]
    if niah:
        res["downstream"]["niah_chance"] = niah[0]["niah_chance"]
        res["downstream"]["niah_above_chance"] = sum(x["niah_mean"] > x["niah_band"] for x in niah)
    return res


def study_table(res: dict) -> tuple[list[str], list[list[str]]]:
    """The loss per shape per architecture as a table (header, rows), with the downstream measures' seed means
    where :func:`study_downstream` added them."""
    from linlm.scaling.downstream import MEASURES

    context = res["kind"] == "context"
    measures = (res.get("downstream") or {}).get("measures", [])
    head = ["arch", "context" if context else "shape (d/l)", "N (non-emb.)", "seeds",
            f"val loss at context {res['common_context']}" if context else "val loss",
            *(["val loss at own context"] if context else []), "spread across shapes", "seed range",
            *(MEASURES[m] for m in measures)]
    rows = []
    for arch, a in res["archs"].items():
        for i, (label, c) in enumerate(a["shapes"].items()):
            first = i == 0
            scores = c.get("downstream", {})
            rows.append([arch, label, f"{c['params']:,}", str(len(c["seeds"])), f"{c['loss']:.4f}",
                         *([f"{c['loss_own_context']:.4f}"] if context else []),
                         f"{a['spread']:.4f}" if first else "",
                         (f"{a['seed_range']:.4f}" if a["seed_range"] is not None else "-") if first else "",
                         *(f"{scores[m]:.4g}" if m in scores else "-" for m in measures)])
    return head, rows


def plot_study(res: dict, title: str) -> bytes:
    """The loss per shape, one line per architecture (its seeds as faint points), as PNG bytes."""
    from matplotlib.figure import Figure

    from linlm import outputs
    from linlm.models.registry import arch_color

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.subplots()
    for arch, a in res["archs"].items():
        labels = list(a["shapes"])
        xs = range(len(labels))
        ax.plot(xs, [a["shapes"][s]["loss"] for s in labels], "o-", color=arch_color(arch),
                label=f"{arch} (spread {a['spread']:.3f})")
        for x, s in zip(xs, labels):
            seeds = list(a["shapes"][s]["seeds"].values())
            ax.plot([x] * len(seeds), seeds, ".", color=arch_color(arch), alpha=0.35)
        ax.set_xticks(list(xs), labels)
    ax.set_xlabel("context" if res["kind"] == "context" else "shape (d_model, n_layers)")
    ax.set_ylabel("validation loss (nats/token)" + (f" at context {res['common_context']}"
                                                     if res["kind"] == "context" else ""))
    ax.set_title(title)
    ax.grid(True, alpha=0.25)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return outputs.figure_png(fig, 110)
