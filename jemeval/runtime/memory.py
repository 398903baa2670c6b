"""The C allocator's settings for jemeval's batch loops, and handing freed memory back to the system.

**Kept buffers (issue 37, item 4).** A batch of 256 CIFAR-shaped images makes activation buffers
of tens of MB (an ImageNet batch: hundreds). glibc serves a request above its mmap threshold (at
most 32 MB, and dynamic) with a fresh ``mmap`` and unmaps it on ``free``; every batch then maps new
pages and the kernel zeroes each one again on first touch: measured on a 2-core AMD EPYC, one
thread, half the process CPU time of ``ood --score logpx,maxprob,gradnorm`` and of a plain torch
loop was system time. :func:`tune_allocator` (called once at CLI start-up, and available to Python
callers) sets ``mallopt(M_MMAP_MAX, 0)`` (no request is served by mmap: the buffers of a batch come
from the heap and, freed, are reused by the next batch) and raises ``M_TRIM_THRESHOLD`` (a free top
of the heap is not handed back after every batch only to be faulted in again). ``GLIBC_TUNABLES``
would do the same but only when set before the process starts; ``mallopt`` works at run time.
Peak memory is then the heap a batch needs, held for the run: flat in the number of images
(benchmarks/memory_scaling.py). On a C library without ``mallopt`` (macOS, musl, Windows) nothing is
changed and :func:`allocator_setting` says so; every result's provenance records it.

**Trimming.** A gradient pass keeps a few KB of outputs per batch, placed between freed buffers;
``malloc_trim(0)`` returns the free pages inside the heap to the system (madvise), so memory stays
flat in N even when those outputs fragment it. With the allocator tuned, a trim makes the next batch
fault in again the pages it hands back, so the batch loop trims only where the allocator is not tuned
(:func:`trim_needed`).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

#: set to ``default`` to leave glibc's allocator as it is (a comparison, or memory held matters more)
ALLOCATOR_ENV = "JEMEVAL_ALLOCATOR"
#: glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
#: the free top of the heap kept before it is handed back to the system: above any batch's buffers
#: (the largest value mallopt's int takes, 2 GiB)
TRIM_THRESHOLD = 2**31 - 1
#: batches between two checks of a gradient pass (:func:`keep_memory_flat`), and the growth of resident
#: memory over its first reading past which a tuned allocator's free pages are handed back
TRIM_EVERY, GROWTH = 8, 1.1
_FIRST_RSS: list[int | None] = [None]
_STATE: dict[str, object] = {"allocator": "default", "reason": "tune_allocator() not called"}


@functools.cache
def _libc():
    """The process's C library when it is glibc (it has ``malloc_trim`` and ``mallopt``), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        libc.malloc_trim  # noqa: B018 (present, or AttributeError: not glibc)
        return libc
    except (OSError, AttributeError):
        return None


def tune_allocator() -> dict[str, object]:
    """Keep the buffers a batch needs (see the module's docstring); idempotent. Returns
    :func:`allocator_setting`. A no-op, recorded, where the C library is not glibc."""
    if _STATE.get("allocator") == "glibc":
        return allocator_setting()
    if os.environ.get(ALLOCATOR_ENV, "") == "default":
        _STATE.clear()
        _STATE.update(allocator="default", reason=f"{ALLOCATOR_ENV}=default")
        return allocator_setting()
    libc = _libc()
    if libc is None:
        _STATE.clear()
        _STATE.update(allocator="default", reason=f"not glibc ({sys.platform}): mallopt unavailable")
        return allocator_setting()
    ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    _STATE.clear()
    if ok:
        _STATE.update(allocator="glibc", glibc=libc.gnu_get_libc_version().decode(),
                      mallopt={"M_MMAP_MAX": 0, "M_TRIM_THRESHOLD": TRIM_THRESHOLD})
    else:
        _STATE.update(allocator="default", reason="mallopt refused the settings")
    return allocator_setting()


def allocator_setting() -> dict[str, object]:
    """What this process's allocator runs with, for provenance: ``{"allocator": "glibc", "mallopt":
    {...}}`` once tuned, else ``{"allocator": "default", "reason": ...}``."""
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in _STATE.items()}


def keep_memory_flat(default_allocator: bool = True) -> bool:
    """Called every :data:`TRIM_EVERY` batches of a gradient pass and at the end of every pass: hand the
    heap's free pages back (:func:`release_freed_memory`) so that memory stays flat in N. With glibc's
    defaults, always (as before). With the allocator tuned, only when the resident memory has grown
    past :data:`GROWTH` times its first reading in this process: a trim makes the next batch fault
    in again the pages it handed back, which is the kernel time tuning saves. ``default_allocator=False``
    (the trainer): nothing with glibc's defaults, whose training memory is flat. Returns whether it trimmed."""
    if _STATE.get("allocator") != "glibc":
        return release_freed_memory() if default_allocator else False
    rss = resident_bytes()
    if rss is None:
        return release_freed_memory()
    if _FIRST_RSS[0] is None:
        _FIRST_RSS[0] = rss
        return False
    return release_freed_memory() if rss > GROWTH * _FIRST_RSS[0] else False


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux: /proc/self/statm), None where it cannot be read."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def release_freed_memory() -> bool:
    """Return the allocator's free heap pages to the system; False where that is not possible."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
