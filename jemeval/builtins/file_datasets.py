"""Datasets from the user's own files: ``npz:FILE`` and ``folder:DIR`` (docs/data.md is the reference).

Both hold either separate splits or one collection of images, and say which in ``splits``
(:mod:`jemeval.data`), so that no command evaluates or fits on training images when a test split
exists, and every command says so when none does:

* ``npz:FILE``: ``x_train``/``y_train`` and ``x_test``/``y_test`` (optional ``x_val``/``y_val``) are
  the splits; ``x``/``y`` (or the old ``images``/``labels``) one split. Images N x C x H x W or
  N x H x W x C (or N x H x W), uint8 0..255 (scaled to [-1, 1]) or floats in [-1, 1]; labels whole
  numbers (-1 = unlabelled), optional.
* ``folder:DIR``: ``DIR/train/`` and ``DIR/test/`` (optional ``DIR/val/``) holding the same class
  folders are the splits; a folder of class folders is one split; a flat folder of images (no
  sub-folders) is an unlabelled set (y = -1), resized to the model's input shape when one is offered
  (an OOD set). ``size=S`` resizes (shorter side) and centre-crops every image to S x S. Which
  entries are read (regular files; links to files inside their folder, once; never a FIFO or a link
  to a folder): :mod:`jemeval.builtins.image_files`. Images of another size than the first are
  refused in one line naming the file, labelled or not (:class:`ImageFiles`).

Both factories are marked ``takes_path``: :func:`jemeval.data.absolute_spec` makes their variant an
absolute path before a checkpoint records it. Anything malformed is refused in one line naming the
file and what would be right; values are checked by :func:`jemeval.data.check_arrays`.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from jemeval.builtins.image_files import IMAGE_SUFFIXES, Listing, list_images, skipped_note
from jemeval.data import RANGE_TOLERANCE, check_labels, check_largest_label
from jemeval.errors import DatasetNotFoundError, UsageError
from jemeval.stored_images import StoredImages, image_problems, mapped_member, member_header

#: the split names a folder or an npz may hold, in the order they are listed
SPLIT_NAMES = ("train", "val", "test")


def _to_unit_range():
    from torchvision import transforms

    return transforms.Lambda(lambda t: t * 2.0 - 1.0)


def _tv_transform(extra=()):
    from torchvision import transforms

    return transforms.Compose([*extra, transforms.ToTensor(), _to_unit_range()])


def _rgb(image):
    return image.convert("RGB")


def _resize_to(input_shape, preprocess: dict | None = None):
    """torchvision transforms taking an image to ``input_shape`` (C, H, W): channels (grey for 1
    channel; RGB for 3, where a grey image's channel is repeated and a colour image stays in colour:
    ``Grayscale(3)`` would make it grey), resize, centre crop. ``preprocess``: the model's own
    (:func:`preprocessing_record`; a hub model's ``metadata["preprocessing"]``), else the shorter
    side resized to the input's and bilinear, as jemeval's own models are fed."""
    from torchvision import transforms

    c, h, w = (int(s) for s in input_shape)
    if c not in (1, 3):
        raise UsageError(f"images can be made 1- or 3-channel, not {c}-channel (input shape {tuple(input_shape)})")
    channels = transforms.Grayscale(1) if c == 1 else transforms.Lambda(_rgb)
    record = preprocessing_record(input_shape, preprocess)
    resize = record["resize"] if isinstance(record["resize"], int) else tuple(record["resize"])
    mode = transforms.InterpolationMode(record["interpolation"])
    return (channels, transforms.Resize(resize, interpolation=mode), transforms.CenterCrop((h, w)))


def preprocessing_record(input_shape, preprocess: dict | None = None) -> dict:
    """How images are brought to ``input_shape``, as provenance records it: ``resize`` (the shorter
    side, or [H, W]), ``crop`` [H, W] (centre), ``interpolation`` and where they come from. The
    model's own ``preprocess`` is used when its crop is the input shape (else the default)."""
    h, w = (int(s) for s in tuple(input_shape)[1:])
    if preprocess and list(preprocess.get("crop") or ()) == [h, w]:
        return dict(preprocess)
    return {"resize": min(h, w), "crop": [h, w], "interpolation": "bilinear", "from": "the model's input shape"}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]


# -- npz -----------------------------------------------------------------------------------------
_NPZ_HOW = ("save one with np.savez(FILE, x_train=..., y_train=..., x_test=..., y_test=...) or, for one split, "
            "np.savez(FILE, x=images, y=labels)")


