"""Which evaluated images a model has seen, said in every result (docs/data.md, "Images a model has seen").

Three things are checked where a command takes its images, before any work starts:

* the checkpoint's own training images: evaluating the set a checkpoint records as its training set
  on its ``train`` split (``--split train``), or on a set without a test split, gives training
  numbers, and the result says so with the count (:func:`trained_on_note`);
* images in two splits: a test, validation or OOD image byte-identical to an image of the training
  split (:mod:`jemeval.image_digests`: image files by SHA-256, npz rows by a hash confirmed byte for
  byte). Some: a warning (stderr and the result's notes) with the count, the first of them, and how
  to drop them; the provenance records the counts. All of them: refused, since the "held-out"
  numbers would be training numbers under another name (split=train measures those on purpose);
* entries of an image folder that are not read (a FIFO, a link out of the folder, ...:
  :mod:`jemeval.builtins.image_files`), noted.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from jemeval.data import absolute_spec, declared_splits, has_test_split, held_out_indices, load_dataset
from jemeval.errors import JemevalError, JemevalWarning, UsageError
from jemeval.image_digests import Digests, base_and_rows, digests, digests_against, same_images
from jemeval.registry import Spec, parse_spec

#: how many of the images in two splits a message and the provenance name
SHOWN = 3


def warn(text: str) -> str:
    """``text`` as a :class:`~jemeval.errors.JemevalWarning` (the command line prints it on stderr, in
    one line); returned for the result's notes."""
    warnings.warn(text, JemevalWarning, stacklevel=3)
    return text


def dataset_notes(ds: Dataset) -> list[str]:
    """What the dataset under ``ds`` says about itself (an image folder's entries that were not read)."""
    return list(getattr(base_and_rows(ds)[0], "notes", None) or [])


@dataclass
class Overlap:
    """The images of one set that are byte-identical to images of a training split."""

    evaluated: Digests
    training: Digests
    hit: np.ndarray  # indices into evaluated
    match: np.ndarray  # the identical training image of each

    @property
    def count(self) -> int:
        return len(self.hit)

    @property
    def total(self) -> bool:
        return self.count == len(self.evaluated) > 0

    def examples(self) -> str:
        pairs = [f"{self.evaluated.name(int(i))} = {self.training.name(int(j))}"
                 for i, j in zip(self.hit[:SHOWN], self.match[:SHOWN])]
        return ", ".join(pairs) + (", ..." if self.count > SHOWN else "")

    def record(self, training: str) -> dict[str, Any]:
        return {"training_images": training, "identical": self.count, "of": len(self.evaluated),
                "first": [self.evaluated.name(int(i)) for i in self.hit[:SHOWN]]}

    def how_to_drop(self) -> str:
        base = self.evaluated.base
        if self.evaluated.kind == "file":
            return "delete those files (docs/data.md, 'Images a model has seen', finds them all)"
        return f"drop those rows of {base.info.get('array', 'the array')} (docs/data.md, 'Images a model has seen')"


def overlap(ds: Dataset, training: Callable[[], Dataset]) -> Overlap | None:
    """The images of ``ds`` byte-identical to images of ``training()`` (loaded only when ``ds`` has
    digests), or None when they cannot be compared (no digests, or of different kinds)."""
    mine = digests(ds)
    if mine is None:
        return None
    theirs = digests_against(training(), mine)
    if theirs is None or theirs.kind != mine.kind:
        return None
    hit, match = same_images(mine, theirs)
    return Overlap(mine, theirs, hit, match)


def check_evaluated(model, data: str, split: str, ds: Dataset, *, context) -> tuple[list[str], dict[str, Any]]:
    """(notes, provenance record) for numbers measured on ``ds``, the ``split`` split of ``data``: its own
    notes, the images the checkpoint trained on, and its images byte-identical to images of ``data``'s
    train split (refused when every one is)."""
    notes, record = dataset_notes(ds), {}
    trained = trained_on_note(model, data, split, ds, context=context)
    if trained:
        notes.append(trained)
    if split != "train" and has_test_split(ds) and "train" in (declared_splits(ds) or ()):
        found = overlap(ds, lambda: load_dataset(data, "train", context.data_root, context.download))
        if found is not None:
            record = {"seen_images": found.record(f"{data} train split")}
            what = f"{split} images of {data}"
            if found.total:
                raise UsageError(all_seen(found, what, f"{data}'s train split", split))
            if found.count:
                notes.append(warn(some_seen(found, what, f"{data}'s train split")))
    return notes, record


