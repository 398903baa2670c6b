"""The real trainer under DistributedDataParallel: 2 gloo processes launched by torchrun on CPU.

Tolerances:
* classifier only (--px-weight 0, no sigma noise, no augmentation): the 2-process run sees the same
  global batches as 1 process (the (seed, epoch) permutation dealt out) and DDP averages the two
  half-batch gradients, which equals the full-batch gradient up to float summation order
  (~1e-7 relative per step). Over 20 Adam steps that stays far below 1e-4, the tolerance used.
* JEM (--px-weight 1): each rank draws its own SGLD noise, buffer chains and re-initialisations,
  so only the sampling-independent part can be compared: the cross-entropy term after one epoch
  stays within 0.05 of the single-process run's (seen: < 0.01), and the run's invariants hold
  (gathered buffer, world size, distinct per-rank streams, exact resume with 2 processes).
"""
from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from jemeval.errors import UsageError
from jemeval.formats.native import read_checkpoint
from jemeval.runtime.distributed import DistContext
from jemeval.training import ddp, resolve_config, train
from jemeval.training.rundir import LOCK_NAME

TINY = ["digits[0-2]", "--arch", "cnn:width=8", "--batch-size", "32", "--lr", "2e-3", "--warmup-iters", "4",
        "--decay-epochs=", "--val-size", "60", "--sgld-steps", "2", "--buffer-size", "120", "--seed", "3",
        "--device", "cpu"]  # gloo on CPU, also where a GPU is visible
CLASSIFIER = ["--px-weight", "0", "--sigma", "0", "--augment", "none"]
API = {"arch": "cnn:width=8", "batch_size": 32, "lr": 2e-3, "warmup_iters": 4,
       "decay_epochs": (), "val_size": 60, "sgld_steps": 2, "buffer_size": 120, "seed": 3, "progress": False,
       "test_eval": False, "device": "cpu"}


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", PYTHONWARNINGS="ignore")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def torchrun(*args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m jemeval train ARGS``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "jemeval", "train", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, env=_env(), timeout=120)


def rows(path, *, timings: bool = True) -> list[dict]:
    """The epoch rows of metrics.csv (without the wall-clock columns when ``timings`` is False)."""
    with open(path) as fh:
        out = [r for r in csv.DictReader(fh) if not r["event"]]
    if not timings:
        out = [{k: v for k, v in r.items() if k not in ("seconds", "images_per_s")} for r in out]
    return out


@pytest.mark.slow
def test_classifier_two_processes_match_one(tmp_path):
    two = torchrun(*TINY, *CLASSIFIER, "--epochs", "2", "--no-progress", "--json",
                   "--out", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count('"status"') == 1  # the summary comes from rank 0 only
    summary = json.loads(two.stdout)
    assert summary["world_size"] == 2 and summary["config"]["resolved"]["per_rank_batch"] == 16
    # --device cpu: gloo processes on CPU even where CUDA is visible
    assert summary["config"]["resolved"]["backend"] == "gloo" and summary["config"]["resolved"]["device"] == "cpu"
    classifier = {**API, "px_weight": 0.0, "sigma": 0.0, "augment": "none", "epochs": 2}
    one = train(resolve_config("digits[0-2]", **classifier, out=str(tmp_path / "one"))).records[0]
    a, b = rows(tmp_path / "one" / "metrics.csv"), rows(tmp_path / "two" / "metrics.csv")
    assert len(a) == len(b) == 2
    for ra, rb in zip(a, b):
        assert ra["step"] == rb["step"] and ra["train_acc"] == rb["train_acc"]
        assert float(rb["loss"]) == pytest.approx(float(ra["loss"]), rel=1e-4)
    wa, wb = read_checkpoint(one["last"])["state_dict"], read_checkpoint(summary["last"])["state_dict"]
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-5), k


def jemeval_nproc(*args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    """``python -m jemeval train ARGS --nproc N`` (re-launches itself through torchrun)."""
    cmd = [sys.executable, "-m", "jemeval", "train", *args, "--nproc", str(nproc)]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, env=_env(), timeout=120)


