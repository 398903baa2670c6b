"""Content digests of a dataset's images: how a test or OOD image that is also a training image is found.

Two kinds, each compared only with its own kind:

* ``file``: an image folder's images, by the SHA-256 of each file's bytes
  (:func:`jemeval.provenance.file_sha256`: kept per process by path, inode, size and change times,
  so a file is read once per process, and the data hash in the provenance reuses it). A training
  split is hashed only where a file could equal an evaluated one (:func:`digests_against`: the same
  size, then the same first and last 4 KiB), so ImageNet's 1.28 million training files cost a
  ``stat`` each, not 140 GB read;
* ``row``: an npz array's images, by a 128-bit multilinear hash of each image's stored bytes, made
  for a chunk of rows at a time with numpy (no Python loop over images) and kept per process by
  file, file state and array. Two rows with equal digests are compared byte for byte before they
  count as one image (:func:`same_images`), so counts are exact.

Rows are compared only with rows of the same dtype and image shape. A dataset of neither kind (a
registered set, an in-memory array, a plugin's) has no digests: nothing is compared.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset, Subset

from jemeval.provenance import file_sha256
from jemeval.stored_images import CHUNK_BYTES, StoredImages, release

_VOID = np.dtype((np.void, 16))
_ROW_CACHE: dict[tuple, np.ndarray] = {}


@dataclass
class Digests:
    """One 16-byte digest per image of a dataset (``values``: N x 2 uint64), of one ``kind``
    (``file``, or ``row:<dtype>:<image shape>``), and what names each image in a message."""

    kind: str
    values: np.ndarray
    base: Dataset  # the ImageFiles or StoredImages the images come from
    rows: np.ndarray  # the base's index of each image

    def __len__(self) -> int:
        return len(self.values)

    def name(self, i: int) -> str:
        """Image ``i`` as a message names it: its file, or its row of the npz array."""
        row = int(self.rows[i])
        if self.kind == "file":
            return repr(str(self.base.files[row]))
        return f"{self.base.info.get('array', 'row')}[{row}]"


def base_and_rows(ds: Dataset) -> tuple[Dataset, np.ndarray | None]:
    """(the dataset under ``ds``, the rows of it ``ds`` holds in order, None for all): through torch's
    ``Subset`` (:func:`jemeval.data.take`) and :class:`jemeval.data.ClassSubset` (``base``, ``indices``)."""
    rows = None
    while True:
        if isinstance(ds, Subset):
            inner, ds = ds.indices, ds.dataset
        elif hasattr(ds, "base") and hasattr(ds, "indices"):
            inner, ds = ds.indices, ds.base
        else:
            return ds, rows
        inner = np.asarray(inner, dtype=np.int64)
        rows = inner if rows is None else inner[rows]


def digests(ds: Dataset) -> Digests | None:
    """The digests of every image of ``ds`` in order, or None when its images come from neither
    files nor an npz array."""
    base, rows = base_and_rows(ds)
    if isinstance(base, StoredImages) and base.info.get("path") and base.info.get("array"):
        values, kind = _row_digests(base), f"row:{base.stored.dtype}:{tuple(base.stored.shape[1:])}"
    elif _reads_files(base):
        values, kind = _file_digests(base.files), "file"
    else:
        return None
    rows = np.arange(len(base)) if rows is None else rows
    return Digests(kind, values[rows], base, rows)


def _reads_files(base: Dataset) -> bool:
    """Whether ``base`` reads its images from files (an image folder, a list of files)."""
    return isinstance(getattr(base, "files", None), list) and hasattr(base, "transform")


def digests_against(training: Dataset, evaluated: Digests) -> Digests | None:
    """The digests of the images of ``training`` that could equal an image of ``evaluated``: for files,
    only those of a size some evaluated file has and, among them, the same first and last 4 KiB (read
    for both sides); the rest cannot be identical, so they are never read whole. Rows are all hashed
    (numpy hashes an npz at memory speed). :func:`same_images` on the result finds exactly what it finds
    on every training image's digest (tested against hashing them all)."""
    base, rows = base_and_rows(training)
    if evaluated.kind != "file" or not _reads_files(base):
        return digests(training)
    rows = np.arange(len(base)) if rows is None else rows
    keep = _could_equal([base.files[r] for r in rows], [evaluated.base.files[r] for r in evaluated.rows])
    rows = rows[keep]
    return Digests("file", _file_digests([base.files[r] for r in rows]), base, rows)


