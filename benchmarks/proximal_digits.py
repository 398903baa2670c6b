"""JEM++'s proximal SGLD vs the default SGLD on digits: accuracy and log p(x) AUROC per CPU-second.

    python benchmarks/proximal_digits.py [--budget 20] [--evals 3] [--threads 1] [--seed 0]
                                         [--samplers sgld10,pyld5x5,pyld5x5-reuse,sgld5]

Each sampler trains its own copy of the same initial model with the digits recipe of
jemeval.training (cnn:width=32, Adam 3e-3 with 20 warm-up iterations, batch 64, sigma 0.03, buffer
1,000, reinit 0.05) and Algorithm 1 built from jemeval parts (benchmarks/train_iteration.py's
``jemeval_iteration``). The runs advance round-robin, one iteration each, so machine load hits them
alike; each stops after ``--budget`` seconds of its own process CPU time. At ``--evals`` equal
points of that budget it reports test accuracy and the AUROC of log p~(x) for digits test
(positive) vs U(-1, 1) noise and vs "interp" (averages of two test digits); evaluation time is not
charged. Samplers:

* sgld10:  the digits default, SGLD 10 steps, step 1, noise 0.01;
* pyld5x5: ProximalSGLD with JEM++'s release settings (5 outer x 5 inner, 1.0 / 0.2, eps 1, no noise);
* pyld5x5-reuse: the same with ``recompute_first_layer=False`` (identical samples for this
  conv-first model, without the 25 first-layer passes per iteration);
* sgld5:   a control with as many full passes as pyld5x5 (is it the inner steps, or just fewer steps?).
"""
from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from timing import header, setup
from train_iteration import jemeval_iteration

from jemeval.data import load_dataset, to_arrays
from jemeval.energy.factory import create_model
from jemeval.runtime.fastpath import FastPath
from jemeval.sampling.buffer import ReplayBuffer
from jemeval.sampling.proximal import ProximalSGLD
from jemeval.sampling.sgld import SGLD

SAMPLERS = {
    "sgld10": lambda: SGLD(steps=10, step_size=1.0, noise=0.01),
    "pyld5x5": lambda: ProximalSGLD(),
    "pyld5x5-reuse": lambda: ProximalSGLD(recompute_first_layer=False),
    "sgld5": lambda: SGLD(steps=5, step_size=1.0, noise=0.01),
}
LR, WARMUP, BATCH, SIGMA = 3e-3, 20, 64, 0.03


class Run:
    """One training run: model, optimizer, buffer, its own RNG streams and CPU-time account."""

    def __init__(self, name: str, base, x: torch.Tensor, y: torch.Tensor, seed: int):
        self.name, self.sampler = name, SAMPLERS[name]()
        self.model = copy.deepcopy(base)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=LR)
        self.g = torch.Generator().manual_seed(seed)
        self.buffer = ReplayBuffer(1000, x.shape[1:], generator=self.g)
        self.x, self.y = x, y
        self.order, self.pos, self.iters, self.cpu, self.wall = torch.randperm(len(x), generator=self.g), 0, 0, 0.0, 0.0

    def step(self) -> None:
        c0, w0 = time.process_time(), time.perf_counter()
        if self.pos + BATCH > len(self.order):
            self.order, self.pos = torch.randperm(len(self.x), generator=self.g), 0
        idx = self.order[self.pos:self.pos + BATCH]
        self.pos += BATCH
        for group in self.opt.param_groups:
            group["lr"] = LR * min(1.0, (self.iters + 1) / WARMUP)
        xb = self.x[idx] + SIGMA * torch.randn(self.x[idx].shape, generator=self.g)
        loss = jemeval_iteration(self.model, xb, self.y[idx], self.buffer, self.opt, self.sampler,
                                 fastpath=FastPath(), generator=self.g)
        if not torch.isfinite(loss):
            raise RuntimeError(f"{self.name}: loss diverged at iteration {self.iters}")
        self.iters += 1
        self.cpu += time.process_time() - c0
        self.wall += time.perf_counter() - w0


def evaluate(model, x_test, y_test, ood: dict[str, torch.Tensor]) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        logits = model(x_test)
        lp_in = logits.logsumexp(1).numpy()
        out = {"acc": float((logits.argmax(1) == y_test).float().mean())}
        for name, x_ood in ood.items():
            lp_out = model(x_ood).logsumexp(1).numpy()
            labels = np.r_[np.ones(len(lp_in)), np.zeros(len(lp_out))]
            out[name] = float(roc_auc_score(labels, np.r_[lp_in, lp_out]))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=20.0, help="CPU seconds of training per sampler")
    parser.add_argument("--evals", type=int, default=3)
    parser.add_argument("--samplers", default="sgld10,pyld5x5,pyld5x5-reuse,sgld5")
    parser.add_argument("--threads", type=int, default=None, help="default 1 on CPU; 0 = torch's choice")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = setup(args)
    x, y = to_arrays(load_dataset("digits", "train"))
    x_test, y_test = to_arrays(load_dataset("digits", "test"))
    g = torch.Generator().manual_seed(123)
    ood = {"auroc_uniform": torch.rand(x_test.shape, generator=g) * 2 - 1,
           "auroc_interp": (x_test + x_test[torch.randperm(len(x_test), generator=g)]) / 2}
    base = create_model("cnn:width=32", 10, tuple(x.shape[1:]))
    runs = [Run(name.strip(), base, x, y, args.seed) for name in args.samplers.split(",")]
    points = [args.budget * (k + 1) / args.evals for k in range(args.evals)]
    results: dict[str, list[tuple]] = {r.name: [] for r in runs}
    next_point = {r.name: 0 for r in runs}

    print(header(f"proximal vs default SGLD on digits: {args.budget:.0f} CPU-s per sampler", device))
    while any(next_point[r.name] < len(points) for r in runs):
        for r in runs:
            k = next_point[r.name]
            if k >= len(points):
                continue
            r.step()
            if r.cpu >= points[k]:
                results[r.name].append((r.cpu, r.wall, r.iters, evaluate(r.model, x_test, y_test, ood)))
                next_point[r.name] += 1
    print(f"{'sampler':14s} {'cpu s':>6s} {'wall s':>7s} {'iters':>6s} {'ms/iter':>8s} {'test acc':>9s} "
          f"{'AUROC unif':>10s} {'AUROC interp':>12s}   settings")
    for r in runs:
        for i, (cpu, wall, iters, ev) in enumerate(results[r.name]):
            settings = r.sampler.settings() if i == 0 else ""
            print(f"{r.name:14s} {cpu:6.1f} {wall:7.1f} {iters:6d} {1000 * cpu / iters:8.1f} {ev['acc']:9.3f} "
                  f"{ev['auroc_uniform']:10.3f} {ev['auroc_interp']:12.3f}   {settings}")


if __name__ == "__main__":
    main()
