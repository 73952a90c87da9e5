"""Checkpoint files: round trips without pickle, verification, fallback, pruning, leftovers."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from linlm import create_model
from linlm.errors import CheckpointError
from linlm.train import checkpoint as ckpt
from linlm.train.distributed import DistInfo, full_state_dicts, load_full_state_dicts


def trained_model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = create_model("llama", preset="tiny")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.9))
    for _ in range(2):
        model(torch.randint(0, 512, (2, 8))).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def write(root, step, model, opt, keep=10):
    msd, osd = full_state_dicts(model, opt, DistInfo())
    return ckpt.save_checkpoint(root, step, model_state=msd, model_config=model.config.to_dict(),
                                optimizer_state=osd, state={"data": {"step": step}}, config_yaml="steps: 1\n",
                                keep=keep)


def test_round_trip_is_exact_and_holds_no_pickle(tmp_path):
    model, opt = trained_model_and_optimizer()
    path = write(tmp_path, 5, model, opt)
    assert sorted(os.listdir(path)) == sorted(["model.safetensors", "config.json", "optimizer.safetensors",
                                               "rng.safetensors", "state.json", "train_config.yaml",
                                               "manifest.json", ".linlm-files.json"])
    from linlm import outputs

    assert outputs.owns_dir(path) and all(outputs.owns_file(p) for p in path.iterdir() if p.name != outputs.LEDGER)
    c = ckpt.load_checkpoint(path)
    assert c.step == 5 and c.state["data"] == {"step": 5}
    model2, opt2 = trained_model_and_optimizer(seed=1)
    load_full_state_dicts(model2, opt2, c.model, c.optimizer)
    for (n, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(a, b), n
    s1, s2 = opt.state_dict(), opt2.state_dict()
    for i in s1["state"]:
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(s1["state"][i][k], s2["state"][i][k])
    assert s2["param_groups"][0]["betas"] == (0.8, 0.9)
    import linlm

    linlm.load(path)  # a checkpoint is a saved model too


def test_rng_states_round_trip():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    tensors, rest = ckpt.capture_rng()
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    ckpt.restore_rng(tensors, rest)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "unfinished"])
def test_verify_detects_damage_and_latest_valid_falls_back(tmp_path, damage):
    model, opt = trained_model_and_optimizer()
    write(tmp_path, 1, model, opt)
    newest = write(tmp_path, 2, model, opt)
    target = newest / "optimizer.safetensors"
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:100])
    elif damage == "flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 1
        target.write_bytes(bytes(data))
    elif damage == "delete":
        target.unlink()
    else:
        (newest / "manifest.json").unlink()
    with pytest.raises(CheckpointError):
        ckpt.verify(newest)
    warnings = []
    found = ckpt.latest_valid(tmp_path, warn=warnings.append)
    assert found == tmp_path / "step_00000001"
    assert len(warnings) == 1 and "step_00000002" in warnings[0]
    assert (tmp_path / "step_00000002.corrupt").is_dir() and not newest.exists()


def test_keep_last_k_and_leftovers(tmp_path):
    model, opt = trained_model_and_optimizer()
    for step in range(1, 6):
        write(tmp_path, step, model, opt, keep=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [4, 5]
    (tmp_path / ".step_00000006.abc.tmp").mkdir()
    (tmp_path / ".step_00000006.abc.tmp" / "model.safetensors").write_bytes(b"partial")
    ckpt.clean_temporaries(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["step_00000004", "step_00000005"]


def test_failed_write_leaves_nothing_and_names_the_previous(tmp_path, monkeypatch):
    model, opt = trained_model_and_optimizer()
    write(tmp_path, 1, model, opt)

    def deny(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(ckpt, "_write_json", deny)
    with pytest.raises(CheckpointError, match="Permission denied.*step_00000001 is intact"):
        write(tmp_path, 2, model, opt)
    assert sorted(os.listdir(tmp_path)) == ["step_00000001"]


def test_resolve_checkpoint_accepts_run_dirs_and_checkpoints(tmp_path):
    model, opt = trained_model_and_optimizer()
    path = write(tmp_path / "run" / "checkpoints", 3, model, opt)
    assert ckpt.resolve_checkpoint(tmp_path / "run") == path
    assert ckpt.resolve_checkpoint(path) == path
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        ckpt.resolve_checkpoint(tmp_path)
