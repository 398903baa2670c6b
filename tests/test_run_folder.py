"""The run folder of `jemeval train` (issue 11): no silent replacement of a run, one process at a
time (a pid lock, stale locks taken over), metrics.csv derivable from last.pt, no debris from killed
writes, no parent folders created, --nproc bounded by the devices. Runs are tiny (a few seconds)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from jemeval.errors import UsageError
from jemeval.formats.native import read_checkpoint
from jemeval.runtime.distributed import available_cpus
from jemeval.training import resolve_config, train
from jemeval.training.rundir import LOCK_NAME, RunLock, check_launch

# 3 digit classes, batch 64 -> 5 iterations per epoch; 1 SGLD step; no test evaluation.
TINY = {"arch": "cnn:width=8", "epochs": 1, "batch_size": 64, "sgld_steps": 1, "buffer_size": 60, "val_size": 60,
        "warmup_iters": 2, "decay_epochs": (), "progress": False, "test_eval": False, "grid_every": 0, "device": "cpu"}
DATASET = "digits[0-2]"
CLI_TINY = ["digits[0-2]", "--arch", "cnn:width=8", "--epochs", "1", "--sgld-steps", "1", "--buffer-size", "60",
            "--val-size", "60", "--device", "cpu", "--no-progress"]


def tiny(out: Path, **changes) -> dict:
    return train(resolve_config(DATASET, **{**TINY, "out": str(out), **changes})).records[0]


def invoke(*args):
    from jemeval.cli import cli

    return CliRunner().invoke(cli, ["train", *args])


def one_line_error(result, exit_code: int = 2) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == exit_code and len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- item 2: a new run never silently replaces an existing one ------------------------------------
def test_new_run_refuses_a_folder_holding_a_run_and_overwrite_replaces_it(tmp_path):
    out = tmp_path / "run"
    tiny(out, epochs=2, grid_every=1)
    (out / "samples" / "mine.txt").write_text("the user's own file")
    before = snapshot(out)
    existing = r"already holds a training run \(last.pt, best.pt, metrics.csv\).*resume=True.*overwrite=True"
    with pytest.raises(UsageError, match=existing):
        tiny(out, seed=5)
    message = one_line_error(invoke(*CLI_TINY, "--out", str(out)))
    assert "--resume" in message and "--overwrite" in message
    assert snapshot(out) == before  # nothing written or changed
    # --overwrite with --resume contradicts itself: one line, before anything is read or written
    both = one_line_error(invoke(*CLI_TINY, "--out", str(out), "--resume", "--overwrite"))
    assert "--resume continues the run in its folder and --overwrite replaces it: give one of them, not both" == \
        both.removeprefix("Error: ")
    with pytest.raises(UsageError, match="not both"):
        train(DATASET, out=str(out), resume=True, overwrite=True)
    assert snapshot(out) == before
    # --overwrite deliberately replaces the run: the old grids go, the user's file stays
    replaced = tiny(out, seed=5, overwrite=True)
    assert replaced["status"] == "completed" and replaced["epochs"] == 1
    assert read_checkpoint(out / "last.pt")["config"]["seed"] == 5
    assert (out / "metrics.csv").read_text().count("\n") == 2  # header + the new run's one epoch
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["mine.txt"]
    assert read_checkpoint(out / "best.pt")["config"]["seed"] == 5
    # a run started with overwrite=True resumes like any other (the flag is not carried over)
    resumed = train(DATASET, out=str(out), resume=True, epochs=2).records[0]
    assert resumed["status"] == "completed" and resumed["epochs"] == 2


# -- item 3: one process per run folder --------------------------------------------------------------
def write_lock(folder: Path, pid: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_NAME
    lock.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "start": None, "token": "t"}))
    return lock


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_live_lock_refuses_a_second_trainer_and_a_dead_ones_is_taken_over(tmp_path, capfd):
    out = tmp_path / "run"
    lock = write_lock(out, os.getpid())  # a live process: this test's own
    with pytest.raises(UsageError, match=rf"in use by another jemeval train \(process {os.getpid()}\)"):
        tiny(out)
    assert f"process {os.getpid()}" in one_line_error(invoke(*CLI_TINY, "--out", str(out)))
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME] and json.loads(lock.read_text())["pid"] == os.getpid()
    # --nproc refuses before starting any process
    assert f"process {os.getpid()}" in one_line_error(invoke(*CLI_TINY, "--out", str(out), "--nproc", "1"))

    pid = dead_pid()
    write_lock(out, pid)
    summary = tiny(out)
    assert summary["status"] == "completed"
    assert f"took over the lock of {str(out)!r} left by process {pid}" in capfd.readouterr().err
    assert not lock.exists()  # released at the end


def test_the_lock_is_released_on_errors_and_held_while_training(tmp_path):
    out = tmp_path / "run"
    seen = []

    def look_then_fail(trainer):
        seen.append(json.loads((out / LOCK_NAME).read_text())["pid"])
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        train(resolve_config(DATASET, **{**TINY, "out": str(out)}), on_step=look_then_fail)
    assert seen == [os.getpid()] and not (out / LOCK_NAME).exists()


HOLDER = """
import sys, time
from jemeval.training.rundir import RunLock
lock = RunLock(sys.argv[1]).acquire()
try:
    print("locked", flush=True)
    time.sleep(60)
