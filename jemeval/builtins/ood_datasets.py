"""OOD benchmark sets: transformed in-distribution images, MNIST, and the image sets that come as files.

* ``rotate:BASE`` (``k`` quarter turns, default 1) and ``flip:BASE`` (left-right mirror): BASE's
  images turned or mirrored, labels of the originals kept (so ``rotate:digits[0-4]`` works). On
  digits they are near-OOD sets: the strokes and pixel statistics of digits, mostly not their shapes.
* ``mnist``: torchvision's MNIST (``download`` fetches it), resized to the model's input shape when
  one is offered (3 x 32 x 32 for a CIFAR model, as OpenOOD v1.5 does), else 1 x 28 x 28.
* ``textures`` and ``places365``: the images under ``DATA_ROOT/textures`` (``DATA_ROOT/places365``)
  when that folder holds any (a user's own copy, e.g. OpenOOD v1.5's ``images_classic`` subset), else
  torchvision's layout under DATA_ROOT, fetched by ``download``: ``torchvision.datasets.DTD`` (all
  5,640 images: its train, val and test splits of partition 1, as OpenOOD v1.5's Textures) and
  ``torchvision.datasets.Places365`` (``split="val", small=True``: 36,500 images at 256 x 256;
  OpenOOD v1.5 uses a subset of them). Resized (shorter side) and centre-cropped to the model's
  input shape, unlabelled (y = -1), every split the same images (``splits = ()``).
* ``tin``: every image file under ``DATA_ROOT/tin`` (Tiny ImageNet, e.g. its ``val/images``), in
  any sub-folders, resized and unlabelled likewise; torchvision cannot download it (nor OpenOOD's list).
  A set that is not there is one line naming the folder (and ``download``, where it would help).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import ConcatDataset

from jemeval.builtins.datasets import _check_split, _torchvision
from jemeval.builtins.file_datasets import IMAGE_SUFFIXES, ImageFiles, _read_image, _resize_to, _tv_transform
from jemeval.builtins.image_files import Listing, list_images, skipped_note
from jemeval.data import load_dataset
from jemeval.derived_images import derived_images
from jemeval.errors import DatasetNotFoundError, UsageError
from jemeval.hookspecs import hookimpl
from jemeval.stored_images import StoredImages

#: the file-based sets: name -> what to put in DATA_ROOT/<name>
FILE_SETS = {
    "tin": "Tiny ImageNet images (e.g. its val/images; OpenOOD v1.5: images_classic/tin)",
    "textures": "the Describable Textures Dataset images (DTD's images/; OpenOOD v1.5: images_classic/texture)",
    "places365": "Places365 images (OpenOOD v1.5: images_classic/places365)",
}
#: the DTD splits that together make OpenOOD's Textures set (every image of DTD)
DTD_SPLITS = ("train", "val", "test")


def _transformed(name: str, split, root, download, variant, base, transform, info) -> StoredImages:
    """BASE's images through ``transform``, drawn batch by batch from BASE's rows (its splits kept)."""
    base = variant or base
    if not base:
        raise UsageError(f"name the dataset to transform, e.g. {name}:digits")
    ds = load_dataset(base, split, root, download)
    return derived_images(ds, transform, name=name, info={"base": base, **info},
                          num_classes=getattr(ds, "num_classes", None))


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


def _has_images(folder: Path) -> bool:
    return folder.is_dir() and any(p.suffix.lower() in IMAGE_SUFFIXES for p in folder.rglob("*"))


def _file_set(name: str, root, input_shape, tv_class: str | None = None) -> ImageFiles:
    """Every image file under DATA_ROOT/NAME (any sub-folders), unlabelled. ``tv_class``: the torchvision
    class that could fetch the set instead, named in the one-line refusal with ``download=True``."""
    folder = Path(root) / name
    listing = list_images(folder, recursive=True) if folder.is_dir() else Listing()  # regular files, links inside
    files = listing.files
    if not files:
        what = "has no image files" if folder.is_dir() else "does not exist"
        fetch = (f", nor is torchvision's {tv_class} under {str(root)!r}; run again with download=True to fetch it "
                 "(needs internet), or" if tv_class else " (it cannot be downloaded);")
        raise DatasetNotFoundError(f"dataset {name!r}: folder {str(folder)!r} {what}{fetch} put {FILE_SETS[name]} "
                                   "there (data_root sets the parent folder), or name any image folder as folder:PATH")
    shape = tuple(int(s) for s in input_shape) if input_shape is not None else (3, 32, 32)
    ds = ImageFiles(files, _tv_transform(_resize_to(shape)), name=name, input_shape=shape,
                    info={"path": str(folder), "files": len(files), "input_shape": list(shape)})
    ds.notes = [note] if (note := skipped_note(listing, f"dataset {name!r}: folder {str(folder)!r}")) else []
    return ds


def _unlabelled(_target) -> int:
    """An OOD set's own classes (DTD's textures, Places365's scenes) are not the model's: y = -1."""
    return -1


def _dtd(root: Path, download: bool, shape) -> ConcatDataset:
    """All of DTD (its train, val and test splits of partition 1: the 5,640 images OpenOOD v1.5 uses)."""
    from torchvision import datasets

    return ConcatDataset([datasets.DTD(str(root), split=s, partition=1, download=download, loader=_read_image,
                                       transform=_tv_transform(_resize_to(shape)), target_transform=_unlabelled)
                          for s in DTD_SPLITS])


def _places365_meta(root: Path) -> None:
    """Refuse, in one line, a category or file list that is there but not torchvision's (md5), with or
    without download: torchvision would refuse it without download, and extract its own over it with."""
    from torchvision.datasets import Places365
    from torchvision.datasets.utils import check_integrity

    for file, md5 in (Places365._CATEGORIES_META, Places365._FILE_LIST_META["val"]):
        path = root / file
        if (path.exists() or path.is_symlink()) and not check_integrity(str(path), md5):
            raise DatasetNotFoundError(f"dataset 'places365': {str(path)!r} is not torchvision's Places365 file (its "
                                       f"md5 is not {md5}); move it away (download=True then fetches torchvision's), "
                                       "or put the images in a folder and name it as folder:PATH")


def _places365(root: Path, download: bool, shape):
    """Places365's validation images at 256 x 256 (``small=True``; 36,500 images, OpenOOD v1.5 takes a subset)."""
    from torchvision import datasets

    _places365_meta(root)
    ds = datasets.Places365(str(root), split="val", small=True, download=download, loader=_read_image,
                            transform=_tv_transform(_resize_to(shape)), target_transform=_unlabelled)
    if not Path(ds.images_dir).is_dir():
        raise DatasetNotFoundError(f"dataset 'places365': {ds.images_dir!r} (the images) does not exist; run again "
                                   "with download=True to fetch them (needs internet)")
    return ds


