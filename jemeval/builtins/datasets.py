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
* ``npz:FILE`` (arrays ``x``/``images`` and optional ``y``/``labels``) and ``folder:DIR`` (an
  ImageFolder: one sub-folder per class). Images must be uint8 or finite floats in [-1, 1] and
  labels whole numbers (-1 = unlabelled); anything else is refused in one line (the checks on
  values are :func:`jemeval.data.check_arrays`, shared by every in-memory dataset).
"""
from __future__ import annotations

import functools
import zipfile
from pathlib import Path

import numpy as np
import torch

from jemeval.data import ArrayDataset, load_dataset, to_arrays
from jemeval.errors import DatasetNotFoundError, UsageError
from jemeval.hookspecs import hookimpl

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
    return ArrayDataset(torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y), num_classes=10, name="digits",
                        info={"source": "sklearn.datasets.load_digits", "split": DIGITS_SPLIT, "augment": None})


# -- torchvision ---------------------------------------------------------------------------------
def _to_unit_range():
    from torchvision import transforms

    return transforms.Lambda(lambda t: t * 2.0 - 1.0)


def _torchvision(name: str, build, root: Path, download: bool, *, num_classes, input_shape, info):
    try:
        ds = build(root, download)
    except RuntimeError as exc:
        if "not found" in str(exc).lower() or "download" in str(exc).lower():
            raise DatasetNotFoundError(
                f"dataset {name!r} not found under {str(root)!r}: run again with --download to fetch it "
                f"(needs internet), or point --data-root at a folder that holds it"
            ) from None
        raise
    except OSError as exc:
        raise DatasetNotFoundError(f"dataset {name!r} could not be read under {str(root)!r}: {exc}") from None
    ds.num_classes = num_classes
    ds.input_shape = input_shape
    ds.info = info
    ds.name = name
    return ds


def _tv_transform(extra=()):
    from torchvision import transforms

    return transforms.Compose([*extra, transforms.ToTensor(), _to_unit_range()])


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
                        info={"source": "torchvision.datasets.CelebA", "center_crop": int(crop), "resize": 32})


# -- synthetic OOD sets ------------------------------------------------------------------------
def _shape(input_shape, name):
    if input_shape is None:
        raise UsageError(f"dataset {name!r} needs the input shape (it takes the model's; pass input_shape=(C, H, W) "
                         "from Python)")
    return tuple(int(s) for s in input_shape)


def uniform(split, root, download, *, input_shape=None, n: int = 1000, seed: int = 0):
    """U(-1, 1) noise images (unlabelled)."""
    g = torch.Generator().manual_seed(int(seed) + (split == "train"))
    x = torch.rand((int(n), *_shape(input_shape, "uniform")), generator=g) * 2 - 1
    return ArrayDataset(x, name="uniform", info={"n": int(n), "seed": int(seed)})


def constant(split, root, download, *, input_shape=None, n: int = 1000, value: float = -1.0):
    """Constant images, every pixel ``value`` (default -1, as in the VERA code)."""
    x = torch.full((int(n), *_shape(input_shape, "constant")), float(value))
    return ArrayDataset(x, name="constant", info={"n": int(n), "value": float(value)})


def gaussian(split, root, download, *, input_shape=None, n: int = 1000, seed: int = 0, std: float = 1.0):
    """N(0, std^2) noise images clipped to [-1, 1]."""
    g = torch.Generator().manual_seed(int(seed) + (split == "train"))
    x = (torch.randn((int(n), *_shape(input_shape, "gaussian")), generator=g) * float(std)).clamp(-1, 1)
    return ArrayDataset(x, name="gaussian", info={"n": int(n), "seed": int(seed), "std": float(std)})


def interp(split, root, download, *, variant: str | None = None, base: str | None = None, seed: int = 0):
    """Averages of pairs of another dataset's images (``interp:digits``), the paper's Interp set."""
    base = variant or base
    if not base:
        raise UsageError("name the dataset to interpolate, e.g. interp:digits")
    x, _ = to_arrays(load_dataset(base, split, root, download))
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(len(x), generator=g)
    same = perm == torch.arange(len(x))
    perm[same] = (perm[same] + 1) % len(x)  # never pair an image with itself
    return ArrayDataset((x + x[perm]) / 2, name="interp", info={"base": base, "seed": int(seed)})


# -- files -------------------------------------------------------------------------------------
def npz(split, root, download, *, variant: str | None = None, path: str | None = None):
    """Arrays from a .npz file: ``x`` (or ``images``: N,C,H,W or N,H,W,C; uint8 0..255 or floats in [-1, 1])
    and optional ``y`` (or ``labels``)."""
    path = variant or path
    if not path:
        raise UsageError("name the file, e.g. npz:/data/images.npz")
    p = Path(path).expanduser()
    if not p.exists():
        raise DatasetNotFoundError(f"npz file {str(p)!r} does not exist")
    x, y = _read_npz(p)
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        x = x.transpose(0, 3, 1, 2)
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0 * 2 - 1
    labels = None if y is None else torch.from_numpy(
        y.astype(np.float64 if np.issubdtype(y.dtype, np.floating) else np.int64))
    # ArrayDataset checks the values (finite, in [-1, 1], whole-number labels)
    ds = ArrayDataset(torch.from_numpy(x.astype(np.float32)), labels, name="npz", info={"path": str(p)})
    k = int(ds.y.max()) + 1 if y is not None and int(ds.y.max()) >= 0 else None
    ds.num_classes = k
    return ds


_NPZ_HOW = "save one with np.savez(FILE, x=images, y=labels)"


def _read_npz(p: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """The image and label arrays of a .npz, numeric and non-empty; one line for every way it is not
    (pickles and object arrays stay refused: ``allow_pickle=False``)."""
    try:
        f = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise UsageError(f"{str(p)!r} is not a readable .npz archive ({detail}); {_NPZ_HOW}") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise UsageError(f"{str(p)!r} is a single .npy array, not a .npz archive with 'x' and 'y'; {_NPZ_HOW}")
    with f:
        key_x = next((k for k in ("x", "images") if k in f.files), None)
        if key_x is None:
            raise UsageError(f"{str(p)!r} has no array 'x' or 'images' (it has {', '.join(f.files) or 'none'}); "
                             f"{_NPZ_HOW}")
        key_y = next((k for k in ("y", "labels") if k in f.files), None)
        arrays = {}
        for key in filter(None, (key_x, key_y)):
            try:
                arrays[key] = f[key]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
                what = "an object array (jemeval loads numeric arrays only)" if "allow_pickle" in str(exc) else \
                    f"unreadable ({(str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]})"
                raise UsageError(f"{str(p)!r}: array {key!r} is {what}; {_NPZ_HOW}") from None
    x, y = arrays[key_x], arrays.get(key_y) if key_y else None
    if x.ndim not in (3, 4) or not (np.issubdtype(x.dtype, np.floating) or x.dtype == np.uint8):
        raise UsageError(f"{str(p)!r}: {key_x!r} must be images N x C x H x W or N x H x W (uint8 0..255 or floats in "
                         f"[-1, 1]), got dtype {x.dtype} and shape {x.shape}")
    if len(x) == 0:
        raise UsageError(f"{str(p)!r} holds no images ({key_x!r} has shape {x.shape})")
    if y is not None and not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
        raise UsageError(f"{str(p)!r}: labels {key_y!r} must be integers, got dtype {y.dtype}")
    return x, y


def folder(split, root, download, *, variant: str | None = None, path: str | None = None, size: int | None = None):
    """An image folder (one sub-folder per class; torchvision ImageFolder), optionally resized to ``size``."""
    path = variant or path
    if not path:
        raise UsageError("name the folder, e.g. folder:/data/my_images")
    p = Path(path).expanduser()
    if not p.is_dir():
        raise DatasetNotFoundError(f"image folder {str(p)!r} does not exist")
    from torchvision import datasets, transforms

    extra = (transforms.Resize(int(size)), transforms.CenterCrop(int(size))) if size else ()
    try:
        ds = datasets.ImageFolder(str(p), transform=_tv_transform(extra), loader=_read_image)
    except FileNotFoundError as exc:  # torchvision's words for an empty folder or one without images
        if "class folder" in str(exc):
            raise UsageError(f"image folder {str(p)!r} has no class sub-folders: put each class's images in a folder "
                             f"of its own ({str(p / 'cat' / '1.png')!r}, {str(p / 'dog' / '2.png')!r})") from None
        raise UsageError(f"image folder {str(p)!r}: {str(exc).strip().splitlines()[0]}") from None
    ds.num_classes = len(ds.classes)
    ds.input_shape = tuple(ds[0][0].shape) if len(ds) else None
    ds.info = {"path": str(p), "size": size}
    ds.name = "folder"
    return ds


def _read_image(path: str):
    """torchvision's RGB loader, with one line naming the file that is not an image (a ``.png`` that
    holds text, a truncated download) instead of PIL's error from inside the batch loop."""
    from PIL import Image

    try:
        with open(path, "rb") as fh:
            return Image.open(fh).convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:  # UnidentifiedImageError is an OSError
        raise UsageError(f"{path!r} in the image folder is not a readable image ({type(exc).__name__}); "
                         "remove or replace it") from None


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
