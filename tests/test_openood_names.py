"""OpenOOD v1.5's CIFAR benchmark sets by name (issue 27 item 5), offline on tiny stand-ins.

The stand-ins are the exact on-disk layouts torchvision's loaders read (DTD: ``dtd/dtd/images`` and
``labels/{train,val,test}1.txt``; Places365 small: ``categories_places365.txt``,
``places365_val.txt``, ``val_256/``; MNIST: ``MNIST/raw`` idx files), written in tmp_path and
read through the torchvision classes with download off. Places365 checks the md5 of its two text
files, so the tests that read a stand-in set the class's expected md5s to the stand-in's.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_bad_inputs import assert_one_line_refusal, runner, snapshot
from torchvision.datasets import Places365

import jemeval
from jemeval.builtins.ood_datasets import DTD_SPLITS
from jemeval.cli import cli
from jemeval.errors import DatasetNotFoundError, JemevalError
from jemeval.evaluation.ood.sets import GROUPS, expand_groups
from jemeval.formats.native import save_checkpoint

OPENOOD_CIFAR = {"near": ["cifar100", "tin"], "far": ["mnist", "svhn", "textures", "places365"]}


def _png(path: Path, rng, size=(40, 52)) -> np.ndarray:
    """A random RGB image written losslessly (whatever the suffix says), and its pixels."""
    pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format="PNG")
    return pixels


def build_dtd(root: Path, rng, size=(40, 52)) -> dict[str, list[np.ndarray]]:
    """torchvision's DTD layout: root/dtd/dtd/images/CLASS/FILE and labels/{split}{partition}.txt."""
    base, pixels = root / "dtd" / "dtd", {s: [] for s in DTD_SPLITS}
    (base / "labels").mkdir(parents=True)
    for s, n in zip(DTD_SPLITS, (3, 2, 2)):
        lines = []
        for i in range(n):
            cls = ("banded", "woven")[i % 2]
            pixels[s].append(_png(base / "images" / cls / f"{cls}_{s}_{i:04d}.jpg", rng, size))
            lines.append(f"{cls}/{cls}_{s}_{i:04d}.jpg")
        (base / "labels" / f"{s}1.txt").write_text("\n".join(lines) + "\n")
        (base / "labels" / f"{s}2.txt").write_text("")  # other partitions exist in DTD; not read
    return pixels


def build_places365(root: Path, rng, n=3, size=(48, 48)) -> list[np.ndarray]:
    """torchvision's Places365 layout for split='val', small=True."""
    (root / "categories_places365.txt").write_text("/a/airfield 0\n/b/beach 1\n")
    names = [f"Places365_val_{i + 1:08d}.jpg" for i in range(n)]
    (root / "places365_val.txt").write_text("".join(f"{name} {i % 2}\n" for i, name in enumerate(names)))
    return [_png(root / "val_256" / name, rng, size) for name in names]


@pytest.fixture
def stand_in_md5s(monkeypatch, tmp_path):
    """Places365's expected md5s set to those of the stand-in files under tmp_path/root."""
    def use(root: Path):
        def md5(file):
            return file, hashlib.md5((root / file).read_bytes()).hexdigest()
        monkeypatch.setattr(Places365, "_CATEGORIES_META", md5("categories_places365.txt"))
        monkeypatch.setattr(Places365, "_FILE_LIST_META", {**Places365._FILE_LIST_META,
                                                           "val": md5("places365_val.txt")})
    return use


