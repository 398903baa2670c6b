"""Issue 23, written as the attacks: config files read as inputs (item 1), FIFOs (5), malformed
config values (11), full disks met outside the atomic writer (12), temporary files a kill leaves and
Ctrl-C under --nproc (13), and provenance that tells code versions apart (18).

Each refusal is one ``Error:`` line, a non-zero exit, no traceback, and every file of the user's
folder unchanged (the battery's own helpers, tests/test_bad_inputs.py).
"""
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
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

import jemeval
from jemeval import atomic
from jemeval.cli import cli
from jemeval.progress import is_progress_line


@pytest.fixture
def folder(tmp_path, digits_classifier_ckpt, monkeypatch):
    """A user's folder: a checkpoint and config files of every kind, the working directory."""
    (tmp_path / "m.pt").write_bytes(Path(digits_classifier_ckpt).read_bytes())
    (tmp_path / "ood.json").write_text(json.dumps({"ood": "uniform", "n": 20}))
    (tmp_path / "robust.yaml").write_text("norm: l2\nn: 4\n")
    (tmp_path / "deep.json").write_text('{"n": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (tmp_path / "deep.yaml").write_text("n: " + "[" * 100_000 + "]" * 100_000 + "\n")
    (tmp_path / "date.yaml").write_text("seed: 2020-01-01\n")
    (tmp_path / "date.toml").write_text("seed = 2020-01-01\n")
    (tmp_path / "dates.yaml").write_text("epsilons: [0.1, 2020-01-01]\n")
    (tmp_path / "huge.yaml").write_text("n: 5\n" + "#" * (2 << 20) + "\n")
    os.mkfifo(tmp_path / "fifo.yaml")
    os.mkfifo(tmp_path / "fifo.pt")
    monkeypatch.chdir(tmp_path)
    return tmp_path


CONFIG_CASES = [
    # item 1: the config file is an input like any other
    ("ood-out-is-config", "ood --model m.pt --config ood.json --out ood.json",
     "--out 'ood.json' is the config file (--config)"),
    ("ood-csv-is-config", "ood --model m.pt --config ood.json --csv ood.json", "--csv 'ood.json' is the config file"),
    ("robust-out-is-config", "robust --model m.pt --config robust.yaml --out robust.yaml",
     "--out 'robust.yaml' is the config file"),
    ("robust-plot-is-config-by-link", "robust --model m.pt --config robust.yaml --csv ./robust.yaml",
     "is the config file"),
    # item 5: a FIFO (or any non-regular file) is refused, never read
    ("config-fifo", "ood --model m.pt --ood uniform --config fifo.yaml", "config 'fifo.yaml' is a FIFO"),
    ("model-fifo", "ood --model fifo.pt --ood uniform", "--model 'fifo.pt' (the input checkpoint) is a FIFO"),
    ("train-config-fifo", "train digits --config fifo.yaml --out run", "is a FIFO"),
    # item 11: malformed values are one line naming the file
    ("config-deep-json", "ood --model m.pt --ood uniform --config deep.json", "'deep.json' is nested too deeply"),
    ("config-deep-yaml", "ood --model m.pt --ood uniform --config deep.yaml", "'deep.yaml' is nested too deeply"),
    ("config-yaml-date", "ood --model m.pt --ood uniform --config date.yaml", "seed is a date (2020-01-01)"),
    ("config-toml-date", "ood --model m.pt --ood uniform --config date.toml", "seed is a date"),
    ("config-date-in-list", "robust --model m.pt --norm l2 --config dates.yaml", "epsilons is a date"),
    ("config-huge", "ood --model m.pt --ood uniform --config huge.yaml", "a config file is a small mapping"),
    ("seed-overflow", "ood --model m.pt --ood uniform --seed 99999999999999999999999", "--seed"),
    ("seed-negative", "eval --model m.pt --seed -1", "--seed"),
]


@pytest.mark.parametrize("args, expected", [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES])
@pytest.mark.any_device
def test_config_and_input_files_are_refused_in_one_line(folder, args, expected):
    before = snapshot(folder)
    result = runner().invoke(cli, args.split())
    assert_one_line_refusal(result, expected)
    assert snapshot(folder) == before


def test_a_fifo_config_does_not_block_a_real_process(folder):
    """Before: `--config fifo.yaml` blocked forever (the read of a FIFO waits for a writer)."""
    proc = subprocess.run([sys.executable, "-m", "jemeval", "ood", "--model", "m.pt", "--ood", "uniform",
                           "--config", "fifo.yaml"], capture_output=True, text=True, timeout=60, cwd=folder)
    assert proc.returncode == 2 and "is a FIFO" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# -- item 12: full disks outside the atomic writes -------------------------------------------------
def test_train_on_a_full_disk_is_one_line_and_leaves_nothing(folder, monkeypatch):
    """The run folder's lock file was written with a plain write: ENOSPC came out as "OSError Errno 28"
    and left an empty lock that blocked the next run."""
    import jemeval.training.rundir as rundir

    real_fdopen = os.fdopen

    class FullDisk:
        def __init__(self, fd, *args, **kwargs):
            self.fh = real_fdopen(fd, *args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir.os, "fdopen", FullDisk)
    before = snapshot(folder)
    result = runner().invoke(cli, "train digits --out run --epochs 1 --device cpu".split())
    assert_one_line_refusal(result, "no space left on device writing 'run/.jemeval-train.lock'")
    assert snapshot(folder) == before  # the folder it created is gone again


def test_export_on_a_full_disk_is_one_line(folder, monkeypatch):
    """safetensors reports a full disk as its own SafetensorError ("... (os error 28)")."""
    import safetensors
    import safetensors.torch as st

    (folder / "m.safetensors").write_text("previous")
    before = snapshot(folder)

    def save_on_a_full_disk(*args, **kwargs):
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(st, "save_file", save_on_a_full_disk)
    result = runner().invoke(cli, "export m.pt --out m.safetensors".split())
    assert_one_line_refusal(result, "no space left on device writing 'm.safetensors'")
    assert snapshot(folder) == before


def test_a_plain_write_on_a_full_disk_is_named_not_a_bug(monkeypatch, folder):
    """The command line's last net: any ENOSPC is the disk, never 'a bug in jemeval'."""
    import jemeval.cli.commands.eval as eval_command

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "somewhere.bin")

    monkeypatch.setattr(eval_command, "evaluate", full, raising=False)
    monkeypatch.setattr(jemeval.evaluation.accuracy, "evaluate", full)
    result = runner().invoke(cli, "eval --model m.pt --n 10 --device cpu".split())
    assert_one_line_refusal(result, "no space left on device writing 'somewhere.bin'")


