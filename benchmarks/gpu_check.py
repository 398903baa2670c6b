"""A GPU check anyone can run: the speed table of issue 16, peak memory, grad-norm throughput, and
every command on the device. Fails loudly (exit status 1, the failing command's stderr) on any error.

    python benchmarks/gpu_check.py                       # CUDA, the paper's settings, under 6 minutes
    python benchmarks/gpu_check.py --smoke --device cpu  # tiny sizes: the same code paths on a CPU

1. One JEM training iteration at the paper's settings (WRN-28-10 without normalisation, batch 64,
   20 SGLD steps; each variant built alone, 2 warm-up calls, the median of ``--repeats`` synchronised
   calls): the release-style reference (benchmarks/naive_reference.py: buffer on the host, three
   forwards), jemeval's ``TrainStep`` in fp32, + channels_last, + bf16, + both (the CUDA default),
   optionally + torch.compile (``--compile``), the CUDA default again as a loop runs it
   (``--iterations`` calls back to back, one synchronisation: the host queues the next call while
   the GPU runs this one), the trainer's loop in this process (an epoch of ``--iterations``), and
   the ``jemeval train`` command itself (its second epoch's images/s from metrics.csv). Images/s,
   the ratio to the release, peak GPU memory, and the model TFLOP/s of each: the FLOPs of one
   device-default ``TrainStep`` call (counted with torch's formulas, ``timing.flops_of``: the work the
   JEM iteration needs, charged to every row alike, the release's third forward not counted) over
   the row's time, to hold against the GPU's practical peak, a large bf16 matmul's TFLOP/s
   (``timing.gemm_ceiling``, printed with the table). Hold the trainer and CLI rows against the
   back-to-back row: both are means over a loop, the synchronised medians are not.
2. The grad-norm OOD score's throughput (images/s), release-style vs jemeval fp32 vs bf16 + channels_last.
3. ``jemeval train``, ``ood``, ``calibrate``, ``eval``, ``robust``, ``sample`` and ``report`` (when the
   installed jemeval has it; otherwise "skipped: no report command") on the device, on a small
   CIFAR-shaped npz the script writes, with the model the train command produced.

Markdown tables are printed, ready for benchmarks/README.md (name the GPU and the date there).
"""
from __future__ import annotations

import argparse
import copy
import gc
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from gradnorm_throughput import naive_gradnorm
from naive_reference import naive_iteration
from timing import flops_of, gemm_ceiling, header, sync
from train_iteration import trainer_step
from trainer_overhead import build_trainer, end_epoch_only_counts, write_npz

from jemeval.builtins.scores import gradnorm
from jemeval.energy.factory import create_model
from jemeval.runtime.fastpath import FastPath
from jemeval.training.recipes import PAPER
from jemeval.training.trainer import opened

FULL = {"smoke": False, "warmup": 2, "arch": "wrn:depth=28,widen=10,norm=none", "batch": 64, "steps": 20,
        "repeats": 5, "iterations": 20, "buffer": 10000,
        "score_batch": 128, "n_eval": 256, "eval_batch": 128, "train_images": 64 * 20}
SMOKE = {"smoke": True, "warmup": 1, "arch": "wrn:depth=10,widen=1,norm=none", "batch": 8, "steps": 2,
         "repeats": 1, "iterations": 2, "buffer": 100,
         "score_batch": 8, "n_eval": 16, "eval_batch": 16, "train_images": 8 * 3}
SHAPE, CLASSES = (3, 32, 32), 10
STEP_VARIANTS = {"TrainStep fp32": {}, "TrainStep + channels_last": {"channels_last": True},
                 "TrainStep + bf16": {"bf16": True}, "TrainStep + bf16 + channels_last": {"bf16": True,
                                                                                          "channels_last": True}}


def measure(fn, repeats: int, device: torch.device, warmup: int = 2, calls: int = 1) -> dict[str, float]:
    """Median seconds per call of ``fn()`` (after ``warmup`` calls) and the peak memory, in GiB.

    Each of the ``repeats`` timings synchronises around ``calls`` calls queued back to back. With
    ``calls=1`` every call is timed alone; with more, the host queues the next call while the GPU
    runs this one, as in a training loop, whose epoch mean is to be held against that figure."""
    for _ in range(warmup):
        fn()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(device)
        times.append((time.perf_counter() - t0) / calls)
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    return {"seconds": statistics.median(times), "peak_gib": peak}


