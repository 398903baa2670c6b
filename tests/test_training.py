"""The built-in JEM trainer: settings, loss terms, augmentation, schedule, divergence recovery,
exact resumption, checkpoints, the command line. Runs are tiny (few batches, 2 SGLD steps)."""
from __future__ import annotations

import json
import math
import os
import signal

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

import jemeval
from jemeval.errors import TrainingDiverged, UsageError
from jemeval.formats.native import read_checkpoint
from jemeval.training import TrainConfig, resolve_config, resume_config, train
from jemeval.training.augment import Augment, augment_for, parse_augment
from jemeval.training.divergence import (
    Adjustments,
    Divergence,
    DivergenceMonitor,
    RecoveryPolicy,
)
from jemeval.training.metrics_log import COLUMNS
from jemeval.training.objectives import Logits, Weights, jem_loss
from jemeval.training.schedule import learning_rate
from jemeval.training.splits import labelled_subset, split_indices
from jemeval.training.state import capture_rng, restore_rng

# A tiny run: 3 digit classes (343 training images after validation), batch 32 -> 10 iterations per epoch.
TINY = {"dataset": "digits[0-2]", "arch": "cnn:width=8", "epochs": 2, "batch_size": 32, "lr": 2e-3, "warmup_iters": 4,
        "decay_epochs": (), "sgld_steps": 2, "buffer_size": 120, "val_size": 60, "progress": False,
        "test_eval": False, "check_every": 2, "device": "cpu"}


def tiny(tmp_path, name="run", **changes) -> TrainConfig:
    return resolve_config(TINY["dataset"] if "dataset" not in changes else changes.pop("dataset"),
                          **{**{k: v for k, v in TINY.items() if k != "dataset"}, "out": str(tmp_path / name), **changes})


def state_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- settings ------------------------------------------------------------------------------------
def test_dataset_defaults_follow_the_paper_for_cifar_and_a_cpu_recipe_for_digits():
    c = resolve_config("cifar10")
    assert c.arch == "wrn:depth=28,widen=10,norm=none" and c.lr == 1e-4 and c.batch_size == 64
    assert (c.sgld_steps, c.sgld_lr, c.sgld_std, c.sigma) == (20, 1.0, 0.01, 0.03)
    assert (c.buffer_size, c.reinit_freq, c.warmup_iters, c.val_size) == (10000, 0.05, 1000, 5000)
    assert c.decay_epochs == (50, 100) and c.epochs == 150 and c.decay_rate == 0.3 and c.optimizer == "adam"
    d = resolve_config("digits")
    assert d.arch.startswith("cnn") and d.epochs <= 40
    assert resolve_config("npz:/x.npz").arch == "cnn"  # generic small defaults
    assert resolve_config("digits", lr=0.5).lr == 0.5 and resolve_config("digits", lr=None).lr == d.lr
    f = resolve_config("digits", objective="factored")
    assert (f.pyx_weight, f.px_weight, f.pxy_weight) == (0.0, 0.0, 1.0)
    record = d.to_dict()
    assert record["sgld"] == {"steps": d.sgld_steps, "step_size": d.sgld_lr, "noise": d.sgld_std, "clamp": None, "bn_mode": "eval"}
    assert record["sigma"] == d.sigma and record["out"] == "runs/digits"


@pytest.mark.parametrize("changes, words", [
    ({"optimizer": "adamw"}, ["adamw", "did you mean 'adam'"]),
    ({"sigma": -0.1}, ["--sigma", ">= 0"]),
    ({"reinit_freq": 2.0}, ["--reinit-freq", "[0, 1]"]),
    ({"objective": "factored", "pyx_weight": 1.0}, ["factored", "--pyx-weight"]),
    ({"px_weight": 0.0, "pyx_weight": 0.0}, ["every loss weight is 0"]),
    ({"augment": "pad=x"}, ["--augment", "pad=4,flip=1"]),
    ({"sgld_stepz": 3}, ["sgld_stepz", "did you mean 'sgld_steps'"]),
])
def test_bad_settings_raise_one_line_usage_errors(changes, words):
    with pytest.raises(UsageError) as exc:
        resolve_config("digits", **changes)
    message = str(exc.value)
    assert "\n" not in message and all(w in message for w in words)


