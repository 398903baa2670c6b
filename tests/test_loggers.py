"""Logging sinks of `jemeval train`: `--log-to tensorboard` (read back with tensorboard's own event
reader), `--log-to wandb` without the package (one line), and the `register_loggers` hook."""
from __future__ import annotations

import csv
import types

import pytest
import torch
from click.testing import CliRunner

import jemeval
from jemeval import testing
from jemeval.cli import cli
from jemeval.components import TrainingLogger
from jemeval.formats.native import read_checkpoint

TINY = ["digits[0-2]", "--arch", "cnn:width=8", "--epochs", "1", "--batch-size", "64", "--sgld-steps", "1",
        "--buffer-size", "60", "--val-size", "60", "--no-progress", "--device", "cpu"]


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


class Recorder(TrainingLogger):
    """A plugin's logger that keeps every call."""

    runs: list = []

    def __init__(self, log_dir, config, tag="rec"):
        self.calls, self.log_dir, self.config, self.tag = [], log_dir, config, tag
        Recorder.runs.append(self)

    def log_scalars(self, values, step):
        self.calls.append(("scalars", step, dict(values)))

    def log_image(self, tag, image, step):
        self.calls.append(("image", step, tag, tuple(image.shape), float(image.min()), float(image.max())))

    def close(self):
        self.calls.append(("close",))


class Broken:
    def __init__(self, log_dir, config):
        pass

    def log_scalars(self, values, step):
        raise ConnectionError("sink unreachable")


def _plugin():
    plugin = types.SimpleNamespace()

    @jemeval.hookimpl
    def register_loggers(register):
        register("recorder", Recorder, help="keeps every call")
        register("broken", Broken)

    plugin.register_loggers = register_loggers
    return plugin


def test_hook_register_loggers(tmp_path, capsys):
    Recorder.runs.clear()
    with testing.registered_plugin(_plugin(), name="log-test", version="1.0"):
        assert {"recorder", "broken", "tensorboard", "wandb"} <= set(jemeval.names("logger"))
        result = jemeval.train("digits[0-2]", arch="cnn:width=8", epochs=1, sgld_steps=1, buffer_size=60, val_size=60,
                               out=str(tmp_path / "run"), device="cpu", progress=False,
                               log_to=["recorder:tag=x", "broken"], log_every=3)
    assert result.summary["status"] == "completed"
    (rec,) = Recorder.runs
    assert rec.tag == "x" and rec.log_dir == tmp_path / "run" / "recorder" and rec.config["log_every"] == 3
    steps = [c[1] for c in rec.calls if c[0] == "scalars" and "train/loss" in c[2]]
    last_step = result.summary["steps"]
    assert steps == list(range(3, last_step + 1, 3))
    first = next(c[2] for c in rec.calls if c[0] == "scalars")
    assert set(first) == {"train/loss", "train/loss_pyx", "train/loss_px", "train/loss_pxy", "train/loss_l2",
                          "train/energy_data", "train/energy_sample", "train/acc", "train/lr"}
    epoch = next(c for c in rec.calls if c[0] == "scalars" and "epoch/val_acc" in c[2])
    with open(tmp_path / "run" / "metrics.csv") as fh:
        row = next(csv.DictReader(fh))
    assert epoch[1] == last_step and epoch[2]["epoch/val_acc"] == pytest.approx(float(row["val_acc"]), abs=1e-6)
    images = {c[2]: c for c in rec.calls if c[0] == "image"}
    assert set(images) == {"samples/buffer", "samples/conditional"}
    assert all(c[1] == last_step and c[3][0] == 3 and 0 <= c[4] <= c[5] <= 1 for c in images.values())
    assert rec.calls[-1] == ("close",)
    # the broken sink was dropped with one line, and the run went on
    err = capsys.readouterr().err
    assert "logger 'broken' failed in log_scalars (ConnectionError: sink unreachable) and is switched off" in err


def test_tensorboard_events_read_back_with_the_logged_scalars(tmp_path):
    pytest.importorskip("tensorboard", reason="--log-to tensorboard needs the tensorboard package (not installed)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logged = invoke("train", *TINY, "--log-to", "tensorboard", "--log-every", "2", "--out", tmp_path / "tb", "--json")
    plain = invoke("train", *TINY, "--out", tmp_path / "plain")
    assert logged.exit_code == 0 and plain.exit_code == 0, logged.output + plain.output
    # logging changes nothing the run computes
    a, b = read_checkpoint(tmp_path / "tb" / "last.pt"), read_checkpoint(tmp_path / "plain" / "last.pt")
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    assert a["config"]["log_to"] == ["tensorboard"] and a["config"]["log_every"] == 2

    events = EventAccumulator(str(tmp_path / "tb" / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    with open(tmp_path / "tb" / "metrics.csv") as fh:
        row = next(csv.DictReader(fh))
    steps = int(row["step"])
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(2, steps + 1, 2))
    for column in ("val_acc", "train_acc", "loss", "energy_data", "lr"):
        (event,) = events.Scalars(f"epoch/{column}")
        assert event.step == steps and event.value == pytest.approx(float(row[column]), rel=1e-5, abs=1e-6)
    assert set(tags["images"]) == {"samples/buffer", "samples/conditional"}
    (grid,) = events.Images("samples/conditional")
    assert (grid.width, grid.height) == (10 * 9 + 1, 10 * 9 + 1)  # 10 chains for each of the 10 classes, 8x8
    assert "config/text_summary" in tags["tensors"]


def test_wandb_without_the_package_is_one_line(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    r = invoke("train", *TINY, "--log-to", "wandb", "--out", tmp_path / "w")
    assert r.exit_code == 1 and r.output.strip().count("\n") == 0
    assert "--log-to wandb needs the wandb package: pip install wandb" in r.output
    assert not (tmp_path / "w").exists()  # refused before the run folder was made


@pytest.mark.parametrize("spec, words", [
    ("tensorbord", "unknown logger 'tensorbord' (did you mean 'tensorboard'?)"),
    ("tensorboard:imgs=0", "logger 'tensorboard' has no option 'imgs' (did you mean 'images'?)"),
    ("wandb:mode=sometimes", "logger 'wandb' mode must be offline, online, disabled, got 'sometimes'"),
])
def test_bad_logger_specs_are_one_line(tmp_path, spec, words):
    r = invoke("train", *TINY, "--log-to", spec, "--out", tmp_path / "x")
    assert r.exit_code == 2 and words in r.output and r.output.strip().count("\n") == 0
    assert not (tmp_path / "x").exists()


def test_log_settings_may_change_on_resume(tmp_path):
    from jemeval.training.config import resolve_config, resume_config

    stored = resolve_config("digits", out=str(tmp_path)).to_dict()
    resumed = resume_config(stored, log_to=["tensorboard"], log_every=5, resume=True)
    assert resumed.log_to == ("tensorboard",) and resumed.log_every == 5