def release_variant(base, x, y, size: dict, device: torch.device):
    model = copy.deepcopy(base)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.999))
    buffer = torch.FloatTensor(size["buffer"], *SHAPE).uniform_(-1, 1)  # on the host, as the release keeps it
    return lambda: naive_iteration(model, x, y, buffer, opt, n_steps=size["steps"])


def step_variant(base, x, y, size: dict, device: torch.device, switches: dict):
    """TrainStep with a fast path; ``cudnn_benchmark`` (not a FastPath switch: a process-wide cuDNN
    setting) lets cuDNN time its convolution algorithms instead of choosing them by heuristics."""
    switches = dict(switches)
    benchmark = switches.pop("cudnn_benchmark", False)
    model = copy.deepcopy(base)
    g = torch.Generator(device=device).manual_seed(0)
    step, reason = trainer_step(model, SHAPE, CLASSES, device, g, FastPath(**switches))
    if step is None:
        raise RuntimeError(reason)
    step.sgld.steps = size["steps"]

    def run():
        saved = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = benchmark or saved
        try:
            step(x, y)
        finally:
            torch.backends.cudnn.benchmark = saved
    return run


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def wanted(switches: dict, size: dict, device: torch.device) -> bool:
    """bf16 variants are left out of CPU smoke runs: bf16 convolutions are very slow on many CPUs."""
    return not (size["smoke"] and device.type == "cpu" and switches.get("bf16"))


