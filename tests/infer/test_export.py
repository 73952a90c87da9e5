"""linlm export: the exported prefill and step (state as explicit tensors) give the eager logits."""

import json

import pytest
import torch
from output_asserts import forbid, one_line_error, snapshot

from linlm import create_model
from linlm.cli import main
from linlm.errors import ConfigError


@pytest.mark.slow
def test_exported_prefill_and_steps_match_eager(tmp_path, capsys):
    model = create_model("cosformer2", preset="tiny", n_layers=1).eval()  # LRPE positions and a TPE state
    model.save(tmp_path / "m")
    assert main(["export", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "e"), "--prefill-len", "12"]) == 0
    assert "wrote" in capsys.readouterr().out
    prefill = torch.export.load(tmp_path / "e.prefill.pt2").module()
    step = torch.export.load(tmp_path / "e.step.pt2").module()
    ids = torch.randint(0, 512, (1, 12))
    with torch.no_grad():
        want, state = model.prefill(ids)
        got, *flat = prefill(ids)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
        for i, tok in enumerate([5, 77, 300]):
            t = torch.tensor([tok])
            want, state = model.step(t, state)
            got, *flat = step(t, torch.tensor(12 + i), *flat)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    # Never over what exists, unless --overwrite; and never over a file linlm did not write, even then.
    assert main(["export", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "e")]) == 2
    assert "already exist" in capsys.readouterr().err
    (tmp_path / "e.json").write_text("my notes on the export")
    before = snapshot(tmp_path)
    assert main(["export", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "e"), "--overwrite"]) == 2
    one_line_error(capsys.readouterr().err, "e.json: exists and linlm did not write it")
    assert snapshot(tmp_path) == before
    (tmp_path / "e.json").unlink()
    assert main(["export", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "e"), "--overwrite",
                 "--prefill-len", "12"]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["prefill"]["inputs"]["input_ids"] == [1, 12]
    from linlm import outputs

    assert all(outputs.owns_file(tmp_path / f"e.{part}") for part in ("prefill.pt2", "step.pt2", "json"))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# Exported graphs are checked to 1e-5, ten times tighter than `linlm export --check`'s default of 1e-4: both sides
# compute in float32 and only the order of the sums differs (onnxruntime's kernels, or the pure-torch scan where
# eager runs the compiled C kernel), which leaves differences of a few float32 ulps of the logits (measured: at
# most 5e-7 on these models).
TOL = 1e-5
ARCHS = ["llama", "tnl", "hgrn2", "cosformer2", "mamba", "mossnet", "deltanet", "gated_deltanet", "mamba2", "gla",
         "retnet"]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_onnx_prefill_and_steps_match_eager_in_onnxruntime(tmp_path, arch):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from linlm.infer.export import check, export

    torch.manual_seed(0)
    kw = dict(n_kv_heads=1) if arch == "llama" else {}  # grouped-query attention in the exported cache
    model = create_model(arch, preset="tiny", n_layers=1, **kw).eval()
    paths = export(model, tmp_path / "m", "onnx", prefill_len=10, batch=2)  # onnxruntime steps 2 rows at once
    assert [p.name for p in paths] == ["m.prefill.onnx", "m.step.onnx", "m.json"]
    meta = json.loads(paths[2].read_text())
    assert meta["batch"] == 2
    assert meta["step"]["inputs"][:2] == ["token_ids", "position"]
    assert meta["step"]["outputs"] == ["logits", *(f"present.{n}" for n in meta["state_names"])]
    diffs = check(model, paths, steps=4)
    assert diffs["steps"] == 4
    for key in ("prefill_logits", "prefill_state", "step_logits", "step_state"):
        assert diffs[key] <= TOL, (key, diffs)


@pytest.mark.slow
@pytest.mark.parametrize("kw", [dict(ssm_policy="dense", ssm_kernel="ssd", shared_experts=1),
                                dict(ssm_policy="routed", ssm_kernel="ssd", mlp_experts=2, mlp_top_k=1)])
def test_mossnet_variants_export_to_onnx(tmp_path, kw):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from linlm.infer.export import check, export

    torch.manual_seed(1)
    model = create_model("mossnet", preset="tiny", n_layers=1, **kw).eval()
    diffs = check(model, export(model, tmp_path / "m", "onnx", prefill_len=8), steps=3)
    assert max(v for k, v in diffs.items() if k != "steps") <= TOL, diffs


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
@pytest.mark.parametrize("kw", [dict(attn_layers=[1]), dict(attn_layers=[0], attn_window=6),
                                dict(attn_layers=[1], attn_options=dict(head_dim=24, n_kv_heads=1, qk_norm=True,
                                                                        output_gate=True, rope_fraction=0.5))],
                         ids=["full", "window", "qwen3_next_attention"])
