"""Exact resumption (jemeval.training.checkpointing, the trainer's stop requests): random states
survive a weights-only round trip, a resumed run equals the uninterrupted one bit for bit on CPU (after
an epoch, after SIGTERM mid-epoch, after a stop requested from Python), and last.pt's weights enter
through the one checked loader."""
from __future__ import annotations

import os
import random
import shutil
import signal

import numpy as np
import pytest
import torch

from jemeval.errors import CheckpointError
from jemeval.formats.native import read_checkpoint
from jemeval.training import resolve_config, train
from jemeval.training.checkpointing import capture_rng, restore_rng

# 3 digit classes (343 training images after validation), batch 32 -> 10 iterations per epoch.
TINY = {"arch": "cnn:width=8", "epochs": 2, "batch_size": 32, "lr": 2e-3, "warmup_iters": 4, "decay_epochs": (),
        "sgld_steps": 2, "buffer_size": 120, "val_size": 60, "progress": False, "test_eval": False, "check_every": 2,
        "device": "cpu"}


def tiny(tmp_path, name, **changes):
    return resolve_config("digits[0-2]", **{**TINY, "out": str(tmp_path / name), **changes})


def state_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def weights(path) -> dict:
    return read_checkpoint(path)["state_dict"]


def test_rng_state_survives_a_weights_only_round_trip(tmp_path):
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    torch.save(capture_rng(g), tmp_path / "rng.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=g))
    restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True), g)
    got = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=g))
    assert torch.equal(expected[0], got[0]) and np.array_equal(expected[1], got[1])
    assert expected[2] == got[2] and torch.equal(expected[3], got[3])


def test_resume_is_exact(tmp_path):
    bigger = {"arch": "cnn:width=16", "batch_size": 64}  # large enough for multi-threaded CPU kernels
    full = train(tiny(tmp_path, "full", **bigger)).records[0]
    train(tiny(tmp_path, "half", epochs=1, **bigger))
    resumed = train(tiny(tmp_path, "half", resume=True, **bigger)).records[0]
    a, b = read_checkpoint(full["last"]), read_checkpoint(resumed["last"])
    assert state_equal(a["state_dict"], b["state_dict"])
    assert torch.equal(a["replay_buffer"], b["replay_buffer"])
    opt_a, opt_b = a["training_state"]["optimizer"]["state"], b["training_state"]["optimizer"]["state"]
    assert all(state_equal(opt_a[k], opt_b[k]) for k in opt_a)
    accuracies = [[r["train_acc"] for r in x["training_state"]["metrics"]] for x in (a, b)]
    assert accuracies[0] == accuracies[1]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The uninterrupted tiny run that the stopped-and-resumed ones must equal."""
    return train(tiny(tmp_path_factory.mktemp("full"), "run")).records[0]


def test_sigterm_mid_epoch_saves_last_pt_and_resume_is_exact(tmp_path, full_run, capfd):
    def stop_at_step_5(trainer):
        if trainer.step == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # the real signal path

    stopped = train(tiny(tmp_path, "cut"), on_step=stop_at_step_5).records[0]
    assert stopped["status"] == "interrupted" and stopped["steps"] == 5
    err = capfd.readouterr().err
    assert "jemeval train: SIGTERM received; saving last.pt after this iteration (again to abort)" in err
    assert f"jemeval train: stopped (SIGTERM) at epoch 1, step 5; saved {stopped['last']}; continue with" in err
    ts = read_checkpoint(stopped["last"])["training_state"]
    assert (ts["epoch"], ts["batch"], ts["step"]) == (0, 5, 5) and ts["perm"] is not None
    resumed = train(tiny(tmp_path, "cut", resume=True)).records[0]
    assert resumed["status"] == "completed"
    assert state_equal(weights(full_run["last"]), weights(resumed["last"]))


def test_a_stop_requested_from_python_ends_like_ctrl_c_and_resumes_exactly(tmp_path, full_run):
    def stop_after_epoch_one(trainer):
        if trainer.step == 13:
            trainer.request_stop("enough for now")

    stopped = train(tiny(tmp_path, "asked"), on_step=stop_after_epoch_one).records[0]
    assert stopped["status"] == "interrupted" and (stopped["epochs"], stopped["steps"]) == (1, 13)
    resumed = train("digits[0-2]", resume=True, out=stopped["out"]).records[0]
    assert resumed["status"] == "completed" and resumed["steps"] == 20
    assert state_equal(weights(full_run["last"]), weights(resumed["last"]))


def test_python_api_resume_takes_unset_settings_from_the_run(tmp_path):
    """train(dataset, resume=True, out=...) needs only what changes: the rest comes from last.pt."""
    first = train(tiny(tmp_path, "api", epochs=1, lr=0.01, sgld_steps=3)).records[0]
    assert first["status"] == "completed"
    resumed = train("digits[0-2]", resume=True, out=str(tmp_path / "api"), epochs=2)
    config = resumed.extra["config"]
    assert config["lr"] == 0.01 and config["sgld_steps"] == 3 and config["epochs"] == 2


def test_a_last_pt_with_non_finite_weights_is_refused(tmp_path, full_run):
    """Weights a resume reads go through formats.native.load_state, like every loaded checkpoint."""
    out = tmp_path / "nan"
    shutil.copytree(full_run["out"], out)
    ckpt = read_checkpoint(out / "last.pt")
    first = next(iter(ckpt["state_dict"]))
    ckpt["state_dict"][first][0] = float("nan")
    torch.save(ckpt, out / "last.pt")
    with pytest.raises(CheckpointError, match="non-finite values in weight tensor"):
        train("digits[0-2]", resume=True, out=str(out), epochs=3)