def check_ood_set(id_name: str, label: str, ds: Dataset, *, context,
                  id_ds: Dataset | None = None) -> tuple[list[str], dict[str, Any]]:
    """(notes, provenance record) for OOD set ``label``: its own notes, and its images byte-identical to
    images of the in-distribution set's train split (refused when every one is: they are in-distribution).
    An in-distribution set ``id_ds`` that declares its splits without a train split (an npz holding only
    ``x_test``) has none to compare with."""
    notes, record = dataset_notes(ds), {}
    if id_ds is not None and "train" not in (declared_splits(id_ds) or ("train",)):
        return notes, record
    found = overlap(ds, lambda: load_dataset(id_name, "train", context.data_root, context.download))
    if found is not None:
        record = {"seen_images": found.record(f"{id_name} train split")}
        if found.total:
            raise UsageError(f"all {found.count} images of OOD set {label!r} are also in {id_name}'s train split, byte "
                             f"for byte (e.g. {found.examples()}): they are in-distribution training images, not OOD; "
                             "choose another OOD set")
        if found.count:
            notes.append(warn(some_seen(found, f"images of OOD set {label!r}", f"{id_name}'s train split")
                              + "; the OOD metrics count them as OOD"))
    return notes, record


def some_seen(found: Overlap, what: str, training: str) -> str:
    verb = "is" if found.count == 1 else "are"
    return (f"{found.count} of the {len(found.evaluated)} {what} {verb} also in {training}, byte for byte (e.g. "
            f"{found.examples()}): a model trained on that split has seen them, so they are not held out; to measure "
            f"held-out images only, {found.how_to_drop()}")


def all_seen(found: Overlap, what: str, training: str, split: str, *, on_purpose: bool = True) -> str:
    purpose = ", or give split=train to measure training images on purpose" if on_purpose else ""
    return (f"all {found.count} {what} are also in {training}, byte for byte (e.g. {found.examples()}): its {split} "
            f"numbers would be training numbers; put held-out images in the {split} split, or remove that split (a set "
            f"with one split is noted as such){purpose}")


# -- the checkpoint's own training images ---------------------------------------------------------------
def same_source(a: str, b: str) -> bool:
    """Whether dataset specs ``a`` and ``b`` name the same images (paths however written, class subsets
    that share a class)."""
    try:
        pa, pb = parse_spec(a), parse_spec(b)
    except JemevalError:
        return False
    if pa.classes is not None and pb.classes is not None and not set(pa.classes) & set(pb.classes):
        return False
    whole = [absolute_spec(str(Spec(p.name, p.variant, p.options))) for p in (pa, pb)]
    return whole[0] == whole[1]


def trained_on_note(model, data: str, split: str, ds: Dataset, *, context) -> str | None:
    """The note for images of the set the checkpoint records as its training set: its ``train`` split,
    or any split of a set without a test split (all of them are its training images), less the images
    ``jemeval train`` held out for validation where the checkpoint records them."""
    recorded = (getattr(model, "metadata", None) or {}).get("dataset")
    if not isinstance(recorded, str) or not same_source(recorded, data):
        return None
    if split != "train" and has_test_split(ds):
        return None
    held = held_out_indices(model, data, len(load_dataset(data, "train", context.data_root, context.download)))
    kept = f", all but the {len(held)} it held out for validation" if held is not None else ""
    which = f"its {split} split" if has_test_split(ds) else "every split of it (it has no test split)"
    return (f"the evaluated images are images the model was trained on: {data} is the set its checkpoint records as "
            f"its training set, and {which} holds its training images{kept}; these are training numbers, not "
            "held-out ones")