def test_resume_config_only_lets_harmless_settings_change():
    stored = resolve_config("digits", epochs=4).to_dict()
    cfg = resume_config(stored, epochs=8, device="cpu")
    assert cfg.epochs == 8 and cfg.resume and cfg.lr == stored["lr"]
    with pytest.raises(UsageError, match="lr=0.5"):
        resume_config(stored, lr=0.5)


# -- building blocks -----------------------------------------------------------------------------
def test_augment_matches_per_image_reference():
    x = torch.randn(6, 3, 8, 8)
    aug = Augment(pad=2, flip=True)
    out = aug(x, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)  # replay the same draws: oy, ox, flip
    oy, ox = torch.randint(0, 5, (6,), generator=g), torch.randint(0, 5, (6,), generator=g)
    flip = torch.rand(6, generator=g) < 0.5
    for i in range(6):
        ref = F.pad(x[i:i + 1], (2, 2, 2, 2), mode="reflect")[0, :, oy[i]:oy[i] + 8, ox[i]:ox[i] + 8]
        if flip[i]:
            ref = ref.flip(2)
        assert torch.equal(out[i], ref)
    assert parse_augment("pad=4,flip=0") == Augment(4, False) and parse_augment("none") == Augment()
    assert augment_for("auto", {"augment": {"pad": 4, "flip": True}}, (3, 32, 32)) == Augment(4, True)
    with pytest.raises(UsageError, match="too large"):
        augment_for("pad=8", {}, (1, 8, 8))


def test_buffer_writes_with_repeated_slots_are_deterministic():
    from jemeval.sampling.buffer import last_writer

    idx = torch.tensor([3, 1, 3, 0, 1, 3])
    x = torch.arange(6.0)
    data = torch.full((5,), -1.0)
    data[idx] = x[last_writer(idx, 5)]
    expected = torch.full((5,), -1.0)
    for i, slot in enumerate(idx.tolist()):  # sequential reference: the last write wins
        expected[slot] = x[i]
    assert torch.equal(data, expected)


def test_learning_rate_warmup_and_step_decay():
    kw = {"warmup_iters": 10, "decay_epochs": (3, 5), "decay_rate": 0.3}
    assert learning_rate(1e-3, 0, 0, **kw) == pytest.approx(1e-4)
    assert learning_rate(1e-3, 9, 0, **kw) == pytest.approx(1e-3)
    assert learning_rate(1e-3, 50, 2, **kw) == pytest.approx(1e-3)
    assert learning_rate(1e-3, 50, 3, **kw) == pytest.approx(3e-4)
    assert learning_rate(1e-3, 50, 7, **kw, scale=0.5) == pytest.approx(1e-3 * 0.09 * 0.5)


def test_jem_loss_terms_match_hand_computation():
    torch.manual_seed(0)
    lab, data, q, qy = (torch.randn(5, 4) for _ in range(4))
    y = torch.tensor([0, 1, 2, 3, 1])
    out = Logits(lab=lab, y_lab=y, data=data, sample=q, sample_y=qy, y_sample=y)
    t = jem_loss(out, Weights(pyx=1.0, px=0.5, pxy=2.0, l2=0.1))
    lse = lambda z: np.log(np.exp(z.numpy()).sum(1))
    ce = np.mean([-(lab[i, y[i]].item() - lse(lab)[i]) for i in range(5)])
    px = -(lse(data).mean() - lse(q).mean())
    fy = lambda z: np.array([z[i, y[i]].item() for i in range(5)])
    pxy = -(fy(lab).mean() - fy(qy).mean())
    l2 = (lse(data) ** 2).mean() + (lse(q) ** 2).mean() + (fy(lab) ** 2).mean() + (fy(qy) ** 2).mean()
    assert t["pyx"].item() == pytest.approx(ce, rel=1e-5)
    assert t["px"].item() == pytest.approx(px, rel=1e-5)
    assert t["pxy"].item() == pytest.approx(pxy, rel=1e-5)
    assert t["l2"].item() == pytest.approx(l2, rel=1e-5)
    assert t["loss"].item() == pytest.approx(ce + 0.5 * px + 2.0 * pxy + 0.1 * l2, rel=1e-5)
    assert t["e_data"].item() == pytest.approx(-lse(data).mean(), rel=1e-5)
    assert t["e_sample"].item() == pytest.approx(-np.concatenate([lse(q), lse(qy)]).mean(), rel=1e-5)


