"""OOD benchmark sets: transformed in-distribution images, MNIST, and the image sets that come as files.

* ``rotate:BASE`` (``k`` quarter turns, default 1) and ``flip:BASE`` (left-right mirror): BASE's
  images turned or mirrored, labels of the originals kept (so ``rotate:digits[0-4]`` works). On
  digits they are near-OOD sets: the strokes and pixel statistics of digits, mostly not their shapes.
* ``mnist``: torchvision's MNIST (``download`` fetches it), resized to the model's input shape when
  one is offered (3 x 32 x 32 for a CIFAR model, as OpenOOD v1.5 does), else 1 x 28 x 28.
* ``tin``, ``textures``, ``places365``: every image file under ``DATA_ROOT/tin`` (Tiny ImageNet,
  e.g. its ``val/images``), ``DATA_ROOT/textures`` (DTD's ``images``) and ``DATA_ROOT/places365``, in
  any sub-folders, resized (shorter side) and centre-cropped to the model's input shape, unlabelled.
  They cannot be downloaded; a missing folder is one line naming it. OpenOOD v1.5 uses subsets of
  them (its ``benchmark_imglist``); put exactly those images in the folders to reproduce its tables.
"""
from __future__ import annotations

from pathlib import Path

import torch

from jemeval.builtins.datasets import _check_split, _torchvision
from jemeval.builtins.file_datasets import IMAGE_SUFFIXES, ImageFiles, _resize_to, _tv_transform
from jemeval.data import ArrayDataset, load_dataset, to_arrays
from jemeval.errors import DatasetNotFoundError, UsageError
from jemeval.hookspecs import hookimpl

#: the file-based sets: name -> what to put in DATA_ROOT/<name>
FILE_SETS = {
    "tin": "Tiny ImageNet images (e.g. its val/images; OpenOOD v1.5: images_classic/tin)",
    "textures": "the Describable Textures Dataset images (DTD's images/; OpenOOD v1.5: images_classic/texture)",
    "places365": "Places365 images (OpenOOD v1.5: images_classic/places365)",
}


def _transformed(name: str, split, root, download, variant, base, transform, info) -> ArrayDataset:
    base = variant or base
    if not base:
        raise UsageError(f"name the dataset to transform, e.g. {name}:digits")
    ds = load_dataset(base, split, root, download)
    x, y = to_arrays(ds)
    out = ArrayDataset(transform(x), y, num_classes=getattr(ds, "num_classes", None), name=name,
                       info={"base": base, **info}, validate=False)
    if hasattr(ds, "splits"):
        out.splits = ds.splits  # rotate:npz:FILE has no test split when FILE has none
    return out


def rotate(split, root, download, *, variant: str | None = None, base: str | None = None, k: int = 1):
    """BASE's images turned by k quarter turns (``rotate:digits``; k = 1: 90 degrees counter-clockwise)."""
    if int(k) != k or int(k) % 4 == 0:
        raise UsageError(f"rotate: k must be a whole number of quarter turns that is not a multiple of 4, got {k!r}")
    return _transformed("rotate", split, root, download, variant, base,
                        lambda x: torch.rot90(x, int(k), dims=(2, 3)).contiguous(), {"k": int(k)})


def flip(split, root, download, *, variant: str | None = None, base: str | None = None):
    """BASE's images mirrored left-right (``flip:digits``)."""
    return _transformed("flip", split, root, download, variant, base, lambda x: torch.flip(x, dims=(3,)), {})


def mnist(split, root, download, *, input_shape=None):
    """MNIST (torchvision); at the model's input shape when offered (OpenOOD: 3 x 32 x 32 for CIFAR)."""
    _check_split("mnist", split)
    from torchvision import datasets

    extra = _resize_to(input_shape) if input_shape is not None else ()
    shape = tuple(int(s) for s in input_shape) if input_shape is not None else (1, 28, 28)

    def build(r, d):
        return datasets.MNIST(str(r), train=split == "train", download=d, transform=_tv_transform(extra))

    return _torchvision("mnist", build, root, download, num_classes=10, input_shape=shape,
                        info={"source": "torchvision.datasets.MNIST", "input_shape": list(shape)})


def _file_set(name: str, root, input_shape) -> ImageFiles:
    folder = Path(root) / name
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES) if folder.is_dir() else []
    if not files:
        what = "has no image files" if folder.is_dir() else "does not exist"
        raise DatasetNotFoundError(f"dataset {name!r}: folder {str(folder)!r} {what}; put {FILE_SETS[name]} there "
                                   f"(data_root sets the parent folder), or name any image folder as folder:PATH")
    shape = tuple(int(s) for s in input_shape) if input_shape is not None else (3, 32, 32)
    return ImageFiles(files, _tv_transform(_resize_to(shape)), name=name, input_shape=shape,
                      info={"path": str(folder), "files": len(files), "input_shape": list(shape)})


def tin(split, root, download, *, input_shape=None):
    """Tiny ImageNet images from DATA_ROOT/tin (OpenOOD v1.5's near-OOD set for CIFAR)."""
    return _file_set("tin", root, input_shape)


def textures(split, root, download, *, input_shape=None):
    """Describable Textures (DTD) images from DATA_ROOT/textures (OpenOOD v1.5's far-OOD set)."""
    return _file_set("textures", root, input_shape)


def places365(split, root, download, *, input_shape=None):
    """Places365 images from DATA_ROOT/places365 (OpenOOD v1.5's far-OOD set)."""
    return _file_set("places365", root, input_shape)


@hookimpl
def register_datasets(register):
    register("rotate", rotate)
    register("flip", flip)
    register("mnist", mnist)
    register("tin", tin)
    register("textures", textures)
    register("places365", places365)
