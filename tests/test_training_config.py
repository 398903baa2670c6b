"""Training settings (jemeval.training.config): per-dataset defaults, one-line errors that name the
parameter, what a resume may change, and configurations stored by older versions."""
from __future__ import annotations

import pytest
import torch

from jemeval.errors import UsageError
from jemeval.training import TrainConfig, resolve_config, resume_config, train


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
    assert record["sgld"] == {"steps": d.sgld_steps, "step_size": d.sgld_lr, "noise": d.sgld_std, "clamp": None,
                              "bn_mode": "eval"}
    assert record["sigma"] == d.sigma and record["out"] == "runs/digits"


@pytest.mark.parametrize("changes, words, param", [
    ({"optimizer": "adamw"}, ["adamw", "did you mean 'adam'"], "optimizer"),
    ({"sigma": -0.1}, ["sigma must be a number >= 0"], "sigma"),
    ({"lr": -1.0}, ["lr must be > 0, got -1.0"], "lr"),
    ({"epochs": 0}, ["epochs must be >= 1, got 0"], "epochs"),
    ({"reinit_freq": 2.0}, ["reinit_freq", "[0, 1]"], "reinit_freq"),
    ({"sgld_lr": float("inf")}, ["sgld_lr must be a finite number > 0"], "sgld_lr"),
    ({"objective": "factored", "pyx_weight": 1.0}, ["factored", "pyx_weight"], "pyx_weight"),
    ({"px_weight": 0.0, "pyx_weight": 0.0}, ["every loss weight is 0"], "pyx_weight"),
    ({"augment": "pad=x"}, ["augment", "pad=4,flip=1"], "augment"),
    ({"resume": True, "overwrite": True}, ["resume=True", "overwrite=True", "not both"], "overwrite"),
    ({"sgld_stepz": 3}, ["sgld_stepz", "did you mean 'sgld_steps'"], None),
])
def test_bad_settings_raise_one_line_usage_errors_naming_the_parameter(changes, words, param):
    with pytest.raises(UsageError) as exc:
        resolve_config("digits", **changes)
    message = str(exc.value)
    assert "\n" not in message and all(w in message for w in words), message
    assert "--" not in message  # the core names parameters; flags belong to the command line
    assert exc.value.param == param


def test_resume_config_only_lets_harmless_settings_change():
    stored = resolve_config("digits", epochs=4).to_dict()
    cfg = resume_config(stored, epochs=8, device="cpu", max_recoveries=9, max_val_drop=1.0)
    assert cfg.epochs == 8 and cfg.resume and cfg.lr == stored["lr"]
    assert (cfg.max_recoveries, cfg.max_val_drop) == (9, 1.0)  # recovery settings: a stuck run can go on
    older = {k: v for k, v in stored.items() if k != "max_val_drop"}  # stored before the setting existed
    assert resume_config(older, epochs=8).max_val_drop == TrainConfig.max_val_drop
    with pytest.raises(UsageError, match="lr=0.5"):
        resume_config(stored, lr=0.5)


def test_configs_stored_by_older_versions_load():
    """0.1 stored a test-only ``inject_divergence`` setting (and always stores derived keys): ignored."""
    stored = {**resolve_config("digits", epochs=3).to_dict(), "inject_divergence": {"step": 3, "kind": "nan"},
              "resolved": {"device": "cpu"}}
    config = TrainConfig.from_dict(stored)
    assert config.epochs == 3 and not hasattr(config, "inject_divergence")
    assert resume_config(stored, epochs=5).epochs == 5


def test_resume_from_a_file_without_training_state_is_one_line(tmp_path):
    (tmp_path / "bad").mkdir()
    torch.save(torch.zeros(3), tmp_path / "bad" / "last.pt")
    with pytest.raises(UsageError, match="holds no training state"):
        train("digits[0-2]", resume=True, out=str(tmp_path / "bad"))
    with pytest.raises(UsageError, match="no .* to continue") as exc:
        train("digits[0-2]", resume=True, out=str(tmp_path / "none"))
    assert exc.value.param == "out"


@pytest.mark.parametrize("native", [True, False])
def test_the_fast_recipe_turns_bf16_on_only_where_the_cpu_has_it(monkeypatch, native):
    from jemeval.training import recipes

    monkeypatch.setattr(recipes, "native_cpu_bf16", lambda: native)
    assert resolve_config("digits", recipe="fast").bf16 is (True if native else None)  # None: the device decides
    assert resolve_config("digits", recipe="fast", bf16=False).bf16 is False  # the user's setting wins
    assert resolve_config("digits").bf16 is None  # the paper's recipe never changes with the machine


def test_native_cpu_bf16_reads_the_cpus_own_flags():
    from pathlib import Path

    from jemeval.training.recipes import native_cpu_bf16

    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo to compare with")
    flags = cpuinfo.read_text().split()
    assert native_cpu_bf16() == ("avx512_bf16" in flags or "amx_tile" in flags)


def test_a_recipe_is_a_set_of_defaults_that_explicit_settings_override():
    from jemeval.training.recipes import FAST_DIGITS

    fast = resolve_config("digits", recipe="fast")
    assert fast.recipe == "fast" and fast.to_dict()["recipe"] == "fast"
    assert {k: getattr(fast, k) for k in FAST_DIGITS} == FAST_DIGITS
    assert (fast.sgld_steps, fast.sgld_lr, fast.epochs, fast.decay_epochs, fast.energy_l2) == (10, 2.0, 18, (17,), 0.01)
    paper = resolve_config("digits")
    assert paper.recipe == "paper" and paper.sampler == "sgld" and paper == resolve_config("digits", recipe="paper")
    assert fast.arch == paper.arch and fast.batch_size == paper.batch_size  # only the recipe's keys change (and bf16)
    assert resolve_config("digits[0-4]", recipe="fast").sgld_lr == 2.0  # by the dataset's base name
    mixed = resolve_config("digits", recipe="fast", sgld_steps=7, sampler="proximal")  # what the user sets wins
    assert (mixed.sgld_steps, mixed.sampler) == (7, "proximal") and mixed.epochs == fast.epochs


@pytest.mark.parametrize("dataset, recipe, words", [
    ("digits", "fats", ["unknown recipe 'fats'", "did you mean 'fast'"]),
    ("cifar10", "fast", ["recipe 'fast' is defined for digits only", "not 'cifar10'"]),
])
def test_an_undefined_recipe_is_a_one_line_error(dataset, recipe, words):
    with pytest.raises(UsageError) as exc:
        resolve_config(dataset, recipe=recipe)
    assert exc.value.param == "recipe" and "\n" not in str(exc.value)
    assert all(w in str(exc.value) for w in words)


def test_a_resume_keeps_the_recipe_and_older_configs_have_the_paper_one():
    stored = resolve_config("digits", recipe="fast", epochs=2).to_dict()
    assert resume_config(stored, epochs=4).recipe == "fast"
    with pytest.raises(UsageError, match="recipe='paper' \\(run has 'fast'\\)"):
        resume_config(stored, recipe="paper")
    older = {k: v for k, v in stored.items() if k != "recipe"}
    assert TrainConfig.from_dict(older).recipe == "paper"
