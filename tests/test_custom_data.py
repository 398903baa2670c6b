"""Issue 25 items 1, 4 and 7's last point: the researcher's own data, attacked where it used to leak.

Every image written here is unique, and a spy on :meth:`EnergyModel._normalize` (the one door every
forward pass goes through: logits, features, gradients) records the SHA-256 of each image the
model is shown, as uint8 pixels. The references are the pixels of the files themselves (PIL /
numpy, not jemeval's loaders), so "which images did the command see, how often" is checked
independently of the code under test.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

import jemeval
from jemeval.data import absolute_spec, has_test_split, no_test_split_note
from jemeval.energy.model import EnergyModel
from jemeval.errors import UsageError
from jemeval.formats.native import read_checkpoint, save_checkpoint

CLASSES = ("ant", "bee", "cat")
SHAPE = (3, 8, 8)


def _digest(chw_uint8: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(chw_uint8, dtype=np.uint8).tobytes()).hexdigest()


def _images(n: int, rng: np.random.Generator, *, size: int = 8) -> list[np.ndarray]:
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]


def _write_pngs(folder: Path, images: list[np.ndarray]) -> list[str]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i, img in enumerate(images):
        Image.fromarray(img).save(folder / f"{i:03d}.png")
    return [_digest(img.transpose(2, 0, 1)) for img in images]


def split_folder(root: Path, counts: dict[str, int], seed: int = 0, classes=CLASSES) -> dict[str, list[str]]:
    """root/<split>/<class>/*.png; the digests of every split's images."""
    rng = np.random.default_rng(seed)
    return {split: [h for c in classes for h in _write_pngs(root / split / c, _images(n, rng))]
            for split, n in counts.items()}


def split_npz(path: Path, counts: dict[str, int], seed: int = 1) -> dict[str, list[str]]:
    """x_<split> (N x H x W x C uint8) and y_<split>; the digests of every split's images."""
    rng = np.random.default_rng(seed)
    arrays, digests = {}, {}
    for split, n in counts.items():
        x = rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
        arrays[f"x_{split}"], arrays[f"y_{split}"] = x, np.arange(n) % len(CLASSES)
        digests[split] = [_digest(img.transpose(2, 0, 1)) for img in x]
    np.savez(path, **arrays)
    return digests


@pytest.fixture
def seen(monkeypatch):
    """Digests of every image a model is shown, in order (a Counter gives how often)."""
    original = EnergyModel._normalize
    shown: list[str] = []

    def spy(self, x):
        u8 = ((x.detach().float().cpu() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
        shown.extend(_digest(img.numpy()) for img in u8)
        return original(self, x)

    monkeypatch.setattr(EnergyModel, "_normalize", spy)
    return shown


def _checkpoint(path: Path, dataset: str, *, num_classes: int = 3) -> Path:
    torch.manual_seed(0)
    return save_checkpoint(path, jemeval.create_model("cnn", num_classes, SHAPE, width=4), dataset=dataset)


def _cli(*args: str):
    from jemeval.cli import cli

    return runner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _json(result) -> dict:
    assert result.exit_code == 0, result.stderr if hasattr(result, "stderr") else result.output
    return json.loads(result.stdout)


# -- item 1: a folder with train/ and test/ is one dataset with two splits ----------------------
def test_split_folder_gives_its_splits_with_the_right_classes(tmp_path):
    """It loaded as 2 classes ['test', 'train'] (every image of both splits, labelled by split)."""
    digests = split_folder(tmp_path / "blobs", {"train": 4, "val": 2, "test": 3})
    for split, per_class in (("train", 4), ("val", 2), ("test", 3)):
        ds = jemeval.load_dataset(f"folder:{tmp_path / 'blobs'}", split)
        assert ds.classes == list(CLASSES) and ds.num_classes == 3 and ds.splits == ("train", "val", "test")
        assert len(ds) == 3 * per_class and sorted({int(ds[i][1]) for i in range(len(ds))}) == [0, 1, 2]
        got = [_digest(((ds[i][0] + 1) * 127.5).round().to(torch.uint8).numpy()) for i in range(len(ds))]
        assert sorted(got) == sorted(digests[split])
    assert has_test_split(ds) and no_test_split_note("folder:x", ds) is None


@pytest.mark.parametrize("layout, words", [
    ({"train/ant": 2, "train/bee": 2, "test/ant": 2},
     "every split must hold the same class folders, but test/ lacks bee"),
    ({"train/ant": 2, "test/ant": 2, "ant": 2}, "mixes split folders (train, test) with other folders (ant)"),
    ({"train/ant": 2, "train/bee": 2}, "has no test split (no test/ folder; it has train/)"),
])
def test_bad_split_folders_are_one_line_and_touch_nothing(tmp_path, monkeypatch, layout, words):
    rng = np.random.default_rng(0)
    for rel, n in layout.items():
        _write_pngs(tmp_path / "d" / rel, _images(n, rng))
    _checkpoint(tmp_path / "m.pt", "digits", num_classes=2)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    assert_one_line_refusal(_cli("eval", "--model", "m.pt", "--data", "folder:d", "--device", "cpu"), words)
    assert snapshot(tmp_path) == before


def test_eval_calibrate_and_knn_on_a_split_folder_see_only_test_images_as_evaluated(tmp_path, seen):
    """``ood`` evaluated every training image as in-distribution, and ``calibrate --temperature-scaling``
    fitted T on images of the set it evaluated."""
    digests = split_folder(tmp_path / "blobs", {"train": 12, "test": 4})
    flat = _write_pngs(tmp_path / "ood", _images(6, np.random.default_rng(7)))
    spec = f"folder:{tmp_path / 'blobs'}"
    model = _checkpoint(tmp_path / "m.pt", spec)
    test, train = Counter(digests["test"]), set(digests["train"])

    record = _json(_cli("eval", "--model", model, "--data", spec, "--device", "cpu", "--json"))["records"][0]
    assert record["n"] == 12 and Counter(seen) == test  # every test image once, nothing else
    seen.clear()

    out = _json(_cli("calibrate", "--model", model, "--data", spec, "--temperature-scaling", "--device", "cpu",
                     "--json"))
    fitted = [h for h in seen if h not in test]
    assert [r["n"] for r in out["records"]] == [12, 12]
    assert Counter(h for h in seen if h in test) == test  # evaluated once each, never fitted on
    assert len(fitted) == out["provenance"]["settings"]["validation"]["n"] == 7 and set(fitted) <= train
    seen.clear()

    out = _json(_cli("ood", "--model", model, "--id", spec, "--ood", f"folder:{tmp_path / 'ood'}", "--score",
                     "knn:k=3,maxprob", "--no-cache", "--device", "cpu", "--json"))
    assert {(r["n_id"], r["n_ood"]) for r in out["records"]} == {(12, 6)}
    assert Counter(h for h in seen if h in test) == test  # the ID images scored once, never fitted on
    assert Counter(h for h in seen if h in train) == Counter(train)  # knn fitted on the 36 train images
    assert Counter(h for h in seen if h in set(flat)) == Counter(flat)
    assert not any("no test split" in n for n in out.get("notes", []))


def test_tuning_and_fitting_on_a_folder_with_val_never_see_a_test_image(tmp_path, seen):
    """``--tune-on``: the in-distribution tuning images are the dataset's val split, the detector's
    fit images its train split; the test images are scored once, as the in-distribution set."""
    digests = split_folder(tmp_path / "blobs", {"train": 10, "val": 3, "test": 4})
    _write_pngs(tmp_path / "tune", _images(5, np.random.default_rng(8)))
    spec = f"folder:{tmp_path / 'blobs'}"
    model = _checkpoint(tmp_path / "m.pt", spec)
    out = _json(_cli("ood", "--model", model, "--id", spec, "--ood", "uniform", "--tune-on",
                     f"folder:{tmp_path / 'tune'}", "--score", "energy,knn:k=3", "--no-cache", "--device", "cpu",
                     "--json"))
    settings = out["provenance"]["settings"]
    assert settings["tuning"]["n_id"] == 9 and settings["fit_data"]["n"] == 30 and out["records"][0]["n_id"] == 12
    counts = Counter(seen)
    assert all(counts[h] == 1 for h in digests["test"])  # scored once as ID: never tuned or fitted on
    assert all(counts[h] >= 1 for h in digests["val"]) and all(counts[h] == 1 for h in digests["train"])


def test_npz_with_train_and_test_arrays_is_split_the_same_way(tmp_path, seen):
    digests = split_npz(tmp_path / "d.npz", {"train": 30, "test": 9})
    spec = f"npz:{tmp_path / 'd.npz'}"
    ds = jemeval.load_dataset(spec, "test")
    assert len(ds) == 9 and ds.splits == ("train", "test") and ds.num_classes == 3
    model = _checkpoint(tmp_path / "m.pt", spec)
    out = _json(_cli("ood", "--model", model, "--id", spec, "--ood", "uniform", "--score", "knn:k=3", "--no-cache",
                     "--device", "cpu", "--json"))
    test, train = Counter(digests["test"]), Counter(digests["train"])
    assert out["records"][0]["n_id"] == 9 and out["provenance"]["settings"]["fit_data"]["n"] == 30
    assert Counter(h for h in seen if h in test) == test and Counter(h for h in seen if h in train) == train
    with pytest.raises(UsageError, match=r"has no val split \(it holds x_train, x_test\)"):
        jemeval.load_dataset(spec, "val")


@pytest.mark.parametrize("arrays, words", [
    ({"x": 4, "x_train": 4}, "holds both 'x' (one split) and x_train (separate splits)"),
    ({"x_train": 4}, "has no test split (it holds x_train)"),
])
def test_bad_split_npz_files_are_one_line(tmp_path, monkeypatch, arrays, words):
    np.savez(tmp_path / "d.npz", **{k: np.zeros((n, 8, 8, 3), np.uint8) for k, n in arrays.items()})
    _checkpoint(tmp_path / "m.pt", "digits")
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    assert_one_line_refusal(_cli("eval", "--model", "m.pt", "--data", "npz:d.npz", "--device", "cpu"), words)
    assert snapshot(tmp_path) == before


# -- item 3/4: a set without a test split says so, and fits apart from what it evaluates ----------
NOTE = "has no test split: these are all its images; if the model was trained on them, these are training numbers"


def test_single_split_npz_is_noted_and_fitting_never_sees_an_evaluated_image(tmp_path, seen):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (40, 8, 8, 3), dtype=np.uint8)
    np.savez(tmp_path / "one.npz", x=x, y=np.arange(40) % 3)
    spec = f"npz:{tmp_path / 'one.npz'}"
    every = Counter(_digest(img.transpose(2, 0, 1)) for img in x)
    model = _checkpoint(tmp_path / "m.pt", spec)

    out = _json(_cli("eval", "--model", model, "--data", spec, "--device", "cpu", "--json"))
    assert out["records"][0]["n"] == 40 and any(NOTE in n for n in out["notes"])
    seen.clear()
    out = _json(_cli("calibrate", "--model", model, "--data", spec, "--temperature-scaling", "--device", "cpu",
                     "--json"))
    validation = out["provenance"]["settings"]["validation"]
    assert [r["n"] for r in out["records"]] == [32, 32] and validation["n"] == 8
    assert Counter(seen) == every  # fit (8) and evaluated (32) images: disjoint, all of the file once
    assert any(NOTE in n for n in out["notes"]) and any("T was fitted on a seeded 8" in n for n in out["notes"])
    seen.clear()
    out = _json(_cli("ood", "--model", model, "--id", spec, "--ood", "uniform", "--score", "knn:k=3", "--no-cache",
                     "--device", "cpu", "--json"))
    assert out["records"][0]["n_id"] == 20 and out["provenance"]["settings"]["fit_data"]["n"] == 20
    assert Counter(h for h in seen if h in every) == every  # each image once: fitted on or evaluated
    assert any(NOTE in n for n in out["notes"])
    out = _json(_cli("robust", "--model", model, "--data", spec, "--norm", "l2", "--epsilons", "0,1", "--n", "4",
                     "--steps", "1", "--device", "cpu", "--json"))
    assert any(NOTE in n for n in out["notes"])


def test_single_split_folder_is_noted_by_train_eval_and_ood(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    for c in CLASSES:
        _write_pngs(tmp_path / "one" / c, _images(10, rng))
    monkeypatch.chdir(tmp_path)
    summary = _json(_cli("train", "folder:one", "--epochs", "1", "--px-weight", "0", "--batch-size", "8",
                         "--out", "run", "--device", "cpu", "--no-progress", "--json"))
    assert summary["test_acc"] is not None and NOTE in summary["test_note"]
    for args in (("eval", "--data", "folder:one"), ("ood", "--id", "folder:one", "--ood", "uniform")):
        result = _cli(*args, "--model", "run/best.pt", "--device", "cpu")
        assert result.exit_code == 0 and f"folder:one {NOTE}" in " ".join(result.stdout.split())


def test_a_split_folder_trains_on_train_validates_on_val_and_tests_on_test(tmp_path, monkeypatch):
    split_folder(tmp_path / "blobs", {"train": 8, "val": 3, "test": 2})
    monkeypatch.chdir(tmp_path)
    summary = _json(_cli("train", "folder:blobs", "--epochs", "1", "--px-weight", "0", "--batch-size", "8",
                         "--out", "run", "--device", "cpu", "--no-progress", "--json"))
    assert summary["test_note"] is None and summary["test_acc"] is not None
    data = read_checkpoint(tmp_path / "run" / "best.pt")["config"]["resolved"]["data"]
    assert (data["n_train"], data["n_val"], data["val_split"]) == (24, 9, "val")


# -- item 4 (issue 25 item 4): an unlabelled flat folder is an OOD set ------------------------------
def test_a_flat_folder_is_an_unlabelled_set_at_the_models_shape(tmp_path):
    rng = np.random.default_rng(2)
    _write_pngs(tmp_path / "flat", _images(3, rng, size=12))
    ds = jemeval.load_dataset(f"folder:{tmp_path / 'flat'}")
    assert len(ds) == 3 and all(ds[i][1] == -1 for i in range(3)) and ds.num_classes is None and ds.splits == ()
    assert tuple(ds[0][0].shape) == (3, 12, 12)
    sized = jemeval.load_dataset(f"folder:{tmp_path / 'flat'}", input_shape=(1, 8, 8))
    assert tuple(sized[0][0].shape) == (1, 8, 8) and float(sized[0][0].min()) >= -1
    # colour images stay in colour at a 3-channel shape (Grayscale(3) made them, and tin/textures, grey)
    _write_pngs(tmp_path / "root" / "textures", _images(2, rng, size=12))
    for ds in (jemeval.load_dataset(f"folder:{tmp_path / 'flat'}", input_shape=SHAPE),
               jemeval.load_dataset("textures", root=tmp_path / "root", input_shape=SHAPE)):
        assert tuple(ds[0][0].shape) == SHAPE and not torch.equal(ds[0][0][0], ds[0][0][1])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no images")
    with pytest.raises(UsageError, match="holds no images and has no class sub-folders"):
        jemeval.load_dataset(f"folder:{tmp_path / 'empty'}")


# -- item 7: paths stored in checkpoints are absolute -------------------------------------------
def test_train_on_a_relative_folder_records_an_absolute_path_and_resumes(tmp_path, monkeypatch):
    split_folder(tmp_path / "data" / "blobs", {"train": 6, "test": 2})
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    args = ("train", "folder:../data/blobs", "--px-weight", "0", "--batch-size", "6", "--out", "run", "--device",
            "cpu", "--no-progress", "--json")
    summary = _json(_cli(*args, "--epochs", "1"))
    expected = f"folder:{tmp_path / 'data' / 'blobs'}"
    ckpt = read_checkpoint(tmp_path / "work" / "run" / "last.pt")
    assert summary["dataset"] == ckpt["config"]["dataset"] == expected
    assert read_checkpoint(tmp_path / "work" / "run" / "best.pt")["dataset"] == expected
    assert _json(_cli(*args, "--epochs", "2", "--resume"))["epochs"] == 2  # the same relative spec resumes


def test_absolute_spec_rewrites_paths_only():
    here = Path.cwd()
    assert absolute_spec("folder:../d,size=8[0-2]") == f"folder:{here.parent / 'd'},size=8[0-2]"
    assert absolute_spec("interp:npz:x.npz") == f"interp:npz:{here / 'x.npz'}"
    for spec in ("digits", "digits[0-4]", "rotate:digits", "uniform:seed=3", f"npz:{here / 'x.npz'}"):
        assert absolute_spec(spec) == spec


# -- item 3: `jemeval list datasets` says whole sentences, without reStructuredText ---------------
def test_list_datasets_is_whole_sentences_without_rst():
    text = _cli("list", "datasets")
    listing = _json(_cli("list", "datasets", "--json"))["dataset"]
    helps = {d["name"]: d["help"] for d in listing}
    assert helps["npz"].endswith("or x/y for one split.") and "``" not in text.stdout
    assert all("``" not in (h or "") and ":func:" not in (h or "") for h in helps.values())