def _model_space(pixels: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(pixels).permute(2, 0, 1).float() / 255 * 2 - 1


# -- names and groups -----------------------------------------------------------------------------
def test_every_openood_cifar_name_is_a_dataset_and_the_groups_are_openoods():
    names = set(jemeval.names("dataset"))
    for id_name, other in (("cifar10", "cifar100"), ("cifar100", "cifar10")):
        assert GROUPS[id_name]["near"] == [other, "tin"] and GROUPS[id_name]["far"] == OPENOOD_CIFAR["far"]
        for s, _ in expand_groups(["near", "far"], id_name):
            assert s in names
    assert [s for s, g in expand_groups(["far"], "cifar100")] == OPENOOD_CIFAR["far"]


# -- textures = torchvision's DTD --------------------------------------------------------------------
def test_textures_reads_every_dtd_split_at_the_models_shape(tmp_path):
    pixels = build_dtd(tmp_path, np.random.default_rng(0), size=(32, 32))
    ds = jemeval.load_dataset("textures", root=tmp_path, input_shape=(3, 32, 32))
    flat = [p for s in DTD_SPLITS for p in pixels[s]]
    assert len(ds) == len(flat) == 7 and ds.splits == () and ds.num_classes is None
    assert ds.info["source"] == "torchvision.datasets.DTD" and ds.info["splits"] == ["train", "val", "test"]
    for i, ref in enumerate(flat):  # a 32 x 32 image at 3 x 32 x 32: exactly its pixels, in [-1, 1]
        x, y = ds[i]
        assert y == -1
        torch.testing.assert_close(x, _model_space(ref), atol=1e-6, rtol=0)
    small = jemeval.load_dataset("textures", root=tmp_path, input_shape=(1, 8, 8))
    xs = torch.stack([small[i][0] for i in range(len(small))])
    assert xs.shape == (7, 1, 8, 8) and float(xs.min()) >= -1 and float(xs.max()) <= 1 and xs.std() > 0.05


def test_a_users_textures_folder_wins_over_torchvisions_layout(tmp_path):
    build_dtd(tmp_path, np.random.default_rng(1))
    _png(tmp_path / "textures" / "mine" / "a.png", np.random.default_rng(2))
    ds = jemeval.load_dataset("textures", root=tmp_path, input_shape=(3, 16, 16))
    assert len(ds) == 1 and ds.info["path"] == str(tmp_path / "textures") and ds[0][0].shape == (3, 16, 16)


def test_missing_textures_names_the_folder_and_the_download_flag(tmp_path):
    (tmp_path / "textures").mkdir()
    before = snapshot(tmp_path)
    with pytest.raises(DatasetNotFoundError) as info:
        jemeval.load_dataset("textures", root=tmp_path)
    message = str(info.value)
    assert "\n" not in message and "download=True" in message and str(tmp_path / "textures") in message
    assert "has no image files" in message and "DTD" in message
    with pytest.raises(DatasetNotFoundError, match="cannot be downloaded") as info:
        jemeval.load_dataset("tin", root=tmp_path, download=True)  # no source: download changes nothing
    assert str(tmp_path / "tin") in str(info.value)
    assert snapshot(tmp_path) == before


def test_a_dtd_label_naming_a_missing_image_is_one_line(tmp_path):
    build_dtd(tmp_path, np.random.default_rng(3))
    (tmp_path / "dtd" / "dtd" / "images" / "banded" / "banded_val_0000.jpg").unlink()
    ds = jemeval.load_dataset("textures", root=tmp_path)
    with pytest.raises(JemevalError, match="banded_val_0000.jpg") as info:
        ds[3]
    assert "\n" not in str(info.value)


# -- places365 = torchvision's Places365 (small, val) ----------------------------------------------------
def test_places365_reads_torchvisions_small_val_split(tmp_path, stand_in_md5s):
    pixels = build_places365(tmp_path, np.random.default_rng(4), size=(32, 32))
    stand_in_md5s(tmp_path)
    ds = jemeval.load_dataset("places365", root=tmp_path, input_shape=(3, 32, 32))
    assert len(ds) == 3 and ds.splits == () and ds.info["source"] == "torchvision.datasets.Places365"
    assert ds.info["split"] == "val" and ds.info["small"] is True
    for i, ref in enumerate(pixels):
        x, y = ds[i]
        assert y == -1
        torch.testing.assert_close(x, _model_space(ref), atol=1e-6, rtol=0)
    assert jemeval.load_dataset("places365", root=tmp_path, input_shape=(1, 8, 8))[2][0].shape == (1, 8, 8)


def test_places365_without_its_images_names_the_folder_and_the_flag(tmp_path, stand_in_md5s):
    build_places365(tmp_path, np.random.default_rng(5))
    stand_in_md5s(tmp_path)
    for image in (tmp_path / "val_256").iterdir():
        image.unlink()
    (tmp_path / "val_256").rmdir()
    with pytest.raises(DatasetNotFoundError) as info:
        jemeval.load_dataset("places365", root=tmp_path)
    assert str(tmp_path / "val_256") in str(info.value) and "download=True" in str(info.value)


@pytest.mark.parametrize("download", [False, True])
def test_a_tampered_places365_file_list_is_refused_and_not_written_over(tmp_path, stand_in_md5s, download):
    build_places365(tmp_path, np.random.default_rng(6))
    stand_in_md5s(tmp_path)
    with open(tmp_path / "places365_val.txt", "a") as fh:
        fh.write("../../etc/passwd 0\n")  # a swapped list: not the one whose md5 torchvision knows
    before = snapshot(tmp_path)
    # with download, torchvision would fetch the devkit and extract it over the file: refused first (offline)
    with pytest.raises(DatasetNotFoundError, match="is not torchvision's Places365 file") as info:
        jemeval.load_dataset("places365", root=tmp_path, download=download)
    assert str(tmp_path / "places365_val.txt") in str(info.value) and "\n" not in str(info.value)
    assert snapshot(tmp_path) == before


def test_stand_ins_are_not_taken_for_torchvisions_files(tmp_path):
    build_places365(tmp_path, np.random.default_rng(7))  # the real md5s: these files are not Places365's
    with pytest.raises(DatasetNotFoundError, match="categories_places365.txt' is not torchvision's"):
        jemeval.load_dataset("places365", root=tmp_path)


# -- mnist, svhn, cifar10/100: torchvision, download where the source allows --------------------------
def _idx(path: Path, array: np.ndarray) -> None:
    """An MNIST idx file (big-endian header: 0, 0, type 0x08 = uint8, ndim; then the dims)."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_mnist_by_name_at_a_cifar_models_shape(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    images = np.random.default_rng(8).integers(0, 256, (5, 28, 28), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    _idx(raw / "t10k-images-idx3-ubyte", images)
    _idx(raw / "t10k-labels-idx1-ubyte", labels)
    _idx(raw / "train-images-idx3-ubyte", images[:2])  # torchvision wants all four files present
    _idx(raw / "train-labels-idx1-ubyte", labels[:2])
    ds = jemeval.load_dataset("mnist", root=tmp_path, input_shape=(3, 32, 32))
    x, y = ds[2]
    assert len(ds) == 5 and x.shape == (3, 32, 32) and int(y) == 4 and torch.equal(x[0], x[2])
    native = jemeval.load_dataset("mnist", root=tmp_path)[2][0]
    torch.testing.assert_close(native[0], torch.from_numpy(images[2]).float() / 255 * 2 - 1, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["mnist", "svhn", "cifar10", "cifar100"])
def test_missing_torchvision_sets_name_the_folder_and_the_flag(tmp_path, name):
    with pytest.raises(DatasetNotFoundError) as info:
        jemeval.load_dataset(name, root=tmp_path)
    assert "download=True" in str(info.value) and str(tmp_path) in str(info.value) and "\n" not in str(info.value)


# -- end to end: jemeval ood --ood textures --------------------------------------------------------------
@pytest.fixture
def tiny_run(tmp_path):
    """A 3 x 16 x 16 cnn checkpoint and an npz ID set of its shape (nothing trained: the point is the data)."""
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "m.pt", jemeval.create_model("cnn", 2, (3, 16, 16), width=4), dataset="digits")
    rng = np.random.default_rng(9)
    np.savez(tmp_path / "id.npz", x_train=rng.integers(0, 256, (8, 16, 16, 3), dtype=np.uint8),
             y_train=np.arange(8) % 2, x_test=rng.integers(0, 256, (6, 16, 16, 3), dtype=np.uint8),
             y_test=np.arange(6) % 2)
    return tmp_path


def test_cli_ood_textures_end_to_end(tiny_run):
    build_dtd(tiny_run / "data", np.random.default_rng(10))
    result = runner().invoke(cli, [
        "ood", "--model", str(tiny_run / "m.pt"), "--id", f"npz:{tiny_run / 'id.npz'}", "--ood", "textures",
        "--score", "maxprob", "--data-root", str(tiny_run / "data"), "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.stderr
    records = json.loads(result.stdout)["records"]
    assert [(r["ood"], r["n_id"], r["n_ood"]) for r in records] == [("textures", 6, 7)]
    assert 0 <= records[0]["auroc"] <= 1


def test_cli_ood_textures_absent_is_one_line(tiny_run):
    (tiny_run / "data").mkdir()
    before = snapshot(tiny_run)
    result = runner().invoke(cli, [
        "ood", "--model", str(tiny_run / "m.pt"), "--id", f"npz:{tiny_run / 'id.npz'}", "--ood", "textures",
        "--score", "maxprob", "--data-root", str(tiny_run / "data"), "--device", "cpu"])
    assert_one_line_refusal(result, "run again with --download to fetch it")
    assert str(tiny_run / "data" / "textures") in result.stderr
    assert snapshot(tiny_run) == before