def _could_equal(candidates: list[Path], targets: list[Path]) -> np.ndarray:
    """Indices of ``candidates`` with the size and the edge bytes of some file of ``targets``."""
    target_sizes = np.array([os.stat(f).st_size for f in targets], dtype=np.int64)
    sizes = np.array([os.stat(f).st_size for f in candidates], dtype=np.int64)
    maybe = np.flatnonzero(np.isin(sizes, target_sizes))
    if not len(maybe):
        return maybe
    shared = np.isin(target_sizes, sizes[maybe])
    edges = {(int(size), _edges(f)) for f, size, keep in zip(targets, target_sizes, shared) if keep}
    return np.array([i for i in maybe if (int(sizes[i]), _edges(candidates[i])) in edges], dtype=np.int64)


def _edges(path: Path, block: int = 4096) -> bytes:
    """A file's first and last ``block`` bytes (the whole file when it is shorter than two blocks)."""
    with open(path, "rb") as fh:
        head = fh.read(block)
        if len(head) < block:
            return head
        fh.seek(-min(block, os.fstat(fh.fileno()).st_size - block), os.SEEK_END)
        return head + fh.read(block)


def _file_digests(files: list[Path]) -> np.ndarray:
    """The first 16 bytes of each file's SHA-256 (each file read once per process)."""
    raw = b"".join(bytes.fromhex(file_sha256(f)[:32]) for f in files)
    return np.frombuffer(raw, dtype="<u8").reshape(len(files), 2).copy()


def _row_digests(base: StoredImages) -> np.ndarray:
    """Per row of the npz array, two 64-bit multilinear hashes of its bytes, kept for this process."""
    path = Path(base.info["path"]).resolve()
    st = os.stat(path)
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, base.info["array"],
           str(base.stored.dtype), tuple(base.stored.shape))
    if key not in _ROW_CACHE:
        _ROW_CACHE[key] = row_digests(base.stored)
    return _ROW_CACHE[key]


def row_digests(x: np.ndarray) -> np.ndarray:
    """N x 2 uint64: sum_j k_j w_j (mod 2^64) over the 64-bit words w of each row's bytes, for two
    fixed random key vectors k (odd), a chunk of rows at a time. Equal rows have equal digests; two
    different rows collide with probability about 2^-64 per key (then :func:`same_images` still
    tells them apart)."""
    n = len(x)
    out = np.empty((n, 2), dtype=np.uint64)
    if n == 0:
        return out
    row_bytes = int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize
    words = -(-row_bytes // 8)
    keys = np.random.default_rng(0x6A656D).integers(0, 2**64, size=(2, words), dtype=np.uint64, endpoint=False) | 1
    per = max(1, CHUNK_BYTES // max(1, row_bytes))
    for start in range(0, n, per):  # chunks of rows: no whole-set copy of a memory-mapped array
        chunk = np.ascontiguousarray(x[start:start + per]).reshape(-1, row_bytes).view(np.uint8)
        if row_bytes % 8:
            chunk = np.pad(chunk, ((0, 0), (0, words * 8 - row_bytes)))
        w = chunk.view("<u8")
        out[start:start + len(w)] = np.stack([(w * keys[0]).sum(axis=1), (w * keys[1]).sum(axis=1)], axis=1)
        release(x)
    return out


def same_images(evaluated: Digests, training: Digests) -> tuple[np.ndarray, np.ndarray]:
    """(indices into ``evaluated``, the index into ``training`` of an identical image) of every
    evaluated image that is also a training image; empty when the two are of different kinds."""
    if evaluated.kind != training.kind or not len(evaluated) or not len(training):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    a = np.ascontiguousarray(evaluated.values).view(_VOID).ravel()
    b = np.ascontiguousarray(training.values).view(_VOID).ravel()
    order = np.argsort(b, kind="stable")
    at = np.minimum(np.searchsorted(b[order], a), len(b) - 1)
    hit = np.flatnonzero(b[order][at] == a)
    match = order[at[hit]]
    if evaluated.kind != "file" and len(hit):  # a hash, not SHA-256: confirm byte for byte
        mine = np.asarray(evaluated.base.stored[evaluated.rows[hit]])
        theirs = np.asarray(training.base.stored[training.rows[match]])
        equal = (mine == theirs).reshape(len(hit), -1).all(axis=1)
        hit, match = hit[equal], match[equal]
    return hit, match
