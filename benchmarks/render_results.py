"""Render one Markdown page per results JSON: the tables come from the numbers, never from hand edits.

    python benchmarks/render_results.py                       # docs/results/*.json -> docs/results/*.md + index.md
    python benchmarks/render_results.py benchmarks/results    # a fresh `make bench` run's JSON, pages beside it
    python benchmarks/render_results.py --check               # exit 1 when a page differs from its JSON

Each X.json becomes X.md in the same folder, with the run's revision, machine (CPU name and flags), torch version
and command line (the `meta` block of benchmarks/_common.py), then the benchmark's tables; a PNG named like the
JSON is shown on its page. A benchmark is known by `meta.benchmark` (the script's name; older files by their own
name or `format`); benchmarks without a page of their own get every list of records as a table. This script reads
JSON only and runs no benchmark; its tables are linlm.render's Markdown tables, as the reports' are.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Callable, Iterable, Optional

from linlm.render import markdown_table

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / "docs" / "results"
RENDER_COMMAND = "python benchmarks/render_results.py"


def num(v, digits: int = 2) -> str:
    """A measured value: integers with thousands separators, floats by size (3 significant digits below 1)."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.{digits}f}"
        return f"{v:.3g}"
    return str(v)


def ratio(v) -> str:
    return "" if v is None else f"{v:.2f}x"


def pct(v) -> str:
    return "" if v is None else f"{100 * v:.1f} %"


def faults(v) -> str:
    return "" if v is None else (f"{v:,.1f}" if v < 100 else f"{v:,.0f}")


