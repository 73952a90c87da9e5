"""The run directory: its lock, refusals that change nothing, resume of finished or corrupt runs, one-line
errors for paths that cannot be written."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from output_asserts import hold_lock
from train_helpers import cli_env, run_cli, tiny_config_dict, write_yaml

from linlm import outputs
from linlm.errors import CheckpointError, ConfigError, DataError, LockedError, StorageError
from linlm.locking import DirLock
from linlm.train import TrainConfig, train
from linlm.train import checkpoint as ckpt


def snapshot(root: Path) -> dict:
    """Every file under root with its bytes (the lock file, which notes its holder, aside)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


# ---- locks --------------------------------------------------------------------------------------------------


def test_a_locked_run_dir_stops_a_second_trainer_naming_the_pid(make_config):
    cfg = make_config("run", steps=2)
    Path(cfg.out_dir).mkdir(parents=True)
    holder = hold_lock(Path(cfg.out_dir))
    try:
        with pytest.raises(LockedError, match=f"PID {holder.pid}"):
            train(cfg, verbose=False)
        assert snapshot(Path(cfg.out_dir)) == {}  # refused before writing anything
    finally:
        holder.kill()
        holder.wait()
    # a lock left by a killed process never blocks the next run
    assert train(cfg, verbose=False).finished