def npz(split, root, download, *, variant: str | None = None, path: str | None = None):
    """Arrays from a .npz file: x_train/y_train and x_test/y_test (optional x_val/y_val), or x/y for one split.

    The images stay in the file (memory-mapped when the member is stored uncompressed, as ``np.savez``
    writes it) and in their dtype: :class:`~jemeval.stored_images.StoredImages` makes the [-1, 1]
    floats one batch at a time, so memory does not grow with the number of images."""
    path = variant or path
    if not path:
        raise UsageError("name the file, e.g. npz:/data/images.npz")
    p = Path(path).expanduser()
    if not p.exists():
        raise DatasetNotFoundError(f"npz file {str(p)!r} does not exist")
    x, y, splits, k, storage, key = _read_npz(p, split)
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        x = x.transpose(0, 3, 1, 2)  # a view: the mapped file is not copied
    labels = None if y is None else torch.from_numpy(
        y.astype(np.float64 if np.issubdtype(y.dtype, np.floating) else np.int64))
    _check_stored(x, labels, str(p))
    ds = StoredImages(x, labels, name="npz", info={"path": str(p), "split": split if splits else None, "array": key},
                      storage=storage)
    ds.num_classes = k
    ds.num_classes_from = "labels"  # an npz declares no classes: k is inferred (jemeval.evaluation.classes)
    ds.splits = splits
    return ds


def _check_stored(x: np.ndarray, labels: torch.Tensor | None, source: str) -> None:
    """:func:`jemeval.data.check_arrays`'s rules (finite, in [-1, 1], whole-number labels) on stored
    images, scanned in chunks: no float copy of the whole set is made to check it."""
    bad, first, lo, hi = image_problems(x)
    if bad:
        raise UsageError(f"{source!r}: {bad} of {len(x)} images hold NaN or inf values (the first is image "
                         f"{first}); images must be finite, in [-1, 1]")
    if lo < -1 - RANGE_TOLERANCE or hi > 1 + RANGE_TOLERANCE:
        raise UsageError(f"{source!r}: float images must lie in [-1, 1] (found {lo:.3g}..{hi:.3g}); store uint8 "
                         "0..255 or rescale")
    check_labels(labels, len(x), source)


npz.takes_path = True


def _npz_layout(p: Path, files: list[str], split: str) -> tuple[str, str | None, tuple[str, ...], list[str]]:
    """(image key, label key or None, the file's splits, every label key) of ``split``."""
    splits = tuple(s for s in SPLIT_NAMES if f"x_{s}" in files)
    single = next((k for k in ("x", "images") if k in files), None)
    if splits and single:
        raise UsageError(f"{str(p)!r} holds both {single!r} (one split) and x_{splits[0]} (separate splits); keep "
                         f"one layout: {_NPZ_HOW}")
    if not splits and single is None:
        raise UsageError(f"{str(p)!r} has no array 'x' or 'images' (it has {', '.join(files) or 'none'}); {_NPZ_HOW}")
    if not splits:
        key_y = next((k for k in ("y", "labels") if k in files), None)
        return single, key_y, (), [key_y] if key_y else []
    if split not in splits:
        raise UsageError(f"{str(p)!r} has no {split} split (it holds {', '.join(f'x_{s}' for s in splits)}); add "
                         f"x_{split}/y_{split}, or ask for one of {', '.join(splits)}")
    label_keys = [f"y_{s}" for s in splits if f"y_{s}" in files]
    return f"x_{split}", (f"y_{split}" if f"y_{split}" in files else None), splits, label_keys


def _read_npz(p: Path, split: str) -> tuple[np.ndarray, np.ndarray | None, tuple[str, ...], int | None, str, str]:
    """(images, labels or None, the file's splits, number of classes, how the images are held, their array) of
    ``split``, numeric and non-empty; one line for every way it is not (pickles and object arrays stay refused:
    ``allow_pickle=False``). The number of classes counts the labels of every split, so a test split
    that lacks a class still has the training split's classes."""
    try:
        f = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise UsageError(f"{str(p)!r} is not a readable .npz archive ({_first_line(exc)}); {_NPZ_HOW}") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise UsageError(f"{str(p)!r} is a single .npy array, not a .npz archive with 'x' and 'y'; {_NPZ_HOW}")
    with f:
        key_x, key_y, splits, label_keys = _npz_layout(p, list(f.files), split)
        arrays = {key: _npz_array(f, p, key) for key in label_keys}
        x, storage = _npz_images(f, p, key_x)
    y = arrays.get(key_y) if key_y else None
    if x.ndim not in (3, 4) or not (np.issubdtype(x.dtype, np.floating) or x.dtype == np.uint8):
        raise UsageError(f"{str(p)!r}: {key_x!r} must be images N x C x H x W or N x H x W (uint8 0..255 or floats in "
                         f"[-1, 1]), got dtype {x.dtype} and shape {x.shape}")
    if len(x) == 0:
        raise UsageError(f"{str(p)!r} holds no images ({key_x!r} has shape {x.shape})")
    for key in label_keys:
        if not (np.issubdtype(arrays[key].dtype, np.integer) or np.issubdtype(arrays[key].dtype, np.floating)):
            raise UsageError(f"{str(p)!r}: labels {key!r} must be integers, got dtype {arrays[key].dtype}")
    tops = {k: int(np.nanmax(arrays[k])) for k in label_keys if arrays[k].size and np.isfinite(arrays[k]).all()}
    top = max(tops.values(), default=-1)
    if top >= 0:  # before anything is sized by it: the model's output layer has top + 1 classes
        key = max(tops, key=tops.get)
        check_largest_label(top, str(p), f" (in {key!r}, index {int(np.nanargmax(arrays[key]))})")
    return x, y, splits, (top + 1 if y is not None and top >= 0 else None), storage, key_x


