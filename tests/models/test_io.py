import json
import sys

import pytest
import torch

import linlm
from linlm import create_model
from linlm.errors import CheckpointError
from linlm.models import format as model_format
from linlm.models.format import config_checksum
from linlm.models.registry import ARCHITECTURES


def _edit_config(path, checksum=True, drop=(), **changes):
    """Change config.json's model config; with checksum=True also rewrite config_sha256 (a deliberate edit).
    ``drop``: top-level keys of config.json to delete afterwards."""
    meta = json.loads((path / "config.json").read_text())
    meta["config"].update(changes)
    if checksum:
        meta["config_sha256"] = config_checksum(meta["config"])
    for key in drop:
        del meta[key]
    (path / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _tree(root):
    """{relative path: bytes} of every file under root (linlm's ledgers aside)."""
    from linlm.outputs import LEDGER

    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and p.name != LEDGER}


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
    _edit_config(path, drop=["weights_sha256"])
    assert linlm.load(path) is not None
    w = path / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size - 100])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        linlm.load(path)


def test_wrong_shapes_raise(tmp_path):
    path = _saved(tmp_path)
    _edit_config(path, drop=["weights_sha256"], d_model=128)
    with pytest.raises(CheckpointError, match="shape"):
        linlm.load(path)


def test_unknown_architecture_raises(tmp_path):
    path = _saved(tmp_path)
    _edit_config(path, arch="transformer-xl")
    with pytest.raises(CheckpointError, match="transformer-xl.*valid choices"):
        linlm.load(path)


