"""Interleaved timing for the benchmarks: ratios measured in one run on a noisy machine.

Shared machines make absolute times meaningless and sequential A-then-B comparisons biased (the
load changes between them). Every benchmark here therefore runs its variants round-robin
(A B C A B C ...) and reports medians, under two clocks:

* wall:  ``time.perf_counter``, what a user waits for;
* cpu:   ``time.process_time`` of this process, which other processes' load barely affects. With
         one thread (the CPU default here) it is the work done; with more threads it also counts
         OpenMP spin-waiting, and wall-clock ratios drift with the load of the other processes.

Ratios between variants of the same run are the numbers to trust and compare. :func:`flops_of` adds
the other yardstick: the FLOPs a call does, so a time becomes an achieved FLOP/s to hold against
the processor's peak (how close to the hardware's limit a kernel-bound step runs).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


def add_common_args(parser: argparse.ArgumentParser, repeats: int) -> None:
    parser.add_argument("--repeats", type=int, default=repeats, help="timed rounds (medians are reported)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads: default 1 on CPU (the steadiest CPU-time ratios on a shared "
                             "machine), torch's choice on CUDA; 0 = torch's choice")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)


def setup(args: argparse.Namespace) -> torch.device:
    device = torch.device(args.device)
    threads = args.threads if args.threads is not None else (1 if device.type == "cpu" else 0)
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    return device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleave(variants: dict[str, Callable[[], object]], repeats: int, device: torch.device,
               warmup: int = 1) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds per call of each variant, measured round-robin."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()
            sync(device)
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            sync(device)
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync(device)
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    return {k: {"wall": statistics.median(wall[k]), "cpu": statistics.median(cpu[k])} for k in variants}


class FlopCount(TorchDispatchMode):
    """Counts the FLOPs of the operators run inside the block with torch's own formulas
    (``torch.utils.flop_counter.flop_registry``: convolutions and their backward, matmuls,
    attention; elementwise work counts 0, as in FlopCounterMode).

    Not FlopCounterMode itself: its per-module tracker raises when ``torch.autograd.grad`` is taken
    with respect to a module's input, which is exactly what every SGLD step does. Totals equal
    FlopCounterMode's wherever it runs (tests/test_benchmark_timing.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out


def flops_of(fn: Callable[[], object]) -> int:
    """The FLOPs of one call of ``fn()`` (run once, on whatever device its tensors live)."""
    with FlopCount() as count:
        fn()
    return count.total


def gemm_ceiling(device: torch.device, dtype: torch.dtype = torch.float32, n: int | None = None,
                 repeats: int = 3) -> float:
    """FLOP/s of one large square matmul (n x n by n x n; n = 2048 on a CPU, 8192 on a GPU) in
    ``dtype``: a practical peak of the device, which a kernel-bound step is held against."""
    n = n or (8192 if device.type == "cuda" else 2048)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    a @ b  # warm-up: the library picks its kernel
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times)


def processor_name() -> str:
    """The CPU's model name and, on Linux, its family/model numbers (kernels differ between
    generations of the same brand, so figures are recorded with them)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
                if not line.strip():
                    break  # the first processor's block is enough
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f", family {fields['cpu family']} model {fields['model']}"
    return name


def header(title: str, device: torch.device) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else processor_name()
    return (f"# {title}\n# torch {torch.__version__}, device {device} ({name}), threads {torch.get_num_threads()}, "
            f"{os.cpu_count()} CPUs, load average {load:.1f} at start")


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:9.1f}"
