"""Epoch by epoch, what ``--recipe finetune`` trades: uniform-noise AUROC rises, interp AUROC falls.

    python benchmarks/finetune_epochs.py [--seeds 0,...,9] [--epochs 6] [--set sgld_steps=5,...]
        [--classifiers DIR] [--threads 1] [--json FILE]

Per seed: the 40-epoch pad-1 ``cnn`` classifier of benchmarks/warm_start.py (``--classifier
epochs=40,decay_epochs=30,augment=pad=1``; or ``DIR/s{seed}/last.pt`` where ``--classifiers`` names
classifiers trained so), then ``train digits --init CLASSIFIER --recipe finetune`` for one epoch and
``--resume`` to 2, 3, ... ``--epochs``. The recipe's learning rate is constant (no warm-up, no decay),
and a resumed run is the uninterrupted one bit for bit, so epoch k here *is* a k-epoch fine-tune:
its last.pt is the run's end and its best.pt what a k-epoch run would keep (the first epoch of the
best validation accuracy). Reported per epoch count: seeds at or above the release's means
(docs/training.md: accuracy 0.9784, interp 0.825; uniform 1.000, counted as >= 0.9995), for best.pt,
for last.pt, and for the best any rule choosing among the k epochs could do (an upper bound on
checkpoint selection).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

import torch
from time_to_accuracy import parse_candidate
from warm_start import aurocs, run

from jemeval.evaluation.accuracy import evaluate

RELEASE = {"test_acc": 0.9784, "interp": 0.825, "uniform": 0.9995}
CLASSIFIER = {"epochs": 40, "decay_epochs": (30,), "augment": "pad=1"}


def measure(checkpoint: Path) -> dict[str, float]:
    acc = evaluate(str(checkpoint), "digits", device="cpu", progress=False).records[0]["accuracy"]
    return {"test_acc": float(acc), **aurocs(str(checkpoint))}


def meets(row: dict) -> bool:
    return all(row[k] >= v for k, v in RELEASE.items())


def trajectory(seed: int, classifier: Path, out: Path, epochs: int, settings: dict) -> list[dict]:
    """Per epoch k: best.pt and last.pt of the k-epoch fine-tune, each measured."""
    rows = []
    for k in range(1, epochs + 1):
        summary, cpu = run("digits", out, seed=seed, init=str(classifier), recipe="finetune", epochs=k,
                           resume=k > 1, **settings)
        kept = out.parent / f"{out.name}-epoch{k}.pt"
        shutil.copyfile(out / "last.pt", kept)
        rows.append({"epoch": k, "cpu": cpu, "best_epoch": summary["best_epoch"],
                     "best": measure(Path(summary["best"])), "last": measure(kept)})
    return rows


def report(runs: dict[int, list[dict]]) -> None:
    print("epochs | best.pt: acc uniform interp, seeds meeting all three | last.pt: the same | any epoch <= k")
    for k in range(1, len(next(iter(runs.values()))) + 1):
        line = [f"{k:>6}"]
        for which in ("best", "last"):
            got = [rows[k - 1][which] for rows in runs.values()]
            means = " ".join(f"{statistics.mean(r[m] for r in got):.4f}" for m in ("test_acc", "uniform", "interp"))
            line.append(f"{means} {sum(map(meets, got))}/{len(got)}")
        oracle = sum(any(meets(r["last"]) for r in rows[:k]) for rows in runs.values())
        line.append(f"{oracle}/{len(runs)}")
        print(" | ".join(line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--set", default="", help="settings over the recipe's, key=value,..., e.g. sgld_steps=5")
    parser.add_argument("--classifiers", default=None, help="a folder of s{seed}/last.pt classifiers to reuse")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = parse_candidate(f"finetune:{args.set}")[1]
    runs: dict[int, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            classifier = Path(args.classifiers) / f"s{seed}" / "last.pt" if args.classifiers else None
            if classifier is None:
                classifier = Path(run("digits", Path(tmp) / f"clf{seed}", seed=seed, px_weight=0.0,
                                      **CLASSIFIER)[0]["last"])
            runs[seed] = trajectory(seed, classifier, Path(tmp) / f"ft{seed}", args.epochs, settings)
            print(f"seed {seed}: " + "; ".join(f"{r['epoch']}: {r['last']}" for r in runs[seed]), flush=True)
    report(runs)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
