"""Training defaults that scale with the data (issue 25 item 2).

A custom set (npz:, folder:, a plugin's) of 500 images got settings made for 150 CIFAR epochs:
20 epochs = 140 iterations under a 1000-iteration warm-up, decays at epochs 160 and 180, lr 1e-4;
one epoch printed lr 7e-07 and validation 6.0% without a word. Now such a set gets epochs, lr,
warm-up, decay epochs, validation and buffer sizes derived from its size (shown by --print-config,
recorded in the run's config), the paper's and the digits settings stay exactly as they were, and
a schedule that cannot complete is one warning line on stderr and a note of the result.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_bad_inputs import runner, snapshot

from jemeval.cli import cli
from jemeval.training import TrainConfig, resolve_config, train
from jemeval.training import config as config_module
from jemeval.training.recipes import DATASET_DEFAULTS, decay_epochs_for, lr_for, scaled_defaults
from jemeval.training.trainer import learning_rate, schedule_warning

DOCS = Path(__file__).resolve().parents[1] / "docs" / "training.md"
TINY = {"arch": "cnn:width=4", "px_weight": 0.0, "device": "cpu", "progress": False, "grid_every": 0,
        "test_eval": False}


def _npz(path: Path, n: int, **extra_splits: int) -> str:
    """An npz of ``n`` random 3x8x8 training images (10 classes), plus any other splits."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split, size in {"train": n, **extra_splits}.items():
        arrays[f"x_{split}"] = rng.integers(0, 256, (size, 3, 8, 8), dtype=np.uint8)
        arrays[f"y_{split}"] = np.arange(size) % 10
    np.savez(path, **arrays)
    return f"npz:{path}"


def _cli(*args):
    return runner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


# -- the rules, against numbers worked out by hand ----------------------------------------------
def test_a_500_image_set_gets_a_schedule_that_completes():
    """500 images: 50 validation, 450 training = 7 batches of 64 an epoch; 20 epochs would be 140
    iterations, so 72 epochs (504 >= 500); warm-up 5% of 504 = 25; decays at 0.8 and 0.9 of 72."""
    settings, why = scaled_defaults(500, 64)
    assert settings == {"epochs": 72, "warmup_iters": 25, "px_weight": 0.1, "px_warmup_iters": 202,
                        "decay_epochs": (58, 65), "lr": 3e-3, "val_size": 50, "buffer_size": 450}
    assert set(why) == set(settings) and "504 iterations" in why["warmup_iters"]
    assert schedule_warning(TrainConfig(dataset="digits", **{k: v for k, v in settings.items()}), 7) is None
    # the epochs asked for are kept, and the rest follows them: 10 epochs = 70 iterations
    asked, _ = scaled_defaults(500, 64, epochs=10)
    assert "epochs" not in asked and (asked["warmup_iters"], asked["decay_epochs"]) == (4, (8, 9))
    # a set with its own validation split trains on all of it and holds nothing out
    own, why = scaled_defaults(500, 64, own_val=True)
    assert "val_size" not in own and own["buffer_size"] == 500 and own["epochs"] == math.ceil(500 / 7)


def test_a_cifar_sized_set_gets_the_papers_rate_and_warm_up():
    settings, _ = scaled_defaults(50000, 64)  # 5000 validation, 45000 training: 703 iterations an epoch
    assert settings == {"epochs": 20, "warmup_iters": 703, "px_weight": 0.1, "px_warmup_iters": 5624,
                        "decay_epochs": (16, 18), "lr": 1e-4, "val_size": 5000, "buffer_size": 10000}
    assert scaled_defaults(500000, 64)[0]["warmup_iters"] == 1000 and lr_for(10**7) == 1e-4


def test_lr_runs_between_the_two_measured_recipes():
    assert lr_for(10) == lr_for(1647) == 3e-3 and lr_for(45000) == 1e-4
    # log-linear: the geometric middle of the sizes gets the geometric middle of the rates
    assert lr_for(round(math.sqrt(1647 * 45000))) == pytest.approx(math.sqrt(3e-3 * 1e-4), rel=0.02)
    rates = [lr_for(n) for n in (1000, 2000, 5000, 10000, 20000, 40000, 50000)]
    assert rates == sorted(rates, reverse=True) and len(set(rates)) == len(rates)


