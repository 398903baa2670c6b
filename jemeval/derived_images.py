"""Image sets computed from another set's rows one batch at a time (``interp:``, ``rotate:``, ``flip:``,
``constant``).

Why: these sets used to be built whole as float32 tensors over their base's images. ``interp`` of
50,000 ImageNet-sized images is 30 GB of float32, more than a machine has, and even on CIFAR the
whole build made the OOD command's peak memory grow with N. Here a set is a
:class:`~jemeval.stored_images.StoredImages` over a :class:`DerivedArray`: when the batch loop asks
for rows, the base's rows (and, for ``interp``, their partners) are read (:func:`read_rows`: an
in-memory set sliced, an npz read from its mapped file, anything else decoded through a DataLoader)
and the same elementwise arithmetic as the whole build is applied to them, so each image is bit for
bit the one the whole build made (tests/test_derived_sets.py computes the old build to check).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from jemeval.data import ArrayDataset, dataset_labels, input_shape_of, to_arrays
from jemeval.stored_images import StoredImages, stored_rows


def _index(rows: np.ndarray) -> slice | np.ndarray:
    """``rows`` as a slice when they are one ascending run (a view of an in-memory set, one read of a file)."""
    if len(rows) and rows[-1] - rows[0] == len(rows) - 1 and bool((np.diff(rows) == 1).all()):
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def read_rows(ds: Dataset, rows: np.ndarray) -> torch.Tensor:
    """Images ``rows`` of ``ds`` (an int array, any order) as one float32 tensor in [-1, 1], the
    values :func:`jemeval.data.to_arrays` gives for them: an in-memory set indexed, images kept as
    stored (and subsets of them) converted from their rows, any other set read through a DataLoader."""
    rows = np.asarray(rows, dtype=np.int64)
    if isinstance(ds, ArrayDataset):
        index = _index(rows)
        return ds.x[index] if isinstance(index, slice) else ds.x[torch.from_numpy(index)]
    stored = stored_rows(ds)
    if stored is not None:
        base, inner = stored
        return base.rows(_index(rows if inner is None else inner[rows]))
    return to_arrays(Subset(ds, rows.tolist()))[0]


class DerivedArray:
    """N x C x H x W float32 images, ``make(read, rows)`` for the rows asked, where ``read(rows)`` gives
    the base's images :func:`read_rows`; indexed like an array (a slice or int array of rows), by
    :meth:`StoredImages.rows <jemeval.stored_images.StoredImages.rows>`. Nothing is kept between reads."""

    dtype = np.dtype(np.float32)

    def __init__(self, base: Dataset | None, n: int, shape: tuple[int, ...],
                 make: Callable[[Callable[[np.ndarray], torch.Tensor], np.ndarray], torch.Tensor]) -> None:
        self.base = base
        self.shape = (int(n), *(int(s) for s in shape))
        self._make = make

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index) -> np.ndarray:
        rows = np.arange(self.shape[0])[index]
        scalar = np.ndim(rows) == 0
        rows = np.atleast_1d(rows).astype(np.int64)
        if len(rows) == 0:
            return np.empty((0, *self.shape[1:]), np.float32)
        out = self._make(lambda r: read_rows(self.base, r), rows).numpy()
        return out[0] if scalar else out


def derived_images(base: Dataset, transform: Callable[[torch.Tensor], torch.Tensor], *, name: str, info: dict,
                   labels: bool = True, num_classes: int | None = None) -> StoredImages:
    """``transform`` (a per-image function of a float batch: a rotation, a mirror) of every image of
    ``base``, drawn batch by batch; labels of the originals kept (``labels``) or -1. The splits the base
    declares are kept (``rotate:npz:FILE`` has no test split when FILE has none)."""
    shape = tuple(transform(torch.zeros((1, *input_shape_of(base)))).shape[1:])
    array = DerivedArray(base, len(base), shape, lambda read, rows: transform(read(rows)))
    y = torch.as_tensor(dataset_labels(base)).long() if labels else None
    return _with_splits(StoredImages(array, y, num_classes=num_classes, name=name, info=info, storage="derived"), base)


def interpolated_images(base: Dataset, seed: int, *, name: str, info: dict) -> StoredImages:
    """Averages ``(x_i + x_perm(i)) / 2`` of pairs of ``base``'s images, the pairs a seeded permutation
    with no fixed point (an image is never paired with itself), unlabelled; drawn batch by batch."""
    n = len(base)
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(n, generator=g)
    same = perm == torch.arange(n)
    perm[same] = (perm[same] + 1) % n  # never pair an image with itself
    partner = perm.numpy()
    array = DerivedArray(base, n, input_shape_of(base), lambda read, rows: (read(rows) + read(partner[rows])) / 2)
    return _with_splits(StoredImages(array, None, name=name, info=info, storage="derived"), base)


def constant_images(n: int, shape: tuple[int, ...], value: float, *, name: str, info: dict) -> StoredImages:
    """``n`` images every pixel ``value``: one image, broadcast (no memory per image); a batch is a copy."""
    one = torch.full((1, *shape), float(value)).numpy()
    return StoredImages(np.broadcast_to(one, (int(n), *shape)), None, name=name, info=info, storage="constant")


def _with_splits(ds: StoredImages, base: Dataset) -> StoredImages:
    if hasattr(base, "splits"):
        ds.splits = base.splits
    return ds
