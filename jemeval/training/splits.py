"""The training data: a fixed validation split, the labelled subset for semi-supervised runs, and
which images each iteration trains on.

A dataset with a ``val`` split of its own (an image folder with ``val/``, an npz with ``x_val``)
validates on it and trains on all of its ``train`` split; any other set has ``val_size`` of its
train split held out (:func:`jemeval.data.split_indices`). The checkpoint records which
(``resolved.data.val_split``), so that calibration and detector fitting find the held-out images again.

Both are drawn with ``split_seed`` (default 1234), not the run's ``seed``, so runs with different
seeds are compared on the same validation images and the same labelled examples, as in the JEM
release (its validation split of 5,000 images also used a fixed seed). Images kept as stored (an
npz: uint8, memory-mapped) stay so, and each batch's rows are converted when it is drawn
(:class:`~jemeval.stored_images.StoredRows`: the same floats, 4x less memory, flat in N when mapped);
any other set is held as one float tensor on the training device (when it fits). Either way batches
are index slices: no DataLoader.

An epoch is ``n // batch_size`` iterations over a (seed, epoch) permutation of the training set, the
same on every rank and dealt out (:func:`jemeval.runtime.distributed.shard_indices`), so the ranks'
b-th batches together are the single-process run's b-th batch (:func:`epoch_order`, :func:`batch`).
In a semi-supervised run the p(x) term takes that batch and the cross-entropy cycles through seeded
permutations of the labelled images instead (:func:`next_labelled`). The positions live in the
:class:`~.position.RunPosition`, so a resume continues mid-epoch with the same images.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from jemeval.data import (
    data_hashes,
    declared_splits,
    default_val_size,
    input_shape_of,
    load_dataset,
    num_classes_of,
    split_indices,
    take,
    to_arrays,
)
from jemeval.errors import JemevalError, UsageError
from jemeval.evaluation.classes import data_classes
from jemeval.runtime import distributed as D
from jemeval.runtime.distributed import DistContext
from jemeval.seen_images import all_seen, dataset_notes, overlap, some_seen
from jemeval.stored_images import StoredRows, stored_rows

if TYPE_CHECKING:
    from jemeval.training.position import RunPosition

#: Training sets larger than this stay in host memory and are copied per batch.
MAX_DEVICE_BYTES = 4 * 1024**3


@dataclass
class TrainingData:
    x: torch.Tensor | StoredRows  # training images (validation images removed); an npz's as stored
    y: torch.Tensor  # their labels
    labelled: torch.Tensor | None  # indices of the labelled images (None: all are labelled)
    x_val: torch.Tensor | StoredRows
    y_val: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    info: dict = field(default_factory=dict)

    @property
    def n_labelled(self) -> int:
        return len(self.x) if self.labelled is None else len(self.labelled)

    def labelled_images(self) -> tuple[torch.Tensor | StoredRows, torch.Tensor]:
        """The labelled training images (as held: a StoredRows stays one) and their labels."""
        if self.labelled is None:
            return self.x, self.y
        return _pick(self.x, self.labelled.cpu().numpy()), self.y[self.labelled]

    def describe(self) -> dict:
        return {"n_train": len(self.x), "n_val": len(self.x_val), "n_labelled": self.n_labelled,
                "num_classes": self.num_classes, "input_shape": list(self.input_shape),
                "val_split": self.info.get("val_split")}


def labelled_subset(labels: np.ndarray, per_class: int, num_classes: int, seed: int) -> np.ndarray:
    """Sorted indices of ``per_class`` randomly chosen examples of every class present."""
    rng = np.random.default_rng(seed)
    chosen = []
    for c in range(num_classes):
        idx = np.flatnonzero(labels == c)
        if len(idx) == 0:
            continue
        if len(idx) < per_class:
            raise UsageError(f"labels_per_class {per_class} is more than the {len(idx)} training images of "
                             f"class {c}", param="labels_per_class")
        chosen.append(rng.choice(idx, size=per_class, replace=False))
    return np.sort(np.concatenate(chosen))


def prepare_data(config, device: torch.device) -> TrainingData:
    """Load the training split, carve out the validation split and the labelled subset (after the
    checks of :func:`check_other_splits`, before any image is decoded)."""
    ds = load_dataset(config.dataset, "train", root=config.data_root, download=config.download)
    own_val = "val" in (declared_splits(ds) or ())  # the dataset's own validation images
    if not own_val:
        val_size = default_val_size(len(ds)) if config.val_size is None else int(config.val_size)
        tr, va = split_indices(len(ds), val_size, config.split_seed)
    info = {**dict(getattr(ds, "info", {}) or {}), **check_other_splits(config, ds, None if own_val else (tr, va))}
    x, y = held_images(ds, config.workers)
    if len(x) == 0:
        raise UsageError(f"dataset {config.dataset!r} has no training images")
    if (y < 0).all():
        raise UsageError(f"dataset {config.dataset!r} has no labels; jemeval train needs labelled images")
    num_classes = num_classes_of(ds)
    info["class_names"] = data_classes(ds).names  # what a warm start compares its source's classes with
    if own_val:
        x_val, y_val = held_images(load_dataset(config.dataset, "val", root=config.data_root,
                                                download=config.download), config.workers)
        tr, info["val_split"] = np.arange(len(x)), "val"
    else:
        x_val, y_val = _pick(x, va), y[torch.from_numpy(va)]
    labels = y.numpy()[tr]
    labelled = None
    if config.labels_per_class is not None:
        subset = labelled_subset(labels, config.labels_per_class, num_classes, config.split_seed + 1)
        labelled = torch.from_numpy(subset)
    elif (labels < 0).any():
        raise UsageError(f"dataset {config.dataset!r} has unlabelled training images; set labels_per_class to "
                         "the number of labels to keep per class", param="labels_per_class")
    stored = isinstance(x, StoredRows)  # read and converted a batch at a time, on the host
    data_device = device if not stored and x.numel() * 4 <= MAX_DEVICE_BYTES else torch.device("cpu")
    return TrainingData(
        x=_pick(x, tr) if stored else _pick(x, tr).to(data_device), y=y[torch.from_numpy(tr)].to(data_device),
        labelled=None if labelled is None else labelled.to(data_device),
        x_val=x_val if isinstance(x_val, StoredRows) else x_val.to(data_device), y_val=y_val.to(data_device),
        num_classes=num_classes, input_shape=tuple(input_shape_of(ds)), info=info,
    )


def held_images(ds, workers: int | None = None) -> tuple[torch.Tensor | StoredRows, torch.Tensor]:
    """(images, labels) of ``ds`` as training holds them: images kept as stored (an npz, or a subset of
    one) stay so, a :class:`StoredRows` converted a batch at a time (the float set never exists whole:
    4x the uint8 file); any other set is read whole as float (:func:`jemeval.data.to_arrays`)."""
    stored = stored_rows(ds)
    if stored is None:
        return to_arrays(ds, workers)
    held = StoredRows(*stored)
    return held, stored[0].y[torch.from_numpy(held.rows)]


def _pick(x: torch.Tensor | StoredRows, rows: np.ndarray) -> torch.Tensor | StoredRows:
    return x.select(rows) if isinstance(x, StoredRows) else x[torch.from_numpy(rows)]


def check_other_splits(config, ds, carved: tuple[np.ndarray, np.ndarray] | None) -> dict:
    """Refuse, before training starts, a dataset whose other splits the trained model could not be
    scored on: images of another shape than the train split's (its test accuracy would be on images
    the model does not take, which eval refuses), or a validation or test split all of whose images
    are training images (:mod:`jemeval.seen_images`). Some such images: ``notes`` (said on stderr),
    and ``test_seen`` for the test accuracy's note. ``carved``: the (train, val) rows of a validation
    split held out of train, whose images should not be training images either. Also the SHA-256 of
    the dataset's files, for the provenance."""
    shape, notes, found = tuple(input_shape_of(ds)), dataset_notes(ds), {}
    for split in [s for s in declared_splits(ds) or () if s != "train"]:
        try:
            other = load_dataset(config.dataset, split, root=config.data_root, download=config.download)
        except JemevalError:
            continue  # no test split to score on: the run's summary says so at the end
        if len(other) and tuple(input_shape_of(other)) != shape:
            raise UsageError(f"dataset {config.dataset!r}: its {split} split holds images of shape "
                             f"{tuple(input_shape_of(other))} but its train split {shape}; a model trained on the "
                             f"train split does not take them (eval refuses them): give every split images of one "
                             f"shape (folder:DIR,size=S resizes them all)")
        found[split] = overlap(other, lambda: ds)
    if carved is not None and len(carved[1]):
        found["held-out validation"] = overlap(take(ds, carved[1]), lambda: take(ds, carved[0]))
    out: dict = {"data_sha256": data_hashes([config.dataset])}
    for split, seen in found.items():
        what = f"{split} images of {config.dataset}"
        if seen is not None and seen.total and split != "held-out validation":
            raise UsageError(all_seen(seen, what, "its train split", split, on_purpose=False))
        if seen is not None and seen.count:
            notes.append(some_seen(seen, what, "its train split" if split != "held-out validation" else
                                   "the rest of its train split, which the model trains on"))
            out["test_seen" if split == "test" else f"{split}_seen"] = notes[-1]
    return {**out, "notes": notes}


