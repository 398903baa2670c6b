"""DataLoader worker processes that fail as the main process does: in one line.

A :class:`~jemeval.errors.JemevalError` raised while a worker reads an example (a file that is no
image, an image of another size) would come back from the DataLoader with the worker's traceback
folded into its message: several lines where the same mistake read without workers is one
(:func:`jemeval.data.iterate_batches` uses these pieces when ``num_workers > 0``).
"""
from __future__ import annotations

from torch.utils.data import Dataset, default_collate

from jemeval.errors import JemevalError


class Raised:
    """A :class:`JemevalError` raised while a DataLoader worker read an example, sent back as data."""

    def __init__(self, error: JemevalError):
        self.error = error


class ErrorsAsData(Dataset):
    """``ds`` for DataLoader worker processes: a JemevalError comes back as a :class:`Raised` item,
    raised again in this process as it was (:func:`raise_if_raised`)."""

    def __init__(self, ds: Dataset):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i):
        try:
            return self.ds[i]
        except JemevalError as exc:
            return Raised(exc)


def collate_or_raised(items: list):
    """torch's collation, or the first :class:`Raised` of the batch (sent on as the batch)."""
    return next((item for item in items if isinstance(item, Raised)), None) or default_collate(items)


def raise_if_raised(batch):
    """``batch`` as it is, or the worker's error raised again in this process."""
    if isinstance(batch, Raised):
        raise batch.error
    return batch
