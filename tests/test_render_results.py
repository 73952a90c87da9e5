"""benchmarks/render_results.py: pages are computed from the JSON's numbers, and the committed pages match their JSON.

The training-step fixture is built with the benchmark's own ratio and target functions, so it has the format that
bench_train_step.py writes; the expected cells are worked out here from the fixture's raw numbers.
"""

from __future__ import annotations

import ast
import json
import random
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import render_results  # noqa: E402


def train_step_fixture(seed: int) -> dict:
    """Two bf16 and fp32 phases of every row the lead's bf16-native run will have, random throughputs."""
    import bench_train_step as bts

    rng = random.Random(seed)
    rows = []
    for shape, dtype, seq, batch in [("demo", "bf16", 128, 16), ("paper", "fp32", 2048, 1),
                                     ("paper", "bf16", 2048, 1)]:
        name = f"demo {dtype}" if shape == "demo" else f"paper-70m {dtype} {seq}"
        for arch in ["llama", "tnl", "mamba", "mossnet", "mossnet (ssd)"]:
            seconds = [rng.uniform(0.1, 3.0) for _ in range(3)]
            sps = sorted(seconds)[1]
            rows.append(dict(arch=arch, name=name, shape=shape, dtype=dtype, seq=seq, batch=batch, threads=1,
                             seq_len=seq, clock="cpu", seconds_per_step=sps, step_seconds=seconds,
                             steps_per_round=1, tokens_per_s=batch * seq / sps,
                             model_flops_per_step=rng.uniform(1e9, 1e11),
                             page_faults_per_step=float(rng.randint(0, 90000)), mfu=rng.uniform(0.1, 0.9)))
    bts.add_ratios(rows)
    return dict(meta={"benchmark": "bench_train_step", "git_revision": "f" * 40, "git_dirty": False,
                      "command": "python benchmarks/bench_train_step.py --clock cpu", "env": {"OMP_NUM_THREADS": "1"},
                      "torch_version": "9.9.9", "cpu": {"model_name": "Test CPU 9000", "bf16_flags": ["amx_bf16"],
                                                        "native_bf16": True}},
                partial=False, matmul_flops_per_s={"bf16/1 threads": 1.5e11}, vocab=8192, demo=bts.DEMO,
                results=rows, target_checks=bts.check_targets(rows))


def render_json(tmp_path: Path, name: str, data: dict) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return render_results.render(path)


def cells(page: str, first: str) -> list[list[str]]:
    """The rows of the page's tables whose first cell is `first`."""
    out = []
    for line in page.splitlines():
        parts = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and parts[0] == first:
            out.append(parts)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_train_step_page_holds_the_json_numbers(tmp_path, seed):
    data = train_step_fixture(seed)
    page = render_json(tmp_path, "bench_train_step_test", data)
    rows = {(r["arch"], r["name"]): r for r in data["results"]}
    assert "Generated from [bench_train_step_test.json]" in page and "render_results.py" in page
    assert "f" * 40 + " (clean)" in page and "Test CPU 9000" in page and "amx_bf16" in page
    assert "`python benchmarks/bench_train_step.py --clock cpu`" in page and "OMP_NUM_THREADS=1" in page
    assert "9.9.9" in page and "tokens per CPU second" in page

    # the summary: every phase's tokens/s and ratio to our LLaMA, worked out from the raw tokens/s
    phases = ["demo bf16", "paper-70m fp32 2048", "paper-70m bf16 2048"]
    for arch in ["tnl", "mossnet (ssd)"]:
        expect = [arch]
        for p in phases:
            expect += [f"{rows[(arch, p)]['tokens_per_s']:,.0f}",
                       f"{rows[(arch, p)]['tokens_per_s'] / rows[('llama', p)]['tokens_per_s']:.2f}x"]
        assert expect in cells(page, arch)

    # MossNet against Mamba, both kernels, with the round-by-round ratios and the equal-MFU ratio
    for arch in ["mossnet", "mossnet (ssd)"]:
        for p in phases:
            r, m = rows[(arch, p)], rows[("mamba", p)]
            rounds = ", ".join(f"{b / a:.2f}" for a, b in zip(r["step_seconds"], m["step_seconds"]))
            line = [p, arch, f"{r['tokens_per_s'] / m['tokens_per_s']:.2f}x", rounds,
                    f"{m['model_flops_per_step'] / r['model_flops_per_step']:.2f}x"]
            assert any(c[:5] == line for c in cells(page, p)), line

    # each phase's table: page faults per step and MFU
    r = rows[("mamba", "paper-70m bf16 2048")]
    pf = r["page_faults_per_step"]
    assert any(c[5] == f"{100 * r['mfu']:.1f} %" and c[6] == (f"{pf:,.1f}" if pf < 100 else f"{pf:,.0f}")
               for c in cells(page, "mamba"))

    # the targets, with the equal-MFU ratios bench_train_step writes
    check = next(c for c in data["target_checks"] if c["row"] == "mossnet (ssd)" and c["phase"] == "paper-70m bf16 2048")
    assert [check["phase"], "mossnet (ssd) / mamba", f"{check['ratio']:.2f}x", f">= {check['target']}x",
            "yes" if check["met"] else "no", f"{check['equal_mfu_ratio']:.2f}x",
            f"{check['mfu_vs_baseline']:.2f}x"] in cells(page, check["phase"])
    assert ["bf16/1 threads", "150"] in cells(page, "bf16/1 threads")


