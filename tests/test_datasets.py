import numpy as np
import pytest
import torch

import jemeval
from jemeval.data import ArrayDataset, iterate_batches, subsample
from jemeval.errors import DatasetNotFoundError, UnknownNameError, UsageError


def test_digits_fixed_split_in_input_space():
    from sklearn.datasets import load_digits

    train, test = jemeval.load_dataset("digits", "train"), jemeval.load_dataset("digits", "test")
    assert (len(train), len(test)) == (1347, 450)
    assert train.x.shape[1:] == (1, 8, 8) and train.x.min() == -1 and train.x.max() == 1
    # the same split every time, stratified: every class has 43-46 test images (class sizes 174-183)
    assert torch.equal(test.x, jemeval.load_dataset("digits", "test").x)
    assert set(np.bincount(test.y.numpy())) <= {43, 44, 45, 46}
    # the images are sklearn's, rescaled from 0..16
    raw = load_digits().images.reshape(len(load_digits().images), -1) / 16 * 2 - 1
    first = test.x[0].reshape(-1).numpy()
    assert np.isclose(raw, first, atol=1e-6).all(axis=1).any()


def test_class_subsets_and_interp():
    low = jemeval.load_dataset("digits[0-4]", "test")
    labels = {int(low[i][1]) for i in range(len(low))}
    assert labels == {0, 1, 2, 3, 4}
    base = jemeval.load_dataset("digits", "test")
    interp = jemeval.load_dataset("interp:digits", "test")
    assert len(interp) == len(base) and (interp.y == -1).all()
    # each interp image is the average of two different digits test images
    x = interp.x[0].reshape(-1)
    pair_sums = (base.x.reshape(len(base), -1)[:, None, :] + base.x.reshape(len(base), -1)[None, :, :]) / 2
    assert torch.isclose(pair_sums, x, atol=1e-6).all(-1).any()


@pytest.mark.parametrize("name", ["uniform", "constant", "gaussian"])
def test_synthetic_sets_take_the_model_shape(name):
    ds = jemeval.load_dataset(name, input_shape=(3, 5, 5), n=17)
    assert ds.x.shape == (17, 3, 5, 5) and ds.x.min() >= -1 and ds.x.max() <= 1 and (ds.y == -1).all()
    with pytest.raises(UsageError, match="needs the input shape"):
        jemeval.load_dataset(name)
    assert torch.all(jemeval.load_dataset("constant", input_shape=(1, 2, 2)).x == -1)


def test_npz_files(tmp_path):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, size=(6, 8, 8, 3), dtype=np.uint8)
    np.savez(tmp_path / "u8.npz", images=imgs, labels=np.arange(6) % 2)
    ds = jemeval.load_dataset(f"npz:{tmp_path / 'u8.npz'}")
    assert ds.x.shape == (6, 3, 8, 8) and ds.num_classes == 2
    assert torch.allclose(ds.x[1, :, 2, 3], torch.tensor(imgs[1, 2, 3] / 255 * 2 - 1, dtype=torch.float32))
    np.savez(tmp_path / "bad.npz", x=np.full((2, 1, 4, 4), 3.0, dtype=np.float32))
    with pytest.raises(UsageError, match=r"must lie in \[-1, 1\]"):
        jemeval.load_dataset(f"npz:{tmp_path / 'bad.npz'}")
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        jemeval.load_dataset(f"npz:{tmp_path / 'nope.npz'}")


def test_image_folder(tmp_path):
    from PIL import Image

    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.fromarray(np.full((12, 12, 3), 255 * i, dtype=np.uint8)).save(tmp_path / cls / f"{i}.png")
    ds = jemeval.load_dataset(f"folder:{tmp_path},size=8")
    assert len(ds) == 4 and ds.num_classes == 2
    x, y = ds[1]
    assert x.shape == (3, 8, 8) and torch.all(x == 1.0) and y == 0