def _npz_images(f, p: Path, key: str) -> tuple[np.ndarray, str]:
    """The images ``key``: memory-mapped when stored uncompressed, else read whole (in their stored
    dtype); and which of the two, for the dataset's ``storage``."""
    try:
        mapped = mapped_member(p, key)
    except UsageError as exc:  # a UsageError is a ValueError: caught first
        raise UsageError(f"{exc}; {_NPZ_HOW}") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise UsageError(f"{str(p)!r}: array {key!r} is unreadable ({_first_line(exc)}); {_NPZ_HOW}") from None
    if mapped is not None:
        return mapped, "memory-mapped"
    return _npz_array(f, p, key), ("read whole: the npz is compressed (np.savez_compressed); save it with np.savez "
                                   "to have it memory-mapped")


def _npz_array(f, p: Path, key: str) -> np.ndarray:
    try:
        member_header(p, key)  # a header whose shape does not fit the entry is refused before numpy reads it
        return f[key]
    except UsageError as exc:  # a UsageError is a ValueError: caught first
        raise UsageError(f"{exc}; {_NPZ_HOW}") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        what = "an object array (jemeval loads numeric arrays only)" if "allow_pickle" in str(exc) else \
            f"unreadable ({_first_line(exc)})"
        raise UsageError(f"{str(p)!r}: array {key!r} is {what}; {_NPZ_HOW}") from None


# -- image folders -------------------------------------------------------------------------------
def folder(split, root, download, *, variant: str | None = None, path: str | None = None, size=None,
           input_shape=None):
    """An image folder: train/ and test/ (optional val/) of class folders, class folders (one split), or flat images."""
    path = variant or path
    if not path:
        raise UsageError("name the folder, e.g. folder:/data/my_images")
    p = Path(path).expanduser()
    if not p.is_dir():
        raise DatasetNotFoundError(f"image folder {str(p)!r} does not exist")
    size = _checked_size(size, p)
    extra = (_sized(size),) if size else ()
    subfolders = sorted(d.name for d in p.iterdir() if d.is_dir() and not d.name.startswith("."))
    splits = tuple(s for s in SPLIT_NAMES if s in subfolders)
    if splits:
        _check_split_folders(p, splits, subfolders, split)
        ds, layout = _class_folders(p / split, extra), "splits"
    elif subfolders:
        ds, layout = _class_folders(p, extra), "classes"
    else:
        ds, layout = _flat_folder(p, size, input_shape), "flat"
    ds.splits = splits
    ds.info = {"path": str(p), "size": size, "layout": layout, "split": split if splits else None, **ds.info}
    ds.name = "folder"
    return ds


folder.takes_path = True


def _checked_size(size, p: Path) -> int | None:
    """``size=S``: a whole number of pixels >= 1 (None: not given)."""
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, (int, float)) or size != int(size) or size < 1:
        raise UsageError(f"folder:{p}: size must be a whole number of pixels >= 1 (size=32 resizes and centre-crops "
                         f"every image to 32 x 32), got size={size!r}")
    return int(size)


def _sized(size: int):
    from torchvision import transforms

    return transforms.Compose([transforms.Resize(int(size)), transforms.CenterCrop(int(size))])


