"""benchmarks/time_to_accuracy.py's bookkeeping: a run that spends its recovery budget is reported as
diverged (it never "reaches" the target, whatever its earlier epochs showed) instead of ending the
benchmark, and the rollbacks of a completed run are shown."""
from __future__ import annotations

from pathlib import Path

import pytest

from jemeval.errors import TrainingDiverged

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TARGET = {"acc": 0.97, "auroc_uniform": 0.99, "auroc_interp": 0.85}


@pytest.fixture
def tta(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import time_to_accuracy

    return time_to_accuracy


def point(epoch, acc, interp, status="completed", recoveries=0):
    return {"epoch": epoch, "wall": 10.0 * epoch, "cpu": 9.0 * epoch, "acc": acc, "auroc_uniform": 1.0,
            "auroc_interp": interp, "status": status, "recoveries": recoveries}


def test_a_diverged_run_is_recorded_not_raised(tta, monkeypatch):
    def diverging_train(*args, **kwargs):
        raise TrainingDiverged("training diverged at epoch 1, step 3 (non-finite loss) and the budget is spent")

    monkeypatch.setattr(tta, "train", diverging_train)
    curve = tta.run({"recipe": "fast"}, seed=4, device="cpu")
    assert len(curve) == 1 and curve[0]["status"] == "diverged" and curve[0]["recoveries"] is None
    assert curve[0]["epoch"] == 0 and curve[0]["acc"] != curve[0]["acc"]  # NaN: never evaluated


def test_time_to_target_ignores_a_diverged_run_and_shows_rollbacks(tta, capsys):
    good_then_diverged = [point(1, 0.98, 0.90, "diverged"), point(2, 0.40, 0.20, "diverged")]
    completed = [point(1, 0.90, 0.70, recoveries=2), point(2, 0.98, 0.86, recoveries=2)]
    assert tta.reached(good_then_diverged, TARGET) is None
    assert tta.reached(completed, TARGET)["epoch"] == 2
    summary = tta.summarize({"fast": {4: good_then_diverged, 5: completed}}, [4, 5], TARGET)
    tta.report(summary, [4, 5], "cpu", base=40.0)
    out = capsys.readouterr().out
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("fast ") and "seed" not in line}
    assert "DIVERGED" in rows["4"] and "never" in rows["4"]
    assert "2 rollbacks" in rows["5"] and "18.0 (ep  2)" in rows["5"]
    assert "reached by 1/2 seeds; mean / release 0.45" in out
