"""linlm profile: rows for every architecture and context, JSON and plot, transformers' Llama beside, bad input."""

import json

import pytest
from output_asserts import assert_png, forbid, one_line_error, snapshot

from linlm.cli import main
from linlm.errors import ConfigError
from linlm.infer.profile import HF_LLAMA, profile


def test_profile_rows_measure_every_quantity():
    pytest.importorskip("transformers")
    rows = profile(["llama", "hgrn2", HF_LLAMA], "tiny", [16, 64], decode_tokens=2)
    assert [(r.arch, r.context) for r in rows] == [(a, n) for a in ("llama", "hgrn2", HF_LLAMA) for n in (16, 64)]
    for r in rows:
        assert r.error is None and r.prefill_tokens_per_s > 0 and r.decode_ms_per_token > 0
        assert r.peak_memory_bytes >= r.memory_before_bytes > 0 and r.state_bytes > 0
    by = {(r.arch, r.context): r.state_bytes for r in rows}
    assert by["hgrn2", 16] == by["hgrn2", 64]  # constant state
    # The KV cache grows with the context, alike in linlm's LLaMA and transformers' (2 x layers x d x 4 bytes/token).
    for arch in ("llama", HF_LLAMA):
        assert by[arch, 64] - by[arch, 16] == 48 * 2 * 2 * 64 * 4


def test_cli_profile_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "p.json", tmp_path / "p.png"
    assert main(["profile", "--archs", "tnl,mamba", "--preset", "tiny", "--contexts", "8,32", "--decode-tokens", "2",
                 "--threads", "1", "--json", str(out), "--plot", str(png)]) == 0
    data = json.loads(out.read_text())
    assert [(r["arch"], r["context"]) for r in data["rows"]] == [("tnl", 8), ("tnl", 32), ("mamba", 8), ("mamba", 32)]
    assert data["environment"]["torch_num_threads"] == 1
    assert_png(png, (1320, 480))  # 11 x 4 inches at 120 dpi, drawn


@pytest.mark.parametrize("kw, match", [
    (dict(archs=["gpt"]), r"archs: unknown architecture 'gpt'.*'hf-llama'"),
    (dict(contexts=[0]), r"contexts: need positive"),
    (dict(dtype="float16"), r"dtype: 'float16'"),
    (dict(device="bogus"), r"device: 'bogus'"),
    (dict(exported=["tflite"]), r"exported: 'tflite' is not an export format"),
])
def test_profile_bad_input(kw, match):
    args = dict(archs=["tnl"], preset="tiny", contexts=[8]) | kw
    with pytest.raises(ConfigError, match=match):
        profile(args.pop("archs"), args.pop("preset"), args.pop("contexts"), **args)


def test_cli_profile_bad_contexts_exit_2(capsys):
    assert main(["profile", "--archs", "tnl", "--preset", "tiny", "--contexts", "8,abc"]) == 2
    err = capsys.readouterr().err
    assert "argument --contexts: expected a whole number from 1 to 1073741824, got 'abc' in '8,abc'" in err
    assert len(err.splitlines()) == 1


@pytest.mark.slow
def test_profile_times_the_exported_steps_beside_eager(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    out, png = tmp_path / "p.json", tmp_path / "p.png"
    assert main(["profile", "--archs", "mamba", "--preset", "tiny", "--contexts", "8,32", "--decode-tokens", "2",
                 "--exported", "onnx,pt2", "--json", str(out), "--plot", str(png)]) == 0
    assert "mamba (onnx)" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [(r["backend"], r["context"]) for r in rows] == [(b, n) for b in ("eager", "onnx", "pt2") for n in (8, 32)]
    eager = {r["context"]: r for r in rows if r["backend"] == "eager"}
    for r in rows:
        assert r["error"] is None and r["decode_ms_per_token"] > 0
        assert r["state_bytes"] == eager[r["context"]]["state_bytes"]  # the same state, as explicit tensors
        if r["backend"] != "eager":  # prefilled by the eager model: no prefill numbers of its own
            assert r["prefill_tokens_per_s"] is None and r["peak_memory_bytes"] is None
    assert_png(png, (1320, 480))  # 11 x 4 inches at 120 dpi, drawn


def test_profile_times_the_compiled_step_beside_eager(tmp_path, capsys):
    import shutil

    import torch

    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("torch.compile on the CPU needs a C++ compiler")
    torch._dynamo.reset()
    out = tmp_path / "p.json"
    assert main(["profile", "--archs", "mamba,llama", "--preset", "tiny", "--contexts", "8,32", "--decode-tokens",
                 "2", "--no-hf", "--compile", "--json", str(out)]) == 0
    assert "mamba (compiled)" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    # LLaMA's KV cache grows: no compiled rows for it
    assert [(r["arch"], r["backend"], r["context"]) for r in rows] == [
        ("mamba", b, n) for b in ("eager", "compiled") for n in (8, 32)] + [("llama", "eager", n) for n in (8, 32)]
    for r in rows:
        assert r["error"] is None and r["decode_ms_per_token"] > 0
    compiled = [r for r in rows if r["backend"] == "compiled"]
    assert all(r["prefill_tokens_per_s"] is None for r in compiled)  # the prompt went through the eager prefill


@pytest.mark.parametrize("flag, where, reason", [
    ("--json", "results.json", "results.json: exists and linlm did not write it"),
    ("--json", "adir", "is a directory"),
    ("--plot", "afile/p.png", "is a file and not a directory"),
    ("--plot", "results.json", "linlm did not write it"),
])
def test_profile_outputs_are_checked_before_anything_is_profiled(flag, where, reason, tmp_path, capsys, monkeypatch):
    """A user's results.json used to be replaced; --plot FILE/p.png and --json DIR ended in tracebacks after the
    whole profile. Now: one line, exit 2, nothing written, no model built."""
    forbid(monkeypatch, "linlm.infer.profile.build", why="a model was built before the outputs were checked")
    (tmp_path / "results.json").write_text('{"my": "own results"}')
    (tmp_path / "afile").write_text("a file")
    (tmp_path / "adir").mkdir()
    before = snapshot(tmp_path)
    assert main(["profile", "--archs", "tnl", "--preset", "tiny", "--contexts", "8", "--decode-tokens", "1",
                 flag, str(tmp_path / where)]) == 2
    one_line_error(capsys.readouterr().err, flag, reason)
    assert snapshot(tmp_path) == before


def test_the_profile_plot_is_a_figure_of_its_own(tmp_path):
    from matplotlib.figure import Figure

    from linlm.infer.profile import ProfileRow, plot, plot_figure

    rows = [ProfileRow(arch, n, "cpu", "float32", decode_ms_per_token=0.1 * n * (k + 1),
                       memory_before_bytes=2**20, peak_memory_bytes=2**20 * (n + 1))
            for k, arch in enumerate(("tnl", "llama")) for n in (8, 32, 128)]
    assert isinstance(plot_figure(rows), Figure)
    assert_png(plot(rows, tmp_path / "p.png", title="t"), (1320, 480))
