"""Time left and counted work (issue 35 item 5): ``jemeval train``'s progress line says the time to the
end of the epoch and of the run, on a terminal and in a log; ``jemeval sample`` says how many chains and
SGLD steps it will run before the first one, and its progress and summary count the same chain-steps.

The training estimates run on a fake clock, so every expected value is worked out by hand from the
durations the test makes up (the rule: :mod:`jemeval.training.timeleft`'s docstring).
"""
from __future__ import annotations

import io
import json
import math
import re
import sys

import pytest
import torch
from test_bad_inputs import runner

from jemeval.cli import cli
from jemeval.energy.factory import create_model
from jemeval.evaluation.generation import sample
from jemeval.formats.native import save_checkpoint
from jemeval.progress import LINE_PREFIX, ProgressBar
from jemeval.training.position import EpochStats, RunPosition
from jemeval.training.reporting import Reporter
from jemeval.training.timeleft import TimeLeft, clock_text


class FakeClock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# -- the estimate -------------------------------------------------------------------------------------
def test_clock_text_is_tqdms_format_rounded():
    assert [clock_text(s) for s in (0, 0.4, 59.6, 75, 3599.5, 3725)] == [
        "00:00", "00:00", "01:00", "01:15", "1:00:00", "1:02:05"]


def test_the_rate_is_the_recent_iterations_and_the_gaps_between_loops_never_count():
    clock = FakeClock()
    left = TimeLeft(epochs=2, window=3, clock=clock)
    assert left.left(0, 0, 10) is None and left.text(0, 0, 10) == ""  # nothing timed yet
    clock.now = 100.0  # setup: not an iteration
    left.loop_started()
    for end in (101.0, 103.0, 106.0, 110.0):  # durations 1, 2, 3, 4
        clock.now = end
        left.iterations_done()
    assert left.seconds_per_iteration() == pytest.approx((2 + 3 + 4) / 3)  # the window: the last 3
    # epoch 0 with 4 of 10 done: 6 x 3 s; run: that + epoch 1's 10 x 3 s, no epoch end measured yet
    assert left.left(0, 4, 10) == pytest.approx((18.0, 48.0))
    left.loop_ended()
    clock.now = 130.0  # the epoch's end: 20 s
    left.epoch_ended()
    clock.now = 500.0  # whatever happens before the next loop (a rollback, say) is no iteration and no epoch end
    left.loop_started()
    clock.now = 506.0
    left.iterations_done(2)  # two iterations in one update: 3 s each
    assert list(left.durations) == [4.0, 3.0, 3.0] and left.epoch_ends == [20.0]
    # epoch 1 (the last) with 2 of 10 done: 8 x 10/3 s, plus its own end (20 s)
    assert left.left(1, 2, 10) == pytest.approx((80 / 3, 80 / 3 + 20))
    assert left.text(1, 2, 10) == "left: epoch 00:27, run 00:47"


# -- the progress line of `jemeval train` ----------------------------------------------------------------
MEANS = {"loss": 1.0, "pyx": 1.0, "px": 0.0, "pxy": 0.0, "l2": 0.0, "e_data": -1.0, "e_sample": -1.0,
         "train_acc": 0.5, "images": 8}


def _epoch(report: Reporter, position: RunPosition, clock: FakeClock, iterations: list[float],
           end: float | None = None) -> None:
    """One epoch (of 4 iterations) as the trainer runs it: the bar, iterations ending at ``iterations``,
    then, when the epoch's end is over at ``end``, its line (None: the epoch goes on, as after a stop)."""
    with report.bar(position, 4) as bar:
        for when in iterations:
            clock.now = when
            position.step, position.batch = position.step + 1, position.batch + 1
            bar.update(1)
            report.show_stats(bar, position.stats)
    if end is not None:
        position.next_epoch()
        clock.now = end
        report.epoch_line(report.epoch_row(position, MEANS, val_acc=0.5, lr=0.1, sgld_steps=1, seconds=1.0, rate=8.0))


