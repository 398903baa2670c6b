"""Issue 25 items 6 and 7: one vocabulary, results you can read, progress in a pipe, help at one width.

* ``--input-sigma`` (evaluation input noise) and ``--chain-sigma`` (refinement chain noise) in every
  evaluation command; ``--sigma`` keeps its old meaning per command for one release, with ONE
  ``note:`` line naming the new flag, and fills the very parameter the new flag fills (the recorded
  provenance says so); a config file's ``sigma`` key too.
* ``Result.to_pandas()`` (and ``pandas.DataFrame(result)``), a one-line ``repr``.
* Progress on a stderr that is not a terminal: one ``progress: ...`` line per stage, never a bar's
  carriage returns (in-process with click's runner, and in a real subprocess writing to a pipe).
* ``--help`` at one width; ``ood --help`` names what its figure draws; ``list --help`` every kind.
"""
from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

from jemeval.cli import HELP_WIDTH, cli
from jemeval.energy.factory import create_model
from jemeval.formats.native import save_checkpoint
from jemeval.progress import LINE_PREFIX, StderrProgress, is_progress_line, progress_bar
from jemeval.registry import KINDS
from jemeval.results import Result

DEPRECATED = "--sigma is deprecated"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder holding m.pt: an untrained digits network (the settings and their records matter
    here, not the numbers), as the current directory."""
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "m.pt", create_model("cnn", 10, (1, 8, 8), metadata={"dataset": "digits"}),
                    dataset="digits")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JEMEVAL_DEBUG", raising=False)
    for name in ("RANK", "JEMEVAL_RELAUNCHED"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def invoke(*args: str):
    return runner().invoke(cli, [*args, "--device", "cpu"])


def messages(err: str) -> list[str]:
    """stderr's lines other than progress and "wrote FILE" (the notes and errors a user reads)."""
    return [line for line in err.splitlines()
            if line.strip() and not is_progress_line(line) and not line.startswith("wrote ")]


# -- item 6: one flag, one meaning -------------------------------------------------------------------
# (command line without the noise, the new flag, what the provenance records the noise as)
NOISE_CASES = {
    "ood": ("ood --model m.pt --ood uniform --n 20 --json", "--input-sigma", ("settings", "sigma")),
    "calibrate": ("calibrate --model m.pt --n 20 --no-bins --json", "--input-sigma", ("settings", "sigma")),
    "eval": ("eval --model m.pt --n 20 --json", "--input-sigma", ("settings", "sigma")),
    "robust": ("robust --model m.pt --norm l2 --n 4 --steps 1 --epsilons 0,1 --refine-steps 1 --chains 2 --json",
               "--chain-sigma", ("settings", "sigma")),
    "distal": ("distal --model m.pt --target 3 --n 2 --steps 2 --refine-steps 1 --chains 2 --grid g.png --json",
               "--chain-sigma", ("settings", "refinement", "sigma")),
}


def _recorded(stdout: str, where: tuple[str, ...]):
    value = json.loads(stdout)["provenance"]
    for key in where:
        value = value[key]
    return value


@pytest.mark.parametrize("command", sorted(NOISE_CASES))
def test_old_sigma_fills_the_new_flags_parameter_with_one_note(folder, command):
    """The attack: a script written for 0.2 (``--sigma 0.05``). It runs as before (input noise in
    ood/calibrate/eval, chain noise in robust/distal), says so in exactly one line naming the new flag,
    and its records and recorded setting are those of the new flag."""
    base, flag, where = NOISE_CASES[command]
    old = invoke(*base.split(), "--sigma", "0.05")
    new = invoke(*base.split(), flag, "0.05")
    none = invoke(*base.split())
    for res in (old, new, none):
        assert res.exit_code == 0, res.stderr
    notes = messages(old.stderr)
    assert len(notes) == 1 and old.stderr.count(DEPRECATED) == 1, old.stderr
    assert notes[0].startswith(f"note: {DEPRECATED}; use {flag} (") and "next release" in notes[0]
    assert DEPRECATED not in new.stderr + none.stderr
    assert _recorded(old.stdout, where) == _recorded(new.stdout, where) == 0.05
    assert _recorded(none.stdout, where) == 0.0
    timeless = [[{k: v for k, v in r.items() if k != "seconds"} for r in json.loads(res.stdout)["records"]]
                for res in (old, new)]
    assert timeless[0] == timeless[1]