def test_monitor_detects_each_kind_of_divergence():
    def stats(loss=1.0, energy=5.0, e_data=-2.0, e_sample=-2.5):
        return {k: torch.tensor(v) for k, v in {"loss": loss, "abs_energy": energy, "e_data": e_data, "e_sample": e_sample}.items()}

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


def test_rng_state_survives_a_weights_only_round_trip(tmp_path):
    import random

    g = torch.Generator().manual_seed(3)
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    torch.save(capture_rng(g), tmp_path / "rng.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=g))
    restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True), g)
    got = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=g))
    assert torch.equal(expected[0], got[0]) and np.array_equal(expected[1], got[1])
    assert expected[2] == got[2] and torch.equal(expected[3], got[3])


def test_validation_split_and_labelled_subset_are_fixed_and_exact():
    tr, va = split_indices(100, 20, seed=1234)
    assert len(va) == 20 and len(np.intersect1d(tr, va)) == 0 and len(tr) + len(va) == 100
    assert np.array_equal(va, split_indices(100, 20, seed=1234)[1])
    labels = np.repeat(np.arange(4), 10)
    sub = labelled_subset(labels, 3, 4, seed=7)
    assert np.array_equal(np.bincount(labels[sub]), [3, 3, 3, 3])
    assert np.array_equal(sub, labelled_subset(labels, 3, 4, seed=7))
    with pytest.raises(UsageError, match="more than"):
        labelled_subset(labels, 11, 4, seed=7)


# -- end-to-end runs -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny JEM run shared by the output checks."""
    out = tmp_path_factory.mktemp("train")
    cfg = tiny(out, epochs=2, test_eval=True)
    return cfg, train(cfg)


def test_run_writes_checkpoints_metrics_and_grids(tiny_run):
    cfg, summary = tiny_run
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
    assert ts["epoch"] == 2 and ts["step"] == summary["steps"] and set(ts["rng"]) >= {"torch", "numpy", "python", "generator"}
    assert last["replay_buffer"].shape == (120, 1, 8, 8) and last["dataset"] == "digits[0-2]"
    assert last["provenance"]["seed"] == cfg.seed and last["provenance"]["settings"]["sigma"] == 0.03


def test_resume_is_exact(tmp_path):
    bigger = {"arch": "cnn:width=16", "batch_size": 64}  # large enough for multi-threaded CPU kernels
    full = train(tiny(tmp_path, "full", epochs=2, **bigger))
    train(tiny(tmp_path, "half", epochs=1, **bigger))
    resumed = train(tiny(tmp_path, "half", epochs=2, resume=True, **bigger))
    a, b = read_checkpoint(full["last"]), read_checkpoint(resumed["last"])
    assert state_equal(a["state_dict"], b["state_dict"])
    assert torch.equal(a["replay_buffer"], b["replay_buffer"])
    opt_a, opt_b = a["training_state"]["optimizer"]["state"], b["training_state"]["optimizer"]["state"]
    assert all(state_equal(opt_a[k], opt_b[k]) for k in opt_a)
    assert [r["train_acc"] for r in a["training_state"]["metrics"]] == [r["train_acc"] for r in b["training_state"]["metrics"]]