@pytest.mark.slow
def test_jem_two_processes_resume_exactly_and_refuse_another_world_size(tmp_path):
    full = jemeval_nproc(*TINY, "--epochs", "2", "--no-progress", "--out", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr[-2000:]
    half = torchrun(*TINY, "--epochs", "1", "--no-progress", "--out", str(tmp_path / "half"))
    assert half.returncode == 0, half.stderr[-2000:]
    # a different world size is refused with one line, before any work
    with pytest.raises(UsageError, match=r"written by 2 process\(es\) but this run has 1.*nproc=2"):
        train(resolve_config("digits[0-2]", **{**API, "epochs": 2}, out=str(tmp_path / "half"), resume=True))
    resumed = torchrun(*TINY, "--epochs", "2", "--no-progress", "--resume", "--out", str(tmp_path / "half"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = read_checkpoint(tmp_path / "full" / "last.pt"), read_checkpoint(tmp_path / "half" / "last.pt")
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    assert torch.equal(a["replay_buffer"], b["replay_buffer"])
    assert rows(tmp_path / "full" / "metrics.csv", timings=False) == \
        rows(tmp_path / "half" / "metrics.csv", timings=False)
    # invariants: the gathered buffer (60 chains per rank), the world size, one stream per rank
    ts = a["training_state"]
    assert a["replay_buffer"].shape[0] == 120 and ts["world_size"] == 2 and len(ts["ranks"]) == 2
    assert not torch.equal(ts["ranks"][0]["rng"]["generator"], ts["ranks"][1]["rng"]["generator"])
    assert a["config"]["resolved"]["per_rank_buffer"] == 60
    # loosely like one process: the cross-entropy term does not depend on the sampler's noise much
    one = train(resolve_config("digits[0-2]", **{**API, "epochs": 1}, out=str(tmp_path / "one"))).records[0]
    r1, r2 = rows(one["metrics"])[0], rows(tmp_path / "full" / "metrics.csv")[0]
    assert abs(float(r1["loss_pyx"]) - float(r2["loss_pyx"])) < 0.05
    assert all(abs(float(r["energy_gap"])) < 10 for r in rows(tmp_path / "full" / "metrics.csv"))


@pytest.mark.slow
def test_nproc_flag_relaunches_and_checks_the_batch(tmp_path):
    cmd = [sys.executable, "-m", "jemeval", "train", *TINY, "--epochs", "1", "--nproc", "2", "--batch-size", "31",
           "--out", str(tmp_path / "bad")]
    bad = subprocess.run(cmd, check=False, capture_output=True, text=True, env=_env(), timeout=60)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "--batch-size 31 is the global batch and must be divisible by the 2 processes" in bad.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_a_locked_run_folder_stops_every_process_at_once(tmp_path):
    """Only rank 0 takes the run folder's lock; when another process holds it, every rank exits with
    the one-line refusal instead of waiting for rank 0 (the process-group timeout is 10 minutes)."""
    out = tmp_path / "locked"
    out.mkdir()
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "start": None, "token": "t"}  # a live process
    (out / LOCK_NAME).write_text(json.dumps(holder))
    started = time.monotonic()
    res = torchrun(*TINY, "--epochs", "1", "--no-progress", "--out", str(out))
    assert res.returncode != 0 and time.monotonic() - started < 100
    assert res.stderr.count(f"in use by another jemeval train (process {os.getpid()})") == 2  # both ranks say why
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]


class _Rank1(DistContext):
    """Rank 1 of 2 without a process group (collectives are single-process no-ops): what it writes."""

    def wrap(self, model, **_):
        return model


def test_only_rank_zero_writes_files(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(ddp, "join", lambda device, batch: _Rank1(rank=1, world_size=2))
    out = tmp_path / "rank1"
    summary = train(resolve_config("digits[0-2]", **{**API, "epochs": 1, "grid_every": 1, "progress": True},
                                   out=str(out))).records[0]
    assert summary["status"] == "completed" and summary["steps"] == 10
    assert not out.exists() or not any(out.rglob("*"))
    assert "epoch 1/1" not in capfd.readouterr().err  # no progress bar or epoch line either


def test_global_batch_and_world_size_checks(tmp_path):
    """What the trainer refuses under DDP, in one line naming the parameter (before any work)."""
    ddp.check_global_batch(64, 4)
    ddp.check_global_batch(31, 1)
    with pytest.raises(UsageError, match=r"batch_size=66 is the global batch and must be divisible by the 4 "
                                         r"processes: use a multiple of 4, e.g. 64") as exc:
        ddp.check_global_batch(66, 4)
    assert exc.value.param == "batch_size"
    ddp.check_world(2, DistContext(world_size=2), tmp_path / "last.pt")
    ddp.check_world(None, DistContext(), tmp_path / "last.pt")  # runs before DDP support: one process
    with pytest.raises(UsageError, match=r"written by 2 process\(es\) but this run has 4: continue it with nproc=2"):
        ddp.check_world(2, DistContext(world_size=4), tmp_path / "last.pt")
    assert ddp.buffer_share(120, DistContext(world_size=4)) == 30
    with pytest.raises(UsageError, match="buffer_size=3 leaves no chains for each of 4 processes"):
        ddp.buffer_share(3, DistContext(world_size=4))
