"""Time to accuracy on digits: the release's recipe vs jemeval's fast recipe, several seeds.

    python benchmarks/time_to_accuracy.py [--seeds 0,1,2] [--recipes release,fast] [--threads 1]
        [--device cpu] [--candidate NAME:key=value,key=value ...] [--json FILE]
        [--targets ACC,UNIFORM,INTERP --base SECONDS]

(``decay_epochs`` in a candidate takes epochs separated by ``/``: ``decay_epochs=6/9``.)

Each (recipe, seed) is a real ``jemeval.training.train`` run (the Python API, one process, no
sample grids, no final test evaluation). After every epoch an ``on_step`` callback evaluates the
current weights through the Python API: ``jemeval.evaluation.accuracy.evaluate`` (digits test
accuracy) and ``jemeval.evaluation.ood.evaluate.evaluate_ood`` (AUROC of log p~(x), digits test vs
``uniform`` and vs ``interp``: averages of two test digits). Evaluation time is not charged: the
clock is the run's wall (and process CPU) time minus the time spent evaluating; the trainer's own
per-epoch validation and checkpoint writes are charged, as in any run.

Recipes (jemeval.training.recipes.RECIPES has the fast one; it is ``jemeval train digits --recipe fast``):

* release: the digits defaults with the paper's sampler (SGLD 20 steps, step size 1, noise 0.01,
  buffer re-initialisation 0.05): cnn:width=32, Adam 3e-3, batch 64, 20 epochs, lr x0.3 at epoch 15;
* fast:    the recipe ``--recipe fast`` sets (SGLD 10 steps of size 2, Adam 4e-3, energy L2 0.01, 15 epochs,
  lr x0.1 at 14; see RECIPES["fast"] and docs/training.md).

The target is the release recipe's FINAL numbers, averaged over the seeds: test accuracy, AUROC vs
uniform, AUROC vs interp. A run reaches it at the first epoch end where all three are at least the
target (a release run's own time is its full training time: its final numbers define the target).
Printed: per-epoch curves, time to target per seed, mean and spread, and the ratio fast / release.
The order alternates recipe by recipe within each seed, so machine load hits them alike.

Not to rerun the release for every candidate: ``--targets ACC,UNIFORM,INTERP`` gives the target (a
previous run's release means; the release is then not run unless ``--recipes`` names it) and
``--base SECONDS`` the release's time the ratios are taken against.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from timing import header, setup

from jemeval.errors import TrainingDiverged
from jemeval.evaluation.accuracy import evaluate
from jemeval.evaluation.ood.evaluate import evaluate_ood
from jemeval.training import train
from jemeval.training.ddp import batch_plan
from jemeval.training.recipes import DIGITS, RECIPES

#: the release's sampler on the digits recipe (docs/training.md, "Recipes")
RELEASE = {"sgld_steps": 20, "sgld_lr": 1.0, "sgld_std": 0.01, "reinit_freq": 0.05, "sampler": "sgld"}
METRICS = ("acc", "auroc_uniform", "auroc_interp")


def recipe_settings(name: str, candidates: dict[str, dict]) -> dict:
    """The settings a recipe name stands for (on top of the digits defaults)."""
    if name == "release":
        return dict(RELEASE)
    if name in candidates:
        return dict(candidates[name])
    return {"recipe": name}


def parse_candidate(text: str) -> tuple[str, dict]:
    """``NAME:key=value,key=value`` -> (NAME, settings); values parsed as int, float, bool or text."""
    name, _, body = text.partition(":")
    settings: dict = {}
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        key, value = key.strip(), value.strip()
        settings[key] = tuple(int(v) for v in value.split("/") if v) if key == "decay_epochs" else _value(value)
    return name.strip(), settings


def _value(text: str):
    if text in ("true", "false", "True", "False"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def measure(model) -> dict[str, float]:
    """Test accuracy and log p~(x) AUROC vs uniform / interp of the current weights."""
    acc = evaluate(model, "digits", device=model.device, progress=False).records[0]["accuracy"]
    ood = evaluate_ood(model, ["uniform", "interp"], id="digits", scores="logpx", device=model.device,
                       progress=False).records
    by_set = {r["ood"].split(":")[0]: r["auroc"] for r in ood}
    model.train()
    return {"acc": acc, "auroc_uniform": by_set["uniform"], "auroc_interp": by_set["interp"]}


def run(settings: dict, seed: int, device: str) -> list[dict]:
    """One training run; the curve: per epoch end (rolled-back epochs included), the charged wall/CPU
    seconds and the three numbers; every point also carries the run's ``status`` (completed or
    diverged: the recovery budget spent) and ``recoveries`` (rollbacks on the way)."""
    curve: list[dict] = []
    clock = {"eval_wall": 0.0, "eval_cpu": 0.0}

    def on_step(trainer) -> None:
        p = trainer.parts
        iterations, _ = batch_plan(len(p.data.x), trainer.config.batch_size, p.ctx.world_size)
        if trainer.position.batch != iterations:
            return
        w0, c0 = time.perf_counter(), time.process_time()
        point = {"epoch": trainer.position.epoch + 1, "wall": w0 - start_wall - clock["eval_wall"],
                 "cpu": c0 - start_cpu - clock["eval_cpu"], **measure(p.model)}
        curve.append(point)
        clock["eval_wall"] += time.perf_counter() - w0
        clock["eval_cpu"] += time.process_time() - c0

    with tempfile.TemporaryDirectory() as out:
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        try:
            summary = train("digits", seed=seed, device=device, out=str(Path(out) / "run"), progress=False,
                            grid_every=0, test_eval=False, on_step=on_step, **settings).records[0]
            status, recoveries = "completed", summary["recoveries"]
        except TrainingDiverged:  # the recovery budget was spent: a failed run, reported as such
            status, recoveries = "diverged", None
            if not curve:  # before the first epoch end: one point at the time it took, numbers unknown
                curve.append({"epoch": 0, "wall": time.perf_counter() - start_wall - clock["eval_wall"],
                              "cpu": time.process_time() - start_cpu - clock["eval_cpu"],
                              **dict.fromkeys(METRICS, float("nan"))})
    for point in curve:
        point.update(status=status, recoveries=recoveries)
    return curve


def reached(curve: list[dict], target: dict[str, float]) -> dict | None:
    """The first epoch end at which every number is at least the target's (never for a diverged run:
    its user gets an error, not a model)."""
    if curve and curve[-1]["status"] == "diverged":
        return None
    return next((p for p in curve if all(p[m] >= target[m] - 1e-12 for m in METRICS)), None)


def summarize(curves: dict[str, dict[int, list[dict]]], seeds: list[int], target: dict | None = None) -> dict:
    """Target (the release's mean final numbers, or given), and per recipe and seed the time to reach it."""
    if target is None:
        finals = [curves["release"][s][-1] for s in seeds]
        target = {m: statistics.mean(f[m] for f in finals) for m in METRICS}
        source = f"release, final, mean of seeds {seeds}"
    else:
        source = "given with --targets"
    out: dict = {"target": target, "target_source": source, "recipes": {}}
    for name, per_seed in curves.items():
        rows = {}
        for s in seeds:
            curve = per_seed[s]
            hit = curve[-1] if name == "release" else reached(curve, target)
            own = curves.get("release", {}).get(s)
            paired = curve[-1] if name == "release" else (reached(curve, own[-1]) if own else None)
            rows[s] = {"final": curve[-1], "hit": hit, "paired": paired}
        out["recipes"][name] = rows
    return out


def _spread(values: list[float]) -> str:
    if not values:
        return "never"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):6.1f} s +- {sd:4.1f} (min {min(values):.1f}, max {max(values):.1f})"


