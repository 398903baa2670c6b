"""Built-in datasets, all in the [-1, 1] input space.

* ``digits``: scikit-learn's bundled 8 x 8 handwritten digits (1,797 images, 10 classes), the
  embedded default that needs no download. Fixed split: ``train_test_split(test_size=0.25,
  stratify=y, random_state=0)`` gives 1,347 train and 450 test images. Pixels 0..16 -> [-1, 1].
* ``cifar10``, ``cifar100``, ``svhn``, ``celeba``: torchvision, with ``--download`` to fetch them.
  CelebA is centre-cropped (140 x 140) and resized to 32 x 32 (the JEM release skipped the crop and
  kept faces non-square; jemeval records the crop in the dataset info).
* ``uniform`` (U(-1, 1)), ``constant`` (every pixel -1 by default), ``gaussian`` (N(0, 1) clipped),
  ``interp:BASE`` (averages of pairs of BASE's images, as in the paper): synthetic OOD sets that
  take the model's input shape.
* ``npz:FILE`` and ``folder:DIR``, the user's own files, with or without separate splits
  (:mod:`jemeval.builtins.file_datasets`; docs/data.md).

Every set here declares the splits its source has (``splits``, :mod:`jemeval.data`): digits,
CIFAR, SVHN and MNIST have train and test, CelebA train, valid and test; ``interp:BASE`` has its
base's.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from jemeval.builtins.file_datasets import _tv_transform, folder, npz
from jemeval.data import ArrayDataset, check_arrays, load_dataset
from jemeval.derived_images import constant_images, interpolated_images
from jemeval.errors import DatasetNotFoundError, UsageError
from jemeval.hookspecs import hookimpl
from jemeval.stored_images import generated_images

SPLITS = ("train", "test")
DIGITS_SPLIT = {"test_size": 0.25, "random_state": 0, "stratify": True}


def _check_split(name: str, split: str, allowed=SPLITS) -> None:
    if split not in allowed:
        raise UsageError(f"dataset {name!r} has no split {split!r}; choose one of {', '.join(allowed)}")


@functools.lru_cache(maxsize=1)
def _digits_arrays():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = bunch.images.astype(np.float32) / 16.0 * 2.0 - 1.0
    y = bunch.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=DIGITS_SPLIT["test_size"], random_state=DIGITS_SPLIT["random_state"], stratify=y
    )
    return {"train": (x_tr, y_tr), "test": (x_te, y_te)}


def digits(split, root, download):
    """scikit-learn's 8x8 digits (bundled; fixed stratified 75/25 split, random_state 0)."""
    _check_split("digits", split)
    x, y = _digits_arrays()[split]
    ds = ArrayDataset(torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y), num_classes=10, name="digits",
                      info={"source": "sklearn.datasets.load_digits", "split": DIGITS_SPLIT, "augment": None})
    ds.splits = SPLITS
    return ds


# -- torchvision ---------------------------------------------------------------------------------
def _torchvision(name: str, build, root: Path, download: bool, *, num_classes, input_shape, info, splits=SPLITS):
    try:
        ds = build(root, download)
    except RuntimeError as exc:
        if "not found" in str(exc).lower() or "download" in str(exc).lower():
            raise DatasetNotFoundError(
                f"dataset {name!r} not found under {str(root)!r}: run again with download=True to fetch it "
                f"(needs internet), or point data_root at a folder that holds it"
            ) from None
        raise
    except OSError as exc:
        raise DatasetNotFoundError(f"dataset {name!r} could not be read under {str(root)!r}: {exc}") from None
    ds.num_classes = num_classes
    ds.input_shape = input_shape
    ds.info = info
    ds.name = name
    ds.splits = tuple(splits)
    return ds


def cifar10(split, root, download):
    """CIFAR-10 (torchvision); 32x32x3, 10 classes."""
    _check_split("cifar10", split)
    from torchvision import datasets

    def build(r, d):
        return datasets.CIFAR10(str(r), train=split == "train", download=d, transform=_tv_transform())

    return _torchvision("cifar10", build, root, download, num_classes=10, input_shape=(3, 32, 32),
                        info={"source": "torchvision.datasets.CIFAR10", "augment": {"pad": 4, "flip": True}})


