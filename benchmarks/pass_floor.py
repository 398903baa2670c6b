"""jemeval's evaluation commands against the floor: a plain torch loop doing the passes they need.

    python benchmarks/pass_floor.py [--n 1000] [--batch 100] [--width 32] [--repeats 3] [--threads 1]
        [--robust-n 100] [--robust-steps 10] [--only ood,eval,calibrate,robust]

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

Variants run round-robin (:func:`timing.interleave`); medians of process CPU seconds (one thread by
default) and wall seconds; the ratio jemeval / floor is the figure.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from timing import add_common_args, header, interleave, setup

from jemeval.energy.factory import create_model
from jemeval.evaluation.accuracy import evaluate
from jemeval.evaluation.calibration import calibrate
from jemeval.evaluation.ood.evaluate import evaluate_ood
from jemeval.evaluation.robust.evaluate import robust

SHAPE, CLASSES, EPS = (3, 32, 32), 10, 8 / 255


def write_sets(folder: Path, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """id.npz (x_test, y_test) and ood.npz (x) as uint8 HWC, the user's layout; the same images as
    float tensors in [-1, 1] (N x 3 x 32 x 32) and the labels, for the floor."""
    rng = np.random.default_rng(seed)
    x_id = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    y_id = rng.integers(0, CLASSES, n)
    x_ood = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    np.savez(folder / "id.npz", x_test=x_id, y_test=y_id)
    np.savez(folder / "ood.npz", x=x_ood)

    def scaled(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).permute(0, 3, 1, 2).float().div(127.5).sub(1.0).contiguous()

    return scaled(x_id), scaled(x_ood), torch.from_numpy(y_id)


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


def variants(args, model, folder: Path, x_id, x_ood, y_id) -> dict[str, dict]:
    """name -> (floor, jemeval) callables for the commands asked for."""
    context = {"batch_size": args.batch, "progress": False, "seed": 0, "cache": False}
    idf, oodf = f"npz:{folder / 'id.npz'}", f"npz:{folder / 'ood.npz'}"
    xr, yr = x_id[:args.robust_n], y_id[:args.robust_n]
    raw = np.load(folder / "id.npz")  # robust's own set: the first robust_n images, all attacked (no subsample)
    np.savez(folder / "robust.npz", x_test=raw["x_test"][:args.robust_n], y_test=raw["y_test"][:args.robust_n])
    robustf = f"npz:{folder / 'robust.npz'}"
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
    }
    return {name: table[name] for name in args.only.split(",")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="images in the ID set and in the OOD set")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--width", type=int, default=32, help="the cnn's width")
    parser.add_argument("--robust-n", type=int, default=100)
    parser.add_argument("--robust-steps", type=int, default=10)
    parser.add_argument("--only", default="ood,eval,calibrate,robust")
    add_common_args(parser, repeats=3)
    args = parser.parse_args()
    device = setup(args)
    print(header(f"jemeval vs the plain torch floor: {args.n} CIFAR-shaped images, batch {args.batch}, "
                 f"cnn width {args.width}", device))
    model = create_model(f"cnn:width={args.width}", CLASSES, SHAPE).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        x_id, x_ood, y_id = write_sets(folder, args.n, args.seed)
        print(f"{'command':<10} {'floor CPU s':>12} {'jemeval CPU s':>14} {'ratio CPU':>10} {'ratio wall':>11}")
        for name, (floor, ours) in variants(args, model, folder, x_id, x_ood, y_id).items():
            t = interleave({"floor": floor, "jemeval": ours}, args.repeats, device)
            print(f"{name:<10} {t['floor']['cpu']:12.3f} {t['jemeval']['cpu']:14.3f} "
                  f"{t['jemeval']['cpu'] / t['floor']['cpu']:10.3f} {t['jemeval']['wall'] / t['floor']['wall']:11.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