def _check_split_folders(p: Path, splits: tuple[str, ...], subfolders: list[str], split: str) -> None:
    """A folder with split folders holds nothing else, every split the same classes, and ``split``."""
    others = [d for d in subfolders if d not in splits]
    if others:
        raise UsageError(f"image folder {str(p)!r} mixes split folders ({', '.join(splits)}) with other folders "
                         f"({', '.join(others[:3])}); put every class folder inside {' and '.join(splits)}/")
    classes = {s: {d.name for d in (p / s).iterdir() if d.is_dir()} for s in splits}
    every = set().union(*classes.values())
    lacking = [f"{s}/ lacks {', '.join(sorted(every - c)[:3])}" for s, c in classes.items() if every - c]
    if lacking:
        raise UsageError(f"image folder {str(p)!r}: every split must hold the same class folders, but "
                         f"{'; '.join(lacking)}")
    if split not in splits:
        have = ", ".join(s + "/" for s in splits)
        raise UsageError(f"image folder {str(p)!r} has no {split} split (no {split}/ folder; it has {have}): "
                         f"add {split}/ with the same class folders, or ask for one of {', '.join(splits)}")


def _class_folders(p: Path, extra) -> ImageFiles:
    """The images of ``p``'s class folders (torchvision's class order: sorted folder names), labelled by
    folder, read as :func:`~jemeval.builtins.image_files.list_images` lists them."""
    classes = sorted(d.name for d in p.iterdir() if d.is_dir()) if p.is_dir() else []
    if not classes:
        raise UsageError(f"image folder {str(p)!r} has no class sub-folders: put each class's images in a folder "
                         f"of its own ({str(p / 'cat' / '1.png')!r}, {str(p / 'dog' / '2.png')!r})")
    listing, labels = Listing(), []
    for label, name in enumerate(classes):
        found = list_images(p / name, recursive=True)
        listing.extend(found)
        labels += [label] * len(found.files)
    present = set(labels)
    empty = [name for label, name in enumerate(classes) if label not in present]
    if empty:
        raise UsageError(f"image folder {str(p)!r}: Found no valid file for the classes {', '.join(empty[:5])} (image "
                         f"files are {', '.join(IMAGE_SUFFIXES)}); put images in them or remove them")
    transform = _tv_transform(extra)
    shape = tuple(transform(_read_image(str(listing.files[0]))).shape)
    ds = ImageFiles(listing.files, transform, name="folder", input_shape=shape, info={}, labels=labels,
                    classes=classes)
    ds.notes = [note] if (note := skipped_note(listing, f"image folder {str(p)!r}")) else []
    return ds


def _flat_folder(p: Path, size: int | None, input_shape) -> ImageFiles:
    """Every image file in ``p`` (no sub-folders), unlabelled: resized to ``size``, else to the model's
    ``input_shape`` when the caller offers one (an OOD set), else as they are."""
    listing = list_images(p, recursive=False)
    if not listing.files:
        raise UsageError(f"image folder {str(p)!r} holds no images and has no class sub-folders: put images in it "
                         f"(an unlabelled set), a folder per class ({str(p / 'cat' / '1.png')!r}), or train/ and "
                         "test/ folders of class folders (docs/data.md)")
    if size:
        extra = (_sized(size),)
    elif input_shape is not None:
        extra = _resize_to(input_shape)
    else:
        extra = ()
    transform = _tv_transform(extra)
    shape = tuple(transform(_read_image(str(listing.files[0]))).shape)
    ds = ImageFiles(listing.files, transform, name="folder", input_shape=shape, info={})
    ds.notes = [note] if (note := skipped_note(listing, f"image folder {str(p)!r}")) else []
    return ds


class ImageFiles(Dataset):
    """Image files read one by one in the given order: unlabelled (y = -1), or with ``labels`` (one
    per file, indices into ``classes``, the names of the class folders). Every image must come out of
    the transform at ``input_shape`` (the first image's): one that does not is refused in one line
    naming it (a batch of mixed sizes cannot be stacked)."""

    def __init__(self, files: list[Path], transform, *, name: str, input_shape, info: dict,
                 labels: list[int] | None = None, classes: list[str] | None = None):
        self.files, self.transform = files, transform
        self.name, self.input_shape, self.info = name, tuple(input_shape), info
        self.targets = [-1] * len(files) if labels is None else list(labels)
        self.classes = classes
        self.num_classes = None if classes is None else len(classes)
        self.notes: list[str] = []  # what the listing left out (image_files.skipped_note)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i):
        x = self.transform(_read_image(str(self.files[i])))
        if tuple(x.shape) != self.input_shape:
            raise UsageError(f"{str(self.files[i])!r} gives an image of shape {tuple(x.shape)}, the folder's first "
                             f"{self.input_shape}; give every image one size, or resize them all with size=S "
                             "(folder:DIR,size=32)")
        return x, self.targets[i]


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
