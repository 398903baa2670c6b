"""How ``jemeval report --preset quick`` scales with the number of models (issue 28 item 3): CPU
seconds for 1, 2 and 4 distinct digits models, per section, and the fit against the number of models.

Issue 28's goal: linear in models, and the quick preset on 2 digits models under 60 CPU seconds.
The models are the README's worked example (benchmarks/report_groups.py trains or reuses them in
``--work``): JEM and baseline of seeds 0 and 1, each its own model (``--name`` per checkpoint, no
seed group), added in the order JEM s0, baseline s0, JEM s1, baseline s1. Each report is the command
a user types, a fresh process writing a new folder (no cache), with one thread (OMP_NUM_THREADS=1,
MKL_NUM_THREADS=1: the command has no thread option; torch reads these); its CPU time is the child's
user + system time (``RUSAGE_CHILDREN``). The cells run round-robin over ``--repeats`` rounds
(medians). ``--before DIR`` also times, interleaved, the jemeval package under DIR (PYTHONPATH=DIR),
e.g. a tree with the pre-change reports/ (``--after DIR``:
a snapshot of the changed one): the before/after ratio of the same cells on the same load.

    python benchmarks/report_scaling.py --work runs/issue26
    python benchmarks/report_scaling.py --work runs/issue26 --repeats 2 --before /tmp/before
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_groups import NAMES, fresh, section_seconds, time_report, train  # noqa: E402
from timing import header  # noqa: E402

#: the models in the order the cells add them: (kind, seed)
ORDER = [("jem", 0), ("base", 0), ("jem", 1), ("base", 1)]


def report_command(models: int, out: str, preset: str) -> list[str]:
    """``jemeval report`` of the first ``models`` checkpoints of :data:`ORDER`, each its own model."""
    cmd = [sys.executable, "-m", "jemeval", "report"]
    for kind, seed in ORDER[:models]:
        cmd += ["--model", f"runs/{kind}-s{seed}/best.pt", "--name", f"{NAMES[kind]}-s{seed}"]
    return cmd + ["--preset", preset, "--device", "cpu", "--out", out]


def fit(counts: list[int], cpu: list[float]) -> tuple[float, float, float]:
    """Least squares CPU = a + b * models: (a, b, R^2)."""
    x, y = np.asarray(counts, dtype=float), np.asarray(cpu, dtype=float)
    b, a = np.polyfit(x, y, 1)
    residual = float(((y - (a + b * x)) ** 2).sum())
    total = float(((y - y.mean()) ** 2).sum())
    return float(a), float(b), 1.0 - residual / total if total else 1.0


def measure(args: argparse.Namespace, work: Path) -> None:
    cells = [int(c) for c in args.models.split(",")]
    variants = {"after": str(args.after.resolve()) if args.after else None,
                **({"before": str(args.before.resolve())} if args.before else {})}
    base_env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    base_env.pop("PYTHONPATH", None)
    times: dict[tuple[str, int], list[dict[str, float]]] = {(v, c): [] for v in variants for c in cells}
    last: dict[tuple[str, int], str] = {}
    for _ in range(args.repeats):
        for c in cells:
            for v, path in variants.items():
                env = dict(base_env, **({"PYTHONPATH": path} if path else {}))
                out = fresh(work, f"scaling-{v}-{c}")
                times[(v, c)].append(time_report(work, report_command(c, out, args.preset), env))
                last[(v, c)] = out
    print("\n| jemeval | models | CPU (s) | CPU per model (s) | wall (s) | load at start "
          "| sections: seconds (report.json cost) | report folder |")
    print("|---|---:|---:|---:|---:|---|---|---|")
    med = {k: {m: statistics.median(t[m] for t in ts) for m in ("cpu", "wall")} for k, ts in times.items()}
    for v in variants:
        for c in cells:
            per = section_seconds(work / last[(v, c)])
            loads = ", ".join(f"{t['load']:.1f}" for t in times[(v, c)])
            sections = ", ".join(f"{k} {s:.1f}" for k, s in per.items())
            print(f"| {v} | {c} | {med[(v, c)]['cpu']:.1f} | {med[(v, c)]['cpu'] / c:.1f} | {med[(v, c)]['wall']:.1f} "
                  f"| {loads} | {sections} | {work}/{last[(v, c)]} |")
    for v in variants:
        a, b, r2 = fit(cells, [med[(v, c)]["cpu"] for c in cells])
        print(f"\n{v}: CPU = {a:.1f} s + {b:.1f} s x models (least squares over {cells}, R^2 = {r2:.4f})")
        if len(cells) >= 3:
            steps = [(med[(v, hi)]["cpu"] - med[(v, lo)]["cpu"]) / (hi - lo) for lo, hi in zip(cells, cells[1:])]
            print(f"{v}: marginal CPU per added model: " + ", ".join(
                f"{lo}->{hi}: {s:.1f} s" for (lo, hi), s in zip(zip(cells, cells[1:]), steps)))
        if 2 in cells:
            verdict = "under" if med[(v, 2)]["cpu"] < 60 else "OVER"
            print(f"{v}: 2 models, quick preset: {med[(v, 2)]['cpu']:.1f} CPU s, {verdict} the 60 CPU s goal")
    if args.before:
        print("\nafter / before (CPU): " + ", ".join(
            f"{c} model(s) {med[('after', c)]['cpu'] / med[('before', c)]['cpu']:.3f}x" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("runs/report-groups"),
                    help="folder holding runs/<jem|base>-s<seed>/ (trained when missing) and timing/")
    ap.add_argument("--models", default="1,2,4", help="numbers of models to time (at most 4)")
    ap.add_argument("--repeats", type=int, default=1, help="timed rounds, round-robin over the cells")
    ap.add_argument("--train-jobs", type=int, default=2, help="trainings at a time (one thread each)")
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--before", type=Path, default=None,
                    help="a folder holding another jemeval package, timed interleaved as 'before'")
    ap.add_argument("--after", type=Path, default=None,
                    help="a folder holding the jemeval package timed as 'after' (default: the installed one)")
    args = ap.parse_args()
    if max(int(c) for c in args.models.split(",")) > len(ORDER):
        sys.exit(f"--models: at most {len(ORDER)}")
    for flag, folder in (("--before", args.before), ("--after", args.after)):
        if folder and not (folder / "jemeval" / "__init__.py").is_file():
            sys.exit(f"{flag} {folder}: no jemeval/__init__.py there")
    work = args.work.resolve()
    (work / "runs").mkdir(parents=True, exist_ok=True)
    (work / "timing").mkdir(exist_ok=True)
    torch.set_num_threads(1)
    print(header(f"jemeval report --preset {args.preset}: 1..4 models (benchmarks/report_scaling.py)",
                 torch.device("cpu")))
    print("# threads: OMP_NUM_THREADS=1, MKL_NUM_THREADS=1 in every report")
    for line in train(work, sorted({s for _, s in ORDER}), args.train_jobs):
        print("# " + line)
    measure(args, work)


if __name__ == "__main__":
    main()