#: name -> (torchvision class, builder, the file that shows torchvision's layout under data_root, what is read)
TORCHVISION_SETS = {
    "textures": ("DTD", _dtd, Path("dtd") / "dtd" / "labels" / "test1.txt",
                 {"splits": list(DTD_SPLITS), "partition": 1}),
    "places365": ("Places365", _places365, Path("places365_val.txt"), {"split": "val", "small": True}),
}


def _openood_set(name: str, root, download: bool, input_shape):
    """DATA_ROOT/NAME when it holds images (a user's folder, e.g. OpenOOD's subset), else torchvision's
    layout under DATA_ROOT (fetched with ``download``), else one line naming both and the flag."""
    root = Path(root)
    cls, build, marker, read = TORCHVISION_SETS[name]
    if _has_images(root / name) or not (download or (root / marker).exists()):
        return _file_set(name, root, input_shape, tv_class=cls)
    shape = tuple(int(s) for s in input_shape) if input_shape is not None else (3, 32, 32)
    return _torchvision(name, lambda r, d: build(r, d, shape), root, download, num_classes=None, input_shape=shape,
                        info={"source": f"torchvision.datasets.{cls}", "path": str(root), **read,
                              "input_shape": list(shape)}, splits=())


def tin(split, root, download, *, input_shape=None):
    """Tiny ImageNet images from DATA_ROOT/tin (OpenOOD v1.5's near-OOD set for CIFAR; no download)."""
    return _file_set("tin", root, input_shape)


def textures(split, root, download, *, input_shape=None):
    """Describable Textures (DTD, all 5,640 images): DATA_ROOT/textures, else torchvision's DTD (download)."""
    return _openood_set("textures", root, download, input_shape)


def places365(split, root, download, *, input_shape=None):
    """Places365 val (256 x 256): DATA_ROOT/places365, else torchvision's Places365 (download)."""
    return _openood_set("places365", root, download, input_shape)


@hookimpl
def register_datasets(register):
    register("rotate", rotate)
    register("flip", flip)
    register("mnist", mnist)
    register("tin", tin)
    register("textures", textures)
    register("places365", places365)
