"""``jemeval train DATA --init SOURCE`` (jemeval.training.warmstart): a run that starts from a
classifier's weights, from each kind of source (a jemeval checkpoint, a safetensors export, timm,
torchvision and pytorch-ood caches with random weights, laid out as the libraries lay them out).

A kept head gives the source's logits before the first step; a re-initialised head is said in one
line and recorded; the run records its source (name, SHA-256); a resume is the uninterrupted run and
never reads the source again; a source that does not fit the data is one line before any file."""
from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from test_bad_inputs import assert_one_line_refusal, runner, snapshot
from test_pretrained import offline, pytorch_ood_wrn, timm_resnet18, torchvision_resnet18  # noqa: F401 (fixtures)

import jemeval
from jemeval.cli import cli
from jemeval.formats.native import read_checkpoint
from jemeval.provenance import file_sha256
from jemeval.training import resolve_config, train
from jemeval.training.parts import initial_model
from jemeval.training.splits import prepare_data

TINY = {"arch": "cnn:width=8", "epochs": 1, "batch_size": 32, "lr": 2e-3, "warmup_iters": 2, "decay_epochs": (),
        "sgld_steps": 2, "buffer_size": 60, "val_size": 30, "progress": False, "test_eval": False,
        "check_every": 2, "device": "cpu"}


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> str:
    """A plain digits classifier (cnn width 8, trained on digits 0-2 of the 10 classes): the source the
    runs below start from."""
    out = tmp_path_factory.mktemp("source") / "clf"
    train(resolve_config("digits[0-2]", **{**TINY, "px_weight": 0.0, "out": str(out)}))
    return str(out / "last.pt")


def first_model(dataset: str, **settings):
    """The network a run would start from (before any step), its config and the line it says."""
    config = resolve_config(dataset, **{**TINY, **settings})
    data = prepare_data(config, torch.device("cpu"))
    model, config, line = initial_model(config, data)
    return model.eval(), config, line, data


def logits(model, x):
    with torch.no_grad():
        return model(x)


def test_a_kept_head_gives_the_classifiers_logits_before_the_first_step(classifier, tmp_path):
    model, config, line, data = first_model("digits[0-2]", init=classifier, out=str(tmp_path / "r"))
    source = jemeval.load_model(classifier)
    x = data.x_val[:16] if isinstance(data.x_val, torch.Tensor) else torch.rand(16, 1, 8, 8) * 2 - 1
    torch.testing.assert_close(logits(model, x), logits(source, x), rtol=0, atol=0)
    assert "head kept (the same 10 classes)" in line and config.arch == "cnn:width=8"
    record = config.init_from
    assert record["sha256"] == file_sha256(classifier) and record["head"] == "kept"
    assert record["source"] == classifier and record["name"] == "last.pt"


def test_another_label_space_reinitialises_the_head_and_says_so(classifier, tmp_path):
    rng = np.random.default_rng(1)  # 8x8 grey images of 3 classes: digits' shape, another label space
    np.savez(tmp_path / "three.npz", x_train=rng.integers(0, 256, (60, 8, 8), dtype=np.uint8),
             y_train=np.arange(60) % 3)
    model, config, line, _ = first_model(f"npz:{tmp_path / 'three.npz'}", init=classifier, out=str(tmp_path / "r"),
                                         arch=None)
    assert "head re-initialised (the source has 10 classes, the data 3)" in line
    source = jemeval.load_model(classifier).net.state_dict()
    ours = model.net.state_dict()
    head = {k for k in ours if ours[k].shape != source[k].shape}
    assert head and all(k.startswith(sorted(head)[0].rsplit(".", 1)[0]) for k in head)  # one layer: the head
    assert all(torch.equal(ours[k], source[k]) for k in ours if k not in head)
    assert config.init_from["head"] == "re-initialised"


def test_a_safetensors_export_starts_a_run_as_its_checkpoint_does(classifier, tmp_path):
    exported = tmp_path / "clf.safetensors"
    assert runner().invoke(cli, ["export", classifier, "--out", str(exported)]).exit_code == 0
    model, config, line, data = first_model("digits[0-2]", init=str(exported), out=str(tmp_path / "r"))
    x = torch.rand(8, 1, 8, 8) * 2 - 1
    torch.testing.assert_close(logits(model, x), logits(jemeval.load_model(classifier), x), rtol=0, atol=0)
    assert config.init_from["sha256"] == file_sha256(exported) and "head kept" in line


