"""``jemeval train`` (jemeval.cli.commands.train): the summary as JSON, resume through the command
line, and one-line errors in which the training code's parameter names become the flags that set them."""
from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from jemeval.cli import cli, flag_message
from jemeval.cli.commands.train import cli as train_command


def invoke(*args):
    return CliRunner().invoke(cli, ["train", *args])


def test_cli_trains_and_prints_json(tmp_path):
    args = ["digits[0-2]", "--arch", "cnn:width=8", "--epochs", "1", "--batch-size", "64", "--sgld-steps", "1",
            "--buffer-size", "60", "--val-size", "60", "--out", str(tmp_path / "cli"), "--no-progress", "--json",
            "--decay-epochs", "5", "--sigma", "0.05", "--device", "cpu"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert list(summary)[:3] == ["status", "dataset", "arch"] and list(summary)[-2:] == ["config", "provenance"]
    assert summary["status"] == "completed" and summary["config"]["sigma"] == 0.05
    assert summary["config"]["decay_epochs"] == [5] and summary["config"]["sgld"]["steps"] == 1
    assert 0 <= summary["test_acc"] <= 1 and math.isfinite(summary["seconds"])
    resumed = invoke("digits[0-2]", "--out", str(tmp_path / "cli"), "--resume", "--epochs", "2", "--no-progress",
                     "--json")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["epochs"] == 2
    changed = invoke("digits[0-2]", "--out", str(tmp_path / "cli"), "--resume", "--lr", "0.1")
    assert changed.exit_code == 2 and "Traceback" not in changed.output
    assert "--resume continues the stored run; these settings differ from it: --lr 0.1 (run has" in changed.output
    text = invoke("digits[0-2]", "--out", str(tmp_path / "cli"), "--resume", "--epochs", "2")
    assert text.exit_code == 0 and text.stdout.splitlines()[0] == "status        completed"
    assert text.stdout.splitlines()[-1] == f"metrics       {tmp_path / 'cli' / 'metrics.csv'}"


@pytest.mark.parametrize("args, words", [
    (["digts"], "did you mean 'digits'"),
    (["digits", "--sigma", "-1"], "--sigma must be a number >= 0"),
    (["digits", "--optimizer", "adamw"], "adamw"),
    (["digits", "--decay-epochs", "a,b"], "--decay-epochs must be comma-separated integers"),
    (["digits", "--out", "/nonexistent-jemeval-run", "--resume"],
     "--resume: no '/nonexistent-jemeval-run/last.pt' to continue; run without --resume or pass the run's --out"),
    (["digits", "--px-weight", "0", "--pyx-weight", "0"],
     "every loss weight is 0: set --pyx-weight, --px-weight or --pxy-weight above 0"),
    (["digits", "--short-run", "--px-weight", "0"], "--short-run needs sampling"),
    (["digits", "--recipe", "fats"], "unknown --recipe 'fats' (did you mean 'fast'?); choose paper or fast"),
    (["cifar10", "--recipe", "fast"], "--recipe 'fast' is defined for digits only"),
    (["digits", "--max-val-drop", "0"], "--max-val-drop must lie in (0, 1] (1 turns the check off), got 0.0"),
])
@pytest.mark.any_device
def test_cli_bad_input_is_one_line_exit_2(args, words):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output


def test_flag_message_writes_parameters_as_the_commands_flags():
    from jemeval.errors import UsageError

    def flags(text, param=None):
        return flag_message(UsageError(text, param=param), train_command)

    assert flags("lr must be > 0, got -1.0", "lr") == "--lr must be > 0, got -1.0"
    assert flags("nproc=64 is more than the 2 CPU core(s): use nproc=2 or fewer", "nproc") == \
        "--nproc 64 is more than the 2 CPU core(s): use --nproc 2 or fewer"
    assert flags("or device='cpu' for 2 gloo processes") == "or --device cpu for 2 gloo processes"
    assert flags("continue it with resume=True, replace it with overwrite=True, or choose another out", "out") == \
        "continue it with --resume, replace it with --overwrite, or choose another --out"
    assert flags("try a smaller lr, more sgld_steps, energy_l2=0.1") == \
        "try a smaller lr, more --sgld-steps, --energy-l2 0.1"  # bare one-word names only for the error's own
    # quoted values and paths keep their words; so do longer words that contain a parameter's name
    assert flags("out '/tmp/out/lr' is a file", "out") == "--out '/tmp/out/lr' is a file"
    assert flags("the resumed run's sgld_steps_total", "resume") == "the resumed run's sgld_steps_total"