def _reporter(tmp_path, clock: FakeClock) -> tuple[Reporter, RunPosition]:
    report = Reporter(tmp_path, main=True, show_progress=None, epochs=3, samples=False, clock=clock)
    report.status_every = 50.0
    return report, RunPosition(stats=EpochStats(torch.device("cpu")))


def test_a_log_gets_both_times_left_on_the_start_and_status_lines(tmp_path, capsys):
    """stderr is a pipe: the epoch's start line and a status line at most every 50 s say the time left.

    Epoch 1: iterations of 10, 20, 30, 40 s (ending at 10, 30, 60, 100); the status after the third
    (60 s since the start line) has 20 s/it: epoch 1 x 20 = 00:20, run 20 + 2 epochs x 4 x 20 = 03:00
    (no epoch end known yet). Its end takes 25 s (100 -> 125). Epoch 2 starts at 130: 25 s/it over the
    four, epoch 4 x 25 = 01:40, run 100 + 4 x 25 + 2 epoch ends x 25 = 04:10. Its first iteration takes
    50 s (status at 180): 30 s/it, epoch 3 x 30 = 01:30, run 90 + 4 x 30 + 2 x 25 = 04:20."""
    clock = FakeClock()
    report, position = _reporter(tmp_path, clock)
    _epoch(report, position, clock, [10.0, 30.0, 60.0, 100.0], end=125.0)
    clock.now = 130.0
    _epoch(report, position, clock, [180.0])
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"{LINE_PREFIX}epoch 1/3: 4 it ..."
    assert re.fullmatch(rf"{LINE_PREFIX}epoch 1/3: 3/4 it, \d+\.\d s \(left: epoch 00:20, run 03:00\)", lines[1])
    assert lines[2].startswith("epoch 1/3  loss 1  train 50.0%")
    assert lines[3] == f"{LINE_PREFIX}epoch 2/3: 4 it ... (left: epoch 01:40, run 04:10)"
    assert re.fullmatch(rf"{LINE_PREFIX}epoch 2/3: 1/4 it, \d+\.\d s \(left: epoch 01:30, run 04:20\)", lines[4])
    assert len(lines) == 5  # the fourth iteration of epoch 1 came 40 s after a status line: none


def test_a_terminal_bar_shows_both_times_left_before_the_statistics(tmp_path, monkeypatch):
    """stderr is a terminal: the times left lead the bar's postfix (tqdm's own estimate of the epoch
    is gone: one estimate, not two). Same clock as above."""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    clock = FakeClock()
    report, position = _reporter(tmp_path, clock)
    _epoch(report, position, clock, [10.0, 30.0, 60.0, 100.0], end=125.0)
    clock.now = 130.0
    with report.bar(position, 4) as bar:
        shown = bar.bar  # the tqdm bar: its first draw is already on the terminal
        assert "left: epoch 01:40, run 04:10" in terminal.getvalue().split("\r")[-1]
        clock.now = 180.0
        position.batch = 1
        bar.update(1)
        report.show_stats(bar, position.stats)
        shown.refresh()
        line = terminal.getvalue().split("\r")[-1]
    assert "left: epoch 01:30, run 04:20 | loss=" in line and "1/4 [" in line, line
    assert "<" not in line  # no second estimate (tqdm's "[elapsed<remaining")


def test_a_real_run_in_a_log_says_the_time_left_from_its_second_epoch(tmp_path, monkeypatch):
    """The trainer itself: epoch 2's start line carries both estimates (epoch 1 has none to give)."""
    monkeypatch.chdir(tmp_path)
    res = runner().invoke(cli, ["train", "digits[0-2]", "--arch", "cnn:width=4", "--epochs", "2", "--batch-size", "64",
                                "--sgld-steps", "1", "--buffer-size", "60", "--val-size", "60", "--decay-epochs", "5",
                                "--out", "run", "--device", "cpu"])
    assert res.exit_code == 0, res.stderr
    starts = [line for line in res.stderr.splitlines() if line.startswith(f"{LINE_PREFIX}epoch ")]
    assert starts[0] == f"{LINE_PREFIX}epoch 1/2: 5 it ..."
    assert re.fullmatch(rf"{LINE_PREFIX}epoch 2/2: 5 it \.\.\. \(left: epoch \d\d:\d\d, run \d\d:\d\d\)", starts[1])