def test_report_old_sigma_is_input_noise_and_chain_sigma_reaches_both_refining_sections(folder):
    """report's --sigma was input noise: its value reaches every section's input_sigma, as
    --input-sigma's does; --chain-sigma reaches accuracy's and robust's chain_sigma."""
    base = ["report", "--model", "m.pt", "--sections", "accuracy,calibration", "--n", "10", "--json"]
    old = invoke(*base, "--out", "old", "--sigma", "0.02", "--chain-sigma", "0.04")
    new = invoke(*base, "--out", "new", "--input-sigma", "0.02", "--chain-sigma", "0.04")
    assert old.exit_code == 0 and new.exit_code == 0, old.stderr + new.stderr
    assert old.stderr.count(DEPRECATED) == 1 and DEPRECATED not in new.stderr
    for res in (old, new):
        options = json.loads(res.stdout)["provenance"]["settings"]["options"]
        assert options["accuracy"]["input_sigma"] == options["calibration"]["input_sigma"] == 0.02
        assert options["accuracy"]["chain_sigma"] == 0.04 and "chain_sigma" not in options["calibration"]


@pytest.mark.parametrize("args, expected", [
    ("ood --model m.pt --ood uniform --sigma 0.03 --input-sigma 0.03 --out r.json",
     "--sigma and --input-sigma both given (--sigma is the old name of --input-sigma in ood): give only "
     "--input-sigma"),
    ("robust --model m.pt --norm l2 --sigma 0.1 --chain-sigma 0.2 --out r.json",
     "give only --chain-sigma"),
    ("report --model m.pt --chain-sigma 0.1 --set robust.chain_sigma=0.2 --out rep",
     "--chain-sigma and --set robust.chain_sigma both set the chain noise"),
    ("eval --model m.pt --sigma nan --out r.json", "Invalid value for '--sigma': must be a finite number >= 0"),
    ("calibrate --model m.pt --input-sigma -1 --out r.json", "'--input-sigma': must be a finite number >= 0"),
    ("distal --model m.pt --target 1 --chain-sigma inf --grid g.png", "'--chain-sigma': must be a finite number"),
])
def test_two_spellings_at_once_or_a_bad_noise_is_one_line(folder, args, expected):
    """The attack: the old and the new spelling with different values (which one ran?), a NaN noise.
    One line, nothing written, no note first."""
    before = snapshot(folder)
    res = invoke(*args.split())
    assert_one_line_refusal(res, expected)
    assert snapshot(folder) == before


def test_a_config_file_sigma_key_keeps_its_meaning(folder):
    """An old config file (``sigma: 0.04`` for robust: the chain noise) keeps working, the note names
    the file and the new key, and the recorded options show the new name only; the same file with the
    new key as well is refused in one line."""
    Path("old.yaml").write_text("sigma: 0.04\n")
    base = NOISE_CASES["robust"][0].split()
    res = invoke(*base, "--config", "old.yaml")
    assert res.exit_code == 0, res.stderr
    (note,) = messages(res.stderr)
    assert note.startswith("note: config 'old.yaml': the key 'sigma' is deprecated; write 'chain-sigma' (")
    prov = json.loads(res.stdout)["provenance"]
    assert prov["settings"]["sigma"] == 0.04 and prov["config"]["keys"] == ["sigma"]
    assert prov["config"]["options"]["chain-sigma"] == 0.04 and "sigma" not in prov["config"]["options"]
    overridden = invoke(*base, "--config", "old.yaml", "--chain-sigma", "0")  # the command line wins
    assert overridden.exit_code == 0 and json.loads(overridden.stdout)["provenance"]["settings"]["sigma"] == 0.0
    Path("both.yaml").write_text("sigma: 0.04\nchain-sigma: 0.01\n")
    before = snapshot(folder)
    assert_one_line_refusal(invoke(*base, "--config", "both.yaml"),
                            "config 'both.yaml' sets both 'sigma' and 'chain-sigma'")
    assert snapshot(folder) == before


