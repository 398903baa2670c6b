"""Your own RGB images: a JEM from scratch vs the plain classifier on generated 32 x 32 image folders.

    python benchmarks/rgb_folder.py [--sizes 600,5000] [--tests 200,1000] [--seeds 0] [--variants jem,classifier]
        [--epochs N] [--candidate NAME:key=value,...] [--root DIR] [--json FILE] [--threads 1]

For each size it writes (or reuses) ``ROOT/rgb-N``: N training and T test images of 10 classes
(benchmarks/rgb_images.py: 5 shapes x 2 colour families on tinted, textured, noisy backgrounds),
as ``train/<class>/*.png`` and ``test/<class>/*.png``, the layout ``jemeval train folder:DIR``
reads. Then each variant is one real ``jemeval.training.train`` run (the Python API; it is
``jemeval train folder:ROOT/rgb-N`` with the same settings) with only what the variant sets:

* jem:        the derived defaults (nothing set);
* classifier: ``px_weight=0`` (cross-entropy only, no sampling), the reference;
* finetune:   ``init`` = the classifier run's best.pt (of the same size and seed; run ``classifier``
  first) and ``recipe="finetune"``: the warm start (``jemeval train folder:... --init best.pt
  --recipe finetune``);
* a candidate ``NAME:key=value,...`` sets those settings over the derived defaults
  (``decay_epochs`` takes epochs separated by ``/``).

After every epoch an ``on_step`` callback measures the test accuracy of the current weights (the
test split, through ``accuracy_on_arrays``, as the trainer's own test accuracy) and the largest
per-iteration loss and |E| of the epoch; that time is not charged: the clock (wall and process CPU
seconds) is the run's minus the time spent measuring. The trainer's validation and checkpoint
writes are charged, as in any run. Printed: per epoch the test accuracy (and where it sits at
chance, 10%), the mean and largest loss, the energies, the charged seconds; per run the totals, the
rollbacks and the load average at its start and end. Runs go one at a time (a shared machine: give
each the same core).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from rgb_images import write_rgb_folder
from time_to_accuracy import parse_candidate
from timing import header, setup

from jemeval.data import load_dataset, to_arrays
from jemeval.errors import TrainingDiverged
from jemeval.evaluation.accuracy import accuracy_on_arrays
from jemeval.training import resolve_config, train
from jemeval.training.ddp import batch_plan

CHANCE = 0.1
VARIANTS = {"jem": {}, "classifier": {"px_weight": 0.0}, "finetune": {"recipe": "finetune"}}


def folder(root: Path, n_train: int, n_test: int) -> str:
    """The generated folder of ``n_train`` + ``n_test`` images (seed 0), written once."""
    path = root / f"rgb-{n_train}"
    if not (path / "test").is_dir():
        write_rgb_folder(path, n_train, n_test, seed=0)
    return f"folder:{path}"


class Watch:
    """Per-iteration loss and |E| (one host sync an iteration: a benchmark's, not the trainer's)."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.energies: list[float] = []

    def wrap(self, step):
        if getattr(step, "watched", False):
            return step

        def watched(*args, **kwargs):
            stats = step(*args, **kwargs)
            self.losses.append(float(stats["loss"]))
            self.energies.append(float(stats["abs_energy"]))
            return stats

        watched.watched, watched.sgld = True, step.sgld
        return watched

    def take(self) -> dict[str, float]:
        nan = float("nan")
        out = {"max_loss": max(self.losses, default=nan), "max_abs_e": max(self.energies, default=nan)}
        self.losses, self.energies = [], []
        return out


def run(spec: str, settings: dict, seed: int, test: tuple, out: Path) -> dict:
    """One run: per epoch end the charged seconds, test accuracy and the epoch's metrics row."""
    curve: list[dict] = []
    clock = {"wall": 0.0, "cpu": 0.0}
    watch = Watch()

    def on_step(trainer) -> None:
        trainer.train_step = watch.wrap(trainer.train_step)
        p = trainer.parts
        iterations, _ = batch_plan(len(p.data.x), trainer.config.batch_size, p.ctx.world_size)
        if trainer.position.batch != iterations:
            return
        w0, c0 = time.perf_counter(), time.process_time()
        point = {"epoch": trainer.position.epoch + 1, "wall": w0 - start[0] - clock["wall"],
                 "cpu": c0 - start[1] - clock["cpu"], "test_acc": accuracy_on_arrays(p.model, *test),
                 **watch.take()}
        curve.append(point)
        print(f"#   epoch {point['epoch']}: test acc {point['test_acc']:.4f}, largest loss {point['max_loss']:.3f}, "
              f"largest |E| {point['max_abs_e']:.1f}, {point['cpu']:.0f} CPU s", flush=True)
        clock["wall"] += time.perf_counter() - w0
        clock["cpu"] += time.process_time() - c0

    config = resolve_config(spec, seed=seed, device="cpu", out=str(out), overwrite=True, progress=False,
                            grid_every=0, test_eval=False, **settings)
    load = os.getloadavg()[0]
    start = (time.perf_counter(), time.process_time())
    try:
        summary = train(config, on_step=on_step).records[0]
        status, recoveries, best_epoch = "completed", summary["recoveries"], summary["best_epoch"]
    except TrainingDiverged:
        status, recoveries, best_epoch = "diverged", None, None
    rows = _metrics(out / "metrics.csv")
    epochs = [r for r in rows if not r.get("event")]
    by_epoch, kept = {int(r["epoch"]): r for r in epochs}, set()
    for point in reversed(curve):  # a rolled-back epoch has two points; its row is the kept (later) one's
        row = by_epoch.get(point["epoch"], {}) if point["epoch"] not in kept else {}
        kept.add(point["epoch"])
        point.update({k: row.get(k) for k in ("train_acc", "val_acc", "loss", "energy_data", "energy_sample", "lr")})
    shown = ("epochs", "lr", "warmup_iters", "px_warmup_iters", "decay_epochs", "sgld_steps", "sgld_lr", "energy_l2",
             "arch", "px_weight", "recipe", "init")
    return {"settings": {k: getattr(config, k) for k in shown},
            "curve": curve, "events": [r["event"] for r in rows if r.get("event")], "status": status,
            "recoveries": recoveries, "best_epoch": best_epoch, "load_start": load, "load_end": os.getloadavg()[0]}


