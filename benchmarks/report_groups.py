"""Cost of a report over seed groups: ``jemeval report --preset quick`` on 1 x 1, 2 x 1 and 2 x 3
(models x seeds) digits checkpoints, wall and CPU seconds, and how they scale.

Issue 26's goal: the quick preset with 2 models x 3 seeds under 3 minutes on an idle 2-core machine.
The script first trains (or reuses, in ``--work``) the README's worked example: ``--seeds`` seeds of
the JEM and of the baseline with ``jemeval train digits --recipe fast`` (baseline: ``--px-weight 0``),
at most ``--train-jobs`` at a time, one thread each. Then it times the report command a user types,
each time as a fresh process writing a new report folder (no cache: every section is computed),
the cells round-robin over ``--repeats`` rounds (medians). CPU time is the children's user + system
time (``RUSAGE_CHILDREN``; the reports run one at a time, so the difference is the report's).

Every command runs with ``--work`` as its working directory and the README's relative paths, so
the 2 x 3 cell is the README's command, ``--out`` aside; ``--readme`` then prints the README's
tables from that report's report.json (the lead's regeneration path):

    python benchmarks/report_groups.py --work runs/issue26
    python benchmarks/report_groups.py --work runs/issue26 --threads 1 --cells 2x3 --repeats 2
    python benchmarks/report_groups.py --work runs/issue26 --readme runs/issue26/runs/report
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from jemeval.reports.tables import SPECS, fmt_count, fmt_key, fmt_p, fmt_seconds

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import header  # noqa: E402

KINDS = {"jem": [], "base": ["--px-weight", "0"]}
NAMES = {"jem": "JEM", "base": "baseline"}


def train_command(kind: str, seed: int) -> list[str]:
    return [sys.executable, "-m", "jemeval", "train", "digits", "--recipe", "fast", *KINDS[kind],
            "--seed", str(seed), "--out", f"runs/{kind}-s{seed}", "--device", "cpu"]


def train(work: Path, seeds: list[int], jobs: int) -> list[str]:
    """Train every missing checkpoint, ``jobs`` at a time (one thread each); lines describing each."""
    todo = [(k, s) for s in seeds for k in KINDS if not (work / f"runs/{k}-s{s}/best.pt").exists()]
    lines = [f"reused runs/{k}-s{s}" for s in seeds for k in KINDS if (k, s) not in todo]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    running: dict[int, tuple[str, int, float, subprocess.Popen]] = {}
    while todo or running:
        while todo and len(running) < jobs:
            kind, seed = todo.pop(0)
            log = open(work / f"runs/{kind}-s{seed}.log", "w")
            proc = subprocess.Popen(train_command(kind, seed), cwd=work, env=env, stdout=log, stderr=log)
            log.close()
            running[proc.pid] = (kind, seed, time.perf_counter(), proc)
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        kind, seed, start, proc = running.pop(pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            sys.exit(f"training runs/{kind}-s{seed} failed ({proc.returncode}); see {work}/runs/{kind}-s{seed}.log")
        lines.append(f"trained runs/{kind}-s{seed}: {time.perf_counter() - start:.0f} s wall, "
                     f"{usage.ru_utime + usage.ru_stime:.0f} s CPU")
    return lines


def report_command(work: Path, models: int, seeds: list[int], out: str, preset: str,
                   checkpoint: str = "last.pt") -> list[str]:
    """The README's command for ``models`` models (JEM first) of ``seeds`` seeds each: a quoted glob
    where it matches exactly those seeds' runs, else one ``--model`` per run under one ``--name``.
    ``checkpoint``: last.pt, the recipe's end (the README's), or best.pt (the best validation epoch)."""
    cmd = [sys.executable, "-m", "jemeval", "report"]
    for kind in list(KINDS)[:models]:
        if len(seeds) == 1:
            cmd += ["--model", f"runs/{kind}-s{seeds[0]}/{checkpoint}"]
        elif sorted(work.glob(f"runs/{kind}-s*/{checkpoint}")) == sorted(
                work / f"runs/{kind}-s{s}/{checkpoint}" for s in seeds):
            cmd += ["--model", f"runs/{kind}-s*/{checkpoint}"]
        else:
            for s in seeds:
                cmd += ["--model", f"runs/{kind}-s{s}/{checkpoint}"]
        cmd += ["--name", NAMES[kind]]
    return cmd + ["--preset", preset, "--device", "cpu", "--out", out]


def time_report(work: Path, cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    """Wall and CPU seconds of one report (a fresh process), and the load average at its start."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    res = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        sys.exit(f"failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr[-2000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"wall": wall, "cpu": cpu, "load": load}


def section_seconds(report_dir: Path) -> dict[str, float]:
    """Seconds per section summed over the runs, from report.json's ``cost`` (measured in-process)."""
    data = json.loads((report_dir / "report.json").read_text())
    totals: dict[str, float] = {}
    for row in (data.get("cost") or {}).get("sections") or []:
        if isinstance(row.get("seconds"), (int, float)):
            totals[row["section"]] = totals.get(row["section"], 0.0) + row["seconds"]
    return totals