@pytest.mark.slow
def test_the_note_is_said_once_under_nproc(folder):
    """The attack: ``--nproc 2`` parses the command line three times (the launcher and two ranks)."""
    proc = subprocess.run([sys.executable, "-m", "jemeval", "ood", "--model", "m.pt", "--ood", "uniform", "--n", "12",
                           "--sigma", "0.03", "--nproc", "2", "--device", "cpu", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(DEPRECATED) == 1, proc.stderr
    assert json.loads(proc.stdout)["provenance"]["settings"]["sigma"] == 0.03


# -- item 7: results you can read -----------------------------------------------------------------------
def _mixed_result() -> Result:
    """Records as evaluation functions make them: floats, numpy and torch scalars, NaN, a missing key."""
    records = [{"score": "logpx", "ood": "uniform", "auroc": np.float32(0.75), "fpr95": float("nan"), "n": 20},
               {"score": "maxprob", "ood": "uniform", "auroc": torch.tensor(0.5, dtype=torch.float64), "n": 20,
                "fpr95": 0.25, "extra": "x"}]
    return Result(records, provenance={"command": "ood", "jemeval_version": "9.9", "device": "cpu",
                                       "platform": "P" * 500, "settings": {"sigma": 0.0}}, notes=["a note"])


def test_to_pandas_is_the_records_as_a_frame_built_by_hand():
    result = _mixed_result()
    by_hand = pd.DataFrame({
        "score": ["logpx", "maxprob"], "ood": ["uniform", "uniform"], "auroc": [0.75, 0.5],
        "fpr95": [math.nan, 0.25], "n": [20, 20], "extra": [math.nan, "x"]})
    frame = result.to_pandas()
    pd.testing.assert_frame_equal(frame, by_hand, check_dtype=False)
    assert frame["auroc"].dtype == np.float64 and frame["fpr95"].isna().tolist() == [True, False]
    pd.testing.assert_frame_equal(result.to_pandas(["auroc", "score", "nope"]), by_hand[["auroc", "score"]],
                                  check_dtype=False)
    pd.testing.assert_frame_equal(result.frame(), frame)  # the 0.2 name
    plain = Result([{"a": 1.0, "b": "x"}, {"a": math.nan, "b": "y"}])
    pd.testing.assert_frame_equal(pd.DataFrame(plain), plain.to_pandas())  # pd.DataFrame(result) works
    assert list(plain) == plain.records


def test_repr_is_one_short_line():
    """The attack: print(result) of 400 records with a long provenance dumped both whole."""
    result = _mixed_result()
    result.records = result.records * 200
    text = repr(result)
    assert text == str(result) == ("<Result ood: 400 records (score, ood, auroc, fpr95, ...); jemeval 9.9, cpu; "
                                   "1 note>")
    assert repr(Result([])) == "<Result: 0 records>"
    assert repr(Result([{"a": 1}])) == "<Result: 1 record (a)>"


def test_repr_of_a_real_result(folder):
    from jemeval.evaluation.ood.evaluate import evaluate_ood

    result = evaluate_ood("m.pt", ["uniform"], n=10, device="cpu", progress=False)
    text = repr(result)
    assert "\n" not in text and len(text) < 120, text
    assert text.startswith(f"<Result ood: {len(result.records)} records (score, ") and "; jemeval " in text
    assert ", cpu" in text and "platform" not in text


# -- item 7: progress in a pipe ------------------------------------------------------------------------
class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_one_rule_a_bar_on_a_terminal_stage_lines_elsewhere(monkeypatch, capsys):
    """The command line's progress: lines on a non-terminal (start, each new step, end with count and
    seconds; none after a failure), a tqdm bar on a terminal."""
    cli_progress = StderrProgress(lines=True)
    with progress_bar(cli_progress, 4, "robust", unit="batch") as bar:
        bar.describe("robust: clean K=0")
        bar.update(2)
        bar.note("30 model passes")  # inside a step: no line
        bar.describe("robust: pgd K=0 full")
        bar.update(2)
    with pytest.raises(KeyboardInterrupt), progress_bar(cli_progress, 3, "fit digits train", unit="img") as bar:
        raise KeyboardInterrupt
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and "\r" not in err and all(is_progress_line(line) for line in lines), err
    assert lines[0] == f"{LINE_PREFIX}robust: 4 batch ..."
    assert lines[1].startswith(f"{LINE_PREFIX}robust: clean K=0 ... (0/4 batch done, ")
    assert lines[2].startswith(f"{LINE_PREFIX}robust: pgd K=0 full ... (2/4 batch done, ")
    assert lines[3].startswith(f"{LINE_PREFIX}robust: 4/4 batch in ") and lines[3].endswith(" s")
    assert lines[4:] == [f"{LINE_PREFIX}fit digits train: 3 img ..."]  # interrupted: no end line
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress_bar(cli_progress, 3, "SGLD", unit="step") as bar:
        bar.update(3)
    assert "\r" in terminal.getvalue() and LINE_PREFIX not in terminal.getvalue()


def _assert_stage_lines(err: str, *expected: str) -> None:
    assert "\r" not in err, repr(err[:300])
    lines = [line for line in err.splitlines() if is_progress_line(line)]
    for text in expected:
        assert any(text in line for line in lines), (text, err)


def test_commands_print_stage_lines_into_a_captured_stderr(folder):
    """click's runner gives a stderr that is no terminal: sample draws no bar into it (it used to
    force one), robust and report print their stages."""
    res = invoke("sample", "--model", "m.pt", "--n", "2", "--steps", "3", "--out", "g.png")
    assert res.exit_code == 0, res.stderr
    _assert_stage_lines(res.stderr, "SGLD: 6 chain-step ...", "SGLD: 6/6 chain-step in ")  # 2 chains x 3 steps
    res = invoke(*NOISE_CASES["robust"][0].split())
    assert res.exit_code == 0, res.stderr
    _assert_stage_lines(res.stderr, "robust: 2 batch ...", "robust: pgd K=1 full ...", "robust: 2/2 batch in ")
    res = invoke("report", "--model", "m.pt", "--sections", "accuracy,calibration", "--n", "10", "--out", "rep")
    assert res.exit_code == 0, res.stderr
    _assert_stage_lines(res.stderr, "report: 2 section ...", "report: calibration m ...", "[m accuracy] eval",
                        "report: 2/2 section in ")


def test_train_says_each_epoch_as_it_starts_into_a_pipe(folder):
    """train: a long first epoch no longer leaves a redirected log empty until it ends."""
    res = runner().invoke(cli, ["train", "digits[0-2]", "--arch", "cnn:width=8", "--epochs", "2", "--batch-size", "64",
                                "--sgld-steps", "1", "--buffer-size", "60", "--val-size", "60", "--decay-epochs", "5",
                                "--out", "run", "--device", "cpu"])
    assert res.exit_code == 0, res.stderr
    assert "\r" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith((LINE_PREFIX, "epoch "))]
    assert [line.split(":")[0] if is_progress_line(line) else line.split()[:2] for line in lines] == [
        "progress", ["epoch", "1/2"], "progress", ["epoch", "2/2"]], res.stderr
    assert lines[0].startswith(f"{LINE_PREFIX}epoch 1/2: ") and lines[0].endswith(" it ...")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["sample --model m.pt --n 2 --steps 3 --out g.png",
                                     "robust --model m.pt --norm l2 --n 4 --steps 1 --epsilons 0,1"])
