"""Interleaved timing for the benchmarks: ratios measured in one run on a noisy machine.

Shared machines make absolute times meaningless and sequential A-then-B comparisons biased (the
load changes between them). Every benchmark here therefore runs its variants round-robin
(A B C A B C ...) and reports medians, under two clocks:

* wall:  ``time.perf_counter``, what a user waits for;
* cpu:   ``time.process_time`` of this process, which other processes' load barely affects. With
         one thread (the CPU default here) it is the work done; with more threads it also counts
         OpenMP spin-waiting, and wall-clock ratios drift with the load of the other processes.

Ratios between variants of the same run are the numbers to trust and compare.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch


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


def header(title: str, device: torch.device) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return (f"# {title}\n# torch {torch.__version__}, device {device} ({name}), threads {torch.get_num_threads()}, "
            f"{os.cpu_count()} CPUs, load average {load:.1f} at start")


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:9.1f}"
