"""Files written by jemeval 0.1.0 (tests/data/v0_1, made with the code of commit 734e7b9) keep working.

best.pt must load to the same logits; last.pt must resume (the run continues for another epoch).
The run is tiny (cnn:width=4, 2 epochs of digits, 1 SGLD step, a 100-chain buffer): a format
fixture, not a good model.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

import jemeval

DATA = Path(__file__).parent / "data" / "v0_1"


def test_a_0_1_checkpoint_loads_to_the_same_logits():
    expected = torch.load(DATA / "expected.pt", weights_only=True)
    model = jemeval.load_model(DATA / "best.pt", device="cpu")
    assert model.arch == "cnn" and model.num_classes == 10 and model.input_shape == (1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(model.logits(expected["x"]), expected["logits"], atol=1e-6)


def test_a_0_1_run_resumes(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(DATA, run)
    result = jemeval.train("digits", out=str(run), resume=True, epochs=3, device="cpu", progress=False,
                           test_eval=False)
    summary = result.summary
    assert summary["status"] == "completed" and summary["epochs"] == 3
    rows = (run / "metrics.csv").read_text().splitlines()
    assert sum(1 for r in rows if r and r[0].isdigit()) == 3  # the two old epochs and the resumed one
