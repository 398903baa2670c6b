"""Divergence (jemeval.training.divergence, recovery): detection, the authors' ladder of remedies, and
end-to-end rollbacks of a real run whose iteration is made to diverge by a fault patched in (the
production code has no fault-injection argument)."""
from __future__ import annotations

import os

import pandas as pd
import pytest
import torch

from jemeval.errors import TrainingDiverged
from jemeval.formats.native import read_checkpoint
from jemeval.training import resolve_config, train
from jemeval.training import step as step_module
from jemeval.training.divergence import Adjustments, Divergence, DivergenceMonitor, RecoveryPolicy

# 3 digit classes (343 training images after validation), batch 32 -> 10 iterations per epoch.
TINY = {"arch": "cnn:width=8", "epochs": 2, "batch_size": 32, "lr": 2e-3, "warmup_iters": 4, "decay_epochs": (),
        "sgld_steps": 2, "buffer_size": 120, "val_size": 60, "progress": False, "test_eval": False, "check_every": 2,
        "device": "cpu"}


def tiny(tmp_path, **changes):
    return resolve_config("digits[0-2]", **{**TINY, "out": str(tmp_path / "run"), **changes})


class Fault:
    """Arms a fault for iteration ``at`` (0-based global step), ``times`` times (again after each
    rollback): its ``on_step`` watches the trainer, :meth:`fires` tells the patched code when."""

    def __init__(self, at: int, times: int = 1) -> None:
        self.at, self.left, self.armed = at, times, False

    def on_step(self, trainer) -> None:  # trainer.step iterations done: the next one is number trainer.step
        self.armed = trainer.step == self.at and self.left > 0

    def fires(self) -> bool:
        if not self.armed:
            return False
        self.armed, self.left = False, self.left - 1
        return True


def nan_loss(monkeypatch, fault: Fault) -> None:
    """The armed iteration's loss becomes NaN, so its gradients and then the weights do too."""
    real = step_module.jem_loss

    def patched(out, weights):
        terms = real(out, weights)
        return {**terms, "loss": terms["loss"] * float("nan")} if fault.fires() else terms

    monkeypatch.setattr(step_module, "jem_loss", patched)


def exploding_samples(monkeypatch, fault: Fault) -> None:
    """The armed iteration's SGLD samples are scaled by 1e6 (their energies explode)."""
    real = step_module.TrainStep.negatives

    def patched(self, n, y=None):
        x = real(self, n, y)
        return x * 1e6 if fault.fires() else x

    monkeypatch.setattr(step_module.TrainStep, "negatives", patched)


def test_monitor_detects_each_kind_of_divergence():
    def stats(loss=1.0, energy=5.0, e_data=-2.0, e_sample=-2.5):
        values = {"loss": loss, "abs_energy": energy, "e_data": e_data, "e_sample": e_sample}
        return {k: torch.tensor(v) for k, v in values.items()}

    m = DivergenceMonitor(max_abs_loss=1e8, max_abs_energy=100.0, energy_gap_band=10.0, gap_patience=2)
    for s in range(5):
        m.record(s, stats())
    m.check()  # healthy
    for bad, words in [(stats(loss=float("nan")), "non-finite loss"), (stats(loss=2e8), "|loss|"),
                       (stats(energy=1e3), "energy magnitude")]:
        m.record(7, bad)
        with pytest.raises(Divergence, match=words.replace("|", r"\|")) as exc:
            m.check()
        assert exc.value.step == 7
    for s in range(3):  # outside the band for 3 > patience 2 iterations
        m.record(10 + s, stats(e_sample=50.0))
    with pytest.raises(Divergence, match="energy gap") as exc:
        m.check()
    assert exc.value.step == 12
    m.reset()
    for s in range(2):
        m.record(s, stats(e_sample=50.0))
    m.record(2, stats())
    m.check()  # back inside the band before the patience ran out


def test_recovery_policy_climbs_the_authors_ladder():
    cfg = resolve_config("digits", lr=1e-3, sgld_steps=20)
    policy, adj = RecoveryPolicy(base_seed=0), Adjustments()
    seen = []
    for attempt in range(1, 6):
        adj, changes = policy.apply(attempt, adj, cfg)
        seen.append(changes)
    assert seen[0] == ["reseed 1001"]
    assert seen[1] == ["reseed 2001", "lr 0.0005"]
    assert seen[2] == ["reseed 3001", "sgld_steps 40"]
    assert seen[3] == ["reseed 4001", "energy_l2 0.1"]
    assert seen[4] == ["reseed 5001", "lr 0.00025"]
    assert (adj.lr_scale, adj.sgld_steps, adj.energy_l2) == (0.25, 40, 0.1)