def cifar100(split, root, download):
    """CIFAR-100 (torchvision); 32x32x3, 100 classes."""
    _check_split("cifar100", split)
    from torchvision import datasets

    def build(r, d):
        return datasets.CIFAR100(str(r), train=split == "train", download=d, transform=_tv_transform())

    return _torchvision("cifar100", build, root, download, num_classes=100, input_shape=(3, 32, 32),
                        info={"source": "torchvision.datasets.CIFAR100", "augment": {"pad": 4, "flip": True}})


def svhn(split, root, download):
    """SVHN (torchvision, train/test split); 32x32x3, 10 classes."""
    _check_split("svhn", split)
    from torchvision import datasets

    def build(r, d):
        return datasets.SVHN(str(r), split=split, download=d, transform=_tv_transform())

    return _torchvision("svhn", build, root, download, num_classes=10, input_shape=(3, 32, 32),
                        info={"source": "torchvision.datasets.SVHN", "augment": {"pad": 4, "flip": False}})


def celeba(split, root, download, *, crop: int = 140):
    """CelebA faces, centre-cropped (140) and resized to 32x32; unlabelled (y = -1)."""
    _check_split("celeba", split, ("train", "valid", "test"))
    from torchvision import datasets, transforms

    extra = (transforms.CenterCrop(int(crop)), transforms.Resize(32))

    def build(r, d):
        return datasets.CelebA(str(r), split=split, target_type=[], download=d, transform=_tv_transform(extra),
                               target_transform=lambda _: -1)

    return _torchvision("celeba", build, root, download, num_classes=None, input_shape=(3, 32, 32),
                        info={"source": "torchvision.datasets.CelebA", "center_crop": int(crop), "resize": 32},
                        splits=("train", "valid", "test"))


# -- synthetic OOD sets ------------------------------------------------------------------------
def _shape(input_shape, name):
    if input_shape is None:
        raise UsageError(f"dataset {name!r} needs the input shape (it takes the model's; pass input_shape=(C, H, W) "
                         "from Python)")
    return tuple(int(s) for s in input_shape)


def uniform(split, root, download, *, input_shape=None, n: int = 1000, seed: int = 0):
    """U(-1, 1) noise images (unlabelled), drawn block by block as they are read."""
    shape = _shape(input_shape, "uniform")
    return generated_images(int(n), shape, int(seed) + (split == "train"),
                            lambda rows, g: torch.rand((rows, *shape), generator=g) * 2 - 1,
                            name="uniform", info={"n": int(n), "seed": int(seed)})


def constant(split, root, download, *, input_shape=None, n: int = 1000, value: float = -1.0):
    """Constant images, every pixel ``value`` (default -1, as in the VERA code)."""
    shape = _shape(input_shape, "constant")
    check_arrays(torch.full((1, *shape), float(value)), None, "constant")  # a value outside [-1, 1] is refused
    return constant_images(int(n), shape, float(value), name="constant", info={"n": int(n), "value": float(value)})


def gaussian(split, root, download, *, input_shape=None, n: int = 1000, seed: int = 0, std: float = 1.0):
    """N(0, std^2) noise images clipped to [-1, 1], drawn block by block as they are read."""
    shape = _shape(input_shape, "gaussian")
    return generated_images(int(n), shape, int(seed) + (split == "train"),
                            lambda rows, g: (torch.randn((rows, *shape), generator=g) * float(std)).clamp(-1, 1),
                            name="gaussian", info={"n": int(n), "seed": int(seed), "std": float(std)})


def interp(split, root, download, *, variant: str | None = None, base: str | None = None, seed: int = 0):
    """Averages of pairs of another dataset's images (``interp:digits``), the paper's Interp set."""
    base = variant or base
    if not base:
        raise UsageError("name the dataset to interpolate, e.g. interp:digits")
    source = load_dataset(base, split, root, download)
    return interpolated_images(source, int(seed), name="interp", info={"base": base, "seed": int(seed)})


@hookimpl
def register_datasets(register):
    register("digits", digits)
    register("cifar10", cifar10)
    register("cifar100", cifar100)
    register("svhn", svhn)
    register("celeba", celeba)
    register("uniform", uniform)
    register("constant", constant)
    register("gaussian", gaussian)
    register("interp", interp)
    register("npz", npz)
    register("folder", folder)