def test_exported_files_get_the_usual_permissions(folder):
    """safetensors writes a 0600 file of its own and renames it: the export gets open()'s mode, as any output."""
    umask = os.umask(0o022)
    os.umask(umask)
    assert runner().invoke(cli, "export m.pt --out m.safetensors".split()).exit_code == 0
    assert (folder / "m.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
    assert not list(folder.glob(".m.safetensors.*.tmp"))


# -- item 13: temporary files a kill leaves; Ctrl-C under --nproc -----------------------------------
KILL_BEFORE_RENAME = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from jemeval import atomic
atomic.os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
atomic.write_text_atomic({target!r}, "new")
"""


def test_a_kill_before_the_rename_leaves_no_litter_past_the_next_write(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    repo = str(Path(jemeval.__file__).resolve().parent.parent)
    proc = subprocess.run([sys.executable, "-c", KILL_BEFORE_RENAME.format(repo=repo, target=str(target))],
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL
    left = list(tmp_path.glob(".r.json.*.tmp"))
    assert len(left) == 1 and target.read_text() == "old"  # the kill left its temporary file
    (tmp_path / ".other.json.abcdefgh.tmp").write_text("another file's")  # not this target's: kept
    (tmp_path / ".r.json.mine.tmp").write_text("the user's")  # not jemeval's pattern: kept
    atomic.write_text_atomic(target, "next")
    assert target.read_text() == "next"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.json.abcdefgh.tmp", ".r.json.mine.tmp", "r.json"]


def test_a_live_writers_temporary_file_is_never_removed(tmp_path):
    """A temporary file whose writer still holds it (another process writing the same output now)."""
    target = tmp_path / "r.json"
    with atomic.atomic_path(target) as tmp:
        tmp.write_text("in progress")
        assert atomic.stale_temp_files(tmp_path, r"r\.json") == []
        atomic.write_text_atomic(target, "the other writer")  # a second writer of the same file
        assert tmp.exists()
    assert target.read_text() == "in progress" and not list(tmp_path.glob("*.tmp"))


def test_ood_out_removes_the_temporary_file_a_killed_run_left(folder):
    (folder / ".r.json.a1b2c3d4.tmp").write_text('{"half": ')
    result = runner().invoke(cli, "ood --model m.pt --ood uniform --n 20 --device cpu --out r.json".split())
    assert result.exit_code == 0, result.stderr
    assert not list(folder.glob(".r.json.*.tmp")) and json.loads((folder / "r.json").read_text())["records"]


SIGINT_AFTER = """
import os, signal, subprocess, sys, time
proc = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        start_new_session=True)
time.sleep(float(sys.argv[1]))
os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the signal to the whole foreground group
out, err = proc.communicate(timeout=120)
print(proc.returncode)
sys.stderr.write(err)
"""


@pytest.mark.slow
def test_ctrl_c_under_nproc_is_one_line(folder):
    """Before: a torch "death signal" warning and an "Aborted!" from every worker (3 lines)."""
    args = [sys.executable, "-m", "jemeval", "robust", "--model", "m.pt", "--norm", "l2", "--nproc", "2",
            "--device", "cpu", "--n", "400", "--refine-steps", "0,5"]
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", SIGINT_AFTER, "12", *args], capture_output=True, text=True,
                          timeout=180, cwd=folder)
    assert time.monotonic() - start < 60, "the run was not stopped"
    assert proc.stdout.strip() == "130"
    said = [line for line in proc.stderr.splitlines() if line.strip() and not is_progress_line(line)]  # a pipe: stages
    assert said == ["Aborted!"], proc.stderr


def test_ctrl_c_while_the_launcher_imports_torch_is_not_a_traceback(monkeypatch, capsys):
    """Before: a Ctrl-C 2 s into `robust --nproc 2` (the launcher still importing torch) printed a
    25-line traceback and exit status 254 beside the parent's "Aborted!"."""
    from jemeval.runtime import launch

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "run_workers", interrupted)
    assert launch.main(["-m", "jemeval", "robust"]) == 130
    assert capsys.readouterr() == ("", "")


