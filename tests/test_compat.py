"""Files written by jemeval 0.1.0 (tests/data/v0_1, made with the code of commit 734e7b9) keep working.

best.pt must load to the same logits; last.pt must resume (the run continues for another epoch).
The run is tiny (cnn:width=4, 2 epochs of digits, 1 SGLD step, a 100-chain buffer): a format
fixture, not a good model.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
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


# -- jemeval 0.2.0 (tests/data/v0_2, made with the code of commit 025356f, the 0.2.0 release) --------
# The same tiny run, written through a config file `jemeval train --print-config` made (config.yaml),
# plus what a user of 0.2 kept beside it: its safetensors export, an `ood --config` file and the
# records 0.2 computed from it (ood_expected.json), and the row 0.2 wrote when it resumed last.pt for
# a third epoch (resumed_epoch3.csv). Issue 24 moved the training and evaluation modules: none of
# these may notice.
DATA_02 = Path(__file__).parent / "data" / "v0_2"


def _metric_rows(path: Path) -> list[dict[str, str]]:
    header, *rows = path.read_text().splitlines()
    return [dict(zip(header.split(","), row.split(","))) for row in rows if row and row[0].isdigit()]


def test_a_0_2_checkpoint_and_its_export_load_to_the_logits_0_2_gave():
    expected = torch.load(DATA_02 / "expected.pt", weights_only=True)
    for name in ("best.pt", "model.safetensors"):
        model = jemeval.load_model(DATA_02 / name, device="cpu")
        assert (model.arch, model.num_classes, model.input_shape) == ("cnn", 10, (1, 8, 8))
        with torch.no_grad():
            assert torch.allclose(model.logits(expected["x"]), expected["logits"], atol=1e-6), name


def test_a_0_2_run_resumes_to_the_row_0_2_wrote(tmp_path):
    """0.2 resumed this last.pt to epoch 3 and wrote resumed_epoch3.csv; the refactored trainer
    (RunPosition, checkpointing.py) must continue the same run: same step, same statistics."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("best.pt", "last.pt", "metrics.csv"):
        shutil.copy(DATA_02 / name, run / name)
    jemeval.train("digits", out=str(run), resume=True, epochs=3, device="cpu", progress=False, test_eval=False)
    rows = _metric_rows(run / "metrics.csv")
    (expected,) = _metric_rows(DATA_02 / "resumed_epoch3.csv")
    assert len(rows) == 3 and rows[-1]["step"] == expected["step"] == "54"
    for key in ("train_acc", "val_acc", "loss", "loss_pyx", "loss_px", "energy_data", "energy_sample", "lr"):
        assert float(rows[-1][key]) == pytest.approx(float(expected[key]), rel=1e-4, abs=1e-5), key


def test_a_0_2_train_config_file_still_configures_the_same_run(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from jemeval.cli import cli

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["train", "--config", str(DATA_02 / "config.yaml"), "--print-config"])
    assert result.exit_code == 0, result.output
    import yaml

    def settings(text: str) -> dict:
        return {k: v for k, v in yaml.safe_load(text).items() if k != "device"}

    added = {"workers": None, "init": None, "px-warmup-iters": 0,  # added since 0.2, at defaults that keep 0.2's run
             "gaussian-starts": 0.0, "best-by": "val_acc"}
    printed = settings(result.output)
    assert {k: printed.pop(k) for k in added if k in printed} == added
    assert printed == settings((DATA_02 / "config.yaml").read_text())


def test_a_0_2_ood_config_file_gives_the_records_0_2_gave(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from jemeval.cli import cli

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["ood", "--model", str(DATA_02 / "best.pt"), "--config",
                                      str(DATA_02 / "ood.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)["records"]
    expected = json.loads((DATA_02 / "ood_expected.json").read_text())["records"]
    assert [(r["score"], r["ood"], r["n_id"]) for r in got] == [(r["score"], r["ood"], r["n_id"]) for r in expected]
    for g, e in zip(got, expected):  # equal here; another processor may swap one near-tied pair of the 40 + 40
        assert g["auroc"] == pytest.approx(e["auroc"], abs=1e-3)  # scores: 6e-4 of AUROC, 1/40 of FPR95
        assert g["fpr95"] == pytest.approx(e["fpr95"], abs=0.03)
