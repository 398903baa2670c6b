"""A JEM from a classifier on digits: a classifier, then ``--init`` + ``--recipe finetune``, against
the release recipe on the same seeds.

    python benchmarks/warm_start.py [--seeds 0,...,9] [--release-seeds 0,1,2] [--arch cnn:width=32]
        [--classifier epochs=40,decay_epochs=30,augment=pad=1] [--threads 1] [--json FILE]

Per seed, through the Python API in this process (``jemeval train`` does the same):

* classifier: ``train digits --px-weight 0`` (the digits defaults: cnn:width=32, 20 epochs; no SGLD),
  with ``--arch`` and the ``--classifier`` settings where given;
* fine-tune:  ``train digits --init CLASSIFIER/last.pt --recipe finetune``;
* release:    ``train digits --sgld-steps 20`` (the release's sampler on the digits defaults; only the
  ``--release-seeds``, the slowest part).

Charged: process CPU seconds of each ``train`` call (one thread), the final test evaluation included;
not charged: the AUROC evaluations after it. Reported per seed: test accuracy of best.pt (the summary's)
and AUROC of log p~(x) of best.pt (``recipe="finetune"`` keeps the last epoch), digits test vs ``uniform``
and vs ``interp``; the CPU ratios against the mean release run measured here; how many seeds reach the
release's means (measured here, and the 10-seed means in docs/training.md: accuracy 0.9784, interp 0.825,
uniform 1.000 counted as >= 0.9995).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from time_to_accuracy import parse_candidate

from jemeval.evaluation.ood.evaluate import evaluate_ood
from jemeval.training import resolve_config, train

#: docs/training.md, Recipes: the release's 10-seed means (uniform: 1.000 on every seed, counted as >= 0.9995)
DOCUMENTED_RELEASE = {"test_acc": 0.9784, "interp": 0.825, "uniform": 0.9995}


def run(dataset: str, out: Path, **settings) -> tuple[dict, float]:
    """(summary, process CPU seconds) of one training run (a fresh one unless ``settings`` say ``resume``)."""
    fresh = {} if settings.get("resume") else {"overwrite": True}
    config = resolve_config(dataset, out=str(out), progress=False, grid_every=0, device="cpu", **fresh, **settings)
    start = time.process_time()
    summary = train(config).summary
    return summary, time.process_time() - start


def aurocs(checkpoint: str) -> dict[str, float]:
    out = evaluate_ood(checkpoint, "uniform,interp", scores="logpx", progress=False, cache=False, device="cpu")
    return {("interp" if r["ood"].startswith("interp") else r["ood"]): float(r["auroc"]) for r in out.records}


def measured(summary: dict, cpu: float) -> dict:
    return {"cpu": cpu, "test_acc": float(summary["test_acc"]), **aurocs(summary["best"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    parser.add_argument("--release-seeds", default="0,1,2")
    parser.add_argument("--arch", default=None, help="the classifier's architecture (default: digits' cnn:width=32)")
    parser.add_argument("--classifier", default="",
                        help="the classifier's settings over digits' defaults: key=value,..., e.g. "
                             "epochs=40,decay_epochs=30,augment=pad=1 (decay_epochs: epochs separated by /)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    classifier = dict(parse_candidate(f"classifier:{args.classifier}")[1], **({"arch": args.arch} if args.arch else {}))
    rows: dict[str, dict[int, dict]] = {"classifier": {}, "finetune": {}, "release": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            clf, cpu = run("digits", Path(tmp) / f"clf{seed}", seed=seed, px_weight=0.0, **classifier)
            rows["classifier"][seed] = measured(clf, cpu)
            ft, cpu = run("digits", Path(tmp) / f"ft{seed}", seed=seed, init=clf["last"], recipe="finetune")
            rows["finetune"][seed] = measured(ft, cpu)
            print(f"seed {seed}: classifier {rows['classifier'][seed]}; finetune {rows['finetune'][seed]}", flush=True)
        for seed in (int(s) for s in args.release_seeds.split(",") if s):
            rel, cpu = run("digits", Path(tmp) / f"rel{seed}", seed=seed, sgld_steps=20)
            rows["release"][seed] = measured(rel, cpu)
            print(f"seed {seed}: release {rows['release'][seed]}", flush=True)
    report(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def report(rows: dict[str, dict[int, dict]]) -> None:
    release = rows["release"]
    base = statistics.mean(r["cpu"] for r in release.values()) if release else float("nan")
    here = {k: statistics.mean(r[k] for r in release.values()) for k in ("test_acc", "uniform", "interp")} \
        if release else {}
    print(f"\nrelease here: {len(release)} runs, {base:.1f} CPU s, {here}")
    for name in ("classifier", "finetune", "release"):
        values = list(rows[name].values())
        if not values:
            continue
        mean = {k: statistics.mean(v[k] for v in values) for k in ("cpu", "test_acc", "uniform", "interp")}
        sd = {k: statistics.stdev(v[k] for v in values) if len(values) > 1 else 0.0 for k in ("test_acc", "interp")}
        print(f"{name:<10} n={len(values)} CPU {mean['cpu']:.1f} s ({mean['cpu'] / base:.2f}x release) "
              f"acc {mean['test_acc']:.4f} +- {sd['test_acc']:.4f} uniform {mean['uniform']:.3f} "
              f"interp {mean['interp']:.3f} +- {sd['interp']:.3f}")
    both = [rows["classifier"][s]["cpu"] + rows["finetune"][s]["cpu"] for s in rows["finetune"]]
    print(f"classifier + finetune: {statistics.mean(both):.1f} CPU s ({statistics.mean(both) / base:.2f}x release)")
    for target_name, target in (("documented release means", DOCUMENTED_RELEASE), ("release means here", here)):
        if not target:
            continue
        hits = sum(r["test_acc"] >= target["test_acc"] and r["interp"] >= target["interp"]
                   and r.get("uniform", 1) >= target.get("uniform", 0) for r in rows["finetune"].values())
        measures = "accuracy, interp" + (", uniform" if "uniform" in target else "")
        print(f"finetune seeds at or above the {target_name} ({measures}): {hits} / {len(rows['finetune'])}")


if __name__ == "__main__":
    main()