# -- `jemeval sample`: the chains and steps it runs, said once and counted alike ---------------------------
@pytest.fixture
def model_file(tmp_path, monkeypatch):
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "m.pt", create_model("cnn", 10, (1, 8, 8), metadata={"dataset": "digits"}),
                    dataset="digits")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "m.pt"


class Recorder:
    """A progress callable that keeps what it was told, in order, beside the plan's call."""

    def __init__(self, events: list) -> None:
        self.events = events

    def __call__(self, total, desc, *, unit="it", leave=False) -> ProgressBar:
        self.events.append(("open", total, unit))
        events = self.events

        class Bar(ProgressBar):
            def update(self, n: int = 1) -> None:
                events.append(("update", n))

        return Bar()


def test_sample_hears_its_plan_before_the_first_step_and_counts_exactly_its_chain_steps(model_file):
    """10 classes x 5 chains, 3 steps, 16 chains at a time: 50 chains in 4 batches, 150 chain-steps."""
    events: list = []
    result = sample(str(model_file), classes="all", n=5, steps=3, batch_size=16, device="cpu", seed=0,
                    progress=Recorder(events), on_plan=lambda plan: events.append(("plan", plan)))
    (first, plan), (opened, total, unit), *updates = events
    assert first == "plan" and opened == "open"  # said before the bar opens, so before any step
    assert plan == {"chains": 50, "classes": 10, "per_class": 5, "steps": 3, "chain_steps": 150, "batch_size": 16,
                    "batches": 4}
    assert (total, unit) == (150, "chain-step")
    assert sum(n for _, n in updates) == 150  # batches of 16, 16, 16 and 2 chains, 3 steps each
    assert result.extra["settings"]["plan"] == plan and result.extra["settings"]["sgld"]["steps"] == 3
    assert sum(r["n"] for r in result.records if r["class"] != "all") == 50


def test_sample_says_its_chains_and_steps_once_and_its_progress_and_summary_agree(model_file):
    res = runner().invoke(cli, ["sample", "--model", "m.pt", "--class", "all", "--n", "5", "--steps", "3",
                                "--batch-size", "16", "--device", "cpu"])
    assert res.exit_code == 0, res.stderr
    err = res.stderr.splitlines()
    said = [line for line in err if line.startswith("jemeval sample:")]
    chains, steps, batches = 10 * 5, 3, math.ceil(10 * 5 / 16)
    assert said == [f"jemeval sample: {chains} chains (10 classes x 5) x {steps} SGLD steps = {chains * steps} "
                    f"chain-steps, in {batches} batches of up to 16 chains"]
    progress = [line for line in err if line.startswith(f"{LINE_PREFIX}SGLD")]
    assert progress[0] == f"{LINE_PREFIX}SGLD: {chains * steps} chain-step ..."
    assert progress[-1].startswith(f"{LINE_PREFIX}SGLD: {chains * steps}/{chains * steps} chain-step in ")
    assert err.index(said[0]) < err.index(progress[0])  # before it starts
    summary = res.stdout.splitlines()[0]
    assert f"{chains} chains (10 classes x 5) x {steps} SGLD steps = {chains * steps} chain-steps;" in summary
    as_json = runner().invoke(cli, ["sample", "--model", "m.pt", "--class", "all", "--n", "5", "--steps", "3",
                                    "--batch-size", "16", "--device", "cpu", "--json"])
    settings = json.loads(as_json.stdout)["provenance"]["settings"]
    assert settings["plan"]["chain_steps"] == chains * steps and settings["sgld"]["steps"] == steps
