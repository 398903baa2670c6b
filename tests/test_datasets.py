import numpy as np
import pytest
import torch

import jemeval
from jemeval.data import iterate_batches, subsample
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


def test_missing_torchvision_dataset_says_how_to_download(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="run again with --download"):
        jemeval.load_dataset("cifar10", "test", root=tmp_path)
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
