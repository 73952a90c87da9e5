"""DIR/report.md and DIR/report.html of a reproduce job: the claims table first, then every section's tables and
plots, then the exact configuration, the versions and the git revision."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from linlm import outputs
from linlm.reproduce.claims import Claim, judge


@dataclass
class Written:
    md: Path
    html: Path
    claims: list[Claim]

    def __fspath__(self) -> str:
        return str(self.md)

    def __str__(self) -> str:
        return str(self.md)


def _f(x, fmt: str = ".4f") -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "-"


def _img(job, name: str) -> Optional[tuple]:
    path = job.plots / name
    return ("img", f"plots/{name}", path.read_bytes()) if path.is_file() else None


def _missing(job, name: str, pending: list[str]) -> Optional[str]:
    if name in job.failures:
        return f"This section failed: {job.failures[name]} (details in errors.log; run the command again to retry)."
    if name in job.waiting:
        return f"Not run yet: {job.waiting[name]}."
    if name in pending or name not in job.results:
        return "Not run yet: its training runs have not finished (run the same command again)."
    return None


def claims_blocks(claims: list[Claim]) -> list[tuple]:
    rows = [[c.claim, c.paper, c.verdict, c.evidence, c.rule] for c in claims]
    return [("h2", "Claims"),
            ("p", "Each verdict is computed from this run's numbers by the rule beside it (linlm/reproduce/claims.py). "
                  "'not supported at this scale' means the measurement cannot decide (no fit, or every model at "
                  "chance), not that the claim is false."),
            ("table", ["claim", "paper", "verdict", "numbers", "rule (threshold)"], rows)]


def scaling_blocks(job, pending: list[str]) -> list[tuple]:
    b = [("h2", "Scaling laws (LLaMA, TNL, HGRN2, cosFormer2)")]
    why = _missing(job, "fits", pending) or _missing(job, "scaling", pending)
    if why:
        return b + [("p", why)]
    fits = job.results["fits"]
    b.append(("p", f"Ladder {job.preset.scaling['ladder']!r}: {len(fits['runs'])} runs. The full scaling report, "
                   "with IsoFLOP profiles, L(N, D) and bootstrap intervals, is scaling_report/report.md. C is in "
                   "PFLOP/s-days, counted with the paper's convention."))
    rows = []
    for arch, f in fits["archs"].items():
        env = f.get("envelope") or {}
        law, n_opt, d_opt = env.get("L(C)"), env.get("N_opt(C)"), env.get("D_opt(C)")
        paper = (f.get("paper") or {}).get("L(C)") or {}
        rows.append([arch, str(f["runs"]), _f(law and law["alpha"]), _f(law and law["beta"]), _f(law and law["r2"], ".3f"),
                     _f(n_opt and n_opt["alpha"]), _f(d_opt and d_opt["alpha"]), _f(paper.get("alpha"))])
    b.append(("table", ["arch", "runs", "L(C) alpha", "L(C) beta", "R²", "N_opt alpha", "D_opt alpha",
                        "paper L(C) alpha"], rows))
    errors = [m for f in fits["archs"].values() for m in (f.get("errors") or {}).values()]
    if errors:
        b.append(("p", "Fits that could not be made: " + " ".join(f"({i}) {m}" for i, m in enumerate(errors, 1))))
    png = Path(fits.get("report", {}).get("loss_vs_compute.png", ""))
    if png.is_file():
        b.append(("img", "plots/loss_vs_compute.png", png.read_bytes()))
    return b


def quality_blocks(job, name: str, title: str, pending: list[str]) -> list[tuple]:
    b = [("h2", title)]
    why = _missing(job, name, pending)
    if why:
        return b + [("p", why)]
    q = job.results[name]
    rows = [[label, m["arch"], f"{m['params']:,}", f"{m['tokens']:,}", _f(m["train_loss"]), _f(m["val_loss"]),
             _f(m["bits_per_byte"]), _f(m["token_perplexity"], ".2f"), f"{m['scored_tokens']:,}"]
            for label, m in q["models"].items()]
    b.append(("p", "Validation loss (nats/token) and bits per byte on the same held-out text for every model: the "
                   "prepared validation split, decoded, scored in sliding windows of the training context with a "
                   "half-window stride."))
    b.append(("table", ["model", "arch", "active N", "training tokens", "final train loss", "val loss",
                        "bits/byte", "perplexity", "tokens scored"], rows))
    return b


def zeroshot_blocks(job, pending: list[str]) -> list[tuple]:
    b = [("h2", "Zero-shot tasks")]
    why = _missing(job, "zeroshot", pending)
    if why:
        return b + [("p", why)]
    z = job.results["zeroshot"]
    if "not_run" in z:
        return b + [("p", f"Skipped: {z['not_run']}.")]
    tasks = sorted({t for m in z["models"].values() for t in m["tasks"]})
    rows = []
    for label, m in z["models"].items():
        cells = [f"{m['tasks'][t][m['tasks'][t]['metric']]:.3f}" if t in m["tasks"] else "-" for t in tasks]
        avg = m.get("commonsense_avg")
        rows.append([label, *cells, f"{avg['score']:.3f}" if avg else "-"])
    b.append(("p", f"From {z['data_dir']}, at most {z['limit']} items per task; each task's metric is the paper's "
                   "(acc or acc_norm)." + (f" Missing task files: {', '.join(z['missing_tasks'])}."
                                          if z["missing_tasks"] else "")))
    b.append(("table", ["model", *tasks, "commonsense avg"], rows))
    if z.get("max_length"):
        first = next(iter(z["models"].values()), {"tasks": {}})["tasks"]
        counts = ", ".join(f"{t} {first[t]['n']} scored, {first[t].get('dropped_docs', 0)} left out"
                           for t in tasks if t in first)
        b.append(("p", f"Every model read the same inputs: contexts cut from the left to {z['max_length']} tokens (the "
                       "shortest window among these models), and items whose answer alone is longer left out for "
                       f"all ({counts})."))
    for name, why in (z.get("not_scored") or {}).items():
        b.append(("p", f"{name} was not scored: {why}"))
    return b


def retrieval_blocks(job, pending: list[str]) -> list[tuple]:
    b = [("h2", "Retrieval: MQAR")]
    why = _missing(job, "mqar", pending)
    if why:
        b.append(("p", why))
    else:
        m = job.results["mqar"]
        b.append(("p", f"Multi-query associative recall: {m['task']['num_kv']} key-value pairs, vocabulary "
                       f"{m['task']['vocab_size']}, chance {m['chance']:.3f}. Each model is trained on MQAR and tested "
                       "on held-out sequences. MossNet E1 vs E4: the same model with one or several SSM experts."))
        rows = [[r["name"], r["arch"], str(r["d_model"]), f"{r['active_params']:,}", f"{r['state_floats']:,}",
                 _f(r["final_loss"]), _f(r["accuracy"], ".3f")] for r in m["rows"]]
        b.append(("table", ["model", "arch", "d", "active N", "state (floats)", "final loss", "accuracy"], rows))
        img = _img(job, m["plot"])
        if img:
            b.append(img)
    b.append(("h2", "Retrieval: needle in a haystack"))
    why = _missing(job, "niah", pending)
    if why:
        return b + [("p", why)]
    n = job.results["niah"]
    b.append(("p", f"Mode {n['settings'].get('mode', 'standard')}, haystack from the validation text; mean accuracy "
                   "over the grid and the weighted score (long contexts and deep needles weigh more)."))
    b.append(("table", ["model", "arch", "lengths", "mean", "weighted"],
              [[k, v["arch"], ", ".join(map(str, v["lengths"])), _f(v["mean"], ".3f"), _f(v["weighted"], ".3f")]
               for k, v in n["models"].items()]))
    for v in n["models"].values():
        img = _img(job, v["plot"])
        if img:
            b.append(img)
    return b


def decode_blocks(job, pending: list[str]) -> list[tuple]:
    b = [("h2", "Decoding: speed and memory against context length")]
    why = _missing(job, "decode", pending)
    if why:
        return b + [("p", why)]
    d = job.results["decode"]
    env = d["environment"]
    b.append(("p", f"Random weights at the comparison's shapes; {env.get('torch_num_threads')} thread(s), load "
                   f"average {_f(env.get('load_average_1min'), '.1f')} when measured. State = the decoding state "
                   "(LLaMA: its KV cache)."))
    rows = [[r["arch"], str(r["context"]), _f(r.get("decode_ms_per_token"), ".2f"),
             _f(r.get("prefill_tokens_per_s"), ".0f"),
             _f((r.get("peak_memory_bytes") or 0) / 2**20, ".1f") if r.get("peak_memory_bytes") else "-",
             f"{r['state_bytes']:,}" if r.get("state_bytes") else "-", r.get("error") or ""] for r in d["rows"]]
    b.append(("table", ["arch", "context", "decode ms/token", "prefill tokens/s", "peak MiB", "state bytes",
                        "error"], rows))
    img = _img(job, d["plot"])
    if img:
        b.append(img)
    return b


def _data_dir_used(job, marker: dict) -> str:
    """The directory the zero-shot section read, once it has run; before, the one it will read."""
    used = (job.results.get("zeroshot") or {}).get("data_dir")
    if used:
        return used
    return f"{marker.get('data_dir') or 'none given'} (the section has not run)"


def provenance_blocks(job, marker: dict) -> list[tuple]:
    v = marker["versions"]
    return [("h2", "Configuration and versions"),
            ("table", ["item", "value"], [["preset", job.preset.name], ["linlm", v["linlm"]],
                                           ["git revision", v.get("git") or "not a git checkout"],
                                           ["torch", v["torch"]], ["numpy", v["numpy"]], ["python", v["python"]],
                                           ["platform", v["platform"]], ["started", marker["created"]],
                                           ["data dir (zero-shot)", _data_dir_used(job, marker)],
                                           ["scaling sweep", marker.get("scaling_dir") or "scaling/"],
                                           ["--set (every training run)", json.dumps(marker.get("overrides") or {})]]),
            ("p", "The preset, exactly as run (linlm/reproduce/presets/" + job.preset.name + ".yaml, with the ladder "
                  f"{job.preset.scaling['ladder']!r} from linlm/scaling/ladders/):"),
            ("pre", json.dumps(job.preset.source(), indent=1))]


def write(job, pending: list[str], marker: dict) -> Written:
    from linlm.scaling.report import render_html, render_markdown

    claims = judge(job.results)
    title = f"linlm reproduce: preset {job.preset.name}"
    intro = (f"{job.preset.description}. Both studies at this preset's scale on the built-in corpus: the scaling "
             "laws of LLaMA, TNL, HGRN2 and cosFormer2 (arXiv 2406.16690) and MossNet against Mamba and LLaMA "
             "(arXiv 2510.26182).")
    if pending:
        intro += f" Incomplete: {', '.join(pending)} not finished; run the same command again."
    blocks = [("h1", title), ("p", intro), *claims_blocks(claims), *scaling_blocks(job, pending),
              *quality_blocks(job, "compare_quality", "MossNet against Mamba and LLaMA (equal active parameters, "
                                                       "equal tokens)", pending),
              *quality_blocks(job, "quality", "Validation loss and bits per byte (largest rung per architecture)",
                              pending),
              *zeroshot_blocks(job, pending), *retrieval_blocks(job, pending), *decode_blocks(job, pending),
              *provenance_blocks(job, marker)]
    for blk in blocks:  # a plot the report shows from elsewhere (the scaling report's) is copied into plots/
        target = job.out / blk[1] if blk[0] == "img" else None
        if target is not None and not (target.is_file() and target.read_bytes() == blk[2]):
            outputs.write_bytes(target, blk[2], "--out")
    md, html = job.out / "report.md", job.out / "report.html"
    outputs.write_text(md, render_markdown(blocks), "--out")
    outputs.write_text(html, render_html(blocks, title=title), "--out")
    results = {"preset": job.preset.name, "sections": job.results, "failed": job.failures, "pending": pending,
               "waiting": job.waiting, "claims": [c.to_dict() for c in claims], "versions": marker["versions"],
               "settings": {k: marker.get(k) for k in ("overrides", "scaling_dir", "data_dir")}}
    outputs.write_json(job.out / "results.json", results, "--out")
    return Written(md, html, claims)
