"""Where `jemeval train` loses time against its own iteration: TrainStep alone vs the trainer's loop.

    python benchmarks/trainer_overhead.py [--device cuda] [--arch wrn:depth=28,widen=10,norm=none]
        [--batch 64] [--steps 20] [--iterations 20] [--repeats 3] [--compile] [--progress]

One real :class:`jemeval.training.trainer.Trainer` is set up on a random CIFAR-shaped npz of
``iterations x batch`` training images (written to a temporary folder), and these variants then
train ITS model on ITS data, each for ``iterations`` iterations, round-robin (A B C A B C ...):

* step-median: ``iterations`` x the median of single synchronised ``TrainStep`` calls: the
  method of benchmarks/train_iteration.py (what the microbenchmark figures mean);
* step:        ``TrainStep`` alone in a loop over the epoch's batches, sliced beforehand;
* step+feed:   the same with the trainer's feed (indexing the epoch's permutation on the device)
               and the learning-rate schedule;
* trainer:     ``Trainer._epoch()``, the loop the CLI runs (statistics, the divergence monitor and
               its check every ``check_every`` iterations, stop requests, the progress bar with
               ``--progress``), without the epoch's end (validation, checkpoints);
* trainer/1check: the same with one divergence check per epoch (no mid-epoch host sync).

Printed: seconds per iteration and images/s of each, the ratio to ``step``, and a breakdown of one
instrumented trainer epoch: host milliseconds per iteration in each part of the loop, host syncs per
iteration (CUDA: ``torch.cuda.set_sync_debug_mode``), Python garbage-collection pauses, and the
peak GPU memory. On CUDA the host times of asynchronous parts are launch times; waiting for the
GPU shows up in the part that synchronises (the check).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import torch
from timing import add_common_args, header, interleave, setup, sync

from jemeval.training import ddp, splits
from jemeval.training import trainer as trainer_module
from jemeval.training.config import resolve_config
from jemeval.training.divergence import DivergenceMonitor
from jemeval.training.position import EpochStats
from jemeval.training.recipes import PAPER
from jemeval.training.reporting import Reporter
from jemeval.training.trainer import StopRequest, Trainer, opened, run_rate


def write_npz(path: Path, n: int, shape: tuple[int, ...], classes: int, seed: int) -> Path:
    """``n`` random uint8 images of ``shape`` with random labels (every class present)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    y = np.arange(n) % classes
    np.savez(path, x=x, y=y)
    return path


def build_trainer(out: Path, *, arch: str, batch: int, steps: int, iterations: int, input_shape: tuple[int, ...],
                  classes: int, device: torch.device, seed: int = 0, **switches) -> Trainer:
    """A Trainer on a fresh npz of ``iterations x batch`` training images (and ``batch`` validation
    images), configured as ``jemeval train npz:FILE ...`` would be; ``switches``: compile, bf16,
    channels_last, progress (None keeps the trainer's default)."""
    data = write_npz(out / "data.npz", iterations * batch + batch, input_shape, classes, seed)
    config = resolve_config(f"npz:{data}", arch=arch, batch_size=batch, sgld_steps=steps, val_size=batch,
                            epochs=10 ** 5, lr=PAPER["lr"], warmup_iters=PAPER["warmup_iters"], out=str(out / "run"),
                            device=str(device), grid_every=0, test_eval=False,
                            seed=seed, **switches)
    return Trainer(config)


