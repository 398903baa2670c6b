"""A report killed with SIGKILL halfway finishes on the next run, computing only what is missing, and
reads exactly like a report that was never interrupted (real processes, real signals)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import without_timings

import jemeval

pytestmark = pytest.mark.slow

REPO = Path(jemeval.__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def command(jem: Path, clf: Path, out: Path) -> list[str]:
    # accuracy first (fast), then samples (slow): the kill lands while the samples are drawn
    return [sys.executable, "-m", "jemeval", "report", "--model", str(clf), "--model", str(jem), "--name", "CLF",
            "--name", "JEM", "--sections", "accuracy,samples", "--n", "40", "--refine-steps", "0",
            "--set", "samples.n=4", "--set", "samples.steps=100", "--device", "cpu", "--out", str(out)]




def entries(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (out / "cache").glob("*.json")} if (out / "cache").is_dir() else {}


def page(out: Path) -> str:
    text = re.sub(r"\*Compute per section[^\n]*\n\n(\|[^\n]*\n)+", "", (out / "report.md").read_text())  # timings
    return re.sub(r"created \S+|\"created\": \"[^\"]*\"", "created", text)


def test_sigkill_halfway_then_rerun_equals_an_uninterrupted_report(tmp_path, digits_jem_ckpt, digits_classifier_ckpt):
    whole = subprocess.run(command(digits_jem_ckpt, digits_classifier_ckpt, tmp_path / "whole"), env=ENV,
                           capture_output=True, text=True, timeout=900)
    assert whole.returncode == 0, whole.stderr

    out = tmp_path / "killed"
    proc = subprocess.Popen(command(digits_jem_ckpt, digits_classifier_ckpt, out), env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while len(entries(out)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # both models' accuracy are cached: kill while the samples are drawn
    proc.kill()
    assert proc.wait(timeout=60) == -9, "the report finished before it could be killed"
    before = entries(out)
    assert sorted(name.split("-")[0] for name in before) == ["accuracy", "accuracy"]
    assert not (out / "report.json").exists()

    rerun = subprocess.run(command(digits_jem_ckpt, digits_classifier_ckpt, out), env=ENV, capture_output=True,
                           text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stderr
    status = [line.split()[:3] for line in rerun.stdout.strip().splitlines()[1:]]
    assert status == [["CLF", "accuracy", "cached"], ["JEM", "accuracy", "cached"],
                      ["CLF", "samples", "computed"], ["JEM", "samples", "computed"]]
    assert {k: v for k, v in entries(out).items() if k in before} == before  # reused, not rewritten
    assert not [p for p in out.rglob("*.tmp")]  # what the kill left mid-write is gone

    resumed = json.loads((out / "report.json").read_text())
    assert without_timings(resumed) == without_timings(json.loads((tmp_path / "whole" / "report.json").read_text()))
    assert page(out) == page(tmp_path / "whole")
    assert sorted(p.name for p in (out / "figures").iterdir()) == sorted(
        p.name for p in (tmp_path / "whole" / "figures").iterdir())