def test_a_real_pipe_gets_lines_not_a_bar(folder, command):
    proc = subprocess.run([sys.executable, "-m", "jemeval", *command.split(), "--device", "cpu"],
                          capture_output=True, text=True, timeout=300, cwd=folder,  # stderr: a pipe
                          env={**os.environ, "JEMEVAL_DEBUG": "0"})
    assert proc.returncode == 0, proc.stderr
    ended = "SGLD: 6/6 chain-step in " if command.startswith("sample") else "robust: 2/2 batch in "
    _assert_stage_lines(proc.stderr, ended)
    assert "it/s" not in proc.stderr and "%|" not in proc.stderr  # no tqdm bar


# -- item 7: help at one width --------------------------------------------------------------------------
MY_COMMANDS = ["ood", "calibrate", "eval", "robust", "sample", "distal", "fidelity", "report", "list"]


def _help(monkeypatch, columns: int, *args: str) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    res = runner().invoke(cli, [*args, "--help"])
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.mark.parametrize("command", ["", *MY_COMMANDS])
def test_help_wraps_at_one_width(monkeypatch, command):
    """The attack: help text hand-wrapped at 98 columns beside options wrapped at 78. On a wide
    terminal (or in a pipe) every line, prose, options and examples, fits HELP_WIDTH - 2 = 98, and
    the options and the prose both use that width; on a narrow one the prose and options follow it
    (only verbatim example lines may not)."""
    args = [command] if command else []
    width = HELP_WIDTH - 2
    text = _help(monkeypatch, 200, *args)
    longest = max(len(line) for line in text.splitlines())
    assert longest <= width, [line for line in text.splitlines() if len(line) > width]
    options = text.split("\nOptions:\n")[1].splitlines()
    if command not in ("list",):  # list's options are two short lines
        assert max(len(line) for line in options) > width - 12, "the options do not use the width"
    narrow = _help(monkeypatch, 70, *args)
    for line in narrow.splitlines():
        if not re.match(r" {4}jemeval | {8}--", line):  # an example's command line is verbatim
            assert len(line) <= 68, line


def test_ood_help_names_every_panel_and_list_help_every_kind(monkeypatch):
    ood = " ".join(_help(monkeypatch, 200, "ood").split())
    assert "histograms of in- vs out-of-distribution scores, ROC curves and precision-recall curves" in ood
    listing = " ".join(_help(monkeypatch, 200, "list").split())
    for kind in KINDS:
        assert f"{kind}s" in listing, kind
    assert "checkpoint_layouts" in listing and "loggers" in listing
