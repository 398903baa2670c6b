"""Datasets by name, one fast batch loop for every evaluation command, and the held-out split.

Every dataset yields ``(x, y)`` with x a float tensor C x H x W in [-1, 1] and y an int (``-1`` for
unlabelled sets such as ``uniform``). Names are specs (:func:`jemeval.registry.parse_spec`):
``digits``, ``digits[0-4]`` (a class subset), ``interp:digits``, ``npz:/path/file.npz``.
:func:`split_indices` defines the validation split training holds out; :func:`held_out_indices` finds it
again from a checkpoint (detector fitting, tuning and temperature scaling keep those images apart).

A dataset declares the splits its source really has in a ``splits`` attribute (``("train", "test")``
for digits, an image folder with ``train/`` and ``test/``, an npz with ``x_train``/``x_test``); a
set with one collection of images (a folder of class folders, an npz with ``x``/``y``) has
``splits = ()``: every split it is asked for is all of its images. :func:`has_test_split` and
:func:`no_test_split_note` are the one rule every command applies to that (docs/data.md).
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from jemeval.context import shareable
from jemeval.data_files import data_hashes, dataset_files, dataset_sha256, names_no_path  # noqa: F401 (their home)
from jemeval.errors import JemevalError, UsageError
from jemeval.plugins import get_registry
from jemeval.registry import Spec, call_with_supported, parse_spec
from jemeval.runtime.workers import resolve_workers
from jemeval.stored_images import StoredImages, stored_rows
from jemeval.worker_errors import ErrorsAsData, collate_or_raised, raise_if_raised

DATA_ROOT_ENV = "JEMEVAL_DATA_ROOT"


def default_root() -> Path:
    return Path(os.environ.get(DATA_ROOT_ENV, "~/.cache/jemeval/datasets")).expanduser()


class ArrayDataset(Dataset):
    """In-memory images and labels; evaluation slices it directly (no DataLoader overhead)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor | None = None, *, num_classes: int | None = None,
                 name: str | None = None, info: dict | None = None, validate: bool = True):
        source = (info or {}).get("path") or name or "in-memory dataset"
        if validate:
            check_arrays(x, y, source)
        self.x = x.float().contiguous()
        self.y = (torch.full((len(x),), -1, dtype=torch.long) if y is None else torch.as_tensor(y).long())
        self.num_classes = num_classes
        self.input_shape = tuple(self.x.shape[1:])
        self.name = name
        self.info = dict(info or {})

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


#: how far outside [-1, 1] float images may stray (rounding of a rescaling), as the npz loader allowed
RANGE_TOLERANCE = 1e-4


def check_arrays(x: torch.Tensor, y: torch.Tensor | None, source: str) -> None:
    """Where arrays become a dataset: images N x ... finite and in [-1, 1], labels one whole number
    >= -1 per image. NaN images otherwise pass a min/max range test and evaluate to chance-level
    garbage, and float labels would be truncated (1.7 -> 1) without a word."""
    if not torch.is_tensor(x) or x.dim() < 2 or not x.is_floating_point():
        what = (f"{str(x.dtype).replace('torch.', '')} of shape {tuple(x.shape)}" if torch.is_tensor(x)
                else type(x).__name__)
        raise UsageError(f"{source!r}: images must be a float tensor N x C x H x W in [-1, 1], got {what}")
    bad = ~torch.isfinite(x).flatten(1).all(1)
    if bool(bad.any()):
        raise UsageError(f"{source!r}: {int(bad.sum())} of {len(x)} images hold NaN or inf values (the first is image "
                         f"{int(bad.nonzero()[0])}); images must be finite, in [-1, 1]")
    if len(x) and (float(x.min()) < -1 - RANGE_TOLERANCE or float(x.max()) > 1 + RANGE_TOLERANCE):
        found = f"{float(x.min()):.3g}..{float(x.max()):.3g}"
        raise UsageError(f"{source!r}: float images must lie in [-1, 1] (found {found}); store uint8 0..255 or rescale")
    check_labels(y, len(x), source)


