"""Images kept as they are stored, converted to the model's [-1, 1] floats one batch at a time.

Why: a CIFAR-sized set held whole as float32 is 4x its uint8 file (600 MB for 50k images), and the
old loader made further whole-set copies while converting. Here an uncompressed ``.npz`` member is
memory-mapped where it lies in the zip (``np.load``'s ``mmap_mode`` does not map npz members), a
uint8 array stays uint8, and :meth:`StoredImages.rows` builds one float batch at a time. The pages a
batch touched are handed back to the page cache after it (``MADV_DONTNEED``), so the process's
resident memory stays flat in the number of images: the file's bytes are read from the OS cache,
never held by the process. A compressed member cannot be mapped: it is read whole, still in its
stored dtype (``np.savez`` instead of ``np.savez_compressed`` makes it mappable).

Nothing here trusts the file: the zip entry must be STORED and unencrypted, its CRC-32 is checked
(what ``np.load`` checks when it reads a member), its ``.npy`` header parsed by ``numpy.lib.format``
and the payload must fit in the entry. Errors are :class:`~jemeval.errors.UsageError` lines naming
the file; the caller adds how to save a readable one.
"""
from __future__ import annotations

import math
import mmap
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from jemeval.errors import UsageError

#: bytes read at a time when checking a member's CRC-32 or scanning float images
CHUNK_BYTES = 1 << 22
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zipfile's structFileHeader: 30 bytes


def mapped_member(path: Path, key: str) -> np.ndarray | None:
    """The array ``key`` of the npz at ``path`` as a read-only ``np.memmap`` of the file, or None when
    the member is compressed (the caller reads it whole). Refuses, in one line, an entry whose CRC-32,
    header or size do not hold up: a tampered or truncated file is not mapped."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(f"{key}.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    if info.flag_bits & 0x1:
        raise UsageError(f"{str(path)!r}: array {key!r} is encrypted")
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        header = fh.read(_LOCAL_HEADER.size)
        if len(header) != _LOCAL_HEADER.size or header[:4] != zipfile.stringFileHeader:
            raise UsageError(f"{str(path)!r}: array {key!r} has a damaged zip entry header")
        fields = _LOCAL_HEADER.unpack(header)
        start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
        _check_crc(fh, path, key, start, info)
        fh.seek(start)
        dtype, shape, fortran = _npy_header(fh, path, key)
        offset = fh.tell()
    size = _check_payload(path, key, dtype, shape, start + info.file_size - offset)
    if size == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")


def member_header(path: Path, key: str) -> tuple[np.dtype, tuple[int, ...], bool]:
    """(dtype, shape, Fortran order) the ``.npy`` header of the npz member ``key`` declares, compressed
    or not, once its payload is known to fit in the entry: what to check before ``np.load`` reads a
    member, whose own arithmetic on a forged shape warns (an int64 overflow) or fails obscurely."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(f"{key}.npy")
        if info.flag_bits & 0x1:
            raise UsageError(f"{str(path)!r}: array {key!r} is encrypted")
        with zf.open(info) as fh:
            dtype, shape, fortran = _npy_header(fh, path, key)
            header = fh.tell()
    _check_payload(path, key, dtype, shape, info.file_size - header)
    return dtype, shape, fortran


def _check_payload(path: Path, key: str, dtype: np.dtype, shape: tuple[int, ...], available: int) -> int:
    """The bytes a header's ``shape`` promises, in Python integers (no int64 to overflow), refused in
    one line when a dimension is negative or they do not fit in the ``available`` bytes."""
    if any(s < 0 for s in shape):
        raise UsageError(f"{str(path)!r}: array {key!r} has a .npy header with a negative dimension (shape {shape})")
    size = math.prod(shape) * dtype.itemsize
    if size > available:
        promised = f"{size} bytes" if size < 10**30 else f"about 10^{len(str(size)) - 1} bytes"
        raise UsageError(f"{str(path)!r}: array {key!r} is truncated or damaged (its .npy header promises shape "
                         f"{_short(shape)}, {promised}; the file holds {max(available, 0)})")
    return size


def _short(shape: tuple[int, ...]) -> str:
    text = str(shape)
    return text if len(text) <= 80 else text[:77] + "...)"


def _check_crc(fh, path: Path, key: str, start: int, info: zipfile.ZipInfo) -> None:
    """The entry's stored bytes against its CRC-32, read in chunks (not mapped: no resident pages)."""
    fh.seek(start)
    crc, left = 0, info.file_size
    while left > 0:
        chunk = fh.read(min(CHUNK_BYTES, left))
        if not chunk:
            raise UsageError(f"{str(path)!r}: array {key!r} is truncated ({left} bytes missing)")
        crc, left = zlib.crc32(chunk, crc), left - len(chunk)
    if crc != info.CRC:
        raise UsageError(f"{str(path)!r}: array {key!r} fails its CRC-32 check (the file was changed or damaged)")