def test_sigterm_mid_epoch_saves_last_pt_and_resume_is_exact(tmp_path):
    full = train(tiny(tmp_path, "full", epochs=2))

    def stop_at_step_5(trainer):
        if trainer.step == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # the real signal path

    stopped = train(tiny(tmp_path, "cut", epochs=2), on_step=stop_at_step_5)
    assert stopped["status"] == "interrupted" and stopped["steps"] == 5
    ts = read_checkpoint(stopped["last"])["training_state"]
    assert (ts["epoch"], ts["batch"], ts["step"]) == (0, 5, 5) and ts["perm"] is not None
    resumed = train(tiny(tmp_path, "cut", epochs=2, resume=True))
    assert resumed["status"] == "completed"
    assert state_equal(read_checkpoint(full["last"])["state_dict"], read_checkpoint(resumed["last"])["state_dict"])


def test_forced_divergence_is_rolled_back_and_logged(tmp_path, capsys):
    # x1e6 samples give |E| ~ 1e5 for this tiny net: a threshold of 1e4 leaves a wide margin
    cfg = tiny(tmp_path, epochs=2, max_abs_energy=1e4, inject_divergence={"step": 11, "kind": "energy"})
    summary = train(cfg)
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


def test_divergence_budget_exhausted_raises_one_clear_line(tmp_path):
    cfg = tiny(tmp_path, epochs=1, max_recoveries=2, inject_divergence={"step": 3, "kind": "nan", "times": 100})
    with pytest.raises(TrainingDiverged) as exc:
        train(cfg)
    message = str(exc.value)
    assert "\n" not in message and "non-finite loss" in message and "budget is spent (2 rollbacks)" in message
    events = pd.read_csv(os.path.join(cfg.out_dir, "metrics.csv"))["event"].dropna().tolist()
    assert [e.split(":")[0].split(" (")[0] for e in events] == [
        "diverged at epoch 1, step 3", "recovered", "diverged at epoch 1, step 3", "recovered",
        "diverged at epoch 1, step 3", "gave up"]
    assert "lr 0.001" in events[3]  # second attempt halves the learning rate


def test_baseline_semi_supervised_factored_and_short_run(tmp_path):
    base = train(tiny(tmp_path, "base", epochs=1, px_weight=0.0))
    ckpt = read_checkpoint(base["last"])
    assert ckpt["replay_buffer"] is None and ckpt["config"]["sampling"] is False
    assert not os.path.exists(os.path.join(base["out"], "samples"))

    seen = []
    cfg = tiny(tmp_path, "semi", epochs=1, labels_per_class=4)
    from jemeval.training.trainer import Trainer

    trainer = Trainer(cfg)
    original = Trainer._next_labelled

    def spy(self, n):
        idx = original(self, n)
        seen.append(idx.clone())
        return idx

    Trainer._next_labelled = spy
    try:
        trainer.run()
    finally:
        Trainer._next_labelled = original
    labelled = set(trainer.data.labelled.tolist())
    assert len(labelled) == 12 and set(torch.cat(seen).tolist()) == labelled
    assert len(trainer.data.x) > 200  # the p(x) term still sees every training image

    fact = train(tiny(tmp_path, "fact", epochs=1, objective="factored"))
    df = pd.read_csv(fact["metrics"])
    assert df["loss_pyx"].iloc[0] == 0 and df["loss_px"].iloc[0] == 0 and df["loss_pxy"].iloc[0] != 0
    short = train(tiny(tmp_path, "short", epochs=1, short_run=True))
    assert read_checkpoint(short["last"])["replay_buffer"] is None
    assert os.path.exists(os.path.join(short["out"], "samples", "buffer_epoch001.png"))


