"""The bad-input battery (issue 11): every user mistake ends in one error line, a non-zero exit, no
traceback, and no file written or changed.

Each case runs in a fresh folder holding the files a user would have (a checkpoint, a symlink and a
hard link to it, a dataset .npz, a folder dataset, a junk file...). The folder is snapshotted
(paths, sizes, mtimes, SHA-256) before and after: a refused command must leave it exactly as it was,
which also proves that no output folder was created and no input was overwritten.

Every error is exactly one stderr line (``Error: ...``), click's own parse errors (an
unknown option, a bad integer) included: jemeval folds click's usage hint into that line.
"""
from __future__ import annotations

import errno
import hashlib
import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import jemeval
from jemeval.artifacts import save_ood_scores
from jemeval.cli import cli
from jemeval.errors import JemevalError
from jemeval.progress import is_progress_line

#: marks a click parse error (the rest, if any, is the expected text)
CLICK = "[click] "


@pytest.fixture
def env(tmp_path, digits_classifier_ckpt, monkeypatch):
    """A folder with a user's files, and the working directory set to it."""
    shutil.copy(digits_classifier_ckpt, tmp_path / "m.pt")
    (tmp_path / "link.pt").symlink_to("m.pt")
    os.link(tmp_path / "m.pt", tmp_path / "hard.pt")
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    (tmp_path / "w.pth").write_bytes(b"\0" * 64)
    (tmp_path / "a_file").write_text("")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (20, 1, 8, 8), dtype=np.uint8), y=np.arange(20) % 10)
    for label in ("a", "b"):
        (tmp_path / "F" / label).mkdir(parents=True)
    ckpt = torch.load(tmp_path / "m.pt", weights_only=True)
    ckpt["dataset"] = f"npz:{tmp_path / 'd.npz'}"  # a model trained on the npz file: read by default
    torch.save(ckpt, tmp_path / "M.pt")
    bad = torch.load(tmp_path / "m.pt", weights_only=True)  # item 9: a checkpoint with NaN weights
    next(v for v in bad["state_dict"].values() if v.is_floating_point()).view(-1)[0] = float("nan")
    torch.save(bad, tmp_path / "nan.pt")
    timm = {**torch.load(tmp_path / "m.pt", weights_only=True), "arch": "timm",  # item 8
            "arch_options": {"variant": "resnet18", "checkpoint_path": str(tmp_path / "a_file")}}
    torch.save(timm, tmp_path / "timm.pt")
    x = rng.uniform(-1, 1, (20, 1, 8, 8)).astype(np.float32)  # item 11: NaN images, fractional labels
    x[0, 0, 0, 0] = np.nan
    np.savez(tmp_path / "nan.npz", x=x, y=np.arange(20) % 10)
    np.savez(tmp_path / "frac.npz", x=np.zeros((20, 1, 8, 8), np.float32), y=np.arange(20) / 3)
    (tmp_path / "done").mkdir()  # item 2: a folder holding a finished run
    (tmp_path / "done" / "last.pt").write_bytes(b"a finished run")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JEMEVAL_DEBUG", raising=False)
    monkeypatch.delenv("JEMEVAL_INCEPTION_WEIGHTS", raising=False)
    return tmp_path


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file, folder and link under ``root`` with what identifies its content."""
    state = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if p.is_symlink():
                state[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                state[rel] = ("dir",)
            elif not p.is_file():  # a FIFO, socket or device: reading it would block
                state[rel] = ("special", st.st_mode, st.st_ino)
            else:
                state[rel] = (st.st_size, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return state


def runner() -> CliRunner:
    """stderr apart from stdout: click >= 8.2 always does it, older versions need mix_stderr=False."""
    if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:
        return CliRunner(mix_stderr=False)
    return CliRunner()


def assert_one_line_refusal(result, expected: str) -> None:
    out, err = result.stdout, result.stderr
    assert result.exit_code not in (0, None), f"exit {result.exit_code}\n{out}\n{err}"
    assert "Traceback" not in out + err and "a bug in jemeval" not in err, err
    # progress lines (a stderr that is no terminal gets one per stage begun before the refusal) are no message
    lines = [line for line in err.splitlines() if line.strip() and not is_progress_line(line)]
    errors = [line for line in lines if line.startswith("Error:")]
    # click's own parse errors too: jemeval folds click's usage block into the one Error: line
    assert len(lines) == 1 and len(errors) == 1, err
    assert expected in errors[0], errors[0]
    assert out == "", out


# (id, arguments, words the error line must contain); "M.pt" records npz:<env>/d.npz as its dataset
CLI_CASES = [
    # item 1: an output may never be a file the command reads, nor another output
    ("ood-out-is-model", "ood --model m.pt --ood uniform --out m.pt",
     "--out 'm.pt' is the input checkpoint (--model); choose another output path"),
    ("ood-csv-is-model", "ood --model m.pt --ood uniform --csv m.pt", "--csv 'm.pt' is the input checkpoint"),
    ("ood-out-symlink-to-model", "ood --model m.pt --ood uniform --out link.pt", "is the input checkpoint"),
    ("ood-out-hardlink-of-model", "ood --model hard.pt --ood uniform --out m.pt", "is the input checkpoint"),
    ("ood-out-same-file-other-spelling", "ood --model m.pt --ood uniform --out ./F/../m.pt", "is the input checkpoint"),
    ("ood-save-scores-is-ood-set", "ood --model m.pt --ood npz:d.npz --save-scores d.npz",
     "--save-scores 'd.npz' is the file of dataset 'npz:d.npz' (--ood)"),
    ("ood-out-is-id-set", "ood --model m.pt --id npz:d.npz --ood uniform --out d.npz", "(--id)"),
    # issue 23 item 4: a checkpoint's recorded set that names a path is never read (the user gives --id)
    ("ood-out-is-default-id-set", "ood --model M.pt --ood uniform --out d.npz",
     "the checkpoint records its training set as 'npz:"),
    ("ood-plot-inside-folder-set", "ood --model m.pt --ood folder:F --plot F/a/x.png",
     "is inside the folder of dataset 'folder:F'"),
    ("ood-two-outputs-one-file", "ood --model m.pt --ood uniform --out r.json --csv r.json",
     "is also --csv; give each output its own file"),
    # item 6: no output folder is created
    ("ood-csv-missing-folder", "ood --model m.pt --ood uniform --csv missing/x.csv",
     "folder 'missing' does not exist; create it first"),
    ("ood-out-parent-is-a-file", "ood --model m.pt --ood uniform --out a_file/r.json", "is not a folder"),
    # ood: existing checks
    ("ood-unknown-ood-set", "ood --model m.pt --ood unifrom", "did you mean 'uniform'"),
    ("ood-unknown-score", "ood --model m.pt --ood uniform --score logpz", "did you mean 'logpx'"),
    ("ood-unknown-metric", "ood --model m.pt --ood uniform --metric aurok", "did you mean 'auroc'"),
    ("ood-score-option-typo", "ood --model m.pt --ood uniform --score energy:t=3", "has no option 't'"),
    ("ood-id-set-as-ood", "ood --model m.pt --ood digits", "is the in-distribution set itself"),
    ("ood-n-zero", "ood --model m.pt --ood uniform --n 0", "Invalid value for '--n'"),
    ("ood-plot-not-png", "ood --model m.pt --ood uniform --plot x.pdf", "--plot must be a .png file"),
    ("ood-save-scores-not-npz", "ood --model m.pt --ood uniform --save-scores s.csv", "must be a .npz file"),
    ("ood-missing-npz", "ood --model m.pt --ood npz:missing.npz", "does not exist"),
    ("ood-bootstrap-negative", "ood --model m.pt --ood uniform --bootstrap -1", "--bootstrap must be >= 0"),
    ("ood-level-above-one", "ood --model m.pt --ood uniform --level 2", "--level in (0, 1)"),
    ("ood-bad-device", "ood --model m.pt --ood uniform --device gpu", "unknown --device 'gpu' (did you mean 'cuda'?)"),
    ("ood-empty-list", "ood --model m.pt --ood ,", "--ood is empty"),
    ("ood-missing-model", "ood --model missing.pt --ood uniform", "does not exist"),
    ("ood-junk-model", "ood --model junk.pt --ood uniform", "'junk.pt'"),
    ("ood-model-is-folder", "ood --model F --ood uniform", "is a folder"),
    ("ood-n-not-a-number", "ood --model m.pt --ood uniform --n abc", CLICK),
    ("ood-without-model", "ood --ood uniform", CLICK),
    # calibrate
    ("calibrate-out-is-model", "calibrate --model m.pt --out m.pt", "is the input checkpoint (--model)"),
    ("calibrate-plot-is-out", "calibrate --model m.pt --plot r.png --out r.png", "give each output its own file"),
    ("calibrate-csv-is-data", "calibrate --model m.pt --data npz:d.npz --csv d.npz", "is the file of dataset"),
    ("calibrate-plot-missing-folder", "calibrate --model m.pt --plot missing/r.png", "does not exist"),
    ("calibrate-bins-zero", "calibrate --model m.pt --bins 0", "--bins must be >= 1"),
    ("calibrate-unlabelled", "calibrate --model m.pt --data uniform", "needs a labelled dataset"),
    ("calibrate-unknown-data", "calibrate --model m.pt --data digts", "did you mean 'digits'"),
    ("calibrate-unknown-metric", "calibrate --model m.pt --metric ecee", "did you mean 'ece'"),
    ("calibrate-ood-metric", "calibrate --model m.pt --metric auroc", "unknown calibration metric 'auroc'"),
    ("calibrate-val-size-zero", "calibrate --model m.pt --temperature-scaling --val-size 0",
     "--val-size must be positive"),
    # eval
    ("eval-out-is-model", "eval --model m.pt --out m.pt", "is the input checkpoint"),
    ("eval-csv-missing-folder", "eval --model m.pt --csv missing/x.csv", "does not exist"),
    ("eval-sigma-nan", "eval --model m.pt --sigma nan", "--sigma"),
    ("eval-refine-steps-word", "eval --model m.pt --refine-steps a", "--refine-steps must be comma-separated integers"),
    ("eval-unknown-data", "eval --model m.pt --data digts", "did you mean 'digits'"),
    ("eval-chains-zero", "eval --model m.pt --chains 0 --refine-steps 1", "--chains must be >= 1"),
    ("eval-negative-n", "eval --model m.pt --n -5", "Invalid value for '--n'"),
    # robust
    ("robust-out-is-model", "robust --model m.pt --norm l2 --out m.pt", "is the input checkpoint"),
    ("robust-plot-missing-folder", "robust --model m.pt --norm l2 --plot missing/r.png", "does not exist"),
    ("robust-unknown-norm", "robust --model m.pt --norm l3", "l3"),
    ("robust-division-by-zero", "robust --model m.pt --norm linf --epsilons 0,1/0", "fractions like 8/255 are fine"),
    ("robust-epsilon-words", "robust --model m.pt --norm l2 --epsilons a,b",
     "--epsilons must be comma-separated numbers"),
    ("robust-epsilon-out-of-range", "robust --model m.pt --norm linf --epsilons 2", "out of range for linf"),
    ("robust-attack-option-typo", "robust --model m.pt --norm l2 --attack pgd:bogus=1", "has no option 'bogus'"),
    ("robust-unknown-attack", "robust --model m.pt --norm l2 --attack pgx", "did you mean 'pgd'"),
    ("robust-unknown-grad-mode", "robust --model m.pt --norm l2 --grad-mode exact", "unknown --grad-mode 'exact'"),
    ("robust-negative-refine-steps", "robust --model m.pt --norm l2 --refine-steps 0,-1", "--refine-steps must be"),
    ("robust-unlabelled-data", "robust --model m.pt --norm l2 --data constant", "'constant' is unlabelled"),
    ("robust-plot-not-png", "robust --model m.pt --norm l2 --plot out.jpg", "--plot must be a .png file"),
    # distal
    ("distal-out-is-model", "distal --model m.pt --target 3 --out m.pt", "is the input checkpoint"),
    ("distal-grid-is-out", "distal --model m.pt --target 3 --grid r.png --out r.png", "give each output its own file"),
    ("distal-grid-missing-folder", "distal --model m.pt --target 3 --grid missing/d.png", "does not exist"),
    ("distal-grid-not-png", "distal --model m.pt --target 3 --grid m.pt", "--grid must be a .png file"),
    ("distal-target-not-a-class", "distal --model m.pt --target 10", "--target 10 is not a class of this model"),
    ("distal-target-word", "distal --model m.pt --target a", "--target must be comma-separated integers"),
    ("distal-lr-zero", "distal --model m.pt --target 3 --lr 0", "--lr must be > 0"),
    # sample
    ("sample-result-is-model", "sample --model m.pt --result m.pt", "--result 'm.pt' is the input checkpoint"),
    ("sample-csv-is-model-link", "sample --model m.pt --csv link.pt", "is the input checkpoint"),
    ("sample-out-not-png", "sample --model m.pt --out m.pt", "--out must be a .png file"),
    ("sample-save-is-init-data", "sample --model m.pt --init data --data npz:d.npz --save d.npz",
     "is the file of dataset"),
    ("sample-two-outputs-one-file", "sample --model m.pt --result g.json --csv g.json",
     "give each output its own file"),
    ("sample-save-missing-folder", "sample --model m.pt --save missing/s.npz", "does not exist"),
    ("sample-class-not-in-model", "sample --model m.pt --class 99", "is not a class of this model"),
    ("sample-n-zero", "sample --model m.pt --n 0", "--n must be >= 1"),
    ("sample-negative-steps", "sample --model m.pt --steps -1", "Invalid value for '--steps'"),
    ("sample-unknown-init", "sample --model m.pt --init bogus", CLICK),
    # fidelity
    ("fidelity-both-sources", "fidelity --model m.pt --samples d.npz", "give exactly one of --model"),
    ("fidelity-out-is-samples", "fidelity --samples d.npz --features m.pt --out d.npz",
     "is the samples file (--samples)"),
    ("fidelity-out-is-features", "fidelity --samples d.npz --features m.pt --csv m.pt",
     "is a feature checkpoint (--features)"),
    ("fidelity-out-is-weights", "fidelity --samples d.npz --inception-weights w.pth --out w.pth",
     "is the Inception weights file (--inception-weights)"),
    ("fidelity-out-is-default-reference", "fidelity --model M.pt --features m.pt --out d.npz",
     "give --ref npz:"),
    ("fidelity-unknown-metric", "fidelity --samples d.npz --metrics isx", "did you mean 'is'"),
    ("fidelity-no-inception-weights", "fidelity --model m.pt", "jemeval never downloads"),
    # convert
    ("convert-out-is-in", "convert m.pt m.pt", "OUT 'm.pt' is the input checkpoint (IN)"),
    ("convert-out-is-in-by-link", "convert m.pt link.pt", "is the input checkpoint (IN)"),
    ("convert-result-is-in", "convert m.pt new.pt --result m.pt", "--result 'm.pt' is the input checkpoint"),
    ("convert-legacy-out-is-in", "convert m.pt new.pt --out m.pt", "--out 'm.pt' is the input checkpoint"),
    ("convert-missing-folder", "convert m.pt missing/new.pt", "does not exist"),
    ("convert-missing-input", "convert missing.pt new.pt", "does not exist"),
    ("convert-not-pt", "convert m.pt new.json", "must be a .pt file"),
    # train, list, plugins, the group
    ("train-unknown-dataset", "train digts --out run", "did you mean 'digits'"),
    ("train-unknown-arch", "train digits --arch cnx --out run", "did you mean 'cnn'"),
    ("train-zero-epochs", "train digits --epochs 0 --out run", "--epochs must be >= 1"),
    ("train-negative-lr", "train digits --lr -1 --out run", "--lr must be > 0"),
    ("train-missing-npz", "train npz:missing.npz --out run", "does not exist"),
    ("train-unknown-optimizer", "train digits --optimizer adamw --out run", CLICK),
    ("train-over-a-finished-run", "train digits --out done", "--resume"),
    ("train-overwrite-and-resume", "train digits --out done --overwrite --resume", "--overwrite"),
    ("train-missing-parent", "train digits --out missing/run", "does not exist"),
    ("train-nproc-above-cores", "train digits --out run --nproc 64 --device cpu", "--nproc 64"),
    ("sample-nproc-above-cores", "sample --model m.pt --nproc 64 --device cpu", "--nproc 64 is more than the"),
    ("sample-nproc-zero", "sample --model m.pt --nproc 0 --device cpu", CLICK),
    ("ood-nproc-above-cores", "ood --model m.pt --ood uniform --nproc 64 --device cpu", "--nproc 64 is more than"),
    ("robust-nproc-above-cores", "robust --model m.pt --norm l2 --nproc 64 --device cpu", "--nproc 64 is more than"),
    ("train-nan-images", "train npz:nan.npz --out run", "NaN or inf"),
    ("train-fractional-labels", "train npz:frac.npz --out run", "whole numbers"),
    # items 8-10: nothing silent, nothing executed
    ("eval-nan-weights", "eval --model nan.pt --n 20", "non-finite values"),
    ("calibrate-nan-weights", "calibrate --model nan.pt --n 20", "non-finite values"),
    ("eval-timm-checkpoint-path", "eval --model timm.pt --n 20", "checkpoint_path"),
    ("eval-nan-sgld-lr", "eval --model m.pt --n 20 --refine-steps 1 --sgld-lr nan", "finite"),
    ("eval-nan-images", "eval --model m.pt --data npz:nan.npz", "NaN or inf"),
    ("list-unknown-kind", "list bogus", CLICK),
    ("plugins-extra-argument", "plugins extra", CLICK),
    ("unknown-command", "plugin", CLICK + "did you mean 'plugins'"),
]


@pytest.mark.parametrize("args, expected", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
@pytest.mark.any_device
def test_cli_refuses_in_one_line_and_touches_nothing(env, args, expected):
    before = snapshot(env)
    result = runner().invoke(cli, args.split())
    assert_one_line_refusal(result, expected.removeprefix(CLICK) or "Error:")
    assert snapshot(env) == before


def test_every_command_checks_its_output_paths():
    """The shared check runs through the Command class: a new command that forgets it fails here.
    (train writes only into its run folder, which the training code guards.)"""
    import click

    from jemeval.cli.paths import Command, PathArgument, PathOption
    from jemeval.plugins import COMMANDS_PLUGIN, get_plugin_manager

    ctx = click.Context(cli)
    builtin = [name for name, entry in get_plugin_manager().commands().items() if entry.plugin == COMMANDS_PLUGIN]
    assert {"ood", "convert", "sample"} <= set(builtin)  # plugins' commands are theirs to check
    for name in builtin:
        command = cli.get_command(ctx, name)
        if name == "train":
            continue
        assert isinstance(command, Command), name
        for param in command.params:
            if param.name in ("out_path", "csv_path", "plot", "grid", "save_scores", "grid_path", "npz_path"):
                assert isinstance(param, (PathOption, PathArgument)) and param.role == "output", (name, param.name)
            if param.name in ("model_path", "samples_path", "features", "inception_weights", "path_in"):
                assert param.role == "input", (name, param.name)
            if param.name in ("data", "ood", "id", "reference"):
                assert param.role == "dataset", (name, param.name)


def test_case_ids_are_unique_and_the_battery_is_large():
    ids = [c[0] for c in CLI_CASES]
    assert len(set(ids)) == len(ids) and len(ids) + len(API_CASES) + len(DISK_FULL_CASES) + 2 >= 60


# -- disk full (item 12): one line, the previous file kept, the temporary file removed ------------
DISK_FULL_CASES = [
    ("result-json", "ood --model m.pt --ood uniform --n 20 --out r.json", "r.json"),
    ("csv", "eval --model m.pt --n 20 --csv r.csv", "r.csv"),
    ("samples-npz", "sample --model m.pt --n 2 --steps 1 --save s.npz", "s.npz"),
]


@pytest.mark.parametrize("args, target", [c[1:] for c in DISK_FULL_CASES], ids=[c[0] for c in DISK_FULL_CASES])
@pytest.mark.any_device
def test_a_full_disk_is_one_line(env, monkeypatch, args, target):
    import jemeval.atomic

    (env / target).write_text("previous")
    before = snapshot(env)

    def fsync_on_a_full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jemeval.atomic.os, "fsync", fsync_on_a_full_disk)
    result = runner().invoke(cli, args.split())
    assert result.exit_code == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"no space left on device writing '{target}'" in errors[0]
    assert snapshot(env) == before  # the previous file intact, no temporary file left


# -- the Python API: a JemevalError with a one-line message, nothing written ---------------------
def _model():
    return jemeval.load_model("m.pt")


API_CASES = [
    ("load_model-missing", lambda: jemeval.load_model("missing.pt"), "does not exist"),
    ("load_model-junk", lambda: jemeval.load_model("junk.pt"), "'junk.pt' is not a PyTorch checkpoint"),
    ("load_dataset-typo", lambda: jemeval.load_dataset("digts"), "did you mean 'digits'"),
    ("load_dataset-missing-npz", lambda: jemeval.load_dataset("npz:missing.npz"), "does not exist"),
    ("get-typo", lambda: jemeval.get("model", "cnx"), "did you mean 'cnn'"),
    ("names-unknown-kind", lambda: jemeval.names("gizmo"), "unknown component kind 'gizmo'"),
    ("evaluate_ood-typo", lambda: jemeval.evaluate_ood(_model(), ["unifrom"]), "did you mean 'uniform'"),
    ("evaluate_ood-metric-typo", lambda: jemeval.evaluate_ood(_model(), ["uniform"], metrics=["aurok"]),
     "did you mean 'auroc'"),
    ("save_ood_scores-missing-folder",
     lambda: save_ood_scores(jemeval.evaluate_ood(_model(), ["uniform"], n=10), "missing/s.npz"), "does not exist"),
    ("calibrate-unlabelled", lambda: jemeval.calibrate(_model(), "uniform"), "needs a labelled dataset"),
    ("calibrate-bins", lambda: jemeval.calibrate(_model(), bins=0), "bins must be >= 1"),
    ("calibrate-metric", lambda: jemeval.calibrate(_model(), metrics=["nope"]), "unknown calibration metric 'nope'"),
    ("evaluate-typo", lambda: jemeval.evaluate(_model(), "digts"), "did you mean 'digits'"),
    ("robust-norm", lambda: jemeval.robust(_model(), norm="l3"), "l3"),
    ("convert-onto-itself", lambda: __import__("jemeval.formats.convert").formats.convert.convert("m.pt", "m.pt"),
     "is the input file"),
]


@pytest.mark.parametrize("call, expected", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_python_api_raises_one_line_jemeval_errors(env, call, expected):
    before = snapshot(env)
    with pytest.raises(JemevalError) as info:
        call()
    message = str(info.value)
    assert expected in message and "\n" not in message
    assert snapshot(env) == before


# -- as a user runs it: a real process, real stderr ----------------------------------------------
@pytest.mark.parametrize("args, expected", [
    ("ood --model m.pt --ood uniform --out m.pt", "--out 'm.pt' is the input checkpoint (--model)"),
    ("calibrate --model m.pt --csv /nonexistent_dir_jemeval/x.csv", "folder '/nonexistent_dir_jemeval' does not exist"),
], ids=["output-is-input", "missing-folder"])
def test_real_process_prints_one_line(env, args, expected):
    before = snapshot(env)
    repo = Path(jemeval.__file__).resolve().parent.parent
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "jemeval", *args.split()], capture_output=True, text=True,
                          cwd=env, env=environ, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and expected in proc.stderr
    assert snapshot(env) == before and not Path("/nonexistent_dir_jemeval").exists()