def test_a_second_cli_trainer_is_refused_and_a_kill_9_leaves_no_stale_lock(tiny_data, tmp_path):
    out = tmp_path / "run"
    long = write_yaml(tmp_path / "long.yaml", tiny_config_dict(tiny_data, out, steps=100000, checkpoint__every=0))
    first = subprocess.Popen([sys.executable, "-m", "linlm", "train", "--config", str(long), "--quiet"],
                             env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text():
            assert first.poll() is None and time.time() < deadline, "the first trainer did not start"
            time.sleep(0.2)
        second = run_cli(["train", "--config", str(long), "--resume", "--quiet"], timeout=120)
        assert second.returncode == 2, second.stderr
        assert f"PID {first.pid}" in second.stderr and "Traceback" not in second.stderr
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    again = run_cli(["train", "--config", str(long), "--overwrite", "--quiet", "steps=2"], timeout=300)
    assert again.returncode == 0, again.stderr


def _prepare_cmd(source: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "linlm", "data", "prepare", "--source", str(source), "--tokenizer", "bpe:300",
            "--out", str(out), "--no-progress", "--num-workers", "1", "--val-fraction", "0.1"]


def test_two_processes_preparing_the_same_source_wait_for_each_other(text_file, tmp_path):
    out = tmp_path / "prepared"
    procs = [subprocess.Popen(_prepare_cmd(text_file, out), env=cli_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (stdout, stderr) in zip(procs, results):
        assert proc.returncode == 0, stderr
    from linlm.data.loader import TokenDataset

    assert TokenDataset(out, "train", verify=True).num_tokens > 0


def test_a_prepare_lock_left_by_a_killed_process_does_not_block(text_file, tmp_path):
    out = tmp_path / "prepared"
    out.mkdir()
    holder = hold_lock(out)
    with pytest.raises(LockedError, match=f"PID {holder.pid}"):
        from linlm.data.prepare import prepare

        prepare(str(text_file), "bpe:300", out, progress=False, num_workers=1, wait_for_lock=False)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    done = subprocess.run(_prepare_cmd(text_file, out), env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_dir_lock_is_exclusive_within_a_process_too(tmp_path):
    with DirLock(tmp_path, "out_dir"):
        with pytest.raises(LockedError, match=f"PID {os.getpid()}"):
            DirLock(tmp_path, "out_dir").acquire()
    DirLock(tmp_path, "out_dir").acquire().release()


# ---- refusals change nothing ----------------------------------------------------------------------------------


def test_a_refused_resume_leaves_config_yaml_and_a_later_resume_works(make_config, text_file, tmp_path):
    from linlm.data.prepare import prepare

    cfg = make_config("run", steps=4)
    train(cfg, verbose=False)
    other = tmp_path / "other-data"
    prepare(str(text_file), "bpe:300", other, val_fraction=0.2, progress=False, num_workers=1, split_chars=1024)
    before = snapshot(Path(cfg.out_dir))
    moved = TrainConfig.from_dict({**cfg.to_dict(), "steps": 6, "data": {**cfg.to_dict()["data"],
                                                                          "dir": str(other)}})
    with pytest.raises((DataError, CheckpointError)):
        train(moved, resume=True, verbose=False)
    assert snapshot(Path(cfg.out_dir)) == before
    longer = TrainConfig.from_dict({**cfg.to_dict(), "steps": 6})
    assert train(longer, resume=True, verbose=False).step == 6


def test_resume_of_a_finished_run_says_so_and_keeps_its_summary(make_config):
    cfg = make_config("run", steps=4)
    first = train(cfg, verbose=False)
    before = snapshot(Path(cfg.out_dir))
    again = train(cfg, resume=True, verbose=False)
    assert again.finished and again.step == 4 and again.loss == pytest.approx(first.loss)
    assert snapshot(Path(cfg.out_dir)) == before
    assert json.loads((Path(cfg.out_dir) / "summary.json").read_text())["loss"] == pytest.approx(first.loss)


def test_a_corrupt_only_checkpoint_stops_resume_with_exit_2(make_config, tmp_path):
    cfg = make_config("run", steps=4, checkpoint__keep=1)
    train(cfg, verbose=False)
    (only,) = [p for _, p in ckpt.list_checkpoints(Path(cfg.out_dir) / "checkpoints")]
    weights = only / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    before = snapshot(Path(cfg.out_dir))
    path = write_yaml(tmp_path / "cfg.yaml", cfg.to_dict())
    done = run_cli(["train", "--config", str(path), "--resume", "--quiet"], timeout=300)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("linlm: error:")]
    assert "Traceback" not in done.stderr and len(errors) == 1 and "--overwrite" in errors[0], done.stderr
    assert snapshot(Path(cfg.out_dir)) == before  # not restarted, not moved aside


def test_resume_compares_the_checkpoints_own_config(make_config, tmp_path):
    cfg = make_config("run", steps=4)
    train(cfg, verbose=False)
    # someone edits config.yaml: it now agrees with a run of another learning rate
    edited = TrainConfig.from_dict({**cfg.to_dict(), "optim": {**cfg.to_dict()["optim"], "lr": 0.5}})
    (Path(cfg.out_dir) / "config.yaml").write_text(edited.to_yaml())
    with pytest.raises(ConfigError, match=r"checkpoint step_00000004 was made with a different optim.lr"):
        train(TrainConfig.from_dict({**edited.to_dict(), "steps": 6}), resume=True, verbose=False)


def test_a_missing_config_yaml_is_named_as_missing(make_config):
    cfg = make_config("run", steps=4)
    train(cfg, verbose=False)
    (Path(cfg.out_dir) / "config.yaml").unlink()
    with pytest.raises(ConfigError) as e:
        train(cfg, verbose=False)
    assert "config.yaml is missing" in str(e.value) and "unreadable" not in str(e.value)
    # resume still works: the checkpoint carries its own config
    assert train(TrainConfig.from_dict({**cfg.to_dict(), "steps": 6}), resume=True, verbose=False).step == 6


def test_demo_refuses_a_run_it_did_not_make(make_config, monkeypatch):
    from linlm.commands import demo

    cfg = make_config("run", steps=2)
    train(cfg, verbose=False)
    before = snapshot(Path(cfg.out_dir))
    monkeypatch.setattr("linlm.train.trainer.train", lambda *a, **k: pytest.fail("the demo trained over the run"))
    with pytest.raises(ConfigError, match="did not make"):
        demo.run_demo(out_dir=cfg.out_dir, steps=2)
    assert snapshot(Path(cfg.out_dir)) == before
    # a mark the user made does not make the run the demo's
    (Path(cfg.out_dir) / demo.DEMO_MARK).write_text("demo\n")
    with pytest.raises(ConfigError, match="did not make"):
        demo.run_demo(out_dir=cfg.out_dir, steps=2)
    # a run the demo marked as its own (linlm wrote the mark) may be replaced
    (Path(cfg.out_dir) / demo.DEMO_MARK).unlink()
    outputs.write_text(Path(cfg.out_dir) / demo.DEMO_MARK, "demo\n")
    seen = {}

    def fake_train(cfg, **kwargs):
        seen.update(kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr("linlm.train.trainer.train", fake_train)
    with pytest.raises(KeyboardInterrupt):
        demo.run_demo(out_dir=cfg.out_dir, steps=2)
    assert seen["overwrite"] is True


# ---- paths that cannot be written --------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["out_dir", "cache", "data_out"])
def test_a_path_under_a_file_is_a_one_line_error(tiny_data, tmp_path, text_file, where):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    env = None
    if where == "out_dir":
        path = write_yaml(tmp_path / "c.yaml", tiny_config_dict(tiny_data, blocker / "run", steps=2))
        args = ["train", "--config", str(path), "--quiet"]
    elif where == "cache":
        cfg = tiny_config_dict(tiny_data, tmp_path / "run", steps=2)
        cfg["data"] = {"source": str(text_file), "tokenizer": "bpe:300", "seq_len": 32}
        args = ["train", "--config", str(write_yaml(tmp_path / "c.yaml", cfg)), "--quiet"]
        env = {**cli_env(), "LINLM_CACHE_DIR": str(blocker / "cache")}
    else:
        args = ["data", "prepare", "--source", str(text_file), "--tokenizer", "bpe:300", "--out",
                str(blocker / "data"), "--no-progress"]
    done = subprocess.run([sys.executable, "-m", "linlm", *args], env=env or cli_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("linlm: error:")]
    assert "Traceback" not in done.stderr and len(errors) == 1 and "a-file" in errors[0], done.stderr
    assert blocker.read_text() == "not a directory\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_out_dir_is_a_one_line_error(make_config, tmp_path):
    cfg = make_config("ro/run", steps=2)
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    try:
        with pytest.raises(StorageError):
            train(cfg, verbose=False)
    finally:
        (tmp_path / "ro").chmod(0o700)


def test_a_read_only_out_dir_simulated(make_config, monkeypatch):
    """As the test above, for any user: the lock file cannot be created (EROFS)."""
    import linlm.locking

    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(linlm.locking.os, "open", read_only)
    cfg = make_config("run", steps=2)
    with pytest.raises(StorageError, match="Read-only file system"):
        train(cfg, verbose=False)
    assert not Path(cfg.out_dir).exists()  # the directory this run created is gone again


def test_a_full_disk_at_config_yaml_is_one_error_and_nothing_half_written(make_config, monkeypatch):
    import linlm.io_utils

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(linlm.io_utils.os, "fsync", full)
    cfg = make_config("run", steps=2)
    with pytest.raises(StorageError, match="No space left on device") as e:
        train(cfg, verbose=False)
    assert "\n" not in str(e.value)
    assert not Path(cfg.out_dir).exists()  # no config.yaml, no temporary file, no empty directory


def test_a_failed_metrics_write_fails_once_and_close_does_not_fail_again(make_config, monkeypatch):
    from linlm.train import metrics

    calls = {"n": 0}
    real_open = open

    class Full:
        """A log file whose disk fills at the third line (every later write and flush fails too)."""

        def __init__(self, f):
            self.f, self.closed = f, False

        def write(self, text):
            calls["n"] += 1
            if calls["n"] >= 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.write(text)

        def flush(self):
            if calls["n"] >= 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.f.flush()

        def fileno(self):
            return self.f.fileno()

        def close(self):
            self.closed = True
            self.f.close()
            if calls["n"] >= 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fake_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return Full(f) if str(path).endswith("metrics.jsonl") and "a" in mode else f

    monkeypatch.setattr(metrics, "open", fake_open, raising=False)
    cfg = make_config("run", steps=6)
    with pytest.raises(StorageError, match="step 3"):  # not an OSError from close() on the way out
        train(cfg, verbose=False)
