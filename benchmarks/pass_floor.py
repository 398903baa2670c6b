"""jemeval's evaluation commands against the floor: a plain torch loop doing the passes they need.

    python benchmarks/pass_floor.py [--n 1000] [--batch 100] [--width 32] [--repeats 3] [--threads 1]
        [--robust-n 100] [--robust-steps 10] [--only ood,eval,calibrate,robust,train]
        [--allocator tuned|default]

CPU time is reported as user and system seconds apart (``getrusage``): a batch whose buffers are
mapped afresh costs system time (the kernel zeroing pages) that a CPU-time ratio would hide on both
sides (issue 37, item 4). The process runs with the allocator setting every jemeval command applies at
start-up (:func:`jemeval.runtime.memory.tune_allocator`; ``--allocator default`` leaves glibc's
defaults), the floor included, so the comparison is fair; the floor is also run with glibc's defaults
in a child process (the "untuned floor" columns), interleaved with the others.

A CIFAR-shaped set (3x32x32 uint8 images, 10 classes) and an OOD set of uniform noise images are
written as the user's own npz files; a ``cnn`` for that shape (untrained: the cost of a pass does not
depend on the weights) is the model. Each jemeval function runs through its public Python API on the
npz files, reading them as a user's run does, metrics and provenance included; the floor is a plain
torch loop over the same images, already in memory as float tensors in the model's [-1, 1] scale:

* ``ood`` (``evaluate_ood``, scores logpx, maxprob, gradnorm; ID and OOD sets): the floor is one
  forward with grad and one backward to the input per batch (what ``gradnorm`` needs; the other two
  read the logits of that same forward). Goal (issue 28): <= 1.1x.
* ``eval`` (``evaluate``) and ``calibrate``: the floor is one no-grad forward per batch.
* ``robust`` at K = 0 (``robust``, apgd-ce, Linf 8/255, ``--robust-steps`` steps, one restart): the
  floor is robust accuracy with torchattacks run directly: a clean forward, APGD on the [0, 1]
  images, a forward of the adversarial examples to count what is still correct. (An untrained
  model classifies ~10% of the inputs correctly and APGD attacks only those, so the two forwards
  weigh more here than on a trained model.)

* ``train`` (``jemeval.training.train`` of the classifier objective, ``px_weight=0``, one epoch of
  ``--train-n`` images of the npz, batch 64, no augmentation, no test evaluation; the checkpoint and
  the epoch's validation pass included): the floor is the same epoch as a plain loop: a seeded
  permutation, the batch with N(0, 0.03^2) noise, forward, cross-entropy, backward, Adam step, then
  one no-grad forward over the held-out images.

Variants run round-robin; medians of user, system and wall seconds (one thread by default); the
ratio jemeval / floor of user time is the figure (goal: <= 1.1x).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from timing import add_common_args, header, setup, sync

from jemeval.energy.factory import create_model
from jemeval.evaluation.accuracy import evaluate
from jemeval.evaluation.calibration import calibrate
from jemeval.evaluation.ood.evaluate import evaluate_ood
from jemeval.evaluation.robust.evaluate import robust
from jemeval.runtime.memory import allocator_setting, tune_allocator
from jemeval.training import resolve_config, train

SHAPE, CLASSES, EPS, TRAIN_BATCH = (3, 32, 32), 10, 8 / 255, 64


def write_sets(folder: Path, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """id.npz (x_test, y_test) and ood.npz (x) as uint8 HWC, the user's layout; the same images as
    float tensors in [-1, 1] (N x 3 x 32 x 32) and the labels, for the floor."""
    rng = np.random.default_rng(seed)
    x_id = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    y_id = rng.integers(0, CLASSES, n)
    x_ood = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    # a train split too, as a user's ID file has (ood compares the OOD images with it; main f3ec869 refuses an
    # npz OOD set whose ID file has no train split, a bug reported beside issue 37)
    np.savez(folder / "id.npz", x_test=x_id, y_test=y_id, x_train=rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
             y_train=rng.integers(0, CLASSES, n))
    np.savez(folder / "ood.npz", x=x_ood)

    def scaled(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).permute(0, 3, 1, 2).float().div(127.5).sub(1.0).contiguous()

    return scaled(x_id), scaled(x_ood), torch.from_numpy(y_id)


def write_train_set(folder: Path, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """train.npz (x, y: uint8 HWC, one split) and the same images as floats, for the floor; the first
    n // 10 are the ones training holds out (the floor takes them, jemeval its own seeded choice)."""
    rng = np.random.default_rng(seed + 1)
    x, y = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, CLASSES, n)
    np.savez(folder / "train.npz", x=x, y=y)
    return torch.from_numpy(x).permute(0, 3, 1, 2).float().div(127.5).sub(1.0).contiguous(), torch.from_numpy(y)