def test_an_error_raised_as_a_ctrl_c_unwinds_is_the_ctrl_c(monkeypatch, folder):
    """Seen once on a loaded 16-core machine: Ctrl-C under --nproc ended in "unexpected RecursionError
    ... (a bug in jemeval)": clean-up that fails while a KeyboardInterrupt unwinds is not a bug."""
    import jemeval.cli.commands.eval as eval_command

    def fails_in_clean_up(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        finally:
            raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(eval_command, "evaluate", fails_in_clean_up, raising=False)
    monkeypatch.setattr(jemeval.evaluation.accuracy, "evaluate", fails_in_clean_up)
    result = runner().invoke(cli, "eval --model m.pt --n 10 --device cpu".split())
    assert result.exit_code == 130 and result.output.strip() == "Aborted!", result.output


# -- item 18: provenance tells code versions apart -------------------------------------------------
def test_the_version_is_one_release_everywhere():
    """pyproject, the package and CHANGELOG name one release (0.1.0 was stamped on 0.2's results)."""
    import importlib.metadata
    import re

    repo = Path(jemeval.__file__).resolve().parent.parent
    declared = re.search(r'^version = "([^"]+)"', (repo / "pyproject.toml").read_text(), re.M).group(1)
    assert declared == jemeval.__version__ == importlib.metadata.version("jemeval")
    assert re.search(rf"^## \[{re.escape(declared)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", (repo / "CHANGELOG.md").read_text(),
                     re.M), "CHANGELOG.md has no dated section for this version"


def test_results_from_a_checkout_name_the_commit_and_whether_it_was_changed():
    from jemeval.provenance import provenance, source_checkout

    repo = Path(jemeval.__file__).resolve().parent.parent
    git = ["git", "-C", str(repo)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if head.returncode != 0:
        pytest.skip("jemeval does not run from a git checkout here")
    changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", "jemeval"],
                             capture_output=True, text=True, check=True).stdout.strip() != ""
    source_checkout.cache_clear()
    record = provenance(command="test")
    assert record["jemeval_version"] == jemeval.__version__
    assert record["jemeval_commit"] == head.stdout.strip() and record["jemeval_dirty"] is changed