# -- which images each iteration trains on ----------------------------------------------------------
def epoch_order(position: RunPosition, n: int, ctx: DistContext, seed: int, device: torch.device) -> torch.Tensor:
    """This rank's order of the epoch in progress (drawn once per epoch, kept for a resume)."""
    if position.perm is None:
        position.perm = D.shard_indices(n, ctx.rank, ctx.world_size, seed, position.epoch).to(device)
    return position.perm


def next_labelled(position: RunPosition, labelled: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """The next ``n`` labelled indices, cycling through seeded permutations of the labelled set."""
    chunks, need = [], n
    total = len(labelled)
    while need > 0:
        if position.lab_perm is None or position.lab_pos >= total:
            position.lab_perm = torch.randperm(total, generator=generator, device=generator.device)
            position.lab_pos = 0
        take = min(need, total - position.lab_pos)
        chunks.append(position.lab_perm[position.lab_pos:position.lab_pos + take])
        position.lab_pos += take
        need -= take
    return labelled[torch.cat(chunks).to(labelled.device)]


def batch(data: TrainingData, position: RunPosition, b: int, size: int, generator: torch.Generator,
          device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(labelled images, their labels, the p(x) images or None when they are the labelled ones)
    of iteration ``b`` of the epoch, on ``device``."""
    idx = position.perm[b * size:(b + 1) * size].to(data.x.device)
    if data.labelled is None:
        x_lab, y_lab, x_data = data.x[idx], data.y[idx], None
    else:
        lab = next_labelled(position, data.labelled, size, generator)
        x_lab, y_lab, x_data = data.x[lab], data.y[lab], data.x[idx].to(device, non_blocking=True)
    return x_lab.to(device, non_blocking=True), y_lab.to(device, non_blocking=True), x_data