def forward_floor(model, images: list[torch.Tensor], batch: int) -> None:
    with torch.no_grad():
        for x in images:
            for i in range(0, len(x), batch):
                model(x[i:i + batch])


def forward_backward_floor(model, images: list[torch.Tensor], batch: int) -> None:
    for x in images:
        for i in range(0, len(x), batch):
            xb = x[i:i + batch].detach().requires_grad_(True)
            torch.autograd.grad(model(xb).logsumexp(dim=1).sum(), xb)


def apgd_floor(model, x: torch.Tensor, y: torch.Tensor, steps: int, batch: int) -> None:
    import torchattacks

    class Unit(torch.nn.Module):  # torchattacks' convention: [0, 1] images
        def forward(self, x01):
            return model(x01 * 2 - 1)

    attack = torchattacks.APGD(Unit().eval(), norm="Linf", eps=EPS, steps=steps, n_restarts=1, loss="ce", seed=0)
    x01 = (x + 1) / 2
    for i in range(0, len(x), batch):
        xb, yb = x01[i:i + batch], y[i:i + batch]
        with torch.no_grad():
            clean = model(xb * 2 - 1).argmax(1) == yb
        adv = attack(xb, yb)
        with torch.no_grad():
            robust = clean & (model(adv * 2 - 1).argmax(1) == yb)
        robust.sum().item()