def iteration_rows(size: dict, device: torch.device, with_compile: bool) -> tuple[list[tuple[str, dict]], int]:
    """(name, {seconds, peak_gib}) per variant, each built, measured and freed on its own; and the
    FLOPs of one iteration (the device's default TrainStep, counted once before it is timed)."""
    torch.manual_seed(0)
    base = create_model(size["arch"], CLASSES, SHAPE).to(device)
    x = torch.rand((size["batch"], *SHAPE), device=device) * 2 - 1
    y = torch.randint(0, CLASSES, (size["batch"],), device=device)
    variants = {"release (buffer on host, 3 forwards)": lambda: release_variant(base, x, y, size, device)}
    for name, switches in STEP_VARIANTS.items():
        if wanted(switches, size, device):
            variants[name] = lambda s=switches: step_variant(base, x, y, size, device, s)
    if device.type == "cuda":
        variants["TrainStep + bf16 + channels_last + cudnn.benchmark"] = lambda: step_variant(
            base, x, y, size, device, {"bf16": True, "channels_last": True, "cudnn_benchmark": True})
    if with_compile:
        variants["TrainStep + bf16 + channels_last + compile"] = lambda: step_variant(
            base, x, y, size, device, {"bf16": True, "channels_last": True, "compile": True})
    rows = []
    for name, build in variants.items():
        fn = build()
        rows.append((name, measure(fn, size["repeats"], device, size["warmup"])))
        del fn
        free(device)
        print(f"#   measured {name}", file=sys.stderr, flush=True)
    # the device's default fast path again, timed as a loop runs it: what the trainer rows compare with
    name = "TrainStep + bf16 + channels_last" if wanted({"bf16": True}, size, device) else "TrainStep + channels_last"
    fn = step_variant(base, x, y, size, device, STEP_VARIANTS[name])
    flops = flops_of(fn)
    rows.append((f"{name}, {size['iterations']} calls back to back",
                 measure(fn, max(1, size["repeats"] // 2), device, size["warmup"], calls=size["iterations"])))
    del fn
    free(device)
    return rows, flops


def trainer_row(size: dict, device: torch.device, tmp: Path) -> tuple[str, dict]:
    """The trainer's own loop (an epoch of ``iterations``, validation and checkpoints excluded)."""
    (tmp / "trainer").mkdir(exist_ok=True)
    trainer = build_trainer(tmp / "trainer", arch=size["arch"], batch=size["batch"], steps=size["steps"],
                            iterations=size["iterations"], input_shape=SHAPE, classes=CLASSES, device=device,
                            progress=False)
    with opened(trainer.config) as session:
        trainer._setup(session)
        end_epoch_only_counts(trainer)
        result = measure(trainer._epoch, max(1, size["repeats"] // 2), device, min(1, size["warmup"]))
    free(device)
    result["seconds"] /= size["iterations"]
    return f"Trainer loop ({size['iterations']} iterations/epoch, in process)", result


def gradnorm_rows(size: dict, device: torch.device) -> list[tuple[str, float]]:
    """(name, images/s) of the grad-norm score on 4 batches: release-style, jemeval fp32, bf16 + channels_last."""
    torch.manual_seed(0)
    base = create_model(size["arch"], CLASSES, SHAPE).to(device).eval()
    data = [torch.rand((size["score_batch"], *SHAPE), device=device) * 2 - 1 for _ in range(4)]

    def jemeval_score(fp: FastPath):
        model = fp.prepare(copy.deepcopy(base)).run.eval()

        def run():
            for x in data:
                with fp.autocast(device.type):
                    gradnorm(model, fp.to_input(x))
        return run

    variants = {"release-style (parameters requiring grad, retain_graph)": lambda: [naive_gradnorm(base, x)
                                                                                  for x in data],
                "jemeval gradnorm, fp32": jemeval_score(FastPath())}
    if wanted({"bf16": True}, size, device):
        variants["jemeval gradnorm, bf16 + channels_last"] = jemeval_score(FastPath(bf16=True, channels_last=True))
    n = len(data) * size["score_batch"]
    rows = [(name, n / measure(fn, size["repeats"], device, size["warmup"])["seconds"])
            for name, fn in variants.items()]
    free(device)
    return rows


def jemeval_command(*args) -> list[str]:
    return [sys.executable, "-m", "jemeval", *[str(a) for a in args]]


def run_command(name: str, argv: list[str], failures: list[tuple[str, str]], timeout: float = 600) -> str | None:
    """Run one command; on a non-zero exit record (its command line, its stderr) and return None."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        failures.append((" ".join(argv), f"timed out after {timeout:.0f} s\n{err.stderr or ''}"))
        print(f"FAILED  {name} (timed out)", flush=True)
        return None
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        failures.append((" ".join(argv), done.stderr.strip() or done.stdout.strip()))
        print(f"FAILED  {name} (exit {done.returncode}, {seconds:.1f} s)", flush=True)
        return None
    print(f"ok      {name} ({seconds:.1f} s)", flush=True)
    return done.stdout


def has_report_command() -> str | None:
    """``jemeval report --help``'s text, or None when the installed jemeval has no report command."""
    done = subprocess.run(jemeval_command("report", "--help"), capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def train_command(size: dict, device: torch.device, tmp: Path, failures: list) -> tuple[Path | None, float | None]:
    """``jemeval train`` for 2 epochs on the npz; (best.pt, the second epoch's images/s) or (None, None)."""
    data = write_npz(tmp / "cifar_shaped.npz", size["train_images"] + size["batch"], SHAPE, CLASSES, seed=1)
    run = tmp / "run"
    out = run_command("train", jemeval_command(
        "train", f"npz:{data}", "--arch", size["arch"], "--epochs", 2, "--batch-size", size["batch"],
        "--sgld-steps", size["steps"], "--val-size", size["batch"], "--buffer-size", size["buffer"],
        "--lr", PAPER["lr"], "--warmup-iters", PAPER["warmup_iters"], "--out", run, "--device", device,
        "--no-progress", "--json"), failures)
    if out is None:
        return None, None
    rows = (run / "metrics.csv").read_text().splitlines()
    keys = rows[0].split(",")
    last = dict(zip(keys, rows[-1].split(",")))
    rate = float(last["images_per_s"]) if last.get("images_per_s") else None
    return run / "best.pt", rate


def evaluation_commands(model: Path, size: dict, device: torch.device, tmp: Path, failures: list) -> None:
    """Every evaluation command once, on the device, with the model ``jemeval train`` wrote."""
    n, eb, data = size["n_eval"], size["eval_batch"], f"npz:{tmp / 'cifar_shaped.npz'}"
    commands = {  # the data named: a checkpoint's recorded npz path is never read by default
        "ood": ("ood", "--model", model, "--id", data, "--ood", "uniform", "--n", n, "--batch-size", eb),
        "calibrate": ("calibrate", "--model", model, "--data", data, "--n", n, "--batch-size", eb),
        "eval": ("eval", "--model", model, "--data", data, "--n", n, "--refine-steps", "0,1", "--chains", 2,
                 "--batch-size", eb),
        "robust": ("robust", "--model", model, "--data", data, "--norm", "linf", "--attack", "pgd", "--epsilons",
                   "0,0.03", "--steps", 2, "--n", max(4, n // 8)),
        "sample": ("sample", "--model", model, "--n", 1, "--steps", size["steps"], "--out", tmp / "samples.png"),
    }
    for name, args in commands.items():
        run_command(name, jemeval_command(*args, "--device", device, "--json"), failures)
    report_help = has_report_command()
    if report_help is None:
        print("skipped: no report command", flush=True)
        return
    args = ["report", "--model", model, "--data", data, "--preset", "quick", "--out", tmp / "report", "--device",
            device]
    if "--n " in report_help or "--n," in report_help:
        args += ["--n", n]
    if "--set " in report_help:  # the preset's sample grid and attack at this check's sizes
        args += ["--set", f"samples.steps={size['steps']}", "--set", "robust.steps=2"]
        args += ["--set", "samples.n=1"] if size["smoke"] else []
    run_command("report", jemeval_command(*args), failures)


def matmul_ceiling(size: dict, device: torch.device) -> tuple[str, float]:
    """(precision, FLOP/s) of a large matmul in the precision of the device's default fast path."""
    dtype = torch.bfloat16 if wanted({"bf16": True}, size, device) else torch.float32
    return str(dtype).removeprefix("torch."), gemm_ceiling(device, dtype)


def print_tables(size: dict, rows: list[tuple[str, dict]], flops: int, ceiling: tuple[str, float],
                 cli_rate: float | None, scores) -> None:
    """The markdown tables: iteration variants (images/s, vs release, peak memory, model TFLOP/s),
    grad-norm throughput."""
    print(f"\n### One training iteration: {size['arch']}, batch {size['batch']}, {size['steps']} SGLD steps "
          f"({flops / 1e12:.3g} TFLOP per iteration; a large {ceiling[0]} matmul on this device: "
          f"{ceiling[1] / 1e12:.3g} TFLOP/s)\n")
    print("| who | images/s | vs release | ms / iteration | peak GPU memory (GiB) | model TFLOP/s |\n"
          "|---|---:|---:|---:|---:|---:|")
    release = size["batch"] / rows[0][1]["seconds"]
    for name, r in rows:
        rate = size["batch"] / r["seconds"]
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        print(f"| {name} | {rate:.0f} | {rate / release:.2f}x | {1e3 * r['seconds']:.1f} | {peak} "
              f"| {flops / r['seconds'] / 1e12:.3g} |")
    if cli_rate is not None:
        print(f"| `jemeval train` (paper lr, warm-up), 2nd epoch (metrics.csv) | {cli_rate:.0f} "
              f"| {cli_rate / release:.2f}x "
              f"| - | - | {flops * cli_rate / size['batch'] / 1e12:.3g} |")
    print(f"\n### Grad-norm score throughput: {size['arch']}, 4 batches of {size['score_batch']}\n")
    print("| variant | images/s | vs release-style |\n|---|---:|---:|")
    for name, rate in scores:
        print(f"| {name} | {rate:.0f} | {rate / scores[0][1]:.2f}x |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (a CPU check of the same code paths)")
    parser.add_argument("--compile", action="store_true", help="also time TrainStep + torch.compile (warm-up 20 s+)")
    parser.add_argument("--repeats", type=int, help="timed calls per variant (median) [default: 5; smoke 1]")
    parser.add_argument("--skip-speed", action="store_true", help="only run the commands")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but CUDA is not available (use --smoke --device cpu on a CPU)", file=sys.stderr)
        return 2
    size = dict(SMOKE if args.smoke else FULL)
    size["repeats"] = args.repeats or size["repeats"]
    started = time.perf_counter()
    print(header(f"jemeval GPU check{' (smoke sizes)' if args.smoke else ''}", device), flush=True)
    failures: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        rows, scores, flops, ceiling = [], [], 0, ("", 0.0)
        if not args.skip_speed:
            rows, flops = iteration_rows(size, device, args.compile)
            rows.append(trainer_row(size, device, tmp))
            scores = gradnorm_rows(size, device)
            ceiling = matmul_ceiling(size, device)
        model, cli_rate = train_command(size, device, tmp, failures)
        if model is not None:
            evaluation_commands(model, size, device, tmp, failures)
        if rows:
            print_tables(size, rows, flops, ceiling, cli_rate, scores)
            if not wanted({"bf16": True}, size, device):
                print("\n(bf16 variants left out: a CPU smoke run; bf16 convolutions are very slow on many CPUs)")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    for command, stderr in failures:
        print(f"\nFAILED: {command}\n{stderr}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