def _outcome(point: dict) -> str:
    if point["status"] == "diverged":
        return "DIVERGED (recovery budget spent)"
    return f"{point['recoveries']} rollbacks" if point["recoveries"] else ""


def report(summary: dict, seeds: list[int], clock: str, base: float | None = None) -> None:
    """The table: final numbers, time to target per seed, mean and spread, ratio vs release (or ``base``)."""
    t = summary["target"]
    print(f"target ({summary['target_source']}): acc {t['acc']:.4f}  AUROC uniform "
          f"{t['auroc_uniform']:.4f}  AUROC interp {t['auroc_interp']:.4f}")
    print(f"{'recipe':10s} {'seed':>4s} {'final acc':>9s} {'unif':>6s} {'interp':>6s} {'total s':>8s}   "
          f"{'to target (' + clock + ' s, epoch)':>26s}   {'to own seed release':>20s}")
    means: dict[str, list[float]] = {}
    for name, rows in summary["recipes"].items():
        for s in seeds:
            r = rows[s]
            f, hit, paired = r["final"], r["hit"], r["paired"]
            hit_text = f"{hit[clock]:7.1f} (ep {hit['epoch']:2d})" if hit else "      never"
            pair_text = f"{paired[clock]:7.1f} (ep {paired['epoch']:2d})" if paired else "      never"
            print(f"{name:10s} {s:4d} {f['acc']:9.4f} {f['auroc_uniform']:6.3f} {f['auroc_interp']:6.3f} "
                  f"{f[clock]:8.1f}   {hit_text:>26s}   {pair_text:>20s}   {_outcome(f)}")
            if hit:
                means.setdefault(name, []).append(hit[clock])
    if base is None:
        base = statistics.mean(means["release"]) if means.get("release") else float("nan")
    print(f"release time (the ratios' base): {base:.1f} {clock} s")
    for name, values in means.items():
        reached_n = len(values)
        ratio = statistics.mean(values) / base if values else float("nan")
        print(f"{name:10s} time to target: {_spread(values)}; reached by {reached_n}/{len(seeds)} seeds; "
              f"mean / release {ratio:.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--recipes", default="release,fast")
    parser.add_argument("--candidate", action="append", default=[],
                        help="an extra recipe NAME:key=value,... (TrainConfig settings over the digits defaults)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads: default 1 on CPU; 0 = torch's")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--json", help="write the curves and the summary to this file")
    parser.add_argument("--targets", help="ACC,UNIFORM,INTERP: fixed targets (e.g. a previous run's release means); "
                                          "the release recipe is then not run unless --recipes names it")
    parser.add_argument("--base", type=float, help="the release's time in seconds (of --clock) for the ratios, "
                                                   "when it is not run here")
    args = parser.parse_args(argv)
    args.seed = 0
    device = setup(args)
    seeds = [int(s) for s in args.seeds.split(",")]
    candidates = dict(parse_candidate(c) for c in args.candidate)
    names = [n.strip() for n in args.recipes.split(",") if n.strip()]
    target = dict(zip(METRICS, (float(v) for v in args.targets.split(",")), strict=True)) if args.targets else None
    if "release" not in names and target is None:
        names.insert(0, "release")
    print(header(f"time to accuracy on digits: recipes {names}, seeds {seeds}", device))
    print(f"# digits defaults: {DIGITS}")
    for name in names:
        print(f"# {name}: {recipe_settings(name, candidates)}" + (f" = {RECIPES[name]['digits']}"
                                                                    if name in RECIPES and name != "paper" else ""))
    curves: dict[str, dict[int, list[dict]]] = {n: {} for n in names}
    for s in seeds:
        for name in names:
            curves[name][s] = run(recipe_settings(name, candidates), s, str(device))
            last = curves[name][s][-1]
            print(f"#   {name} seed {s}: {len(curves[name][s])} epoch ends, {last['wall']:.1f} s wall, "
                  f"{last['cpu']:.1f} s CPU, acc {last['acc']:.4f}, AUROC uniform {last['auroc_uniform']:.3f}, interp "
                  f"{last['auroc_interp']:.3f}, {last['status']}, {last['recoveries']} rollbacks", flush=True)
    summary = summarize(curves, seeds, target)
    report(summary, seeds, args.clock, args.base)
    if args.json:
        Path(args.json).write_text(json.dumps({"curves": curves, "summary": summary}, indent=1, default=str))


if __name__ == "__main__":
    main()