def _metrics(path: Path) -> list[dict]:
    import csv

    if not path.exists():
        return []
    with open(path) as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _number(text: str):
    try:
        return float(text)
    except (TypeError, ValueError):
        return text


def show(name: str, result: dict) -> None:
    """Per-epoch lines, then the run's totals."""
    s = result["settings"]
    print(f"## {name}: {s}")
    print(f"{'epoch':>5s} {'test acc':>8s} {'val acc':>7s} {'train':>6s} {'loss':>7s} {'max loss':>8s} "
          f"{'E(data)':>8s} {'E(smp)':>8s} {'max|E|':>7s} {'lr':>8s} {'wall s':>7s} {'cpu s':>7s}")
    for p in result["curve"]:
        flag = "  <- chance" if p["test_acc"] <= CHANCE + 0.02 else ""
        print(f"{p['epoch']:5d} {p['test_acc']:8.4f} {_f(p.get('val_acc'), 7, 4)} {_f(p.get('train_acc'), 6, 3)} "
              f"{_f(p.get('loss'), 7, 3)} {p['max_loss']:8.3f} {_f(p.get('energy_data'), 8, 2)} "
              f"{_f(p.get('energy_sample'), 8, 2)} {p['max_abs_e']:7.1f} {_f(p.get('lr'), 8, 6)} {p['wall']:7.1f} "
              f"{p['cpu']:7.1f}{flag}")
    last = result["curve"][-1] if result["curve"] else {"wall": float("nan"), "cpu": float("nan"), "epoch": 1}
    n = max(last["epoch"], 1)
    print(f"# {name}: {result['status']}, {result['recoveries']} rollbacks, final test acc "
          f"{last.get('test_acc', float('nan')):.4f}, best.pt's (epoch {result['best_epoch']}) {_best_pt(result):.4f}; "
          f"{last['wall']:.0f} s wall ({last['wall'] / n:.1f} an epoch), {last['cpu']:.0f} s CPU "
          f"({last['cpu'] / n:.1f} an epoch); load {result['load_start']:.2f} -> {result['load_end']:.2f}")
    for event in result["events"]:
        print(f"#   event: {event}")


def _best_pt(result: dict) -> float:
    """The test accuracy of the epoch best.pt holds (the run's ``best_epoch``: the first with the highest
    validation accuracy, or the last under ``best_by="last"``), not the highest test accuracy of any epoch;
    of a rolled-back epoch, the kept (later) point."""
    held = [p for p in result["curve"] if p["epoch"] == result.get("best_epoch")]
    return held[-1]["test_acc"] if held else float("nan")


def _f(value, width: int, digits: int) -> str:
    return f"{value:{width}.{digits}f}" if isinstance(value, float) else f"{'-':>{width}s}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="600,5000", help="training images per folder")
    parser.add_argument("--tests", default="200,1000", help="test images per folder (one per size)")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--variants", default="jem,classifier")
    parser.add_argument("--candidate", action="append", default=[], help="NAME:key=value,... over the defaults")
    parser.add_argument("--epochs", type=int, help="train this many epochs (default: the derived number)")
    parser.add_argument("--root", default="runs/rgb-bench", help="folder for the image folders and the runs")
    parser.add_argument("--json", help="write every run's curve to this file")
    parser.add_argument("--threads", type=int, default=None, help="torch threads: default 1 on CPU; 0 = torch's")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    args.seed = 0
    device = setup(args)
    root = Path(args.root)
    (root / "runs").mkdir(parents=True, exist_ok=True)
    variants = {**VARIANTS, **dict(parse_candidate(c) for c in args.candidate)}
    names = [n.strip() for n in args.variants.split(",") if n.strip()] + [parse_candidate(c)[0] for c in args.candidate]
    print(header(f"RGB image folders: sizes {args.sizes}, variants {names}", device))
    results = {}
    for n_train, n_test in zip((int(s) for s in args.sizes.split(",")), (int(t) for t in args.tests.split(","))):
        spec = folder(root, n_train, n_test)
        test = to_arrays(load_dataset(spec, "test"))
        for seed in (int(s) for s in args.seeds.split(",")):
            for name in dict.fromkeys(names):
                settings = dict(variants[name], **({"epochs": args.epochs} if args.epochs else {}))
                if name == "finetune":
                    settings["init"] = str(root / "runs" / f"{n_train}-classifier-seed-{seed}" / "best.pt")
                key = f"{n_train} {name} seed {seed}"
                results[key] = run(spec, settings, seed, test, root / "runs" / key.replace(" ", "-"))
                show(key, results[key])
                if args.json:
                    Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