def check_labels(y: torch.Tensor | None, n: int, source: str) -> None:
    """:func:`check_arrays`'s rules for the labels of ``n`` images (also used on images kept as stored)."""
    if y is None:
        return
    y = torch.as_tensor(y)
    if y.dim() != 1 or len(y) != n:
        raise UsageError(f"{source!r}: {n} images but labels of shape {tuple(y.shape)}; give one label per image")
    if y.dtype == torch.bool or y.is_complex():
        raise UsageError(f"{source!r}: labels must be integers, got dtype {y.dtype}")
    if y.is_floating_point():
        whole = torch.isfinite(y) & (y == y.round())
        if not bool(whole.all()):
            first = int((~whole).nonzero()[0])
            raise UsageError(f"{source!r}: labels must be whole numbers, but label {first} is {float(y[first])!r}; "
                             "store integer class indices (-1 = unlabelled)")
    if len(y) and int(y.min()) < -1:
        raise UsageError(f"{source!r}: labels must be class indices >= 0 (or -1 = unlabelled), found {int(y.min())}")
    if len(y):
        check_largest_label(int(y.max()), source)


#: the most classes a dataset may have (a label is a class index below it): more than any classification
#: set (ImageNet-21k 21,841, Google Landmarks v2 203,094); a larger label is a mistake whose model
#: would not fit in memory (label 2**40 asked for a 2**40-way output layer)
MAX_CLASSES = 2**20


def check_largest_label(top: int, source: str, where: str = "") -> None:
    """Refuse, before any model is made for it, a label that makes more than :data:`MAX_CLASSES` classes."""
    if top >= MAX_CLASSES:
        raise UsageError(f"{source!r}: label {top}{where} would make {top + 1} classes; labels are class indices "
                         f"0..K-1 with K at most {MAX_CLASSES} (-1 = unlabelled): renumber the classes from 0")


class ClassSubset(Dataset):
    """The examples of ``base`` whose label is in ``classes`` (labels kept as they are)."""

    def __init__(self, base: Dataset, classes: Sequence[int]):
        self.base = base
        self.classes = tuple(classes)
        labels = dataset_labels(base)
        self.indices = np.flatnonzero(np.isin(labels, self.classes))
        if len(self.indices) == 0:
            raise UsageError(f"no examples with classes {list(self.classes)} in this dataset")
        self.num_classes = getattr(base, "num_classes", None)
        self.input_shape = getattr(base, "input_shape", None)
        self.info = {**getattr(base, "info", {}), "classes": list(self.classes)}
        if hasattr(base, "splits"):
            self.splits = base.splits

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i):
        return self.base[int(self.indices[i])]


def dataset_labels(ds: Dataset) -> np.ndarray:
    """All labels of a dataset as an int array (fast for ArrayDataset and torchvision sets)."""
    if isinstance(ds, (ArrayDataset, StoredImages)):
        return ds.y.numpy()
    if isinstance(ds, ClassSubset):
        return dataset_labels(ds.base)[ds.indices]
    for attr in ("targets", "labels"):
        if hasattr(ds, attr):
            return np.asarray(getattr(ds, attr)).reshape(-1)
    return np.asarray([int(ds[i][1]) for i in range(len(ds))])


@shareable
def load_dataset(name: str, split: str = "test", root: str | os.PathLike | None = None, download: bool = False,
                 **options: Any) -> Dataset:
    """The dataset registered as ``name`` (a spec) for ``split``, in the [-1, 1] input space.

    Keyword options go to the dataset factory; the context options ``input_shape``, ``n``, ``seed``
    and ``preprocess`` (a hub model's own resize and crop) are offered to factories that accept them
    (synthetic sets take the model's input shape).
    """
    spec = parse_spec(name)
    factory = get_registry().get("dataset", spec.name)
    context = {k: options.pop(k) for k in ("input_shape", "n", "seed", "preprocess") if k in options}
    opts = {**spec.options, **options}
    if spec.variant is not None:
        opts["variant"] = spec.variant
    root = Path(root).expanduser() if root is not None else default_root()
    ds = call_with_supported(factory, split, root, download, context=context, **opts)
    if spec.classes is not None:
        ds = ClassSubset(ds, spec.classes)
    if not hasattr(ds, "spec"):
        try:
            ds.spec = str(spec)
        except AttributeError:
            pass
    return ds


def subsample(ds: Dataset, n: int | None, seed: int = 0, *, name: str = "n") -> Dataset:
    """A seeded random subset of ``n`` examples (all of them when n is None or >= len).

    ``name`` is the caller's parameter in the error for n <= 0 (``ref_n`` for fidelity's reference).
    """
    if n is not None and n <= 0:
        raise UsageError(f"{name} must be a positive number of examples, got {n}", param=name)
    if n is None or n >= len(ds):
        return ds
    return take(ds, np.sort(np.random.default_rng(seed).choice(len(ds), size=n, replace=False)))