def test_cifar_shaped_npz_with_wrn_trains_checkpoints_and_resumes(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny_cifar.npz"
    np.savez(path, x=rng.integers(0, 256, (48, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, 48))
    cfg = {"arch": "wrn:depth=10,widen=2", "batch_size": 16, "sgld_steps": 1, "buffer_size": 40, "val_size": 8,
           "augment": "pad=4,flip=1", "progress": False, "test_eval": False, "grid_every": 1, "device": "cpu"}
    first = train(f"npz:{path}", epochs=1, out=str(tmp_path / "run"), **cfg)
    assert first["steps"] == 2
    model = jemeval.load_model(first["last"])
    assert model.arch == "wrn" and model.input_shape == (3, 32, 32) and model.arch_options["widen"] == 2
    resumed = train(f"npz:{path}", epochs=2, out=str(tmp_path / "run"), resume=True, **cfg)
    assert resumed["epochs"] == 2 and resumed["steps"] == 4
    assert read_checkpoint(resumed["last"])["config"]["resolved"]["augment"] == {"pad": 4, "flip": True, "mode": "reflect"}


# -- the command line ----------------------------------------------------------------------------
def invoke(*args):
    from jemeval.cli import cli

    return CliRunner().invoke(cli, ["train", *args])


def test_cli_trains_and_prints_json(tmp_path):
    args = ["digits[0-2]", "--arch", "cnn:width=8", "--epochs", "1", "--batch-size", "64", "--sgld-steps", "1",
            "--buffer-size", "60", "--val-size", "60", "--out", str(tmp_path / "cli"), "--no-progress", "--json",
            "--decay-epochs", "5", "--sigma", "0.05", "--device", "cpu"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "completed" and summary["config"]["sigma"] == 0.05
    assert summary["config"]["decay_epochs"] == [5] and summary["config"]["sgld"]["steps"] == 1
    assert 0 <= summary["test_acc"] <= 1 and math.isfinite(summary["seconds"])
    resumed = invoke("digits[0-2]", "--out", str(tmp_path / "cli"), "--resume", "--epochs", "2", "--no-progress", "--json")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["epochs"] == 2
    changed = invoke("digits[0-2]", "--out", str(tmp_path / "cli"), "--resume", "--lr", "0.1")
    assert changed.exit_code == 2 and "lr=0.1" in changed.output and "Traceback" not in changed.output


@pytest.mark.parametrize("args, words", [
    (["digts"], "did you mean 'digits'"),
    (["digits", "--sigma", "-1"], "--sigma must be a number >= 0"),
    (["digits", "--optimizer", "adamw"], "adamw"),
    (["digits", "--decay-epochs", "a,b"], "--decay-epochs must be comma-separated integers"),
    (["digits", "--out", "/nonexistent-jemeval-run", "--resume"], "no '/nonexistent-jemeval-run/last.pt' to continue"),
])
def test_cli_bad_input_is_one_line_exit_2(args, words):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output


def test_benchmark_prints_ratios():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_step", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "train_step.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    r = bench.main(["--arch", "cnn:width=8", "--batch", "16", "--steps", "2", "--repeats", "1", "--json", "--device", "cpu"])
    assert r["sgld_step_over_forward_backward"] > 0 and r["jem_iteration_over_plain_iteration"] > 1
    assert r["jem_images_per_s"] > 0


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
    from jemeval.cli import cli
    from jemeval.sampling.recorded import recorded_sgld
    from jemeval.sampling.refinement import RefinedClassifier

    out = tmp_path / "prox"
    args = ["train", "digits[0-2]", "--arch", "cnn:width=8", "--epochs", "1", "--batch-size", "32", "--sgld-steps", "2",
            "--buffer-size", "120", "--val-size", "60", "--sampler", "proximal", "--inner-steps", "2",
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


def test_python_api_resume_takes_unset_settings_from_the_run(tmp_path):
    """train(dataset, resume=True, out=...) needs only what changes: the rest comes from last.pt."""
    first = train(tiny(tmp_path, "api", epochs=1, lr=0.01, sgld_steps=3))
    assert first["status"] == "completed"
    resumed = train(TINY["dataset"], resume=True, out=str(tmp_path / "api"), epochs=2)
    assert resumed["config"]["lr"] == 0.01 and resumed["config"]["sgld_steps"] == 3 and resumed["config"]["epochs"] == 2


def test_resume_from_a_file_without_training_state_is_one_line(tmp_path):
    from jemeval.errors import UsageError

    (tmp_path / "bad").mkdir()
    torch.save(torch.zeros(3), tmp_path / "bad" / "last.pt")
    with pytest.raises(UsageError, match="holds no training state"):
        train(TINY["dataset"], resume=True, out=str(tmp_path / "bad"))
    with pytest.raises(UsageError, match="--sgld-lr must be a finite number > 0"):
        resolve_config("digits", sgld_lr=float("inf"))
