"""The training loop in-process: outputs, resume, checkpoint faults, the NaN guard and refused inputs."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from output_asserts import assert_png
from safetensors.torch import load_file
from train_helpers import assert_bitwise_equal, final_weights

from linlm.cli import main
from linlm.errors import CheckpointError, ConfigError, DataError, TokenizerError
from linlm.outputs import LEDGER
from linlm.train import checkpoint as ckpt
from linlm.train import TrainingDiverged, train
from linlm.train.metrics import read_metrics


def steps_of(run_dir):
    return [name for _, name in ((s, p.name) for s, p in ckpt.list_checkpoints(run_dir / "checkpoints"))]


def test_a_run_writes_metrics_checkpoints_plot_and_samples(make_config):
    cfg = make_config("run", steps=8, samples__prompts=["The king"], samples__max_new_tokens=6)
    result = train(cfg, verbose=False)
    out = result.out_dir
    recs = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs] == list(range(1, 9))
    for key in ("step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "skipped", "skipped_steps"):
        assert key in recs[0], key
    assert recs[-1]["tokens"] == 8 * 4 * 32
    assert [r["step"] for r in recs if "val_loss" in r] == [4, 8]
    assert recs[-1]["loss"] < recs[0]["loss"] - 0.5, "the loss should drop on this easy data"
    assert 0 < recs[-1]["mfu"] < 1
    assert steps_of(out) == ["step_00000004", "step_00000006", "step_00000008"]  # keep=3
    for _, path in ckpt.list_checkpoints(out / "checkpoints"):
        ckpt.verify(path)
    assert_png(out / "loss_curve.png", (840, 504))  # 7 x 4.2 inches at 120 dpi, drawn
    samples = (out / "samples.txt").read_text()
    assert "The king" in samples and result.samples and result.samples[0][0] == "The king"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 8 and summary["val_loss"] == pytest.approx(result.val_loss)
    # a checkpoint is also a saved model
    import linlm

    model = linlm.load(result.checkpoint)
    assert_bitwise_equal(model.state_dict(), load_file(str(result.checkpoint / "model.safetensors")))


def test_resume_repeats_the_uninterrupted_run_bitwise(make_config):
    ref = train(make_config("ref"), verbose=False)
    cfg = make_config("cut")
    train(cfg, verbose=False)
    # lose the last two checkpoints, as if the run had died after step 4
    import shutil

    for name in ("step_00000006", "step_00000008"):
        shutil.rmtree(cfg.out_dir + "/checkpoints/" + name)
    resumed = train(cfg, resume=True, verbose=False)
    assert resumed.step == 8
    assert_bitwise_equal(final_weights(ref.out_dir), final_weights(resumed.out_dir))
    a, b = read_metrics(ref.out_dir / "metrics.jsonl"), read_metrics(resumed.out_dir / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(1, 9))
    assert [(r["loss"], r.get("val_loss"), r["lr"]) for r in a] == [(r["loss"], r.get("val_loss"), r["lr"]) for r in b]


@pytest.mark.parametrize("damage", ["flip-model", "truncate-optimizer"])
def test_corrupt_newest_checkpoint_falls_back_to_the_previous(make_config, caplog, damage):
    ref = train(make_config("ref", steps=6), verbose=False)
    cfg = make_config("run", steps=6)
    train(cfg, verbose=False)
    newest = ckpt.list_checkpoints(ref.out_dir.parent / "run" / "checkpoints")[-1][1]
    if damage == "flip-model":
        f = newest / "model.safetensors"
        data = bytearray(f.read_bytes())
        data[-5] ^= 0xFF
        f.write_bytes(bytes(data))
    else:
        f = newest / "optimizer.safetensors"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="linlm.train"):
        resumed = train(cfg, resume=True, verbose=False)
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "step_00000006" in warning and "corrupt" in warning
    assert resumed.step == 6
    assert_bitwise_equal(final_weights(ref.out_dir), final_weights(resumed.out_dir))


def test_write_failure_keeps_the_previous_checkpoint(make_config, monkeypatch):
    cfg = make_config("run", steps=6)
    real = ckpt.save_file

    def failing(tensors, filename, metadata=None):
        if "step_00000004" in str(filename) and "optimizer" in str(filename):
            raise OSError(28, "No space left on device")
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(ckpt, "save_file", failing)
    with pytest.raises(CheckpointError) as e:
        train(cfg, verbose=False)
    msg = str(e.value)
    assert "No space left on device" in msg and "step_00000002 is intact" in msg and "--resume" in msg
    root = cfg.out_dir + "/checkpoints"
    assert sorted(os.listdir(root)) == [LEDGER, "step_00000002"], "no temporary or partial directory may remain"
    ckpt.verify(root + "/step_00000002")
    monkeypatch.setattr(ckpt, "save_file", real)
    resumed = train(cfg, resume=True, verbose=False)
    assert resumed.step == 6


def test_nan_step_is_skipped_without_an_update(make_config):
    cfg = make_config("run", steps=5, debug__nan_steps=[3], checkpoint__every=1, checkpoint__keep=10)
    result = train(cfg, verbose=False)
    recs = read_metrics(result.out_dir / "metrics.jsonl")
    assert [r["skipped"] for r in recs] == [False, False, True, False, False]
    assert recs[2]["loss"] is None and recs[-1]["skipped_steps"] == 1
    root = result.out_dir / "checkpoints"
    assert steps_of(result.out_dir) == ["step_00000001", "step_00000002", "step_00000004", "step_00000005"]
    # step 3 changed nothing: step 4 equals one clean update from step 2's weights, while step 2 != step 4
    w2 = load_file(str(root / "step_00000002" / "model.safetensors"))
    w4 = load_file(str(root / "step_00000004" / "model.safetensors"))
    assert not torch.equal(w2["embed.weight"], w4["embed.weight"])
    opt4 = load_file(str(root / "step_00000004" / "optimizer.safetensors"))
    assert float(opt4["state/embed.weight/step"]) == 3.0, "three updates in four steps"


def test_nan_guard_stops_after_max_bad_steps(make_config):
    cfg = make_config("run", steps=10, debug__nan_steps=[3, 4, 5], max_bad_steps=3)
    with pytest.raises(TrainingDiverged) as e:
        train(cfg, verbose=False)
    assert "step 5" in str(e.value) and "step_00000002" in str(e.value)
    root = cfg.out_dir + "/checkpoints"
    assert sorted(os.listdir(root)) == [LEDGER, "step_00000002"]
    ckpt.verify(root + "/step_00000002")


def test_grad_accumulation_matches_the_full_batch(make_config):
    a = train(make_config("a", steps=4, eval__every=0), verbose=False)
    b = train(make_config("b", steps=4, eval__every=0, grad_accum=2), verbose=False)
    la = [r["loss"] for r in read_metrics(a.out_dir / "metrics.jsonl")]
    lb = [r["loss"] for r in read_metrics(b.out_dir / "metrics.jsonl")]
    assert la == pytest.approx(lb, rel=1e-5, abs=1e-6)


def test_activation_checkpointing_and_bf16_train(make_config):
    a = train(make_config("a", steps=3, eval__every=0), verbose=False)
    b = train(make_config("b", steps=3, eval__every=0, activation_checkpointing=True), verbose=False)
    la = [r["loss"] for r in read_metrics(a.out_dir / "metrics.jsonl")]
    lb = [r["loss"] for r in read_metrics(b.out_dir / "metrics.jsonl")]
    assert la == pytest.approx(lb, rel=1e-6, abs=1e-6)
    c = train(make_config("c", steps=3, eval__every=0, precision="bf16"), verbose=False)
    lc = [r["loss"] for r in read_metrics(c.out_dir / "metrics.jsonl")]
    assert lc == pytest.approx(la, rel=0.02) and lc != la  # bf16 is close to fp32, and really ran in bf16


def test_precision_auto_trains_in_the_resolved_precision(make_config, monkeypatch):
    """precision auto on a device without native bf16 trains exactly as fp32; with it, as bf16."""
    from linlm import devices

    monkeypatch.setattr(devices, "native_bf16", lambda device: False)
    a = train(make_config("a", steps=2, eval__every=0), verbose=False)
    b = train(make_config("b", steps=2, eval__every=0, precision="auto"), verbose=False)
    monkeypatch.setattr(devices, "native_bf16", lambda device: True)
    c = train(make_config("c", steps=2, eval__every=0, precision="auto"), verbose=False)
    la, lb, lc = ([r["loss"] for r in read_metrics(x.out_dir / "metrics.jsonl")] for x in (a, b, c))
    assert la == lb
    assert [json.loads((x.out_dir / "summary.json").read_text())["precision"] for x in (a, b, c)] == [
        "fp32", "fp32", "bf16"]
    assert lc == pytest.approx(la, rel=0.02) and lc != la


def test_existing_run_with_another_config_is_refused(make_config):
    train(make_config("run", steps=2), verbose=False)
    with pytest.raises(ConfigError, match=r"different config.*optim\.lr.*--resume.*--overwrite"):
        train(make_config("run", steps=2, optim__lr=5e-3), verbose=False)
    with pytest.raises(ConfigError, match="already holds a run with this config"):
        train(make_config("run", steps=2), verbose=False)
    with pytest.raises(ConfigError, match=r"cannot resume.*optim\.lr"):
        train(make_config("run", steps=2, optim__lr=5e-3), resume=True, verbose=False)
    result = train(make_config("run", steps=3, optim__lr=5e-3), overwrite=True, verbose=False)
    assert [r["step"] for r in read_metrics(result.out_dir / "metrics.jsonl")] == [1, 2, 3]


def test_tokenizer_larger_than_the_model_is_refused(make_config):
    cfg = make_config("run", model__overrides={"n_layers": 1, "d_model": 32, "n_heads": 2, "vocab_size": 256})
    with pytest.raises(TokenizerError, match="300 token ids.*vocab_size is 256"):
        train(cfg, verbose=False)
    assert not os.path.exists(cfg.out_dir), "nothing may be written for a refused run"


def test_sequence_longer_than_the_data_is_refused(make_config):
    cfg = make_config("run", data__seq_len=200_000,
                      model__overrides={"n_layers": 1, "d_model": 32, "n_heads": 2, "max_seq_len": 200_000})
    with pytest.raises(DataError, match=r"data\.seq_len.*200000"):
        train(cfg, verbose=False)
    assert not os.path.exists(cfg.out_dir)


def _cli_args(cfg) -> list[str]:
    return ["train", "--data-dir", str(cfg.data.dir), "--out", str(cfg.out_dir), "--quiet",
            "model.overrides={n_layers: 1, d_model: 32, n_heads: 2, max_seq_len: 128}", "data.seq_len=32",
            "batch_size=4", "steps=2", "eval.every=0", "samples.max_new_tokens=0", "threads=1"]


@pytest.mark.parametrize("case", ["tokenizer", "seq_len", "unknown_key", "existing_run"])
def test_cli_exits_2_without_traceback(make_config, capsys, case):
    cfg = make_config("run")
    args = _cli_args(cfg)
    expect = {"tokenizer": "vocab_size", "seq_len": "seq_len", "unknown_key": "optim.lrr",
              "existing_run": "already holds"}[case]
    if case == "tokenizer":
        args.append("model.overrides.vocab_size=256")
    elif case == "seq_len":
        args += ["data.seq_len=100000", "model.overrides.max_seq_len=100000"]
    elif case == "unknown_key":
        args.append("optim.lrr=0.1")
    else:
        assert main(args) == 0
        capsys.readouterr()
        args.append("optim.lr=0.1")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("linlm: error:") and expect in err and "Traceback" not in err


def test_cli_train_then_generate(make_config, capsys):
    cfg = make_config("run")
    assert main(_cli_args(cfg)) == 0
    capsys.readouterr()
    assert main(["generate", "--model", str(cfg.out_dir), "--prompt", "The king", "--max-new-tokens", "5",
                 "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The king") and len(out.strip()) > len("The king")
    assert main(["generate", "--model", str(cfg.out_dir) + "/nope", "--prompt", "x"]) == 2


def test_mixture_of_experts_aux_loss_is_logged(make_config):
    from linlm.models.registry import ARCHITECTURES

    if "mossnet" not in ARCHITECTURES:
        pytest.skip("the MossNet architecture is not registered in this tree")
    cfg = make_config("run", steps=2, eval__every=0, model__arch="mossnet",
                      model__overrides={"n_layers": 1, "d_model": 32, "n_heads": 2, "glu_dim": 64})
    recs = read_metrics(train(cfg, verbose=False).out_dir / "metrics.jsonl")
    assert all(r.get("aux_loss", 0) > 0 for r in recs)


def _as_written_before_the_options(run: Path, keys) -> None:
    """Rewrite a run directory as linlm wrote it before the options in ``keys`` existed: no such keys in its configs
    (config.json's model config flat, with tpe and no options), config.json in format 1 without a checksum, and
    manifests that match (each file recorded in its ledger as
    linlm's, as linlm would have)."""
    import yaml

    from linlm import outputs
    from linlm.io_utils import MANIFEST, file_digests

    def strip_yaml(path: Path) -> None:
        data = yaml.safe_load(path.read_text())
        for k in keys:
            data["model"]["overrides"].pop(k, None)
        outputs.write_text(path, yaml.safe_dump(data, sort_keys=False))

    strip_yaml(run / "config.yaml")
    for ck in sorted((run / "checkpoints").glob("step_*")):
        meta = json.loads((ck / "config.json").read_text())
        meta["format_version"] = 1
        meta.pop("config_sha256", None)
        meta["config"].pop("options")
        meta["config"]["tpe"] = True
        outputs.write_text(ck / "config.json", json.dumps(meta))
        strip_yaml(ck / "train_config.yaml")
        manifest = json.loads((ck / MANIFEST).read_text())
        manifest["files"] = {n: d for n, d in file_digests(ck).items()
                             if n != MANIFEST and not outputs.bookkeeping(n)}
        outputs.write_text(ck / MANIFEST, json.dumps(manifest))


def test_a_run_saved_before_the_new_defaults_resumes_with_the_options_it_was_trained_with(make_config):
    # The options' values before they existed (ArchSpec.saved_before), in the flat spelling of that time.
    SAVED_BEFORE = {"tnl_slopes": "pow2", "tnl_v_silu": False, "cosformer2_gate_before_norm": False}
    shape = {"n_layers": 2, "d_model": 32, "n_heads": 2, "glu_dim": 64, "max_seq_len": 128}
    first = train(make_config("run", model__arch="tnl", model__overrides={**shape, **SAVED_BEFORE}, steps=4),
                  verbose=False)
    _as_written_before_the_options(first.out_dir, SAVED_BEFORE)
    resumed = train(make_config("run", model__arch="tnl", model__overrides=shape, steps=6), resume=True,
                    verbose=False)
    assert resumed.step == 6
    saved = json.loads((resumed.checkpoint / "config.json").read_text())["config"]
    assert saved["options"] == {"slopes": "pow2", "v_silu": False}  # not the new defaults (alibi, SiLU on v)


def test_kept_steps_every_k_tokens_and_log_spaced():
    # 128 tokens a step: every 300 tokens is steps 3 (384 >= 300), 5 (640 >= 600), 8 (1024 >= 900), up to 8 steps.
    assert ckpt.kept_steps(8, 128, every_tokens=300) == {3, 5, 8}
    assert ckpt.kept_steps(8, 128, log_points=4) == {1, 2, 4, 8}
    assert ckpt.kept_steps(1000, 128, log_points=4) == {1, 10, 100, 1000}
    assert ckpt.kept_steps(8, 128, log_points=1) == {8}
    assert ckpt.kept_steps(8, 128) == frozenset()
    assert ckpt.kept_steps(8, 128, every_tokens=256, log_points=2) == {1, 2, 4, 6, 8}


def test_a_run_keeps_checkpoints_at_chosen_points(make_config):
    """checkpoint.keep_log / keep_every_tokens: those steps' checkpoints are written and never pruned, beside the
    newest `keep` (here 1) of the periodic ones; a negative count is refused."""
    cfg = make_config("kept", steps=8, checkpoint__every=0, checkpoint__keep=1, checkpoint__keep_log=4,
                      checkpoint__keep_every_tokens=3 * 4 * 32)
    out = train(cfg, verbose=False).out_dir
    assert steps_of(out) == [f"step_{s:08d}" for s in (1, 2, 3, 4, 6, 8)]
    for step, path in ckpt.list_checkpoints(out / "checkpoints"):
        ckpt.verify(path, model_only_ok=True)
        assert ckpt.is_model_only(path) == (step != 8)  # the kept points shed their optimizer state; the newest not
    from linlm.errors import ConfigError

    with pytest.raises(ConfigError, match="checkpoint.keep_log"):
        make_config("bad", checkpoint__keep_log=-1)


def test_kept_checkpoints_become_model_only(make_config, caplog):
    """A kept point past the newest `keep` drops its optimizer and RNG files (same weights, same digests), loads as a
    model and as --init-from weights, is passed over (not set aside) when a run resumes, and refuses to be resumed
    from by name; one holding a file of the user's stays whole."""
    import linlm
    from linlm.io_utils import MANIFEST

    out = train(make_config("full", steps=4, checkpoint__every=1, checkpoint__keep=10), verbose=False).out_dir
    root = out / "checkpoints"
    paths = dict(ckpt.list_checkpoints(root))
    before = {s: json.loads((p / MANIFEST).read_text())["files"] for s, p in paths.items()}
    (paths[3] / "notes.txt").write_text("mine")
    with caplog.at_level(logging.WARNING, logger="linlm.train"):
        ckpt.prune(root, keep=1, protect=frozenset({1, 3}))
    assert sorted(dict(ckpt.list_checkpoints(root))) == [1, 3, 4]  # step 2 was not kept
    one = paths[1]
    assert ckpt.is_model_only(one) and not (one / ckpt.OPTIM_FILE).exists() and not (one / ckpt.RNG_FILE).exists()
    files = json.loads((one / MANIFEST).read_text())["files"]
    assert files == {k: v for k, v in before[1].items() if k not in (ckpt.OPTIM_FILE, ckpt.RNG_FILE)}
    full_bytes = sum(v["bytes"] for v in before[1].values())
    assert sum(v["bytes"] for v in files.values()) < 0.5 * full_bytes  # AdamW's moments are twice the weights
    ckpt.verify(one, model_only_ok=True)
    assert not ckpt.is_model_only(paths[3]) and (paths[3] / ckpt.OPTIM_FILE).is_file()  # the user's file: whole
    assert "notes.txt" in caplog.text and not ckpt.is_model_only(paths[4])
    with pytest.raises(CheckpointError, match="model-only checkpoint"):
        ckpt.verify(one)
    with pytest.raises(CheckpointError, match="model-only checkpoint"):
        ckpt.load_checkpoint(one, verified=True)
    weights = load_file(str(one / "model.safetensors"))
    model = linlm.load(one)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    # The newest full checkpoint is damaged: resuming finds no checkpoint to continue from, and names only that one.
    (paths[4] / ckpt.OPTIM_FILE).write_bytes(b"0")
    (paths[3] / ckpt.OPTIM_FILE).write_bytes(b"0")
    found, corrupt = ckpt.scan(root)
    assert found is None and [p.name for p, _ in corrupt] == ["step_00000004", "step_00000003"]
    # --init-from reads only the weights: a model-only checkpoint will do.
    init = train(make_config("init", steps=1, init_from=str(one)), verbose=False)
    assert init.out_dir.is_dir()