def test_only_the_recipes_architecture_gets_the_larger_small_set_lr(tmp_path):
    """Before: a WRN-28-10 (no normalisation) on 1280 CIFAR-shaped images got the digits cnn's 3e-3 and
    diverged within 11 iterations on an H200, every recovery too; the paper's 1e-4 trained (0 recoveries)."""
    assert lr_for(1210, "cnn:width=8") == 3e-3 and lr_for(1210, "wrn:depth=28,widen=10,norm=none") == 1e-4
    assert lr_for(10, "resnet") == 1e-4
    spec = _npz(tmp_path / "d.npz", 500)
    wrn = resolve_config(spec, arch="wrn:depth=10,widen=1,norm=none")
    assert wrn.lr == 1e-4 and "measured only for 'cnn' models, not 'wrn'" in wrn.derived["settings"]["lr"]
    assert resolve_config(spec, arch="cnn:width=8").lr == 3e-3 == resolve_config(spec).lr
    assert wrn.warmup_iters == resolve_config(spec).warmup_iters  # the rest is still from the set's size


@pytest.mark.parametrize("epochs, expected", [(1, ()), (2, ()), (3, (2,)), (5, (4,)), (10, (8, 9)), (20, (16, 18)),
                                              (150, (120, 135))])
def test_decays_fall_before_the_last_epoch(epochs, expected):
    assert decay_epochs_for(epochs) == expected


def test_a_tiny_set_trains_200_epochs_at_most():
    settings, _ = scaled_defaults(6, 64)  # 6 images: no validation image, one batch of 6 an epoch
    assert (settings["val_size"], settings["epochs"], settings["buffer_size"]) == (0, 200, 64)


# -- resolving: custom sets derive, the paper's and the digits settings do not move ----------------
@pytest.mark.parametrize("name", sorted(DATASET_DEFAULTS))
def test_datasets_with_their_own_settings_keep_them_exactly(name, monkeypatch):
    def no_reading(*args, **kwargs):
        raise AssertionError("a dataset with its own defaults was read to derive settings")

    monkeypatch.setattr(config_module, "load_dataset", no_reading)
    config = resolve_config(name)
    assert config.derived is None
    assert {k: getattr(config, k) for k in DATASET_DEFAULTS[name]} == DATASET_DEFAULTS[name]
    assert config.epochs == DATASET_DEFAULTS[name]["epochs"]