def epoch_batches(trainer: Trainer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The current epoch's batches, sliced beforehand (what ``step`` trains on)."""
    p, s = trainer.parts, trainer.position
    iterations, size = ddp.batch_plan(len(p.data.x), trainer.config.batch_size, p.ctx.world_size)
    splits.epoch_order(s, len(p.data.x), p.ctx, trainer.config.seed, p.generator.device)
    return [splits.batch(p.data, s, b, size, p.generator, p.device)[:2] for b in range(iterations)]


def variants(trainer: Trainer, batches, device: torch.device) -> dict:
    """The loops to compare, each ``len(batches)`` iterations on the trainer's model and data."""
    cfg, p, s = trainer.config, trainer.parts, trainer.position

    def step_median():
        times = []
        for x, y in batches:
            sync(device)
            t0 = time.perf_counter()
            trainer.train_step(x, y)
            sync(device)
            times.append(time.perf_counter() - t0)
        step_median.epochs.append(statistics.median(times) * len(times))

    step_median.epochs = []  # per call: iterations x the median single-iteration time

    def step():
        for x, y in batches:
            trainer.train_step(x, y)

    def step_feed():
        iterations, size = ddp.batch_plan(len(p.data.x), cfg.batch_size, p.ctx.world_size)
        splits.epoch_order(s, len(p.data.x), p.ctx, cfg.seed, p.generator.device)
        for b in range(iterations):
            x, y, x_data = splits.batch(p.data, s, b, size, p.generator, p.device)
            for group in p.optimizer.param_groups:
                group["lr"] = run_rate(cfg, s.step, s.epoch, s.adjustments.lr_scale)
            trainer.train_step(x, y, x_data)

    def trainer_epoch(check_every: int | None = None):
        def run():
            saved = cfg.check_every
            if check_every is not None:
                cfg.check_every = check_every
            try:
                trainer._epoch()
            finally:
                cfg.check_every = saved
        return run

    return {"step-median": step_median, "step": step, "step+feed": step_feed, "trainer": trainer_epoch(),
            "trainer/1check": trainer_epoch(len(batches))}


def end_epoch_only_counts(trainer: Trainer) -> None:
    """The epoch's end (validation, checkpoints) is not what is measured: just start the next epoch."""
    trainer._end_epoch = lambda started: trainer.position.next_epoch()


@contextmanager
def timed_parts(trainer: Trainer, totals: dict[str, float], counts: dict[str, int]):
    """Host time spent in each part of the trainer's loop (wrappers removed on exit)."""
    def wrap(fn, name):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                totals[name] += time.perf_counter() - t0
                counts[name] += 1
        return timed

    patches = [(trainer_module, "batch", "feed (indexing)"), (trainer_module, "run_rate", "lr schedule"),
               (EpochStats, "add", "epoch statistics"), (DivergenceMonitor, "record", "monitor.record"),
               (trainer_module, "check", "divergence check (sync)"),
               (Reporter, "show_stats", "progress postfix (sync)"), (StopRequest, "agreed", "stop request")]
    with ExitStack() as stack:
        for owner, attr, name in patches:
            original = owner.__dict__[attr]
            fn = original.__func__ if isinstance(original, staticmethod) else original
            new = wrap(fn, name)
            setattr(owner, attr, staticmethod(new) if isinstance(original, staticmethod) else new)
            stack.callback(setattr, owner, attr, original)
        step = trainer.train_step
        trainer.train_step = wrap(step, "TrainStep (host)")
        stack.callback(setattr, trainer, "train_step", step)
        yield


@contextmanager
def gc_pauses(totals: dict[str, float], counts: dict[str, int]):
    """Time spent in Python's garbage collector while the block runs."""
    started: list[float] = []

    def callback(phase, info):
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            totals["gc pauses"] += time.perf_counter() - started.pop()
            counts["gc pauses"] += 1

    gc.callbacks.append(callback)
    try:
        yield
    finally:
        gc.callbacks.remove(callback)


@contextmanager
def counted_syncs(device: torch.device, counts: dict[str, int]):
    """Host-device synchronisations in the block (CUDA's sync debug mode; nothing to count on CPU)."""
    if device.type != "cuda":
        yield
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(1)
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(0)
    counts["host syncs"] = sum("synchroniz" in str(w.message) for w in caught)


def breakdown(trainer: Trainer, iterations: int, device: torch.device) -> None:
    """One instrumented trainer epoch: host ms per iteration per part, syncs, GC pauses."""
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    sync(device)
    t0 = time.perf_counter()
    with timed_parts(trainer, totals, counts), gc_pauses(totals, counts), counted_syncs(device, counts):
        trainer._epoch()
        sync(device)
    total = time.perf_counter() - t0
    print(f"breakdown of one instrumented trainer epoch ({iterations} iterations, {1e3 * total / iterations:.1f} ms "
          "per iteration, host clock):")
    parts = sum(v for k, v in totals.items() if k != "gc pauses")
    for name, seconds in [*totals.items(), ("other (loop, bar, epoch start/end)", total - parts)]:
        calls = counts.get(name)
        print(f"  {name:36s} {1e3 * seconds / iterations:9.3f} ms/iter  {100 * seconds / total:5.1f}%"
              + (f"  ({calls} calls)" if calls is not None else ""))
    if device.type == "cuda":
        print(f"  host syncs: {counts['host syncs'] / iterations:.2f} per iteration; peak GPU memory "
              f"{torch.cuda.max_memory_allocated(device) / 2 ** 30:.2f} GiB")


def report(times: dict[str, dict[str, float]], median_seconds: float, iterations: int, batch: int) -> None:
    base = times["step"]["wall"]
    print(f"{'variant':16s} {'s/epoch':>8s} {'ms/iter':>8s} {'img/s':>7s} {'vs step':>8s}   (cpu s/epoch)")
    rows = {"step-median": {"wall": median_seconds, "cpu": times["step-median"]["cpu"]}, **{
        k: v for k, v in times.items() if k != "step-median"}}
    for name, r in rows.items():
        print(f"{name:16s} {r['wall']:8.3f} {1e3 * r['wall'] / iterations:8.1f} {iterations * batch / r['wall']:7.1f} "
              f"{base / r['wall']:7.3f}x   ({r['cpu']:.3f})")
    print(f"trainer / step: wall {times['trainer']['wall'] / base:.3f}, cpu "
          f"{times['trainer']['cpu'] / times['step']['cpu']:.3f}; the trainer runs at "
          f"{100 * base / times['trainer']['wall']:.1f}% of TrainStep's speed "
          f"({100 * median_seconds / times['trainer']['wall']:.1f}% of the single-call median's)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="wrn:depth=16,widen=4,norm=none")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="SGLD steps per iteration")
    parser.add_argument("--iterations", type=int, default=10, help="iterations per timed epoch")
    parser.add_argument("--input-shape", default="3,32,32")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="torch.compile (default: the trainer's default for the device)")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--progress", action="store_true", help="show the progress bar (as on a terminal)")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="torch.backends.cudnn.benchmark = True (cuDNN times its convolution algorithms)")
    add_common_args(parser, repeats=3)
    args = parser.parse_args(argv)
    device = setup(args)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(Path(tmp), arch=args.arch, batch=args.batch, steps=args.steps,
                                iterations=args.iterations, classes=args.classes, device=device, seed=args.seed,
                                input_shape=tuple(int(s) for s in args.input_shape.split(",")), compile=args.compile,
                                bf16=args.bf16, channels_last=args.channels_last, progress=args.progress)
        with opened(trainer.config) as session:
            trainer._setup(session)
            end_epoch_only_counts(trainer)
            print(header(f"trainer overhead: {args.arch}, batch {args.batch}, {args.steps} SGLD steps, "
                         f"{args.iterations} iterations per epoch", device))
            print(f"# fast path: {trainer.parts.fastpath.settings()}; check_every {trainer.config.check_every}; "
                  f"cudnn.benchmark {torch.backends.cudnn.benchmark}")
            batches = epoch_batches(trainer)
            loops = variants(trainer, batches, device)
            times = interleave(loops, args.repeats, device, warmup=1)
            report(times, statistics.median(loops["step-median"].epochs), len(batches), args.batch)
            breakdown(trainer, len(batches), device)


if __name__ == "__main__":
    main()