def plural(n, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def table(headers: list[str], rows: Iterable[list]) -> list[str]:
    """A Markdown table; cells are strings already (or values shown with `num`)."""
    return markdown_table(headers, list(rows), cell=lambda c: c if isinstance(c, str) else num(c))


def command_line(meta: dict) -> str:
    cmd = meta.get("command")
    if not cmd:
        return "not recorded"
    note = meta.get("command_note")
    return f"`{cmd}`" + (f" ({note})" if note else "")


def machine_rows(meta: dict) -> list[list[str]]:
    """Where and with what the numbers were measured; a field older files lack says so."""
    if not meta:
        return [["recorded", "no meta block in this file"]]
    missing = "not recorded"
    rev = meta.get("git_revision") or missing
    dirty = meta.get("git_dirty")
    if dirty is not None and rev != missing:
        rev += " (with uncommitted changes)" if dirty else " (clean)"
    cpu = meta.get("cpu") or {}
    name = cpu.get("model_name") or meta.get("cpu_model") or missing
    ident = ", ".join(f"{k} {cpu[k]}" for k in ("family", "model", "stepping") if cpu.get(k) is not None)
    machine = f"{name}" + (f" ({ident})" if ident else "")
    machine += f", {meta.get('machine') or '?'}, {meta.get('cpu_count') or '?'} CPUs"
    flags = cpu.get("bf16_flags")
    flag_text = missing if flags is None else (", ".join(flags) if flags else "none of avx2, avx512f, avx512_bf16, "
                                                                                  "amx_tile, amx_bf16")
    native = cpu.get("native_bf16")
    torch_text = meta.get("torch_version") or missing
    extra = [plural(meta["torch_num_threads"], "thread") if meta.get("torch_num_threads") else "",
             f"CPU capability {cpu['torch_cpu_capability']}" if cpu.get("torch_cpu_capability") else "",
             f"oneDNN {cpu['onednn_version']}" if cpu.get("onednn_version") else "",
             f"CUDA {meta['cuda']}" if meta.get("cuda") else ""]
    extra = [e for e in extra if e]
    if extra:
        torch_text += " (" + ", ".join(extra) + ")"
    alloc = meta.get("allocator_settings")
    rows = [["revision", rev], ["measured (UTC)", meta.get("utc_time") or missing],
            ["command", command_line(meta)], ["machine", machine], ["CPU flags (bf16-related)", flag_text],
            ["native bf16", missing if native is None else num(native)]]
    if meta.get("gpu"):
        rows.append(["GPU", meta["gpu"]])
    rows += [["torch", torch_text], ["python", meta.get("python_version") or missing],
             ["load average (1 min)", num(meta.get("load_average_1min")) or missing],
             ["allocator", "linlm's settings" if alloc else ("glibc's defaults" if "allocator_settings" in meta else missing)]]
    if meta.get("env"):
        rows.append(["environment", ", ".join(f"{k}={v}" for k, v in sorted(meta["env"].items()))])
    return rows


def header(title: str, json_name: str, meta: dict) -> list[str]:
    return [f"<!-- Generated by `{RENDER_COMMAND}` from {json_name}. Do not edit: rerun that command. -->",
            f"# {title}", "",
            f"Generated from [{json_name}]({json_name}) by `{RENDER_COMMAND}`; the tables are the file's numbers, "
            "so edit the renderer or rerun the benchmark, never this page.", "",
            *table(["", ""], machine_rows(meta)), ""]


def settings_table(values: dict) -> list[str]:
    rows = [[k, json.dumps(v) if isinstance(v, (list, dict)) else num(v)] for k, v in values.items()
            if k not in ("func",)]
    return table(["setting", "value"], rows) + [""]


def image(json_path: Path, alt: str) -> list[str]:
    png = json_path.with_suffix(".png")
    return [f"![{alt}]({png.name})", ""] if png.is_file() else []


def render_train_step(data: dict, path: Path) -> list[str]:
    rows = [r for r in data.get("results", []) if not r.get("hf")]
    hf_rows = [r for r in data.get("results", []) if r.get("hf")]
    phases = list(dict.fromkeys(r["name"] for r in rows))
    archs = list(dict.fromkeys(r["arch"] for r in rows))
    by = {(r["arch"], r["name"]): r for r in rows}
    out = header("Training-step throughput", path.name, data.get("meta", {}))
    if data.get("partial"):
        out += ["**Partial**: the run stopped before its last phase; the phases below finished.", ""]
    clock = {r.get("clock", "wall") for r in rows}
    per = "CPU second" if clock == {"cpu"} else "second"
    out += ["Forward + backward + AdamW, tokens per " + per + " (`benchmarks/bench_train_step.py`): every model of a "
            "phase is built first, then timed in interleaved rounds; medians. Ratios are within a phase.", ""]
    demo = data.get("demo") or {}
    if demo:
        ov = demo.get("overrides", {})
        out += [f"Phases: \"demo\" is the demo's model (d {ov.get('d_model')}, {ov.get('n_layers')} layers, "
                f"vocab {ov.get('vocab_size')}), batch {demo.get('batch')} x {demo.get('seq')} tokens on "
                f"{plural(demo.get('threads'), 'thread')}; \"paper-70m\" is that preset with vocabulary "
                f"{data.get('vocab')}, one sequence per step.", ""]
    out += ["## Tokens/s and ratio to our LLaMA", ""]
    headers = ["arch"] + [h for p in phases for h in (p, "vs our LLaMA")]
    out += table(headers, [[a] + [c for p in phases for c in (
        num(by[(a, p)]["tokens_per_s"]) if (a, p) in by else "",
        ratio(by[(a, p)].get("ratio_vs_our_llama")) if (a, p) in by else "")] for a in archs]) + [""]

    moss = [r for r in rows if "ratio_vs_mamba" in r]
    if moss:
        out += ["## MossNet against Mamba", "",
                "Equal-MFU ratio: Mamba's model FLOPs per step over the row's, the ratio the two would have at "
                "equal model-FLOPs utilisation.", ""]
        mamba = {r["name"]: r for r in rows if r["arch"] == "mamba"}
        out += table(["phase", "row", "vs Mamba", "round by round", "equal-MFU ratio", "MFU", "Mamba's MFU"], [
            [r["name"], r["arch"], ratio(r["ratio_vs_mamba"]),
             ", ".join(f"{x:.2f}" for x in r.get("ratio_vs_mamba_per_round", [])),
             ratio(mamba[r["name"]]["model_flops_per_step"] / r["model_flops_per_step"])
             if r["name"] in mamba else "",
             pct(r.get("mfu")), pct(mamba.get(r["name"], {}).get("mfu"))] for r in moss]) + [""]

    out += ["## Each phase", ""]
    for p in phases:
        out += [f"### {p}", ""]
        out += table(["arch", "tokens/s", "vs our LLaMA", "vs Mamba", "MFLOP/token", "MFU", "page faults/step",
                      "s/step", "steps/round"], [
            [r["arch"], num(r["tokens_per_s"]), ratio(r.get("ratio_vs_our_llama")), ratio(r.get("ratio_vs_mamba")),
             f"{r['model_flops_per_step'] / (r['batch'] * r['seq_len']) / 1e6:.3g}", pct(r.get("mfu")),
             faults(r.get("page_faults_per_step")), f"{r['seconds_per_step']:.3f}", num(r.get("steps_per_round"))]
            for r in rows if r["name"] == p]) + [""]
    if hf_rows:
        out += ["## Our LLaMA against transformers' LlamaForCausalLM", ""]
        out += table(["phase", "row", "tokens/s", "vs transformers", "round by round"], [
            [r["name"], r["arch"], num(r["tokens_per_s"]), ratio(r.get("ratio_vs_hf_llama")),
             ", ".join(f"{x:.2f}" for x in r.get("ratio_vs_hf_llama_per_round", []))] for r in hf_rows]) + [""]

    checks = data.get("target_checks") or []
    if checks:
        has_mfu = any("equal_mfu_ratio" in c for c in checks)
        out += ["## Targets", ""]
        hs = ["phase", "row / baseline", "ratio", "target", "met"]
        if has_mfu:
            hs += ["equal-MFU ratio", "MFU vs baseline's"]
        out += table(hs, [[c["phase"], f"{c['row']} / {c['baseline']}", ratio(c["ratio"]), f">= {c['target']}x",
                           num(c["met"])]
                          + ([ratio(c.get("equal_mfu_ratio")), ratio(c.get("mfu_vs_baseline"))] if has_mfu else [])
                          for c in checks]) + [""]
    ceilings = data.get("matmul_flops_per_s") or {}
    if ceilings:
        out += ["## Matmul ceilings", "", "MFU is against the best of several square matmuls, at the start and at the "
                "end of the run.", ""]
        out += table(["dtype / threads", "GFLOP/s"], [[k, f"{v / 1e9:.0f}"] for k, v in ceilings.items()]) + [""]
    return out


def render_eval(data: dict, path: Path) -> list[str]:
    out = header("Shared-context scoring of multiple-choice items", path.name, data.get("meta", {}))
    out += ["`benchmarks/bench_eval.py`: hellaswag-shaped items (4 choices) scored three ways, items/s: shared "
            "(one prefill of each context, its state reused for every choice), naive (a full pass per choice) and "
            "harness-style (a full pass per choice and a log-softmax over every position). Token ratio: token "
            "positions through the layers, naive over shared.", ""]
    out += settings_table(data.get("config", {}))
    rows = []
    for r in data.get("results", []):
        ips, tok = r.get("items_per_s", {}), r.get("forward_tokens", {})
        rows.append([r["arch"], num(ips.get("harness"), 1), num(ips.get("naive"), 1), num(ips.get("shared"), 1),
                     ratio(r.get("speedup_vs_harness_style")), ratio(r.get("speedup")),
                     ratio(tok["naive"] / tok["shared"]) if tok.get("shared") else "",
                     f"{r['max_abs_loglik_diff']:.1e}" if r.get("max_abs_loglik_diff") is not None else ""])
    out += table(["arch", "harness-style items/s", "naive items/s", "shared items/s", "vs harness-style", "vs naive",
                  "token ratio", "max abs log-likelihood difference"], rows) + [""]
    return out


def render_decode(data: dict, path: Path) -> list[str]:
    rows = [r for r in data.get("rows", []) if r.get("error") is None]
    contexts = data.get("contexts") or sorted({r["context"] for r in rows})
    out = header("Prefill and decoding against context", path.name, data.get("meta", {}))
    out += [f"`benchmarks/bench_decode.py` (`linlm profile`'s protocol): preset {data.get('preset')}, batch 1; a "
            f"prompt of n random tokens is prefilled, then {data.get('decode_tokens')} tokens are decoded from its "
            "state (median ms per token). Memory is the process's peak resident set during the prefill, less the "
            "resident set before it.", ""]
    eager = [r for r in rows if r.get("backend", "eager") == "eager"]
    fp32 = {(r["arch"], r["context"]): r for r in eager if r["dtype"] == "float32"}
    archs = list(dict.fromkeys(r["arch"] for r in eager))
    hi, lo = max(contexts), min(contexts)
    out += ["## Decode latency, float32 (ms/token)", ""]
    out += table(["arch"] + [str(n) for n in contexts] + [f"prefill tok/s at {hi}", f"prefill MiB at {hi}",
                                                         f"state MiB at {lo}", f"state MiB at {hi}"], [
        [a] + [num(fp32[(a, n)]["decode_ms_per_token"]) if (a, n) in fp32 else "" for n in contexts]
        + ([num(fp32[(a, hi)]["prefill_tokens_per_s"]),
            num((fp32[(a, hi)]["peak_memory_bytes"] - fp32[(a, hi)]["memory_before_bytes"]) / 2**20)
            if fp32[(a, hi)].get("peak_memory_bytes") is not None else "",
            num(fp32[(a, lo)]["state_bytes"] / 2**20) if (a, lo) in fp32 else "",
            num(fp32[(a, hi)]["state_bytes"] / 2**20)] if (a, hi) in fp32 else ["", "", "", ""])
        for a in archs]) + [""]
    other = [r for r in rows if r["dtype"] != "float32" or r.get("backend", "eager") != "eager"]
    if other:
        out += ["## Other precisions and exported steps", ""]
        out += table(["arch", "dtype", "step", "context", "decode ms/token", "prefill tok/s"], [
            [r["arch"], r["dtype"], r.get("backend", "eager"), num(r["context"]), num(r["decode_ms_per_token"]),
             num(r.get("prefill_tokens_per_s"))] for r in other]) + [""]
    inter = data.get("interleaved_llama_vs_hf") or {}
    if inter:
        out += ["## Our LLaMA against transformers' Llama, alternating rounds", ""]
        out += table(["context", "ours ms/token", "transformers ms/token", "ratio", "rounds"], [
            [n, num(v["llama_ms"]), num(v["hf_ms"]), num(v["ratio"], 3), num(len(v.get("rounds_ms", {}).get("llama", [])))]
            for n, v in inter.items()]) + [""]
    targets = data.get("targets") or []
    if targets:
        out += ["## Targets", "", "Each value as the benchmark recorded it (rounded there).", ""]
        out += table(["target", "value", "goal", "held"], [
            [t["target"], ", ".join(num(x) for x in t["value"]) if isinstance(t["value"], list) else str(t["value"]),
             t["goal"], "" if t["held"] is None else num(t["held"])] for t in targets]) + [""]
    out += image(path, "decode latency and prefill memory against context")
    return out


def acc3(v) -> str:
    """An accuracy to three decimals ("" for none: a run that diverged)."""
    return "" if v is None else f"{v:.3f}"


def spread(r: dict) -> str:
    return "" if r.get("accuracy_min") is None else f"{r['accuracy_min']:.3f}-{r['accuracy_max']:.3f}"


def render_mqar(data: dict, path: Path) -> list[str]:
    out = header("MQAR: associative recall against width and state size", path.name, data.get("meta", {}))
    task = data.get("mqar", {})
    out += [f"`linlm mqar` (the experiment's `results.json`): {task.get('num_kv')} key-value pairs and "
            f"{task.get('num_queries')} queries per sequence of {task.get('seq_len')} tokens, vocabulary "
            f"{task.get('vocab_size')}; accuracy over the held-out answers, and the fraction of sequences with every "
            "answer right. State: the decoding state's floats per sequence (LLaMA: its KV cache after the "
            "sequence), and per layer.", ""]
    out += ["## Settings", ""] + settings_table(data.get("settings", {}))
    configs = data.get("configs")
    if configs:
        seeds = data.get("seeds") or []
        out += ["## Configurations", "",
                f"Each configuration over {plural(len(seeds), 'seed')} ({', '.join(map(str, seeds))}): accuracy is "
                "the seeds' mean, spread their min-max (std: sample standard deviation). Convergence: the mean "
                "training loss of the last tenth of the steps against the tenth before it; \"still falling\" "
                "counts the seeds whose loss fell by more than 2 % between the two.", ""]
        out += table(["model", "arch", "E", "policy", "d", "layers", "active params", "state/layer", "diverged",
                      "accuracy", "min-max", "std", "all right", "loss, last window", "previous window",
                      "still falling"], [
            [c["name"], c["arch"], num(c.get("experts")), c.get("policy") or "", num(c["d_model"]),
             num(c["n_layers"]), num(c["active_params"]), num(c["state_per_layer"]),
             f"{c.get('diverged', 0)} of {len(c['seeds'])}", acc3(c["accuracy"]), spread(c), acc3(c["accuracy_std"]),
             acc3(c["sequence_accuracy"]), num(c.get("loss_last_window")), num(c.get("loss_prev_window")),
             "" if c.get("still_falling") is None else f"{c['still_falling']} of {len(c['seeds'])}"]
            for c in configs]) + [""]
        out += ["## Comparison groups", "",
                "Per width: the models within the tolerance of the reference's active parameters, and of its "
                "state per layer (one group per E); ratio is the member's measure over the reference's.", ""]
        for g in data.get("groups", []):
            what = g["kind"] + (f", E = {g['experts']}" if "experts" in g else "")
            out += [f"### {what}, d = {g['d_model']}", "",
                    f"Reference {g['reference']}; {g['measure']} within {100 * g['tolerance']:.0f} %.", ""]
            out += table(["model", "active params", "state/layer", "ratio", "accuracy", "min-max", "still falling"], [
                [m["name"], num(m["active_params"]), num(m["state_per_layer"]), f"{m['ratio']:.3f}",
                 acc3(m["accuracy"]), spread(m),
                 "" if m.get("still_falling") is None else f"{m['still_falling']} of {m['seeds']}"]
                for m in g["members"]]) + [""]
    out += ["## Runs", ""]
    out += table(["run", "arch", "seed", "d", "layers", "active params", "state (floats)", "accuracy", "all right",
                  "final train loss", "seconds", "diverged"], [
        [r.get("run", r["name"]), r["arch"], num(r.get("seed")), num(r["d_model"]), num(r["n_layers"]),
         num(r["active_params"]), num(r["state_floats"]), acc3(r["accuracy"]), acc3(r["sequence_accuracy"]),
         num(r["final_loss"]), num(r["seconds"], 0), r.get("diverged") or ""]
        for r in data.get("runs", [])]) + [""]
    out += image(path, "MQAR accuracy against state size and width")
    return out


def _flatten(record: dict) -> dict:
    flat = {}
    for k, v in record.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                if not isinstance(v2, (list, dict)):
                    flat[f"{k}.{k2}"] = v2
        elif not isinstance(v, list):
            flat[k] = v
    return flat


def render_generic(data: dict, path: Path) -> list[str]:
    """Every list of records as a table, every mapping of plain values as a settings table."""
    out = header(path.stem.replace("_", " "), path.name, data.get("meta", {}))
    plain = {k: v for k, v in data.items() if k != "meta" and not isinstance(v, (list, dict))}
    if plain:
        out += settings_table(plain)
    for key, value in data.items():
        if key == "meta":
            continue
        if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            flat = [_flatten(r) for r in value]
            cols = list(dict.fromkeys(c for r in flat for c in r))
            out += [f"## {key}", ""] + table(cols, [[r.get(c) for c in cols] for r in flat]) + [""]
        elif isinstance(value, dict) and value and all(not isinstance(v, (list, dict)) for v in value.values()):
            out += [f"## {key}", ""] + settings_table(value)
    return out


def _records(data: dict, key: str, field: str) -> bool:
    rows = data.get(key)
    return isinstance(rows, list) and bool(rows) and all(isinstance(r, dict) and field in r for r in rows)


# name -> (renderer, whether a file of that benchmark has the shape the renderer reads: a benchmark's other modes,
# such as bench_train_step.py --memory, write other records and get the generic page)
RENDERERS: dict[str, tuple[Callable[[dict, Path], list[str]], Callable[[dict], bool]]] = {
    "bench_train_step": (render_train_step, lambda d: _records(d, "results", "tokens_per_s")),
    "bench_eval": (render_eval, lambda d: _records(d, "results", "items_per_s")),
    "bench_decode": (render_decode, lambda d: _records(d, "rows", "decode_ms_per_token")),
    "linlm-mqar": (render_mqar, lambda d: _records(d, "runs", "accuracy")),
}


def benchmark_of(data: dict, path: Path) -> Optional[str]:
    """Which benchmark wrote the file: meta.benchmark, a `format` field, else the longest known prefix of its name."""
    name = (data.get("meta") or {}).get("benchmark") or data.get("format")
    if name in RENDERERS:
        return name
    known = [k for k in RENDERERS if path.stem == k or path.stem.startswith(k + "_")]
    return max(known, key=len) if known else None


def render(path: Path) -> str:
    """The page of one results file."""
    data = json.loads(path.read_text(encoding="utf-8"))
    renderer, fits = RENDERERS.get(benchmark_of(data, path), (render_generic, None))
    lines = (renderer if fits is None or fits(data) else render_generic)(data, path)
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def render_index(pages: dict[Path, str]) -> str:
    """The folder's index.md: one line per page, with its revision, CPU and date."""
    lines = [f"<!-- Generated by `{RENDER_COMMAND}`. Do not edit: rerun that command. -->", "# Results", "",
             f"One page per results file in this folder, generated by `{RENDER_COMMAND}` from the JSON the benchmark "
             "wrote. To add one, copy a JSON file from benchmarks/results/ here and rerun that command.", ""]
    rows = []
    for page, text in pages.items():
        meta = json.loads(page.with_suffix(".json").read_text(encoding="utf-8")).get("meta") or {}
        title = next((ln[2:] for ln in text.splitlines() if ln.startswith("# ")), page.stem)
        cpu = (meta.get("cpu") or {}).get("model_name") or meta.get("cpu_model") or "not recorded"
        rev, date = meta.get("git_revision"), meta.get("utc_time")
        rows.append([f"[{page.name}]({page.name})", title, rev[:7] if rev else "not recorded", cpu,
                     date[:10] if date else "not recorded"])
    return "\n".join(lines + table(["page", "what", "revision", "CPU", "date"], rows)) + "\n"


def render_folder(folder: Path, check: bool = False) -> list[Path]:
    """Render every *.json in folder into X.md, and index.md; with check, write nothing and return the pages that
    differ from what their JSON renders."""
    pages = {src.with_suffix(".md"): render(src) for src in sorted(folder.glob("*.json"))}
    if pages:
        pages[folder / "index.md"] = render_index(pages)
    stale = []
    for page, text in pages.items():
        if check:
            if not page.is_file() or page.read_text(encoding="utf-8") != text:
                stale.append(page)
        else:
            page.write_text(text, encoding="utf-8")
    return stale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", type=Path, default=[DEFAULT_DIR],
                    help="folders of results JSON (default: docs/results)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs from its JSON")
    args = ap.parse_args(argv)
    stale = []
    for folder in args.folders:
        if not folder.is_dir():
            print(f"render_results: {folder} is not a directory", file=sys.stderr)
            return 2
        stale += render_folder(folder, check=args.check)
    if args.check and stale:
        print("out of date (run `" + RENDER_COMMAND + "`): " + ", ".join(str(p) for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