def test_missing_directory_raises(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        linlm.load(tmp_path / "nope")


def test_save_over_existing_replaces_atomically(tmp_path):
    path = _saved(tmp_path)
    model = create_model("tnl", preset="tiny")
    model.save(path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary leftovers
    loaded = linlm.load(path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


# ---- saving never removes what linlm did not write ----------------------------------------------------------


def _assert_refused(target, match, overwrite=False):
    """Saving to ``target`` raises CheckpointError and changes nothing under its parent (no temporaries either)."""
    before = _tree(target.parent)
    with pytest.raises(CheckpointError, match=match):
        create_model("tnl", preset="tiny").save(target, overwrite=overwrite)
    assert _tree(target.parent) == before


def test_save_onto_existing_file_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("my notes")
    _assert_refused(tmp_path / "notes.txt", "existing file.*nothing was written", overwrite=True)


@pytest.mark.parametrize("overwrite", [False, True])
def test_save_into_foreign_directory_is_refused(tmp_path, overwrite):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_00000010").mkdir(parents=True)
    (run / "checkpoints" / "step_00000010" / "model.safetensors").write_bytes(b"weights")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "NOTES.md").write_text("do not delete")
    _assert_refused(run, "not a saved linlm model.*NOTES.md", overwrite)


def test_save_under_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    _assert_refused(tmp_path / "f" / "m", "cannot be written")


def test_save_onto_a_symlink_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    _assert_refused(tmp_path / "link", "symbolic link", overwrite=True)


def test_save_into_empty_directory(tmp_path):
    (tmp_path / "m").mkdir()
    create_model("tnl", preset="tiny").save(tmp_path / "m")
    assert sorted(_tree(tmp_path)) == ["m/config.json", "m/model.safetensors"]


def test_replacing_a_saved_model_needs_overwrite(tmp_path):
    _assert_refused(_saved(tmp_path), "pass overwrite=True")


def test_overwrite_refuses_a_model_directory_holding_user_files(tmp_path):
    path = _saved(tmp_path)
    (path / "README.md").write_text("how I trained this")
    _assert_refused(path, "did not write.*README.md", overwrite=True)


def test_training_checkpoint_is_not_overwritten_by_save(tmp_path):
    _assert_refused(_checkpoint(tmp_path), "did not write.*manifest.json", overwrite=True)


def test_failed_overwrite_leaves_the_old_model(tmp_path, monkeypatch):
    path = _saved(tmp_path)
    before = _tree(path)

    def fail(directory, state_dict, config):
        (directory / "model.safetensors").write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model_format, "write_model_files", fail)
    with pytest.raises(CheckpointError, match="No space left on device.*unchanged"):
        create_model("tnl", preset="tiny").save(path, overwrite=True)
    assert _tree(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


@pytest.mark.parametrize("exchange", [True, False])
def test_commit_dir_removes_only_owned_files(tmp_path, caplog, monkeypatch, exchange):
    from linlm import outputs
    from linlm.outputs import trees

    if exchange and not sys.platform.startswith("linux"):
        pytest.skip("the atomic swap of two directories (renameat2 RENAME_EXCHANGE) is Linux's")
    swaps: list[bool] = []  # what each swap attempt returned
    real = trees._exchange

    def exchange_seen(a, b):
        swaps.append(real(a, b) if exchange else False)  # False: a system without the swap (two renames)
        return swaps[-1]

    monkeypatch.setattr(trees, "_exchange", exchange_seen)

    target = tmp_path / "d"
    first = outputs.temp_dir_beside(target)
    (first / "a.bin").write_text("old")
    outputs.commit_dir(first, target)
    (target / "mine.txt").write_text("user")
    tmp = outputs.temp_dir_beside(target)
    (tmp / "a.bin").write_text("new")
    outputs.commit_dir(tmp, target)
    assert _tree(target) == {"a.bin": b"new"} and outputs.owns_dir(target)
    assert swaps == [exchange]  # the replacement took the path under test: one swap, or two renames
    kept = [p for p in tmp_path.iterdir() if p.name != "d"]
    assert len(kept) == 1 and _tree(kept[0]) == {"mine.txt": b"user"}
    assert "mine.txt" in caplog.text


# ---- integrity checks on load ----------------------------------------------------------------------------------


def test_edited_config_is_refused(tmp_path):
    path = _saved(tmp_path)
    _edit_config(path, checksum=False, norm_eps=1e-2)
    with pytest.raises(CheckpointError, match="config_sha256"):
        linlm.load(path)


def test_removed_config_checksum_is_refused(tmp_path):
    path = _saved(tmp_path)
    _edit_config(path, drop=["config_sha256"], norm_eps=1e-2)
    with pytest.raises(CheckpointError, match="config_sha256 is missing"):
        linlm.load(path)


def _checkpoint(tmp_path, model=None):
    from linlm.train.checkpoint import save_checkpoint

    model = model or create_model("tnl", preset="tiny")
    return save_checkpoint(tmp_path / "checkpoints", 5, model_state=model.state_dict(),
                           model_config=model.config.to_dict(), optimizer_state={}, state={}, config_yaml="steps: 5\n")


def test_load_checkpoint_verifies_manifest(tmp_path):
    model = create_model("tnl", preset="tiny").eval()
    path = _checkpoint(tmp_path, model)
    ids = torch.randint(0, 512, (1, 9))
    with torch.no_grad():
        assert torch.equal(linlm.load(path).eval()(ids), model(ids))
    # An edit that keeps config.json self-consistent (and its size) is still caught by the manifest.
    size = (path / "config.json").stat().st_size
    _edit_config(path, norm_eps=9e-06)
    assert (path / "config.json").stat().st_size == size
    with pytest.raises(CheckpointError, match="config.json: sha256 differs from the manifest"):
        linlm.load(path)


def test_load_checkpoint_detects_changed_other_file(tmp_path):
    path = _checkpoint(tmp_path)
    f = path / "state.json"
    f.write_text(f.read_text().replace('"step": 5', '"step": 6'))
    with pytest.raises(CheckpointError, match="state.json"):
        linlm.load(path)


def test_load_refuses_checkpoint_manifest_missing_model_files(tmp_path):
    path = _checkpoint(tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["files"]["config.json"]
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="does not list config.json"):
        linlm.load(path)