def _npy_header(fh, path: Path, key: str) -> tuple[np.dtype, tuple[int, ...], bool]:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        shape, fortran, dtype = (fmt.read_array_header_1_0(fh) if version == (1, 0)
                                 else fmt.read_array_header_2_0(fh))
    except (ValueError, OSError, EOFError) as exc:
        raise UsageError(f"{str(path)!r}: array {key!r} has no valid .npy header "
                         f"({(str(exc).splitlines() or [''])[0][:100]})") from None
    if dtype.hasobject:
        raise UsageError(f"{str(path)!r}: array {key!r} is an object array (jemeval loads numeric arrays only)")
    return dtype, tuple(int(s) for s in shape), bool(fortran)


def release(array: np.ndarray) -> None:
    """Hand the pages of a memory-mapped array back to the page cache (no-op for an in-memory one):
    they stop counting as this process's memory, and are read again from the cache when touched."""
    mm = getattr(array, "_mmap", None)
    if isinstance(mm, mmap.mmap) and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mm.madvise(mmap.MADV_DONTNEED)


def to_unit_floats(a: np.ndarray) -> np.ndarray:
    """Stored images as float32 in [-1, 1]: uint8 0..255 scaled (the arithmetic the npz loader always
    used, in float32), floats as they are."""
    if a.dtype == np.uint8:  # in place: one allocation per batch, the same float32 values as x / 255.0 * 2 - 1
        out = a.astype(np.float32)
        out /= np.float32(255.0)
        out *= np.float32(2)
        out -= np.float32(1)
        return out
    return a.astype(np.float32)  # always a copy: a batch never points into the mapped file