@pytest.mark.any_device
def test_missing_torchvision_dataset_says_how_to_download(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="run again with download=True"):
        jemeval.load_dataset("cifar10", "test", root=tmp_path)
    from click.testing import CliRunner

    from jemeval.cli import cli

    result = CliRunner().invoke(cli, ["train", "cifar10", "--data-root", str(tmp_path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 1 and "run again with --download to fetch it" in result.output
    assert "point --data-root at a folder" in result.output and not (tmp_path / "r").exists()
    with pytest.raises(UsageError, match="has no split 'valid'"):
        jemeval.load_dataset("svhn", "valid", root=tmp_path)
    with pytest.raises(UnknownNameError, match="did you mean 'cifar10'"):
        jemeval.load_dataset("cifar11")


def test_subsample_and_batches_are_seeded_and_ordered():
    ds = jemeval.load_dataset("digits", "test")
    a, b = subsample(ds, 100, seed=3), subsample(ds, 100, seed=3)
    assert torch.equal(a.x, b.x) and len(a) == 100
    xs = torch.cat([x for x, _ in iterate_batches(a, 32)])
    assert torch.equal(xs, a.x)


# -- issue 11: bad data is refused where it enters, in one line ---------------------------------
def _npz(tmp_path, **arrays):
    np.savez(tmp_path / "d.npz", **arrays)
    return f"npz:{tmp_path / 'd.npz'}"


def test_non_finite_images_and_fractional_labels_are_refused(tmp_path):
    """Issue 11 item 11: NaN images passed the min/max range test (accuracy 0.05, exit 0) and float
    labels were truncated (1.7 -> 1) without a word."""
    x = np.zeros((5, 1, 4, 4), np.float32)
    x[3, 0, 1, 1] = np.nan
    with pytest.raises(UsageError, match=r"1 of 5 images hold NaN or inf values \(the first is image 3\)"):
        jemeval.load_dataset(_npz(tmp_path, x=x))
    x[3, 0, 1, 1] = np.inf
    with pytest.raises(UsageError, match="NaN or inf"):
        jemeval.load_dataset(_npz(tmp_path, x=x))
    x[3, 0, 1, 1] = 0.5
    with pytest.raises(UsageError, match=r"labels must be whole numbers, but label 2 is 1\.7"):
        jemeval.load_dataset(_npz(tmp_path, x=x, y=np.array([0, 1, 1.7, 2, 0])))
    with pytest.raises(UsageError, match="labels must be class indices >= 0"):
        jemeval.load_dataset(_npz(tmp_path, x=x, y=np.array([0, 1, -3, 2, 0])))
    # whole-number float labels lose nothing and are accepted; -1 means unlabelled
    ds = jemeval.load_dataset(_npz(tmp_path, x=x, y=np.array([0.0, 1.0, 2.0, -1.0, 0.0])))
    assert ds.y.tolist() == [0, 1, 2, -1, 0] and ds.num_classes == 3
    # the same check guards every in-memory dataset, not just npz files
    with pytest.raises(UsageError, match="'mine': 1 of 2 images hold NaN"):
        ArrayDataset(torch.tensor([[0.0], [float("nan")]]), name="mine")
    with pytest.raises(UsageError, match="labels must be whole numbers"):
        ArrayDataset(torch.zeros(2, 1), torch.tensor([0.0, 0.5]))


def test_nan_npz_is_refused_by_eval_in_one_line(tmp_path, digits_classifier_ckpt):
    from click.testing import CliRunner

    from jemeval.cli import cli

    x = np.zeros((4, 1, 8, 8), np.float32)
    x[0] = np.nan
    spec = _npz(tmp_path, x=x, y=np.zeros(4, np.int64))
    r = CliRunner().invoke(cli, ["eval", "--model", str(digits_classifier_ckpt), "--data", spec, "--device", "cpu"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "NaN or inf" in r.output, r.output


def _bad_npz(tmp_path, kind):
    p = tmp_path / "bad.npz"
    if kind == "zero images":
        np.savez(p, x=np.zeros((0, 1, 4, 4), np.float32))
    elif kind == "npy":
        np.save(tmp_path / "bad.npy", np.zeros((2, 1, 4, 4), np.float32))
        return tmp_path / "bad.npy"
    elif kind == "corrupt zip":
        p.write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    elif kind == "0-d x":
        np.savez(p, x=np.array(0.5))
    elif kind == "string x":
        np.savez(p, x=np.array(["a", "b"]))
    elif kind == "length mismatch":
        np.savez(p, x=np.zeros((4, 1, 4, 4), np.float32), y=np.zeros(3, np.int64))
    elif kind == "object array":
        np.savez(p, x=np.array([np.zeros(2), np.zeros(3)], dtype=object))
    elif kind == "pickle":
        import pickle

        p.write_bytes(pickle.dumps({"x": 1}))
    elif kind == "no x":
        np.savez(p, pixels=np.zeros((2, 1, 4, 4), np.float32))
    elif kind == "string labels":
        np.savez(p, x=np.zeros((2, 1, 4, 4), np.float32), y=np.array(["cat", "dog"]))
    return p


@pytest.mark.parametrize("kind, message", [
    ("zero images", "holds no images ('x' has shape (0, 1, 4, 4))"),
    ("npy", "is a single .npy array, not a .npz archive"),
    ("corrupt zip", "is not a readable .npz archive"),
    ("0-d x", "got dtype float64 and shape ()"),
    ("string x", "got dtype <U1 and shape (2,)"),
    ("length mismatch", "4 images but labels of shape (3,)"),
    ("object array", "array 'x' is an object array (jemeval loads numeric arrays only)"),
    ("pickle", "is not a readable .npz archive"),
    ("no x", "has no array 'x' or 'images' (it has pixels)"),
    ("string labels", "labels 'y' must be integers, got dtype <U3"),
])
def test_bad_npz_files_are_one_clear_line(tmp_path, kind, message):
    """Issue 11 item 12: these ended in "unexpected X ... (a bug in jemeval)"."""
    path = _bad_npz(tmp_path, kind)
    with pytest.raises(UsageError) as exc:
        jemeval.load_dataset(f"npz:{path}")
    assert message in str(exc.value) and str(path) in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("layout, message", [
    ({}, "has no class sub-folders"),
    ({"loose.txt": "text"}, "holds no images and has no class sub-folders"),  # a flat folder of images loads (y=-1)
    ({"cat/notes.txt": "text"}, "Found no valid file for the classes cat"),
    ({"cat/broken.png": "text", "cat/ok.png": "png"}, "broken.png' in the image folder is not a readable image"),
])
def test_bad_image_folders_are_one_clear_line(tmp_path, layout, message):
    from PIL import Image

    root = tmp_path / "imgs"
    root.mkdir()
    for rel, content in layout.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if content == "png":
            Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(root / rel)
        else:
            (root / rel).write_text("not an image")
    with pytest.raises(UsageError) as exc:
        ds = jemeval.load_dataset(f"folder:{root}")
        [ds[i] for i in range(len(ds))]
    assert message in str(exc.value) and "\n" not in str(exc.value)