def take(ds: Dataset, idx: Sequence[int] | np.ndarray) -> Dataset:
    """The examples ``idx`` of ``ds``, in that order, keeping its attributes (an ArrayDataset stays one)."""
    idx = np.asarray(idx, dtype=np.int64)
    if isinstance(ds, ArrayDataset):
        out = ArrayDataset(ds.x[idx], ds.y[idx], num_classes=ds.num_classes, name=ds.name, info=ds.info, validate=False)
        out.spec = getattr(ds, "spec", None)
        if hasattr(ds, "splits"):
            out.splits = ds.splits
        return out
    sub = torch.utils.data.Subset(ds, idx.tolist())
    for attr in ("num_classes", "input_shape", "info", "spec", "splits"):
        if hasattr(ds, attr):
            setattr(sub, attr, getattr(ds, attr))
    return sub


def default_val_size(n: int) -> int:
    """The validation split ``jemeval train`` holds out of ``n`` training images: 10%, at most 5000."""
    return min(5000, n // 10)


def split_indices(n: int, val_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) index arrays, both sorted; a seeded permutation decides.

    The one definition of the held-out split: training carves it out, and calibration finds the
    same images again from a checkpoint's ``val_size`` and ``split_seed``.
    """
    if val_size >= n:
        raise UsageError(f"val_size {val_size} leaves no training images (the training split has {n}); "
                         "use a smaller validation split", param="val_size")
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[val_size:]), np.sort(perm[:val_size])


def held_out_indices(model: Any, data: str, n_train: int) -> np.ndarray | None:
    """The train-split indices ``jemeval train`` held out for validation (:func:`split_indices`), if the
    checkpoint's config describes them (``val_size`` and ``split_seed``), ``data`` is its training set
    (the same files, however the path is written) and training carved them out of the train split (a
    dataset with a ``val`` split of its own was validated on that instead: nothing was held out of
    train). Detector fitting, tuning and temperature scaling keep these images apart."""
    config = (getattr(model, "metadata", None) or {}).get("config") or {}
    if not isinstance(config, dict) or "split_seed" not in config or not isinstance(config.get("dataset"), str):
        return None
    if absolute_spec(config["dataset"]) != absolute_spec(data):
        return None
    resolved = config.get("resolved") if isinstance(config.get("resolved"), dict) else {}
    if isinstance(resolved.get("data"), dict) and resolved["data"].get("val_split"):
        return None
    val_size = config.get("val_size")
    val_size = default_val_size(n_train) if val_size is None else int(val_size)
    if val_size <= 0 or val_size >= n_train:
        return None
    return split_indices(n_train, val_size, int(config["split_seed"]))[1]


# -- splits: which images a dataset keeps apart --------------------------------------------------
def declared_splits(ds: Dataset) -> tuple[str, ...] | None:
    """The splits ``ds`` declares (its ``splits`` attribute), or None for a set that declares none
    (a plugin's, a synthetic set): such a set is trusted to give each split its own images."""
    splits = getattr(ds, "splits", None)
    return None if splits is None else tuple(splits)


def has_test_split(ds: Dataset) -> bool:
    """Whether ``ds`` comes from a source with a test split of its own, kept apart from its training
    images; False for a single-split set (``splits = ()``), whose "test" images are all of them."""
    splits = declared_splits(ds)
    return splits is None or "test" in splits


def no_test_split_note(spec: str, ds: Dataset) -> str | None:
    """THE note for numbers measured on a set without a test split (eval, calibrate, ood, train's
    test accuracy), None for a set with one."""
    if has_test_split(ds):
        return None
    return (f"{spec} has no test split: these are all its images; if the model was trained on them, these are "
            "training numbers (give a dataset with a test split: docs/data.md)")


def holdout_parts(n: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fitted, evaluated): a seeded ``size`` of ``n`` images to fit on (a temperature, a detector) and
    the disjoint rest to evaluate, both sorted. For a set with no split to fit on apart from the one
    evaluated; ``size`` is at most half, so at least half is evaluated."""
    size = max(1, min(int(size), n // 2))
    if n < 2:
        raise UsageError(f"{n} image(s) cannot be split into a part to fit on and a part to evaluate")
    rest, fitted = split_indices(n, size, seed)
    return fitted, rest


def absolute_spec(spec: str) -> str:
    """``spec`` with the paths it names made absolute (``folder:../data/blobs`` ->
    ``folder:/home/me/data/blobs``), so a spec recorded in a checkpoint names the same files from any
    working directory. A path is the variant of a factory marked ``takes_path`` (npz, folder) or a
    ``path=`` option; a variant or ``base=`` that is itself a dataset spec (``interp:npz:f.npz``) is
    made absolute in turn. Anything else, and a spec that does not parse, is returned unchanged."""
    try:
        parsed = parse_spec(spec)
    except JemevalError:
        return spec
    registry = get_registry()

    def factory(name: str):
        return registry.get("dataset", name) if name in registry.names("dataset") else None

    def nested(text: str) -> str:
        try:
            inner = parse_spec(text).name
        except JemevalError:
            return text
        return absolute_spec(text) if factory(inner) is not None else text

    variant, options = parsed.variant, dict(parsed.options)
    if isinstance(variant, str) and variant:
        variant = _absolute(variant) if getattr(factory(parsed.name), "takes_path", False) else nested(variant)
    if isinstance(options.get("path"), str):
        options["path"] = _absolute(options["path"])
    if isinstance(options.get("base"), str):
        options["base"] = nested(options["base"])
    if (variant, options) == (parsed.variant, parsed.options):
        return spec
    classes = re.search(r"\[[^\]]*\]\s*$", spec.strip())
    text = str(Spec(parsed.name, variant, options))
    return text + (classes.group(0).strip() if classes else "")


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def iterate_batches(ds: Dataset, batch_size: int = 256, device: str | torch.device = "cpu",
                    num_workers: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (x, y) batches on ``device`` in dataset order.

    In-memory datasets are sliced directly; images kept as stored (a memory-mapped npz), and the
    subsets :func:`take` and :class:`ClassSubset` make of them, are read and converted to float one
    batch at a time (:func:`jemeval.stored_images.stored_rows`); others go through a DataLoader (pinned
    memory on CUDA) with ``num_workers`` decoding processes (None: :func:`~jemeval.runtime.workers.default_workers`).
    """
    device = torch.device(device)
    if isinstance(ds, ArrayDataset):
        for i in range(0, len(ds), batch_size):
            x, y = ds.x[i:i + batch_size], ds.y[i:i + batch_size]
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        return
    stored = stored_rows(ds)
    if stored is not None:
        base, rows = stored
        for i in range(0, len(ds), batch_size):
            index = slice(i, min(i + batch_size, len(ds))) if rows is None else rows[i:i + batch_size]
            yield (base.rows(index).to(device, non_blocking=True),
                   base.y[index].to(device, non_blocking=True))
        return
    num_workers = loader_workers(ds, num_workers)
    workers = num_workers > 0  # a worker's JemevalError comes back as data, raised here in one line
    loader = DataLoader(ErrorsAsData(ds) if workers else ds, batch_size=batch_size, shuffle=False,
                        num_workers=num_workers, pin_memory=device.type == "cuda",
                        collate_fn=collate_or_raised if workers else None)
    for batch in loader:
        x, y = raise_if_raised(batch)
        yield x.to(device, non_blocking=True), torch.as_tensor(y).long().to(device, non_blocking=True)


def loader_workers(ds: Dataset, workers: int | None) -> int:
    """The decoding processes a pass over ``ds`` starts: none for sets sliced as arrays (in memory,
    or stored: npz, the derived OOD sets), ``workers`` (None: the default for this machine) for the
    sets read image by image. What a result records as its ``workers``."""
    if isinstance(ds, ArrayDataset) or stored_rows(ds) is not None:
        return 0
    return resolve_workers(workers)


def to_arrays(ds: Dataset, workers: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Materialise a (small) dataset as two tensors (``workers``: DataLoader processes decoding an
    image folder, None for the default; :func:`iterate_batches`)."""
    if isinstance(ds, ArrayDataset):
        return ds.x, ds.y
    xs, ys = [], []
    for x, y in iterate_batches(ds, 512, num_workers=workers):
        xs.append(x)
        ys.append(y)
    return torch.cat(xs), torch.cat(ys)


def input_shape_of(ds: Dataset) -> tuple[int, ...]:
    shape = getattr(ds, "input_shape", None)
    if shape:
        return tuple(shape)
    return tuple(ds[0][0].shape)


def num_classes_of(ds: Dataset) -> int | None:
    k = getattr(ds, "num_classes", None)
    if k:
        return int(k)
    labels = dataset_labels(ds)
    labels = labels[labels >= 0]
    return int(labels.max()) + 1 if len(labels) else None