def test_a_custom_set_derives_what_was_not_given_and_records_it(tmp_path):
    spec = _npz(tmp_path / "d.npz", 500)
    config = resolve_config(spec)
    expected, _ = scaled_defaults(500, 64)
    assert {k: getattr(config, k) for k in expected} == expected
    assert config.derived["from"] == {"train_images": 500, "own_val_split": False, "epochs": 72, "batch_size": 64}
    assert set(config.derived["settings"]) == set(expected)
    assert config.to_dict()["derived"] == config.derived  # what checkpoints, summary and provenance record
    # an explicit setting always wins and is not called derived; the rest follows it
    mine = resolve_config(spec, lr=1e-3, epochs=10, batch_size=32)
    assert (mine.lr, mine.epochs, mine.batch_size) == (1e-3, 10, 32)
    assert mine.warmup_iters == round(0.05 * 10 * (450 // 32)) and mine.decay_epochs == (8, 9)
    assert not {"lr", "epochs", "batch_size"} & set(mine.derived["settings"])
    # a split of its own: validates on it, nothing held out
    split = resolve_config(_npz(tmp_path / "v.npz", 300, val=40, test=40))
    assert split.val_size is None and "val_size" not in split.derived["settings"] and split.buffer_size == 300


def test_an_unreadable_set_is_derived_when_the_run_starts(tmp_path):
    """The data may not be there yet (a download, a file made later): resolving leaves the settings
    to the run instead of keeping values made for another dataset."""
    path = tmp_path / "later.npz"
    config = resolve_config(f"npz:{path}", **TINY, epochs=3, out=str(tmp_path / "run"))
    assert config.derived["pending"] == ["lr", "warmup_iters", "px_warmup_iters", "decay_epochs", "val_size",
                                         "buffer_size"]
    _npz(path, 40)
    result = train(config)
    record = result.extra["config"]
    expected, _ = scaled_defaults(40, 64, epochs=3)  # 4 validation images, 36 training: one batch an epoch
    expected = {k: v for k, v in expected.items() if k not in TINY}  # given (px_weight 0): not derived
    assert {k: record[k] for k in expected} == {k: list(v) if isinstance(v, tuple) else v for k, v in expected.items()}
    assert record["derived"]["from"]["train_images"] == 40 and record["resolved"]["data"]["n_val"] == 4


# -- --print-config shows the derived schedule --------------------------------------------------
def test_print_config_shows_each_derived_setting_and_from_what(tmp_path):
    spec = _npz(tmp_path / "d.npz", 500)
    before = snapshot(tmp_path)
    result = _cli("train", "--print-config", spec, "--lr", "0.001")
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    values = yaml.safe_load(text)
    assert (values["epochs"], values["warmup-iters"], values["decay-epochs"]) == (72, 25, [58, 65])
    assert (values["val-size"], values["buffer-size"], values["lr"]) == (50, 450, 0.001)
    lines = text.splitlines()
    for key in ("epochs", "warmup-iters", "decay-epochs", "val-size", "buffer-size"):
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{key}: "))
        comment = " ".join(line[2:] for line in lines[:at][::-1][:3][::-1] if line.startswith("# "))
        assert "derived: " in comment, (key, comment)
    at = lines.index("lr: 0.001")  # given: no derived comment
    assert "derived" not in lines[at - 1]
    assert "derived from the data (500 training-split images, batch 64, 72 epochs)" in text
    assert "504 iterations" in text  # the warm-up's reason: 5% of the run
    # reading the file back runs the same settings (and the digits/cifar files stay as they were)
    (tmp_path / "c.yaml").write_text(text)
    again = yaml.safe_load(_cli("train", "--print-config", "--config", tmp_path / "c.yaml").stdout)
    assert again == values
    assert snapshot(tmp_path) == {**before, "c.yaml": snapshot(tmp_path)["c.yaml"]}
    assert "derived" not in _cli("train", "--print-config", "cifar10").stdout


def test_print_config_of_a_set_not_there_yet_leaves_the_settings_to_the_run(tmp_path):
    result = _cli("train", "--print-config", f"npz:{tmp_path / 'later.npz'}")
    values = yaml.safe_load(result.stdout)
    assert result.exit_code == 0 and values["lr"] is None and values["warmup-iters"] is None  # not 1e-4 / 1000
    flat = " ".join(line.removeprefix("# ") for line in result.stdout.splitlines())  # comments wrap at any word
    assert "the run derives it from the data's size" in flat and "does not exist" in flat


# -- the attack: the issue's schedule, given explicitly, warns once ------------------------------
def test_a_schedule_that_cannot_complete_is_one_warning_line_and_a_note(tmp_path):
    spec = _npz(tmp_path / "d.npz", 200)  # 180 training images: 2 iterations an epoch
    result = _cli("train", spec, "--epochs", "2", "--warmup-iters", "1000", "--decay-epochs", "160,180", "--lr",
                  "1e-4", "--arch", "cnn:width=4", "--px-weight", "0", "--device", "cpu", "--out", tmp_path / "run",
                  "--no-progress")
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    line = lines[0]
    assert "warmup_iters=1000" in line and "4 iterations" in line and "160, 180" in line, line
    end = learning_rate(1e-4, 3, 1, warmup_iters=1000)  # the rate of the run's last iteration: 4e-07
    assert f"it ends at {end:.2g}" in line
    # the Python API: the same line in the result's notes; a derived schedule gives none
    run = train(spec, **TINY, epochs=2, lr=1e-4, warmup_iters=1000, decay_epochs=(160, 180), out=str(tmp_path / "api"))
    assert [n for n in run.notes if "schedule" in n] == [line.removeprefix("jemeval train: ")]
    derived = train(spec, **TINY, epochs=2, out=str(tmp_path / "derived"))
    assert not [n for n in derived.notes if "schedule" in n]


@pytest.mark.parametrize("settings, words", [
    ({"warmup_iters": 50, "decay_epochs": ()}, ["warm-up (warmup_iters=50) is longer than the run (40 iterations"]),
    ({"warmup_iters": 5, "decay_epochs": (4, 9)}, ["decay_epochs 4, 9 are not before the last epoch (epochs=4)"]),
    ({"warmup_iters": 5, "decay_epochs": (3, 4)}, ["decay_epochs 4 is not before", "that decay never happens"]),
    ({"warmup_iters": 25, "decay_epochs": (2,)}, ["first decay (epoch 2, iteration 20) comes before the warm-up"]),
])
def test_each_impossible_schedule_is_named(settings, words):
    line = schedule_warning(TrainConfig(dataset="digits", epochs=4, **settings), 10)
    assert line and "\n" not in line and all(w in line for w in words), line
    assert schedule_warning(TrainConfig(dataset="digits", epochs=4, warmup_iters=5, decay_epochs=(3,)), 10) is None


# -- acceptance: the documented 600-image set learns with the defaults --------------------------
def _docs_blobs(folder: Path) -> Path:
    """Run the generator of docs/training.md literally (in ``folder``): blobs.npz."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    code = next(b for b in blocks if 'np.savez("blobs.npz"' in b)
    cwd = Path.cwd()
    try:
        os.chdir(folder)
        exec(compile(code, str(DOCS), "exec"), {"__name__": "docs_blobs"})
    finally:
        os.chdir(cwd)
    return folder / "blobs.npz"


def test_the_documented_600_image_set_learns_with_the_defaults(tmp_path):
    """The defaults' architecture (cnn, width 32) with JEM's 20 SGLD steps takes ~15 min on one core
    (docs/training.md has that figure); here the plain classifier (px_weight 0) at width 16, with
    every derived setting, in ~25 s. The same run with the settings this set got before stays at chance."""
    path = _docs_blobs(tmp_path)
    with np.load(path) as f:
        assert f["x_train"].shape == (500, 3, 32, 32) and f["x_test"].shape == (100, 3, 32, 32)
    common = {"arch": "cnn:width=16", "px_weight": 0.0, "device": "cpu", "progress": False, "grid_every": 0}
    config = resolve_config(f"npz:{path}", **common, out=str(tmp_path / "run"))
    assert (config.epochs, config.lr, config.warmup_iters, config.decay_epochs) == (72, 3e-3, 25, (58, 65))
    record = train(config).records[0]
    assert record["test_acc"] >= 0.5, record  # chance is 0.1; measured 0.72
    before = train(f"npz:{path}", **common, epochs=20, lr=1e-4, warmup_iters=1000, decay_epochs=(160, 180),
                   val_size=50, out=str(tmp_path / "before")).records[0]
    assert before["test_acc"] <= 0.2, before


def test_the_warning_docs_show_is_the_issues_schedule_word_for_word():
    """The issue's run: 450 training images (7 iterations an epoch), 20 epochs, the old settings."""
    old = TrainConfig(dataset="npz:/x.npz", epochs=20, lr=1e-4, warmup_iters=1000, decay_epochs=(160, 180))
    line = schedule_warning(old, 7)
    assert f"jemeval train: {line}\n" in DOCS.read_text()
    assert "it ends at 1.4e-05" in line and learning_rate(1e-4, 139, 19, warmup_iters=1000) == pytest.approx(1.4e-5)