def train_floor(width: int, x: torch.Tensor, y: torch.Tensor, val: int, seed: int) -> None:
    """One epoch of the plain classifier on all but ``val`` images, then a no-grad pass over those."""
    torch.manual_seed(seed)
    net = create_model(f"cnn:width={width}", CLASSES, SHAPE)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    xt, yt, xv = x[val:], y[val:], x[:val]
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(xt), generator=g)
    for i in range(0, len(xt) - TRAIN_BATCH + 1, TRAIN_BATCH):
        idx = order[i:i + TRAIN_BATCH]
        xb = xt[idx] + 0.03 * torch.randn(len(idx), *SHAPE, generator=g)
        loss = torch.nn.functional.cross_entropy(net(xb), yt[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    forward_floor(net.eval(), [xv], 256)


def train_jemeval(width: int, data: str, val: int, folder: Path, seed: int) -> None:
    runs = sorted(folder.glob("run-*"))
    config = resolve_config(data, arch=f"cnn:width={width}", epochs=1, px_weight=0, batch_size=TRAIN_BATCH,
                            val_size=val, augment="none", test_eval=False, progress=False, device="cpu", seed=seed,
                            out=str(folder / f"run-{len(runs)}"), grid_every=0)
    train(config)


def measure(fn) -> dict[str, float]:
    """User, system and wall seconds of one call (a child variant returns its own measurement)."""
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    got = fn()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    if isinstance(got, dict):
        return got
    return {"user": r1.ru_utime - r0.ru_utime, "sys": r1.ru_stime - r0.ru_stime, "wall": time.perf_counter() - w0}


def rounds(table: dict, repeats: int, device: torch.device) -> dict[str, dict[str, float]]:
    """Medians of each variant's user, system and wall seconds, run round-robin after one warm-up round."""
    for fn in table.values():
        fn()
        sync(device)
    got: dict[str, list[dict]] = {k: [] for k in table}
    for _ in range(repeats):
        for name, fn in table.items():
            got[name].append(measure(fn))
            sync(device)
    return {k: {m: statistics.median(r[m] for r in v) for m in ("user", "sys", "wall")} for k, v in got.items()}


def untuned_floor(args, name: str) -> dict[str, float]:
    """The floor of ``name`` in a child process with glibc's allocator defaults (mallopt cannot be undone)."""
    cmd = [sys.executable, __file__, "--child-floor", name, "--n", str(args.n), "--batch", str(args.batch),
           "--width", str(args.width), "--train-n", str(args.train_n), "--seed", str(args.seed),
           "--threads", str(args.threads or 1)]
    out = subprocess.run(cmd, env={**os.environ, "JEMEVAL_ALLOCATOR": "default"}, check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def variants(args, model, folder: Path, x_id, x_ood, y_id) -> dict[str, dict]:
    """name -> (floor, jemeval) callables for the commands asked for."""
    context = {"batch_size": args.batch, "progress": False, "seed": 0, "cache": False}
    idf, oodf = f"npz:{folder / 'id.npz'}", f"npz:{folder / 'ood.npz'}"
    xr, yr = x_id[:args.robust_n], y_id[:args.robust_n]
    raw = np.load(folder / "id.npz")  # robust's own set: the first robust_n images, all attacked (no subsample)
    np.savez(folder / "robust.npz", x_test=raw["x_test"][:args.robust_n], y_test=raw["y_test"][:args.robust_n])
    robustf = f"npz:{folder / 'robust.npz'}"
    x_train, y_train = write_train_set(folder, args.train_n, args.seed)
    table = {
        "ood": (lambda: forward_backward_floor(model, [x_id, x_ood], args.batch),
                lambda: evaluate_ood(model, oodf, id=idf, scores="logpx,maxprob,gradnorm", **context)),
        "eval": (lambda: forward_floor(model, [x_id], args.batch),
                 lambda: evaluate(model, idf, **context)),
        "calibrate": (lambda: forward_floor(model, [x_id], args.batch),
                      lambda: calibrate(model, idf, **context)),
        "robust": (lambda: apgd_floor(model, xr, yr, args.robust_steps, args.batch),
                   lambda: robust(model, norm="linf", attacks="apgd-ce", epsilons=[EPS], data=robustf, n=None,
                                  steps=args.robust_steps, restarts=1, **context)),
        "train": (lambda: train_floor(args.width, x_train, y_train, args.train_n // 10, args.seed),
                  lambda: train_jemeval(args.width, f"npz:{folder / 'train.npz'}", args.train_n // 10, folder,
                                        args.seed)),
    }
    return {name: table[name] for name in args.only.split(",")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="images in the ID set and in the OOD set")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--width", type=int, default=32, help="the cnn's width")
    parser.add_argument("--robust-n", type=int, default=100)
    parser.add_argument("--robust-steps", type=int, default=10)
    parser.add_argument("--only", default="ood,eval,calibrate,robust,train")
    parser.add_argument("--train-n", type=int, default=2000, help="images of the train command's npz (of the ID set)")
    parser.add_argument("--allocator", choices=("tuned", "default"), default="tuned",
                        help="tuned: the setting jemeval's CLI applies at start-up; default: glibc's")
    parser.add_argument("--child-floor", default=None, help=argparse.SUPPRESS)
    add_common_args(parser, repeats=3)
    args = parser.parse_args()
    if args.allocator == "tuned" and args.child_floor is None:
        tune_allocator()
    device = setup(args)
    model = create_model(f"cnn:width={args.width}", CLASSES, SHAPE).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        x_id, x_ood, y_id = write_sets(folder, args.n, args.seed)
        table = variants(args, model, folder, x_id, x_ood, y_id)
        if args.child_floor:  # one warm-up and one timed call of the floor, as JSON
            floor = table[args.child_floor][0]
            floor()
            print(json.dumps(measure(floor)))
            return
        print(header(f"jemeval vs the plain torch floor: {args.n} CIFAR-shaped images, batch {args.batch}, "
                     f"cnn width {args.width}, train {args.train_n} images; allocator {allocator_setting()}", device))
        print(f"{'command':<10} {'floor user':>10} {'floor sys':>9} {'jemeval user':>12} {'jemeval sys':>11} "
              f"{'untuned floor user':>18} {'untuned floor sys':>17} {'ratio user':>10} {'ratio wall':>10}")
        for name, (floor, ours) in table.items():
            t = rounds({"floor": floor, "jemeval": ours, "untuned": lambda name=name: untuned_floor(args, name)},
                       args.repeats, device)
            f, j, u = t["floor"], t["jemeval"], t["untuned"]
            print(f"{name:<10} {f['user']:10.3f} {f['sys']:9.3f} {j['user']:12.3f} {j['sys']:11.3f} "
                  f"{u['user']:18.3f} {u['sys']:17.3f} {j['user'] / f['user']:10.3f} {j['wall'] / f['wall']:10.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