def test_forced_divergence_is_rolled_back_and_logged(tmp_path, monkeypatch, capsys):
    fault = Fault(at=11)
    exploding_samples(monkeypatch, fault)
    # x1e6 samples give |E| ~ 1e5 for this tiny net: a threshold of 1e4 leaves a wide margin
    result = train(tiny(tmp_path, max_abs_energy=1e4), on_step=fault.on_step)
    summary = result.records[0]
    assert summary["status"] == "completed" and summary["recoveries"] == 1 and summary["epochs"] == 2
    df = pd.read_csv(summary["metrics"])
    events = df["event"].dropna().tolist()
    assert events[0].startswith("diverged at epoch 2, step 11: energy magnitude")
    assert events[1].startswith("recovered (attempt 1/5): rollback to epoch 1 (step 10), reseed 1001")
    assert df[df["event"].isna()]["epoch"].tolist() == [1, 2]
    assert "jemeval train: recovered" in capsys.readouterr().err
    last = read_checkpoint(summary["last"])
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values())
    assert last["training_state"]["recoveries"] == 1 and last["training_state"]["adjustments"]["seed"] == 1001


def test_divergence_budget_exhausted_raises_one_clear_line(tmp_path, monkeypatch):
    fault = Fault(at=3, times=100)
    nan_loss(monkeypatch, fault)
    cfg = tiny(tmp_path, epochs=1, max_recoveries=2)
    with pytest.raises(TrainingDiverged) as exc:
        train(cfg, on_step=fault.on_step)
    message = str(exc.value)
    assert "\n" not in message and "non-finite loss" in message and "budget is spent (2 rollbacks)" in message
    assert "max_recoveries" in message and "--" not in message  # parameters, not flags
    events = pd.read_csv(os.path.join(cfg.out_dir, "metrics.csv"))["event"].dropna().tolist()
    assert [e.split(":")[0].split(" (")[0] for e in events] == [
        "diverged at epoch 1, step 3", "recovered", "diverged at epoch 1, step 3", "recovered",
        "diverged at epoch 1, step 3", "gave up"]
    assert "lr 0.001" in events[3]  # second attempt halves the learning rate



# a plain classifier that learns within 3 epochs: val acc 0.28 / 0.53 / 0.82 (42 iterations per epoch)
LEARNS = {"px_weight": 0.0, "batch_size": 8, "lr": 3e-3, "epochs": 3, "max_val_drop": 0.1}


def zero_weights_after(step: int):
    """An ``on_step`` that zeroes every weight after iteration ``step`` (before any rollback): equal
    logits, every image predicted as class 0, finite moderate energies (nothing the per-iteration
    checks can see)."""

    def on_step(trainer) -> None:
        if trainer.step == step and not trainer.position.recoveries:
            with torch.no_grad():
                for param in trainer.parts.model.parameters():
                    param.zero_()

    return on_step


def test_collapsed_validation_accuracy_is_rolled_back_not_saved(tmp_path):
    """An epoch can end with a collapsed model but finite, moderate energies (digits, the first recipe
    "fast", seed 4: val 0.95 -> 0.33 in one epoch): it is rolled back, never saved as last.pt."""
    summary = train(tiny(tmp_path, **LEARNS), on_step=zero_weights_after(126)).records[0]
    df = pd.read_csv(summary["metrics"])
    events = df["event"].dropna().tolist()
    assert summary["status"] == "completed" and summary["recoveries"] == 1, events
    assert events[0].startswith("diverged at epoch 3, step 126: validation accuracy 0.")
    assert "is more than 0.1 below the best (0.5333, epoch 2)" in events[0]
    assert events[1].startswith("recovered (attempt 1/5): rollback to epoch 2 (step 84), reseed 1001")
    rows = df[df["event"].isna()]
    assert rows["epoch"].tolist() == [1, 2, 3] and rows["val_acc"].iloc[-1] > 0.6  # the collapse left no row
    assert read_checkpoint(summary["last"])["training_state"]["recoveries"] == 1


def test_validation_check_can_be_turned_off(tmp_path):
    summary = train(tiny(tmp_path, **{**LEARNS, "max_val_drop": 1.0}), on_step=zero_weights_after(126)).records[0]
    val_acc = pd.read_csv(summary["metrics"])["val_acc"].tolist()
    assert summary["recoveries"] == 0 and val_acc[-1] < val_acc[-2] - 0.1  # saved as it was
