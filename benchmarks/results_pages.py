"""One renderer per benchmark that has a page of its own (train step, eval, decode, MQAR), the generic page
for the rest (every list of records as a table), and RENDERERS, which maps a benchmark's name to its page."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from results_format import faults, header, image, num, pct, plural, ratio, settings_table, table


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


def render_reproduce(data: dict, path: Path) -> list[str]:
    recipe = data.get("recipe", {})
    out = header(f"linlm reproduce: recipe {recipe.get('name')}", path.name, data.get("meta", {}))
    judged = data.get("judged_at")
    judged = (judged[:7] if judged else "not recorded") + (" (with uncommitted changes)" if data.get("judged_dirty")
                                                           else "")
    claims = data.get("claims", [])
    if "evidence" in data:  # judged by the one rule; the file holds what every verdict needs to be computed again
        out += [f"{recipe.get('description', '')}. The job ran as the command above, at the revision above; its "
                f"claims were judged from its saved sections by linlm/reproduce/claims/ at revision {judged} "
                "(benchmarks/publish_reproduce.py), by one rule: each difference's 95 % interval over the unit that "
                "varies (seeds, or seed replicates of a fit), Holm's correction over every difference tested, "
                "'alike' only by two one-sided tests within a stated margin. This file holds the per-seed values, "
                "replicates and fitted points the verdicts rest on, and a test computes every verdict again from "
                "it. The job's own report holds every section's tables and plots.", ""]
        out += ["## Claims", ""]
        out += table(["claim", "verdict", "scale", "differences (95 % interval, p) and numbers", "judged by"],
                     [[c["claim"], c["verdict"] + (f": {c['why']}" if c.get("why") else ""), c.get("scale") or "-",
                       c["evidence"], c["difference"]] for c in claims])
    else:
        out += [f"{recipe.get('description', '')}. The job ran as the command above, at the revision above; its "
                f"claims were judged from its saved sections by linlm/reproduce/claims.py at revision {judged}"
                " (benchmarks/publish_reproduce.py). Each verdict follows the rule beside it; the job's own report "
                "holds every section's tables and plots.", "",
                "These verdicts follow the rules of that revision, before linlm judged every claim by one rule "
                "(intervals over seeds or seed replicates, Holm's correction, 'alike' only by an equivalence test). "
                "This file keeps the verdicts, not the per-seed values, replicates and fitted points the current "
                "rule needs, so they cannot be judged again from it; a new run of the recipe replaces them.", ""]
        out += ["## Claims", ""]
        out += table(["claim", "paper", "verdict", "evidence", "rule"],
                     [[c["claim"], c["paper"], c["verdict"], c["evidence"], c["rule"]] for c in claims])
    if recipe.get("tradeoffs"):
        out += ["", "## What the recipe's size gives up", "",
                "Each choice lowers the power of the claims that rest on that section (the recipe's `tradeoffs`).", ""]
        out += table(["section", "choice and its price"], [[k, v] for k, v in recipe["tradeoffs"].items()])
    pauses = data.get("paused") or []
    stopped = ("; the job was stopped and continued, and its time stopped is not counted: "
               + ", ".join(f"{p['from_utc']} to {p['to_utc']}" for p in pauses)) if pauses else ""
    out += ["", "## Time", "",
            f"Minutes per section, from the times the job wrote each section's result (a section's minutes run from "
            f"the end of the one before{stopped}): {num(data.get('total_minutes'), 1)} minutes in all, "
            f"{plural(recipe.get('seeds'), 'seed')} in the comparison.", ""]
    stopped_column = ["stopped (minutes, not counted)"] if pauses else []
    out += table(["section", "finished (UTC)", "minutes", *stopped_column],
                 [[r["section"], r["finished_utc"], num(r["minutes"], 1)]
                  + ([num(r.get("paused_minutes", 0), 1)] if pauses else []) for r in data.get("sections", [])])
    out += ["", "## Settings", ""] + settings_table(data.get("settings", {}))
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
def render_llamacpp(data: dict, path: Path) -> list[str]:
    shape, contexts = data.get("shape", {}), data.get("contexts", [])
    out = header("linlm against llama.cpp", path.name, data.get("meta", {}))
    out += [f"`benchmarks/bench_llamacpp.py`: one Mamba checkpoint (d {shape.get('hidden_size')}, "
            f"{shape.get('num_hidden_layers')} layers, vocabulary {shape.get('vocab_size')}, random weights) converted "
            f"by `linlm convert` (+ `linlm quantize --to int8`) and by llama.cpp's `convert_hf_to_gguf.py` (F32, Q8_0), "
            f"llama-cpp-python {data.get('llama_cpp_python')}. Batch 1"
            f"{' (batched decoding below)' if data.get('batched') else ''}; {data.get('rounds')} rounds, engines "
            "alternating, each run a process of its own; medians over rounds. At 1 thread the process CPU clock, at "
            "more the wall clock. Peak RSS is the process's VmHWM (the interpreter and runtime included).", ""]
    lean = {k: rs for k, rs in data.get("runs", {}).items() if k.split("@")[0].endswith("-lean")}
    if lean:
        clean = all(r.get("torch_imported") is False for rs in lean.values() for r in rs)
        out += ["A `-lean` variant decodes linlm's model of that precision through `linlm.infer.lean` (the C kernels "
                "with numpy around them), in a process that " + ("never imported torch (each of its runs reported so)."
                                                                  if clean else "imported torch in some run."), ""]
    out += ["## Per engine", ""]
    out += table(["variant@threads", *[f"decode ms after {n}" for n in contexts],
                  f"prefill tok/s at {contexts[-1] if contexts else ''}", "peak RSS MiB", "bandwidth floor ms",
                  *[f"state MiB after {n}" for n in contexts]],
                 [[k, *[num(v.get(f"decode_ms_{n}")) for n in contexts],
                   num(v.get(f"prefill_tokens_per_s_{contexts[-1]}")) if contexts else "",
                   num(v["peak_rss_bytes"] / 2**20),
                   num(data.get("floor_ms", {}).get(k.split("@")[1], {}).get(k.split("@")[0])),
                   *[num(v[f"state_bytes_{n}"] / 2**20) if v.get(f"state_bytes_{n}") else "" for n in contexts]]
                  for k, v in data.get("summary", {}).items()]) + [""]
    runs = data.get("runs", {})
    if runs and contexts:
        out += ["Decode ms per token in each round (the medians above are over these), in the order the rounds "
                "ran:", ""]

        def rounds(key: str, rs: list, n: int) -> str:
            clock = "cpu" if int(key.split("@")[1]) == 1 else "wall"
            return " / ".join(num(r["contexts"][str(n)][f"decode_ms_{clock}"]) for r in rs)

        out += table(["variant@threads", *[f"rounds after {n}" for n in contexts]],
                     [[k, *[rounds(k, rs, n) for n in contexts]] for k, rs in runs.items()]) + [""]
    profiled = {k: v for k, v in data.get("summary", {}).items() if v.get("step_profile")}
    if profiled:
        out += ["## Where a linlm decoding step's time goes", "",
                "ms per step at batch 1 after a short prompt (first round): the whole step; the matrix-vector "
                "products alone (every Linear and the head, one row each, the model's own weights); the dispatch "
                "floor (the same architecture and depth at width 16: Python, module calls and per-op dispatch); the "
                "rest (element-wise work at full width: conv, gates, the state update and read-out). The parts are "
                "measured apart, so they overlap where the step fuses them: a plain Mamba model's eager step is one "
                "kernel call, its products inside it without the per-Linear calls the products alone pay for, so "
                "its rest can come out below zero. The bandwidth floor is the weights' bytes over the bandwidth measured in the same run. A compiled variant decodes "
                "through `CausalLM.compile_step()` (its compile time is the first step's, with torch's on-disk "
                "cache as the run found it).", ""]
        out += table(["variant@threads", "step ms", "matrix-vector ms", "dispatch ms", "rest ms",
                      "bandwidth floor ms", "compile s"],
                     [[k, num(v["step_profile"]["step_ms"]), num(v["step_profile"]["matvec_ms"]),
                       num(v["step_profile"]["dispatch_ms"]), num(v["step_profile"]["rest_ms"]),
                       num(data.get("floor_ms", {}).get(k.split("@")[1], {}).get(k.split("@")[0])),
                       num(v["compile_s"]) if v.get("compile_s") is not None else ""]
                      for k, v in profiled.items()]) + [""]
    out += ["## Ratios against the targets", ""]
    out += table(["threads", "what", "linlm", "llama.cpp", "linlm / llama.cpp", "target", "met"],
                 [[r["threads"], r["what"], num(r["linlm"]), num(r["llamacpp"]), ratio(r["ratio"]), r["target"],
                   "yes" if r["met"] else "no"] for r in data.get("ratios", [])]) + [""]
    if data.get("batched"):
        out += ["## Batched decoding", "",
                "Aggregate decode tokens/s with B sequences at once, each after its own prompt: linlm steps a batch of "
                "B tokens through `model.step`; llama.cpp decodes them as parallel sequences of one context "
                "(`n_seq_max` = B, one token per sequence id per step). Medians over rounds, in the same worker "
                "processes as above (after their peak RSS was read).", ""]
        out += table(["threads", "batch", "linlm", "tokens/s", "llama.cpp", "tokens/s", "linlm / llama.cpp"],
                     [[r["threads"], r["batch"], r["linlm"], num(r["linlm_tokens_per_s"]), r["llamacpp"],
                       num(r["llamacpp_tokens_per_s"]), ratio(r["ratio"])] for r in data["batched"]]) + [""]
    bw = data.get("bandwidth", {})
    out += ["Memory read bandwidth in the same run (GB/s; the floor is the weights' bytes over it): "
            + "; ".join(f"{t} thread(s): {num(b.get('gb_per_s_cpu'))} (CPU clock), {num(b.get('gb_per_s_wall'))} (wall)"
                        for t, b in bw.items()), ""]
    out += ["Greedy agreement over the first tokens of a seeded prompt: "
            + "; ".join(f"{k} {pct(v)}" for k, v in data.get("greedy_agreement", {}).items()), ""]
    return out


RENDERERS: dict[str, tuple[Callable[[dict, Path], list[str]], Callable[[dict], bool]]] = {
    "bench_train_step": (render_train_step, lambda d: _records(d, "results", "tokens_per_s")),
    "bench_eval": (render_eval, lambda d: _records(d, "results", "items_per_s")),
    "bench_decode": (render_decode, lambda d: _records(d, "rows", "decode_ms_per_token")),
    "bench_llamacpp": (render_llamacpp, lambda d: isinstance(d.get("ratios"), list)),
    "linlm-mqar": (render_mqar, lambda d: _records(d, "runs", "accuracy")),
    "linlm-reproduce": (render_reproduce, lambda d: _records(d, "claims", "verdict")),
}