finally:
    lock.release()
"""


def start_holder(folder: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_two_real_processes_sigterm_releases_and_sigkill_leaves_a_lock_taken_over(tmp_path, capfd):
    out = tmp_path / "run"
    out.mkdir()
    holder = start_holder(out)
    try:
        assert f"process {holder.pid}" in one_line_error(invoke(*CLI_TINY, "--out", str(out)))
    finally:
        holder.send_signal(signal.SIGTERM)  # the default action would leave the lock: it is released
        holder.wait(timeout=30)
    assert not (out / LOCK_NAME).exists()

    holder = start_holder(out)
    holder.kill()  # SIGKILL: nothing can release the lock
    holder.wait(timeout=30)
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == holder.pid
    assert tiny(out)["status"] == "completed"
    assert f"left by process {holder.pid}, which is no longer running" in capfd.readouterr().err
    assert not (out / LOCK_NAME).exists()


def test_a_second_acquirer_is_refused_until_the_first_releases(tmp_path):
    first = RunLock(tmp_path).acquire()
    with pytest.raises(UsageError, match=f"process {os.getpid()}"):
        RunLock(tmp_path).acquire()
    first.release()
    first.release()  # idempotent
    assert not (tmp_path / LOCK_NAME).exists()
    RunLock(tmp_path).acquire().release()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process start times come from Linux /proc")
def test_a_recycled_pid_does_not_keep_a_lock(tmp_path):
    """A lock whose pid now belongs to another process (another start time, e.g. after a container
    restart) is stale; with the right start time it is live."""
    first = RunLock(tmp_path).acquire()
    record = json.loads((tmp_path / LOCK_NAME).read_text())
    assert record["start"] is not None
    first.release()
    (tmp_path / LOCK_NAME).write_text(json.dumps({**record, "start": str(int(record["start"]) + 1), "token": "old"}))
    second = RunLock(tmp_path).acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] != "old"
    second.release()
    (tmp_path / LOCK_NAME).write_text(json.dumps({**record, "token": "old"}))
    with pytest.raises(UsageError, match="in use"):
        RunLock(tmp_path).acquire()


# -- item 4: metrics.csv is derived from last.pt ------------------------------------------------------
def test_resume_rewrites_metrics_csv_from_last_pt(tmp_path):
    out = tmp_path / "run"
    tiny(out, epochs=2)
    original = (out / "metrics.csv").read_text()
    assert original.count("\n") == 3
    # a kill between the last.pt rename and the CSV write: the CSV lacks the last epoch's row
    (out / "metrics.csv").write_text("".join(original.splitlines(keepends=True)[:-1]))
    resumed = train(DATASET, out=str(out), resume=True).records[0]
    assert resumed["status"] == "completed" and resumed["epochs"] == 2
    assert (out / "metrics.csv").read_text() == original
    (out / "metrics.csv").unlink()
    train(DATASET, out=str(out), resume=True)
    assert (out / "metrics.csv").read_text() == original


# -- item 5: temporary files of interrupted writes are removed ----------------------------------------
def test_stale_temporary_files_are_removed_on_start_and_resume(tmp_path):
    out = tmp_path / "run"
    (out / "samples").mkdir(parents=True)

    def stale(folder: Path, name: str) -> Path:  # exactly what jemeval.atomic's mkstemp leaves behind
        fd, path = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
        os.close(fd)
        return Path(path)

    debris = [stale(out, "last.pt"), stale(out, "best.pt"), stale(out / "samples", "buffer_epoch001.png")]
    keep = [out / ".last.pt.notes.tmp", out / ".mydata.abcdefgh.tmp", out / "keep.tmp",
            out / "samples" / ".x.abcdefgh.tmp"]
    for path in keep:
        path.write_text("user data")
    tiny(out)
    assert not any(p.exists() for p in debris) and all(p.exists() for p in keep)
    debris = [stale(out, "last.pt"), stale(out, "metrics.csv")]
    train(DATASET, out=str(out), resume=True, epochs=2)
    assert not any(p.exists() for p in debris) and all(p.exists() for p in keep)


# -- item 6: the run folder may be created, its parents may not ---------------------------------------
def test_out_with_a_missing_parent_is_one_line_and_creates_nothing(tmp_path, monkeypatch):
    missing = tmp_path / "nonexistent_dir" / "run"
    with pytest.raises(UsageError, match=rf"its parent folder {str(missing.parent)!r} does not exist"):
        tiny(missing)
    message = one_line_error(invoke(*CLI_TINY, "--out", str(missing)))
    assert str(missing.parent) in message and "does not exist" in message
    assert "does not exist" in one_line_error(invoke(*CLI_TINY, "--out", str(missing), "--nproc", "1"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is a file, not a run folder"):
        tiny(tmp_path / "file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    # the default runs/DATASET is created with its parent
    monkeypatch.chdir(tmp_path)
    summary = train(DATASET, **{**TINY, "px_weight": 0.0}).records[0]
    assert summary["status"] == "completed" and Path(summary["last"]) == Path("runs/digits/last.pt")


# -- item 13: --nproc is bounded by the devices ----------------------------------------------------
@pytest.mark.any_device
def test_nproc_above_the_devices_is_refused_before_launch(tmp_path, monkeypatch):
    too_many = available_cpus() + 1
    message = one_line_error(invoke(*CLI_TINY, "--out", str(tmp_path / "cpu"), "--nproc", str(too_many)))
    assert f"--nproc {too_many} is more than the {available_cpus()} CPU core(s)" in message
    # one visible GPU (simulated): two nccl processes are refused, two gloo processes on CPU are not
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    message = one_line_error(invoke(*CLI_TINY[:-3], "--device", "cuda", "--no-progress", "--out",
                                    str(tmp_path / "gpu"), "--nproc", "2"))
    assert "needs one GPU per process but 1 GPU(s) are visible" in message and "--device cpu" in message
    assert "1 GPU(s)" in one_line_error(invoke(*CLI_TINY[:-3], "--no-progress", "--out", str(tmp_path / "gpu"),
                                               "--nproc", "2"))  # --device auto picks CUDA
    if available_cpus() >= 2:
        check_launch(resolve_config(DATASET, **{**TINY, "out": str(tmp_path / "cpu")}), 2)
    assert not any(tmp_path.iterdir())  # nothing created by any refusal


def test_nproc_zero_is_one_line(tmp_path):
    assert "--nproc must be >= 1" in one_line_error(invoke(*CLI_TINY, "--out", str(tmp_path / "r"), "--nproc", "0"))
    assert not any(tmp_path.iterdir())


def test_lock_holder_message_waits_for_a_half_written_lock(tmp_path):
    """An empty lock file (a holder between creating and writing it) is not broken at once."""
    (tmp_path / LOCK_NAME).write_text("")
    started = time.monotonic()
    with pytest.raises(UsageError, match="keeps changing"):
        RunLock(tmp_path).acquire()
    assert time.monotonic() - started < 5 and (tmp_path / LOCK_NAME).exists()
    old = time.time() - 3600
    os.utime(tmp_path / LOCK_NAME, (old, old))  # ... but an old empty one is debris of a kill
    RunLock(tmp_path).acquire().release()
    assert not (tmp_path / LOCK_NAME).exists()
