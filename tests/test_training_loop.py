"""The training loop end to end (jemeval.training.trainer, summary, splits, visuals): what a run writes
and returns, the objective variants, a CIFAR-shaped run with a WRN, the shared JEM fixtures, and the
proximal sampler. Runs are tiny (few batches, 1-2 SGLD steps)."""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

import jemeval
from jemeval.cli import cli
from jemeval.errors import UsageError
from jemeval.formats.native import read_checkpoint
from jemeval.results import Result
from jemeval.sampling.recorded import recorded_sgld
from jemeval.sampling.refinement import RefinedClassifier
from jemeval.training import Trainer, TrainResult, resolve_config, splits, train
from jemeval.training.reporting import COLUMNS

# 3 digit classes (343 training images after validation), batch 32 -> 10 iterations per epoch.
TINY = {"arch": "cnn:width=8", "epochs": 2, "batch_size": 32, "lr": 2e-3, "warmup_iters": 4, "decay_epochs": (),
        "sgld_steps": 2, "buffer_size": 120, "val_size": 60, "progress": False, "test_eval": False, "check_every": 2,
        "device": "cpu"}


def tiny(tmp_path, name="run", **changes):
    return resolve_config("digits[0-2]", **{**TINY, "out": str(tmp_path / name), **changes})


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny JEM run shared by the output checks."""
    cfg = tiny(tmp_path_factory.mktemp("train"), test_eval=True)
    return cfg, train(cfg)


def test_run_writes_checkpoints_metrics_and_grids(tiny_run):
    cfg, result = tiny_run
    summary = result.records[0]
    out = cfg.out_dir
    assert summary["status"] == "completed" and summary["epochs"] == 2 and summary["recoveries"] == 0
    assert summary["test_acc"] is not None and 0 <= summary["test_acc"] <= 1
    df = pd.read_csv(summary["metrics"])
    assert list(df.columns) == list(COLUMNS) and list(df["epoch"]) == [1, 2] and df["event"].isna().all()
    assert (df["sgld_steps"] == 2).all() and df["images_per_s"].gt(0).all() and df["val_acc"].between(0, 1).all()
    for epoch in (1, 2):
        for kind in ("buffer", "conditional"):
            png = os.path.join(out, "samples", f"{kind}_epoch{epoch:03d}.png")
            with open(png, "rb") as fh:
                assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    model = jemeval.load_model(summary["best"])  # loads through the public API (weights_only)
    assert model.metadata["config"]["sgld"]["steps"] == 2 and model.metadata["config"]["sigma"] == 0.03
    last = read_checkpoint(summary["last"])
    ts = last["training_state"]
    assert {"optimizer", "scheduler", "epoch", "step", "best_val_acc", "recoveries", "rng", "metrics"} <= set(ts)
    assert ts["epoch"] == 2 and ts["step"] == summary["steps"]
    assert set(ts["rng"]) >= {"torch", "numpy", "python", "generator"}
    assert last["replay_buffer"].shape == (120, 1, 8, 8) and last["dataset"] == "digits[0-2]"
    assert last["provenance"]["seed"] == cfg.seed and last["provenance"]["settings"]["sigma"] == 0.03


def test_train_returns_a_result_and_the_old_dict_access_warns(tiny_run):
    """jemeval.train speaks the API's one vocabulary (a Result); result["key"] still reads the old
    summary dict for one release, with a DeprecationWarning."""
    _, result = tiny_run
    assert isinstance(result, Result) and isinstance(result, TrainResult) and len(result.records) == 1
    record = result.records[0]
    assert "config" not in record and "provenance" not in record
    assert result.extra["config"]["sgld"]["steps"] == 2 and result.provenance["command"] == "train"
    assert result.provenance["training"]["epoch"] == 2
    assert result.summary == {**record, "config": result.extra["config"], "provenance": result.provenance}
    assert json.loads(result.to_json())["records"][0]["best"] == record["best"]
    with pytest.warns(DeprecationWarning, match="result.records"):
        assert result["best"] == record["best"]
    with pytest.warns(DeprecationWarning):
        assert result.get("config") == result.extra["config"] and "test_acc" in result
    assert jemeval.train is train


def test_baseline_semi_supervised_factored_and_short_run(tmp_path, monkeypatch):
    base = train(tiny(tmp_path, "base", epochs=1, px_weight=0.0)).records[0]
    ckpt = read_checkpoint(base["last"])
    assert ckpt["replay_buffer"] is None and ckpt["config"]["sampling"] is False
    assert not os.path.exists(os.path.join(base["out"], "samples"))

    seen = []
    original = splits.next_labelled

    def spy(*args, **kwargs):
        idx = original(*args, **kwargs)
        seen.append(idx.clone())
        return idx

    monkeypatch.setattr(splits, "next_labelled", spy)
    trainer = Trainer(tiny(tmp_path, "semi", epochs=1, labels_per_class=4))
    trainer.run()
    labelled = set(trainer.parts.data.labelled.tolist())
    assert len(labelled) == 12 and set(torch.cat(seen).tolist()) == labelled
    assert len(trainer.parts.data.x) > 200  # the p(x) term still sees every training image
    monkeypatch.undo()

    fact = train(tiny(tmp_path, "fact", epochs=1, objective="factored")).records[0]
    df = pd.read_csv(fact["metrics"])
    assert df["loss_pyx"].iloc[0] == 0 and df["loss_px"].iloc[0] == 0 and df["loss_pxy"].iloc[0] != 0
    short = train(tiny(tmp_path, "short", epochs=1, short_run=True)).records[0]
    assert read_checkpoint(short["last"])["replay_buffer"] is None
    assert os.path.exists(os.path.join(short["out"], "samples", "buffer_epoch001.png"))


def test_cifar_shaped_npz_with_wrn_trains_checkpoints_and_resumes(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny_cifar.npz"
    np.savez(path, x=rng.integers(0, 256, (48, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, 48))
    cfg = {"arch": "wrn:depth=10,widen=2", "batch_size": 16, "sgld_steps": 1, "buffer_size": 40, "val_size": 8,
           "augment": "pad=4,flip=1", "progress": False, "test_eval": False, "grid_every": 1, "device": "cpu"}
    first = train(f"npz:{path}", epochs=1, out=str(tmp_path / "run"), **cfg).records[0]
    assert first["steps"] == 2
    model = jemeval.load_model(first["last"])
    assert model.arch == "wrn" and model.input_shape == (3, 32, 32) and model.arch_options["widen"] == 2
    resumed = train(f"npz:{path}", epochs=2, out=str(tmp_path / "run"), resume=True, **cfg)
    assert resumed.records[0]["epochs"] == 2 and resumed.records[0]["steps"] == 4
    augment = read_checkpoint(resumed.records[0]["last"])["config"]["resolved"]["augment"]
    assert augment == {"pad": 4, "flip": True, "mode": "reflect"}


def test_shared_fixtures_jem_beats_baseline_on_log_px_auroc(digits_jem_ckpt, digits_baseline_ckpt):
    """The conftest fixtures other tests rely on: both classify, only the JEM's log p(x) separates
    digits from uniform noise almost perfectly (AUROC by sklearn on logsumexp logits)."""
    from sklearn.metrics import roc_auc_score

    test = jemeval.load_dataset("digits", "test")
    noise = jemeval.load_dataset("uniform", "test", input_shape=(1, 8, 8), n=1000)
    results = {}
    for name, path in (("jem", digits_jem_ckpt), ("baseline", digits_baseline_ckpt)):
        model = jemeval.load_model(path)
        with torch.no_grad():
            acc = (model(test.x).argmax(1) == test.y).float().mean().item()
            scores = torch.cat([model.log_px(test.x), model.log_px(noise.x)]).numpy()
        results[name] = (acc, roc_auc_score([1] * len(test) + [0] * len(noise), scores))
    assert results["jem"][0] >= 0.9 and results["baseline"][0] >= 0.9
    assert results["jem"][1] >= 0.99 and results["jem"][1] > results["baseline"][1]
    cfg = jemeval.load_model(digits_jem_ckpt).metadata["config"]
    assert cfg["sgld"]["steps"] == 5 and cfg["sigma"] == 0.03
    assert jemeval.load_model(digits_baseline_ckpt).metadata["config"]["sampling"] is False


def test_proximal_sampler_trains_and_its_checkpoint_samples_and_refines(tmp_path):
    out = tmp_path / "prox"
    args = ["train", "digits[0-2]", "--arch", "cnn:width=8", "--epochs", "1", "--batch-size", "32", "--sgld-steps",
            "2", "--buffer-size", "120", "--val-size", "60", "--sampler", "proximal", "--inner-steps", "2",
            "--inner-step-size", "0.1", "--no-progress", "--out", str(out), "--json", "--device", "cpu"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["status"] == "completed" and summary["recoveries"] == 0
    recorded = read_checkpoint(out / "best.pt")["config"]["sgld"]
    assert recorded["sampler"] == "proximal-sgld" and recorded["inner_steps"] == 2 and recorded["steps"] == 2
    assert recorded["inner_step_size"] == 0.1 and recorded["clamp"] == [-1.0, 1.0]
    rows = pd.read_csv(out / "metrics.csv")
    assert np.isfinite(rows["loss"]).all() and (rows["sgld_steps"] == 2).all()
    # evaluation keeps plain SGLD with the recorded step size / noise / clamp, and says so
    model = jemeval.load_model(out / "best.pt")
    sgld = recorded_sgld(model, 3)[0]
    assert (sgld.steps, sgld.step_size, sgld.noise, sgld.clamp) == (3, 1.0, 0.01, (-1.0, 1.0))
    refined = RefinedClassifier(model, 2, chains=1, sigma=0.0)
    assert refined(torch.zeros(2, *model.input_shape)).shape == (2, model.num_classes)
    assert "trained with proximal-sgld" in refined.settings()["sgld_note"]
    res = CliRunner().invoke(cli, ["sample", "--model", str(out / "best.pt"), "--n", "4", "--steps", "2", "--device",
                                   "cpu", "--out", str(tmp_path / "g.png"), "--json"])
    assert res.exit_code == 0, res.output
    settings = json.loads(res.stdout)["settings"]
    assert "proximal-sgld" in settings["sgld_defaults_from"] and "sampler" not in settings["sgld"]
    with pytest.raises(UsageError, match="unknown sampler"):
        tiny(tmp_path, sampler="pyld")