def test_hybrid_stacks_export_equal_to_eager(tmp_path, fmt, kw):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    from linlm.infer.export import check, export

    torch.manual_seed(2)
    model = create_model("gla", preset="tiny", **kw).eval()
    diffs = check(model, export(model, tmp_path / "m", fmt, prefill_len=8), steps=4)
    assert max(v for k, v in diffs.items() if k != "steps") <= TOL, diffs
    if "attn_window" in kw:  # a prefill shorter than the window's cache would give the step two shapes
        with pytest.raises(ConfigError, match="prefill_len: 4 is shorter than the attention window's cache"):
            export(model, tmp_path / "short", fmt, prefill_len=4)


def test_static_shape_moe_and_mossnet_paths_equal_eager(monkeypatch):
    """The forms taken while torch.export traces (no shape from the routing) give the eager outputs."""
    torch.manual_seed(0)
    model = create_model("mossnet", preset="tiny", mlp_experts=8, mlp_top_k=2).eval()
    ids = torch.randint(0, 512, (2, 9))
    with torch.no_grad():
        want_logits, want_state = model.prefill(ids)
        want_step, _ = model.step(torch.tensor([3, 4]), want_state)
        monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
        got_logits, got_state = model.prefill(ids)  # MLP: every expert on 18 tokens; mixer: padded to T
        got_step, _ = model.step(torch.tensor([3, 4]), got_state)  # MLP: 2 tokens x 2 gathered experts < 8
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=TOL)
    torch.testing.assert_close(got_step, want_step, rtol=0, atol=TOL)
    for got, want in zip(got_state.layers, want_state.layers):
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=TOL)


def test_static_vector_gate_scores_equal_eager(monkeypatch):
    from linlm.ops.gla import gla_chunk

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 32, 2, 8, generator=g) for _ in range(3))
    log_a = -torch.rand(1, 32, 2, 8, generator=g)
    want = gla_chunk(q, k, v, log_a, chunk_size=16)[0]
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    got = gla_chunk(q, k, v, log_a, chunk_size=16)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_cli_onnx_export_with_check(tmp_path, model_dir, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    assert main(["export", "--model", str(model_dir), "--format", "onnx", "--out", str(tmp_path / "e.onnx"),
                 "--prefill-len", "6", "--check", "3"]) == 0
    out = capsys.readouterr().out
    assert "e.step.onnx" in out and "step_logits" in out
    assert (tmp_path / "e.prefill.onnx").stat().st_size > 10_000
    assert not list(tmp_path.glob("*.tmp"))


def test_onnx_without_its_packages_is_a_clear_error(tmp_path, monkeypatch):
    import importlib.util

    from linlm.infer.export import export

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    with pytest.raises(ConfigError, match=r"onnxscript not installed; pip install 'linlm\[export\]'"):
        export(create_model("tnl", preset="tiny"), tmp_path / "x", "onnx")
    assert not list(tmp_path.iterdir())


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading the model (or tracing it) fails the test: every refusal below must come before either."""
    forbid(monkeypatch, "linlm.infer.generate.load_model", "linlm.infer.export.export_programs",
           why="the model was loaded or traced before --out was checked")


@pytest.mark.parametrize("where, reason", [
    ("afile/x", "is a file and not a directory"),
    ("adir", "names a directory, and the export's output is a file stem"),
    ("new/", "names a directory, and the export's output is a file stem"),
    ("user", "user.step.pt2: exists and linlm did not write it"),
])
@pytest.mark.parametrize("overwrite", [False, True])
def test_export_out_is_checked_before_the_model_loads(where, reason, overwrite, tmp_path, model_dir, capsys,
                                                       no_model_load):
    """`--out FILE/x` (it used to fail with a traceback after tracing), an existing directory (--out is a file stem)
    and a user's file among the outputs: one line, exit 2, nothing written, with or without --overwrite."""
    (tmp_path / "afile").write_text("a file")
    (tmp_path / "adir").mkdir()
    (tmp_path / "user.step.pt2").write_text("the user's own program")
    before = snapshot(tmp_path)
    out = str(tmp_path / where) + ("/" if where.endswith("/") else "")
    args = ["export", "--model", str(model_dir), "--out", out] + ["--overwrite"] * overwrite
    assert main(args) == 2
    one_line_error(capsys.readouterr().err, "--out", reason)
    assert snapshot(tmp_path) == before


def test_export_help_says_out_is_a_file_stem(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--out STEM" in text and "file stem of the outputs, not a directory" in text
    assert "STEM.prefill.FMT, STEM.step.FMT and STEM.json" in text
