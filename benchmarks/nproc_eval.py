"""Evaluation on several processes: wall time of ``jemeval robust|ood|sample --nproc N`` per N, and
a check that every N gives the records of ``--nproc 1``.

Each N runs the same command line as a fresh process (start-up and model loading included: what a
user waits for), ``--rounds`` times round-robin; the median wall time and its ratio to N = 1 are
printed. On CUDA each process takes one GPU (N <= the GPUs visible); on CPU one core each.

    python benchmarks/nproc_eval.py --model runs/digits/best.pt --device cpu --nproc 1,2
    python benchmarks/nproc_eval.py --model jem.pt --device cuda --nproc 1,2,4,8 --command robust \\
        --args "--norm l2 --n 1000 --batch-size 125 --refine-steps 0,10 --steps 20"
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_ARGS = {
    "robust": "--norm l2 --n 64 --batch-size 8 --refine-steps 0,1 --steps 5 --epsilons 0.5,1",
    "ood": "--ood uniform,gaussian --n 200 --batch-size 25 --score logpx,gradnorm",
    "sample": "--class all --n 8 --steps 20 --batch-size 10",
}
RESULT_FLAG = {"robust": "--out", "ood": "--out", "sample": "--result"}


def run_once(command: str, model: str, device: str, extra: str, nproc: int, folder: Path) -> tuple[float, list]:
    """(wall seconds, records) of one ``jemeval COMMAND ... --nproc N`` run."""
    out = folder / f"result-{nproc}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "jemeval", command, "--model", model, "--device", device, *shlex.split(extra),
           RESULT_FLAG[command], str(out), "--nproc", str(nproc)]
    env = dict(os.environ)
    env.pop("WORLD_SIZE", None)
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if res.returncode != 0:
        sys.exit(f"failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr[-2000:]}")
    records = json.loads(out.read_text())["records"]
    for r in records:
        r.pop("seconds", None)  # robust's per-run wall time
    return seconds, records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--command", choices=sorted(DEFAULT_ARGS), default="robust")
    ap.add_argument("--args", default=None, help="the command's other options [default: a small run]")
    ap.add_argument("--nproc", default="1,2", help="numbers of processes, e.g. 1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    counts = [int(v) for v in a.nproc.split(",")]
    extra = DEFAULT_ARGS[a.command] if a.args is None else a.args
    print(f"# jemeval {a.command} {extra} --device {a.device}; load {os.getloadavg()[0]:.1f}")
    times: dict[int, list[float]] = {n: [] for n in counts}
    reference = None
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.rounds):
            for n in counts:
                seconds, records = run_once(a.command, a.model, a.device, extra, n, Path(tmp))
                times[n].append(seconds)
                reference = records if reference is None else reference
                if records != reference:
                    sys.exit(f"--nproc {n} gave other records than --nproc {counts[0]}")
    base = statistics.median(times[counts[0]])
    print("| nproc | median wall s | speed-up | records |\n|---:|---:|---:|---|")
    for n in counts:
        med = statistics.median(times[n])
        print(f"| {n} | {med:.1f} | {base / med:.2f}x | equal |")


if __name__ == "__main__":
    main()
