"""Handing freed memory back to the operating system during a long pass over a dataset.

A gradient pass (``ood --score gradnorm``: one forward with grad and one backward per batch)
allocates and frees activation buffers of a few MB every batch, while the batch's outputs (scores,
logits: a few KB) are kept. glibc's allocator serves the buffers from its heap once its dynamic
mmap threshold has risen past their size, and the kept outputs, placed between them, stop the heap
from shrinking: peak memory then grows with the number of images (2.3x at 50k CIFAR-shaped images
against 1k, benchmarks/memory_scaling.py) although nothing per image is held but the outputs.
``malloc_trim(0)`` returns every free page of the heap to the system (madvise), so memory stays flat in
N; it costs a walk of the allocator's free lists, well under a millisecond, once every few batches.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim`` (None on other C libraries and platforms)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Return the allocator's free heap pages to the system; False where that is not possible."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