def test_a_changed_number_changes_the_page(tmp_path):
    data = train_step_fixture(0)
    before = render_json(tmp_path, "a", data)
    data["results"][0]["tokens_per_s"] = 123456.0
    after = render_json(tmp_path, "a", data)
    assert "123,456" in after and "123,456" not in before


def test_other_modes_of_a_benchmark_get_the_generic_page(tmp_path):
    # bench_train_step.py --memory writes other records under the same meta.benchmark
    data = {"meta": {"benchmark": "bench_train_step"},
            "results": [{"arch": "mamba", "phase": "demo bf16", "peak_rss_bytes": 456789012}]}
    page = render_json(tmp_path, "bench_train_step_memory", data)
    assert ["mamba", "demo bf16", "456,789,012"] in cells(page, "mamba")
    assert "| revision | not recorded |" in page


def test_an_old_file_says_what_it_does_not_record(tmp_path):
    page = render_json(tmp_path, "bench_eval_x", {"meta": {"cpu_model": "Old CPU"}, "config": {"items": 7},
                                                  "results": [{"arch": "tnl", "items_per_s": {"shared": 9.0,
                                                               "naive": 3.0, "harness": 2.0},
                                                               "forward_tokens": {"shared": 10, "naive": 30},
                                                               "speedup": 3.0, "speedup_vs_harness_style": 4.5}]})
    assert "| command | not recorded |" in page and "| CPU flags (bf16-related) | not recorded |" in page
    assert ["tnl", "2.0", "3.0", "9.0", "4.50x", "3.00x", "3.00x", ""] in cells(page, "tnl")


def test_committed_pages_match_their_json():
    """The pages in docs/results are what the renderer makes of the JSON beside them: nobody edited a table."""
    stale = render_results.render_folder(ROOT / "docs" / "results", check=True)
    assert not stale, f"out of date, run `python benchmarks/render_results.py`: {stale}"
    assert (ROOT / "docs" / "results" / "index.md").is_file()


def test_check_mode_finds_an_edited_page(tmp_path):
    (tmp_path / "bench_eval.json").write_text(json.dumps({"meta": {}, "results": []}))
    assert render_results.main([str(tmp_path)]) == 0
    assert render_results.main([str(tmp_path), "--check"]) == 0
    page = tmp_path / "bench_eval.md"
    page.write_text(page.read_text() + "| hand | edit |\n")
    assert render_results.main([str(tmp_path), "--check"]) == 1


def _writes_meta(call: ast.Call) -> bool:
    """write_json(name, payload) whose payload is a dict literal or dict(...) with meta=meta() (or {**meta(), ...})."""
    payload = call.args[1] if len(call.args) > 1 else None
    if isinstance(payload, ast.Name):  # a payload built earlier: judged by the assignment (see below)
        return True
    if isinstance(payload, ast.Dict):
        pairs = dict(zip(payload.keys, payload.values))
        value = next((v for k, v in pairs.items() if isinstance(k, ast.Constant) and k.value == "meta"), None)
    elif isinstance(payload, ast.Call) and getattr(payload.func, "id", None) == "dict":
        value = next((kw.value for kw in payload.keywords if kw.arg == "meta"), None)
    else:
        return False
    if value is None:
        return False
    return "meta()" in ast.unparse(value)


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("bench_*.py")))
def test_every_benchmark_writes_meta(script):
    """Every JSON a benchmark writes goes through _common.write_json with meta() (revision, machine, torch,
    command line), so that render_results.py can show where its numbers come from."""
    tree = ast.parse((BENCH / script).read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "write_json"]
    assert calls, f"{script} writes no JSON through _common.write_json"
    for call in calls:
        assert _writes_meta(call), f"{script}:{call.lineno}: write_json without meta()"
    names = {c.args[1].id for c in calls if len(c.args) > 1 and isinstance(c.args[1], ast.Name)}
    for node in ast.walk(tree):  # payloads built in a variable first
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) in names for t in node.targets):
            assert "meta()" in ast.unparse(node.value), f"{script}:{node.lineno}: payload without meta()"
    assert not re.search(r"^\s*def meta\(", (BENCH / script).read_text(), re.M), f"{script} defines its own meta()"


def test_the_meta_of_a_benchmark_renders_every_machine_row(tmp_path, monkeypatch):
    """meta() (linlm's environment record plus the command) has every field the page's machine table shows, and
    write_json writes it as linlm's JSON."""
    import _common

    monkeypatch.setattr(_common, "RESULTS", tmp_path)
    path = _common.write_json("bench_probe", {"meta": _common.meta(), "results": [{"x": Path("a")}]})
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["results"] == [{"x": "a"}]
    import results_format

    rows = dict(results_format.machine_rows(data["meta"]))
    for key in ("measured (UTC)", "command", "machine", "CPU flags (bf16-related)", "native bf16", "torch", "python",
                "load average (1 min)"):
        assert "not recorded" not in rows[key], (key, rows[key])
    rev = data["meta"]["git_revision"]  # None where the tests run outside a git checkout (an unpacked archive)
    assert rows["revision"] == "not recorded" if rev is None else rows["revision"].startswith(rev + " (")