def image_problems(x: np.ndarray) -> tuple[int, int | None, float, float]:
    """(images holding NaN/inf, the first of them, min, max) of float images, in chunks of images so
    that no whole-set temporary exists; uint8 images have none (0..255 always maps into [-1, 1])."""
    if x.dtype == np.uint8 or len(x) == 0:
        return 0, None, -1.0, 1.0
    per = max(1, CHUNK_BYTES // max(1, x[0].nbytes))
    bad, first, lo, hi = 0, None, np.inf, -np.inf
    for i in range(0, len(x), per):
        chunk = np.asarray(x[i:i + per], dtype=np.float64).reshape(min(per, len(x) - i), -1)
        finite = np.isfinite(chunk).all(1)
        if not finite.all():
            bad += int((~finite).sum())
            first = i + int(np.flatnonzero(~finite)[0]) if first is None else first
        elif chunk.size:
            lo, hi = min(lo, float(chunk.min())), max(hi, float(chunk.max()))
        release(x)
    return bad, first, lo, hi


class StoredImages(Dataset):
    """Images N x C x H x W in their stored dtype (``stored``) (uint8 0..255, or floats in [-1, 1]; a memory map of
    the file or an array in memory) and labels; :meth:`rows` converts one batch to float32 in [-1, 1].
    :func:`jemeval.data.iterate_batches` slices it (and the subsets :func:`jemeval.data.take` makes of
    it) batch by batch: the float images of the whole set never exist at once."""

    def __init__(self, x: np.ndarray, y: torch.Tensor | None, *, num_classes: int | None = None,
                 name: str | None = None, info: dict | None = None, storage: str = "memory"):
        self.stored = x
        self.y = torch.full((len(x),), -1, dtype=torch.long) if y is None else torch.as_tensor(y).long()
        self.num_classes = num_classes
        self.input_shape = tuple(int(s) for s in x.shape[1:])
        self.name = name
        self.info = dict(info or {})
        self.storage = storage  # "memory-mapped" or why it is held in memory

    def __len__(self) -> int:
        return len(self.stored)

    @property
    def x(self) -> torch.Tensor:
        """Every image as one float tensor, made anew on each read: what 0.2's in-memory npz dataset
        offered, for callers that want the whole (small) set; the batch loop never reads it."""
        return self.rows(slice(None))

    def rows(self, index: slice | np.ndarray) -> torch.Tensor:
        """Images ``index`` (a slice or an int array, any order) as float32 N x C x H x W in [-1, 1]."""
        batch = np.ascontiguousarray(to_unit_floats(np.asarray(self.stored[index])))
        release(self.stored)
        return torch.from_numpy(batch)

    def __getitem__(self, i):
        return self.rows(np.asarray([int(i)]))[0], int(self.y[int(i)])


class StoredRows:
    """Rows ``rows`` of a :class:`StoredImages` (all of them for None), indexed like the float tensor of
    those images: ``held[idx]`` (an int tensor or array, any order) converts just those images
    (:meth:`StoredImages.rows`). What training holds instead of its whole set as float: the images
    stay as stored (an npz's uint8, memory-mapped), 4x less than float32 and flat in N when mapped,
    and each batch is the float values a whole conversion would have given, bit for bit."""

    device = torch.device("cpu")

    def __init__(self, base: StoredImages, rows: np.ndarray | None = None) -> None:
        self.base = base
        self.rows = np.arange(len(base), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        self.shape = (len(self.rows), *base.input_shape)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx) -> torch.Tensor:
        idx = idx.cpu().numpy() if torch.is_tensor(idx) else np.asarray(idx)
        return self.base.rows(self.rows[idx.astype(np.int64)])

    def select(self, idx: np.ndarray) -> StoredRows:
        """The rows ``idx`` of these, still as stored (a split carved out of a set)."""
        return StoredRows(self.base, self.rows[np.asarray(idx, dtype=np.int64)])

    def dataset(self) -> Dataset:
        """These images, with the base's labels, as a dataset the batch loop reads batch by batch."""
        return Subset(self.base, self.rows.tolist())


def stored_rows(ds: Dataset) -> tuple[StoredImages, np.ndarray | None] | None:
    """(the :class:`StoredImages` under ``ds``, the rows of it ``ds`` holds in order, None for all) when
    ``ds`` is one, or a chain of subsets of one (torch's ``Subset``, which :func:`jemeval.data.take`
    makes, and :class:`jemeval.data.ClassSubset`, which holds ``base`` and ``indices``); None
    otherwise. Lets a subset be read batch by batch from the stored images, not image by image."""
    rows = None
    while not isinstance(ds, StoredImages):
        if isinstance(ds, Subset):
            inner, ds = ds.indices, ds.dataset
        elif hasattr(ds, "base") and hasattr(ds, "indices"):
            inner, ds = ds.indices, ds.base
        else:
            return None
        inner = np.asarray(inner, dtype=np.int64)
        rows = inner if rows is None else inner[rows]
    return ds, rows


class GeneratedArray:
    """A seeded noise image set (N x C x H x W float32 in [-1, 1]) that exists one block at a time.

    ``make(rows, generator)`` draws ``rows`` images (``torch.rand`` or ``torch.randn`` and elementwise
    arithmetic). Blocks of :data:`GENERATED_BLOCK` rows are drawn in order from one generator: torch's
    CPU draws of consecutive blocks whose sizes are multiples of 16 values are the whole tensor's draws
    bit for bit (tests/test_streaming_data.py checks it), so the set equals the one drawn at once,
    without holding it (50k ImageNet-sized noise images would be 30 GB). The last block also takes
    the rows that do not fill a block: ``torch.randn`` redraws the last 16 values of a tensor whose
    size is not a multiple of 16, so the tail is drawn with the block before it, as in one draw.
    Reading in order (the batch loop, a sorted subset) draws each block once; a jump back restarts
    from the generator state kept every :data:`STATE_EVERY` blocks.
    """

    dtype = np.dtype(np.float32)

    def __init__(self, n: int, shape: tuple[int, ...], seed: int, make) -> None:
        self.shape = (int(n), *shape)
        self._make = make
        self._generator = torch.Generator().manual_seed(int(seed))
        self._saved = {0: self._generator.get_state()}  # block -> the generator's state at its start
        self._next = 0  # the block the generator would draw next
        self._blocks = max(1, int(n) // GENERATED_BLOCK)  # the last one holds the rows left over
        self._last: tuple[int, torch.Tensor] | None = None

    def __len__(self) -> int:
        return self.shape[0]

    def _block(self, k: int) -> torch.Tensor:
        if self._last is not None and self._last[0] == k:
            return self._last[1]
        if k < self._next:  # back: from the last saved state at or before k
            self._next = max(b for b in self._saved if b <= k)
            self._generator.set_state(self._saved[self._next])
        while True:
            start = self._next * GENERATED_BLOCK
            last = self._next == self._blocks - 1
            out = self._make(self.shape[0] - start if last else GENERATED_BLOCK, self._generator)
            self._next += 1
            if self._next % STATE_EVERY == 0:
                self._saved.setdefault(self._next, self._generator.get_state())
            if self._next > k:
                self._last = (k, out)
                return out

    def __getitem__(self, index) -> np.ndarray:
        rows = np.arange(self.shape[0])[index]
        scalar = np.ndim(rows) == 0
        rows = np.atleast_1d(rows).astype(np.int64)
        out = np.empty((len(rows), *self.shape[1:]), np.float32)
        blocks = np.minimum(rows // GENERATED_BLOCK, self._blocks - 1)
        for k in dict.fromkeys(blocks.tolist()):  # in the order the rows ask for them
            where = blocks == k
            out[where] = self._block(int(k)).numpy()[rows[where] - k * GENERATED_BLOCK]
        return out[0] if scalar else out


#: rows per drawn block of a :class:`GeneratedArray` (a multiple of 16: see its docstring), and the
#: blocks between two kept generator states (~5 KB each)
GENERATED_BLOCK, STATE_EVERY = 16, 64


def generated_images(n: int, shape: tuple[int, ...], seed: int, make, *, name: str, info: dict) -> StoredImages:
    """A noise set that is drawn block by block as the batch loop reads it (:class:`GeneratedArray`),
    unlabelled, with the images of ``make(n, generator)`` drawn at once."""
    ds = StoredImages(GeneratedArray(n, tuple(shape), seed, make), None, name=name, info=info, storage="generated")
    return ds