def rgb_npz(path, classes: int, size: int = 32, n: int = 40) -> str:
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8),
             y_train=np.arange(n) % classes, x_test=rng.integers(0, 256, (10, size, size, 3), dtype=np.uint8),
             y_test=np.arange(10) % classes)
    return f"npz:{path}"


@pytest.mark.parametrize("kind", ["timm", "torchvision"])
def test_an_imagenet_hub_model_keeps_its_body_and_normalisation_and_gets_a_new_head(
        kind, tmp_path, request):
    net, path = request.getfixturevalue(f"{kind}_resnet18")
    data = rgb_npz(tmp_path / "rgb.npz", classes=4)
    model, config, line, _ = first_model(data, init=f"{kind}:resnet18", arch=None, out=str(tmp_path / "r"),
                                         val_size=8, buffer_size=8)
    assert "head re-initialised (the source has 1000 classes, the data 4)" in line
    assert config.init_from["sha256"] == file_sha256(path.resolve())
    assert model.normalization == jemeval.load_model(f"{kind}:resnet18").normalization is not None
    ours = model.net.state_dict()
    body = {k: v for k, v in ours.items() if "fc." not in k}
    theirs = jemeval.load_model(f"{kind}:resnet18").net.state_dict()
    assert body and all(torch.equal(v, theirs[k]) for k, v in body.items())
    assert ours[[k for k in ours if k.endswith("fc.weight")][0]].shape == (4, 512)


def test_a_pytorch_ood_model_with_the_same_classes_keeps_its_head(pytorch_ood_wrn, tmp_path):  # noqa: F811
    data = rgb_npz(tmp_path / "rgb.npz", classes=10)
    model, config, line, _ = first_model(data, init="pytorch-ood:wrn-40-2/cifar10/oe", arch=None,
                                         out=str(tmp_path / "r"), val_size=8, buffer_size=8)
    x = torch.rand(4, 3, 32, 32) * 2 - 1
    torch.testing.assert_close(logits(model, x), logits(jemeval.load_model("pytorch-ood:wrn-40-2/cifar10/oe"), x),
                               rtol=0, atol=0)
    assert "head kept (the same 10 classes)" in line


def _cli(*args):
    return runner().invoke(cli, [str(a) for a in args])


def test_a_resumed_warm_start_is_the_uninterrupted_run_without_reading_the_source(classifier, tmp_path):
    source = tmp_path / "source.pt"
    source.write_bytes(open(classifier, "rb").read())
    common = ["train", "digits[0-2]", "--init", source, "--arch", "cnn:width=8", "--batch-size", "32",
              "--sgld-steps", "2", "--buffer-size", "60", "--val-size", "30", "--warmup-iters", "2",
              "--decay-epochs", "", "--device", "cpu", "--no-progress"]
    common.remove("--arch"), common.remove("cnn:width=8")  # the architecture is the source's
    full = _cli(*common, "--epochs", "2", "--out", tmp_path / "full")
    assert full.exit_code == 0, full.output
    assert "jemeval train: --init source.pt: cnn:width=8, head kept" in full.stderr
    half = _cli(*common, "--epochs", "1", "--out", tmp_path / "half")
    assert half.exit_code == 0, half.output
    source.write_bytes(b"not a checkpoint any more")  # a resume must not read it
    resumed = _cli(*common, "--epochs", "2", "--out", tmp_path / "half", "--resume")
    assert resumed.exit_code == 0, resumed.output
    a, b = (read_checkpoint(tmp_path / run / "last.pt") for run in ("full", "half"))
    assert a["state_dict"].keys() == b["state_dict"].keys()
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    assert torch.equal(a["replay_buffer"], b["replay_buffer"])
    init = b["config"]["init_from"]
    assert init["sha256"] == file_sha256(classifier) and init["head"] == "kept"


def test_print_config_shows_the_init_and_the_sources_architecture(classifier, tmp_path):
    result = _cli("train", "digits[0-2]", "--init", classifier, "--print-config")
    assert result.exit_code == 0, result.output
    assert f"init: {classifier}" in result.output and "arch: cnn:width=8" in result.output