def fresh(work: Path, name: str) -> str:
    """A report folder name under ``work/timing`` that does not exist yet (nothing is overwritten)."""
    for i in range(1, 1000):
        out = Path("timing") / f"{name}-{i}"
        if not (work / out).exists():
            return str(out)
    sys.exit(f"{work}/timing holds 999 folders named {name}-N; remove them")


def measure(args: argparse.Namespace, work: Path, seeds: list[int], env: dict[str, str]) -> None:
    cells = [tuple(int(v) for v in c.split("x")) for c in args.cells.split(",")]
    times: dict[tuple[int, int], list[dict[str, float]]] = {c: [] for c in cells}
    last: dict[tuple[int, int], str] = {}
    for _ in range(args.repeats):
        for models, n in cells:
            out = fresh(work, f"{models}x{n}")
            cmd = report_command(work, models, seeds[:n], out, args.preset, args.checkpoint)
            times[(models, n)].append(time_report(work, cmd, env))
            last[(models, n)] = out
    base = cells[0]
    med = {c: {k: statistics.median(t[k] for t in times[c]) for k in ("wall", "cpu")} for c in cells}
    print(f"\n| models x seeds | checkpoints | wall (s) | CPU (s) | wall / {base[0]}x{base[1]} | "
          f"CPU / {base[0]}x{base[1]} | load at start | report folder |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for c in cells:
        loads = ", ".join(f"{t['load']:.1f}" for t in times[c])
        print(f"| {c[0]} x {c[1]} | {c[0] * c[1]} | {med[c]['wall']:.1f} | {med[c]['cpu']:.1f} | "
              f"{med[c]['wall'] / med[base]['wall']:.2f}x | {med[c]['cpu'] / med[base]['cpu']:.2f}x | {loads} | "
              f"{work}/{last[c]} |")
    print(f"\n(medians of {args.repeats} round(s); wall of each: "
          + "; ".join(f"{c[0]}x{c[1]} " + ", ".join(f"{t['wall']:.1f}" for t in times[c]) for c in cells) + ")")
    for c in cells:
        per = section_seconds(work / last[c])
        print(f"{c[0]}x{c[1]}: seconds per section (report.json cost, summed over runs): "
              + ", ".join(f"{k} {v:.1f}" for k, v in per.items()))
    if (2, 3) in med:
        verdict = "under" if med[(2, 3)]["wall"] < 180 else "OVER"
        loads = ", ".join(f"{t['load']:.1f}" for t in times[(2, 3)])
        print(f"\n2 x 3 {args.preset} report: {med[(2, 3)]['wall']:.0f} s wall, {verdict} the 3-minute goal "
              f"(load average at start: {loads})")

#: the README's excerpt: section -> the metrics shown (report.md has them all)
README_METRICS = {"accuracy": ["accuracy", "nll"], "calibration": ["temperature", "ece", "nll"], "ood": ["auroc"],
                  "robust": ["robust_accuracy"]}


def _value(record: dict, metric: str) -> str:
    value = record.get(metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    sd = (record.get("sd") or {}).get(metric)
    return f"{value:.4f}" + (f" +- {sd:.4f}" if sd is not None else "")


def _p(test: dict | None) -> str:
    """A test's p after Holm, as the page writes it (0.031, < 1e-4), or why there is none."""
    if test is None:
        return "-"
    if test.get("p_holm") is None:
        return f"cannot run: {test.get('error')}"
    return fmt_p(test["p_holm"]) + (" **yes**" if test.get("significant") else "")


def _difference(test: dict | None) -> str:
    if test is None or not isinstance(test.get("difference"), (int, float)):
        return "no test"
    diff = f"{test['difference']:+.4f}"
    return diff + (f" [{test['ci_low']:+.3f}, {test['ci_high']:+.3f}]" if test.get("ci_low") is not None else "")


def readme_tables(data: dict) -> str:
    """The README's worked-example tables from a report.json: per model ``mean +- sd`` over its seeds
    (flagged numbers marked), the difference of the first two models with the method-level test's 95%
    interval, its p after Holm (or-hillis: do the methods differ?) and the input-level test's (do
    these runs differ?). The better value is bold only where the deciding test is significant in its
    direction and neither number is flagged, as on the page."""
    models = [g["model"] for g in data["groups"]["models"]][:2]
    if len(models) < 2:
        sys.exit("--readme: the report compares fewer than 2 models")
    n_runs = {g["model"]: len(g["runs"]) for g in data["groups"]["models"]}
    grouped = {(r["section"], r["model"]) for r in data["groups"]["records"]}
    out = []
    for section, metrics in README_METRICS.items():
        spec = SPECS[section]
        rows: dict[tuple, dict[str, dict]] = {}
        for r in data["groups"]["records"] + [r for r in data["records"] if (section, r["model"]) not in grouped]:
            if r["section"] == section and r["model"] in models:
                rows.setdefault(tuple(str(r.get(k)) for k, _ in spec.keys), {})[r["model"]] = r
        tests: dict[tuple, dict[str, dict]] = {}
        for c in data["comparisons"]:
            if c["section"] == section and {c["model_a"], c["model_b"]} == set(models):
                key = (tuple(str(c.get(k)) for k, _ in spec.keys), c["metric"])
                tests.setdefault(key, {})[c.get("scope", "runs")] = c
        labels = {k: (label, better) for k, label, better in spec.metrics}
        heads = [label for _, label in spec.keys] + ["metric"] + [
            f"{m} ({n_runs[m]} seed{'s' if n_runs[m] > 1 else ''})" for m in models]
        heads += [f"{models[0]} - {models[1]} [95% CI]", "methods differ? or-hillis p (Holm)",
                  "these runs differ? p (Holm)"]
        rule = "|" + "---|" * (len(spec.keys) + 1) + "---:|" * 3 + "---:|---:|"
        out += ["", "| " + " | ".join(heads) + " |", rule]
        for key, by_model in rows.items():
            first = next(iter(by_model.values()))
            for metric in metrics:
                if not any(isinstance(r.get(metric), (int, float)) for r in by_model.values()):
                    continue
                found = tests.get((key, metric), {})
                method, runs = found.get("method"), found.get("runs")
                deciding = method if method is not None else runs
                cells = [_value(by_model.get(m, {}), metric) for m in models]
                flagged = [metric == "robust_accuracy" and bool(by_model.get(m, {}).get("flags")) for m in models]
                better = labels[metric][1]
                if deciding and deciding.get("significant") and better and not any(flagged) and isinstance(
                        deciding.get("difference"), (int, float)):
                    winner = 0 if (deciding["difference"] > 0) == (better == "max") else 1
                    cells[winner] = f"**{cells[winner]}**"
                cells = [c + (" (flagged)" if f else "") for c, f in zip(cells, flagged)]
                arrow = {"max": " ↑", "min": " ↓"}.get(better, "")
                out.append("| " + " | ".join([fmt_key(k, first.get(k), first) for k, _ in spec.keys]
                                             + [labels[metric][0] + arrow] + cells
                                             + [_difference(deciding), _p(method), _p(runs)]) + " |")
    return "\n".join(out[1:] + [""] + summary_table(data))


SUMMARY = [("clean_accuracy", "clean accuracy"), ("robust_accuracy", "robust accuracy"), ("auroc", "AUROC"),
           ("ece_ts", "ECE after T-scaling"), ("forward_passes", "forward passes"),
           ("training_seconds", "training (s)")]


def _summary_cell(row: dict, key: str) -> str:
    value, sd = row.get(key), (row.get("sd") or {}).get(key)
    if key == "forward_passes" and isinstance(value, (int, float)):
        return fmt_count(value)
    if key == "training_seconds" and isinstance(value, (int, float)):
        return fmt_seconds(value) + (f" +- {fmt_seconds(sd)}" if sd else "")
    return _value(row, key)


def summary_table(data: dict) -> list[str]:
    """report.json's one row per model (the JEM trilemma), ``mean +- sd`` over the seeds; its K is the
    best among those whose robust numbers no check flagged."""
    lines = ["| model | runs | K | robust at | best score | " + " | ".join(label for _, label in SUMMARY) + " |",
             "|---|---:|---:|---|---|" + "---:|" * len(SUMMARY)]
    for row in data.get("summary") or []:
        cells = [_summary_cell(row, key) for key, _ in SUMMARY]
        where = f"{row.get('norm')} eps {row.get('epsilon'):g}" + (" (every K flagged)" if row.get("robust_flagged")
                                                                    else "")
        lines.append(f"| {row['model']} | {row.get('n_seeds', 1)} | {row.get('refine_steps')} | {where} | "
                     f"{row.get('score')} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("runs/report-groups"),
                    help="folder holding runs/<jem|base>-s<seed>/ (trained when missing) and timing/")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--cells", default="1x1,2x1,2x3", help="models x seeds to time; the first is the ratios' unit")
    ap.add_argument("--repeats", type=int, default=1, help="timed rounds, round-robin over the cells")
    ap.add_argument("--threads", type=int, default=0,
                    help="OMP_NUM_THREADS of each report; 0 = unset (torch's default: what a user gets)")
    ap.add_argument("--train-jobs", type=int, default=2, help="trainings at a time (one thread each)")
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--checkpoint", default="last.pt", choices=("last.pt", "best.pt"),
                    help="which checkpoint of each run the report reads (the README's: last.pt)")
    ap.add_argument("--readme", type=Path, default=None,
                    help="only print the README's tables from this report folder's report.json")
    args = ap.parse_args()
    if args.readme:
        print(readme_tables(json.loads((args.readme / "report.json").read_text())))
        return
    work = args.work.resolve()
    (work / "runs").mkdir(parents=True, exist_ok=True)
    (work / "timing").mkdir(exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    print(header(f"jemeval report --preset {args.preset}: seed groups (benchmarks/report_groups.py)",
                 torch.device("cpu")))
    print("# threads: " + (f"OMP_NUM_THREADS={args.threads}" if args.threads else "torch's default (unset)"))
    for line in train(work, seeds, args.train_jobs):
        print("# " + line)
    measure(args, work, seeds, env)


if __name__ == "__main__":
    main()
