"""A dataset's labels read as another set of classes (a class map, :mod:`jemeval.evaluation.classes`).

:func:`relabelled` returns the dataset with label y >= 0 replaced by ``lut[y]`` (-1, unlabelled,
stays -1), keeping its kind wherever the batch loop reads that kind batch by batch
(:func:`jemeval.data.iterate_batches`): an in-memory set stays an :class:`~jemeval.data.ArrayDataset`
(the images shared), images kept as stored stay :class:`~jemeval.stored_images.StoredImages`, a
subset stays a subset of the relabelled set, and torchvision's image folders, CIFAR and SVHN get
their label lists mapped. Any other dataset is wrapped (read image by image, as before). The map is
part of the result's ``info``, so a detector fitted on one map is never taken from the cache for
another (:func:`jemeval.evaluation.ood.fit.dataset_fingerprint`).
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from jemeval.data import ArrayDataset, ClassSubset, dataset_labels
from jemeval.errors import UsageError
from jemeval.stored_images import StoredImages

#: a label the map leaves out (refused once the evaluated images are known)
UNMAPPED = -2


def relabelled(ds: Dataset, lut: np.ndarray, *, num_classes: int | None, what: str) -> Dataset:
    """``ds`` with its labels mapped by ``lut`` (-1 in ``lut``: a class the map leaves out); one line
    naming ``what`` (the map) when an image of ``ds`` has such a label."""
    table = np.where(np.asarray(lut, dtype=np.int64) < 0, UNMAPPED, np.asarray(lut, dtype=np.int64))
    out = _relabel(ds, table, num_classes)
    labels = mapped(labels_of(ds), table)
    if (labels == UNMAPPED).any():
        first = int(labels_of(ds)[labels == UNMAPPED][0])
        raise UsageError(f"label {first} of the data has no model class in {what}; map every class of the data "
                         "(docs/data.md, class maps)", param="class_map")
    return out


def labels_of(ds: Dataset) -> np.ndarray:
    """The labels of ``ds``, read through torch's subsets (:func:`jemeval.data.dataset_labels` would
    read a subset of an image folder image by image)."""
    if isinstance(ds, Subset):
        return labels_of(ds.dataset)[np.asarray(ds.indices, dtype=np.int64)]
    return dataset_labels(ds)


def mapped(y, table: np.ndarray) -> np.ndarray:
    """Labels ``y`` through ``table``; -1 stays -1, a label beyond the table is :data:`UNMAPPED`."""
    y = np.asarray(y, dtype=np.int64)
    inside = (y >= 0) & (y < len(table))
    return np.where(inside, table[np.where(inside, y, 0)], np.where(y < 0, y, UNMAPPED))


def _relabel(ds: Dataset, table: np.ndarray, num_classes: int | None) -> Dataset:
    from torchvision import datasets

    if isinstance(ds, ArrayDataset):
        out = ArrayDataset(ds.x, torch.from_numpy(mapped(ds.y.numpy(), table)), name=ds.name, info=ds.info,
                           validate=False)
        for attr in ("spec", "splits"):
            if hasattr(ds, attr):
                setattr(out, attr, getattr(ds, attr))
    elif isinstance(ds, StoredImages):
        out = copy.copy(ds)
        out.y = torch.from_numpy(mapped(ds.y.numpy(), table))
    elif isinstance(ds, (Subset, ClassSubset)):  # the same rows of the relabelled set
        out = copy.copy(ds)
        setattr(out, "dataset" if isinstance(ds, Subset) else "base",
                _relabel(ds.dataset if isinstance(ds, Subset) else ds.base, table, num_classes))
    elif isinstance(ds, datasets.DatasetFolder):  # __getitem__ reads samples; targets is what labels are read from
        out = copy.copy(ds)
        out.targets = mapped(ds.targets, table).tolist()
        out.samples = [(path, y) for (path, _), y in zip(ds.samples, out.targets)]
        out.imgs = out.samples
    elif isinstance(ds, datasets.CIFAR10):  # CIFAR-100 too: __getitem__ reads targets
        out = copy.copy(ds)
        out.targets = mapped(ds.targets, table).tolist()
    elif isinstance(ds, datasets.SVHN):  # __getitem__ reads labels
        out = copy.copy(ds)
        out.labels = mapped(ds.labels, table)
    else:
        out = _Wrapped(ds, table)
    out.num_classes = num_classes
    out.info = {**(getattr(ds, "info", None) or {}), "class_map": table.tolist()}
    return out


class _Wrapped(Dataset):
    """Any other dataset, its labels mapped as each image is read (``targets``: all of them, mapped once)."""

    def __init__(self, base: Dataset, table: np.ndarray):
        self.base, self.table = base, table
        self.targets = mapped(labels_of(base), table)
        for attr in ("input_shape", "spec", "splits", "name"):
            if hasattr(base, attr):
                setattr(self, attr, getattr(base, attr))

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i):
        x, _ = self.base[i]
        return x, int(self.targets[i])