@pytest.mark.parametrize("args, message", [
    (["--init", "nothing.pt"], "nothing.pt"),
    (["--init", "timm:resnet9999"], "unknown timm architecture"),
    (["--init", "SRC", "--arch", "cnn:width=16"], "both name the architecture"),
])
def test_a_bad_init_is_one_line_before_any_file(args, message, classifier, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    result = _cli("train", "digits[0-2]", *[classifier if a == "SRC" else a for a in args], "--out", "run")
    assert_one_line_refusal(result, message)
    assert snapshot(tmp_path) == before


def test_a_source_built_for_other_images_is_one_line(classifier, tmp_path, monkeypatch):
    """cnn's last layer depends on the input size: an 8x8 classifier cannot start a 32x32 RGB run."""
    monkeypatch.chdir(tmp_path)
    data = rgb_npz(tmp_path / "rgb.npz", classes=3)
    before = snapshot(tmp_path)
    result = _cli("train", data, "--init", classifier, "--out", "run", "--device", "cpu")
    assert_one_line_refusal(result, "the source was built for inputs of another shape")
    assert snapshot(tmp_path) == before


def test_recipe_finetune_scales_the_runs_own_settings_and_needs_an_init(classifier, tmp_path):
    config = resolve_config("digits", init=classifier, recipe="finetune", out=str(tmp_path / "r"))
    assert (config.epochs, config.lr, config.warmup_iters, config.decay_epochs) == (3, pytest.approx(1e-3), 0, ())
    assert (config.sgld_lr, config.sgld_steps, config.px_weight, config.energy_l2) == (0.1, 5, 0.16, 0.0)
    assert (config.short_run, config.gaussian_starts, config.best_by) == (True, 0.75, "last")
    assert config.init_from["batchnorm"] is False  # cnn: no BatchNorm
    assert "15% of the 20 epochs" in config.derived["settings"]["epochs"]
    mine = resolve_config("digits", init=classifier, recipe="finetune", epochs=6, out=str(tmp_path / "r"))
    assert mine.epochs == 6  # what the user sets wins
    plain = resolve_config("digits", init=classifier, recipe="finetune", px_weight=0.0, out=str(tmp_path / "r"))
    assert (plain.px_weight, plain.short_run, plain.samples) == (0.0, False, False)  # no chains to run short
    assert plain.gaussian_starts == 0.0 and "short_run" not in plain.derived["settings"]
    with pytest.raises(jemeval.errors.UsageError, match="recipe 'finetune' continues a classifier"):
        resolve_config("digits", recipe="finetune")


def test_recipe_finetune_from_a_batchnorm_source_keeps_persistent_chains(timm_resnet18, tmp_path):  # noqa: F811
    """A source with BatchNorm (timm's resnet18) gets recipes.FINETUNE_BATCHNORM: persistent chains with
    steps of 0.01, a tenth of the run's epochs and lr; the record says why."""
    data = rgb_npz(tmp_path / "rgb.npz", classes=4)
    scratch = resolve_config(data, init="timm:resnet18", out=str(tmp_path / "r"))
    config = resolve_config(data, init="timm:resnet18", recipe="finetune", out=str(tmp_path / "r"))
    assert config.init_from["batchnorm"] is True
    assert (config.short_run, config.sgld_lr, config.px_weight) == (False, 0.01, 0.01)
    assert (config.gaussian_starts, config.best_by) == (0.0, "val_acc")
    assert config.epochs == max(2, round(scratch.epochs / 10))
    assert config.lr == pytest.approx(scratch.lr / 10)
    assert "BatchNorm" in config.derived["settings"]["sgld_lr"]


def test_best_by_last_keeps_the_last_epoch_where_val_acc_keeps_the_first_best(classifier, tmp_path):
    """recipe finetune keeps its end (best_by="last"); the default keeps the first epoch of the best
    validation accuracy, read here from metrics.csv."""
    runs = {}
    for best_by in ("last", "val_acc"):
        out = tmp_path / best_by
        settings = {**TINY, "epochs": 3, "init": classifier, "best_by": best_by, "out": str(out)}
        runs[best_by] = train(resolve_config("digits[0-2]", **settings)).records[0]
    rows = list(csv.DictReader(open(runs["val_acc"]["metrics"])))
    accuracies = [float(r["val_acc"]) for r in rows if not r["event"]]
    assert runs["val_acc"]["best_epoch"] == 1 + accuracies.index(max(accuracies))
    assert runs["last"]["best_epoch"] == 3
    best, last = (read_checkpoint(tmp_path / "last" / name) for name in ("best.pt", "last.pt"))
    assert all(torch.equal(best["state_dict"][k], last["state_dict"][k]) for k in last["state_dict"])
    with pytest.raises(jemeval.errors.UsageError,
                       match=r"unknown best_by 'lst' \(did you mean 'last'\?\); choose val_acc or last"):
        resolve_config("digits", best_by="lst")
