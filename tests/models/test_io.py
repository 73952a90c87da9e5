import json

import pytest
import torch

import linlm
from linlm import create_model
from linlm.errors import CheckpointError
from linlm.models.registry import ARCHITECTURES


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_save_load_roundtrip(tmp_path, arch):
    model = create_model(arch, preset="tiny").eval()
    model.save(tmp_path / "m")
    loaded = linlm.load(tmp_path / "m").eval()
    assert loaded.config == model.config
    ids = torch.randint(0, 512, (2, 21))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)


def _saved(tmp_path):
    model = create_model("tnl", preset="tiny")
    model.save(tmp_path / "m")
    return tmp_path / "m"


def test_truncated_weights_raise(tmp_path):
    path = _saved(tmp_path)
    w = path / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="checksum|truncated|corrupt"):
        linlm.load(path)


def test_truncated_weights_without_checksum_raise(tmp_path):
    path = _saved(tmp_path)
    meta = json.loads((path / "config.json").read_text())
    del meta["weights_sha256"]
    (path / "config.json").write_text(json.dumps(meta))
    w = path / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size - 100])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        linlm.load(path)


def test_wrong_shapes_raise(tmp_path):
    path = _saved(tmp_path)
    meta = json.loads((path / "config.json").read_text())
    meta["config"]["d_model"] = 128
    del meta["weights_sha256"]
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="shape"):
        linlm.load(path)


def test_unknown_architecture_raises(tmp_path):
    path = _saved(tmp_path)
    meta = json.loads((path / "config.json").read_text())
    meta["config"]["arch"] = "transformer-xl"
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="transformer-xl.*valid choices"):
        linlm.load(path)


def test_missing_directory_raises(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        linlm.load(tmp_path / "nope")


def test_save_over_existing_replaces_atomically(tmp_path):
    path = _saved(tmp_path)
    model = create_model("tnl", preset="tiny")
    model.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary leftovers
    loaded = linlm.load(path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
