"""Images per second of the grad-norm OOD score, batched, per fast-path setting.

    python benchmarks/gradnorm_throughput.py [--arch wrn:depth=16,widen=4] [--batch 128] [--batches 2]
                                             [--repeats 3] [--threads N] [--device cpu|cuda]

The score is -||d log p~(x)/dx||_2 per example (the JEM paper's evaluation, docs/reproducing.md), one backward per
batch. Variants, interleaved in one run:

* naive:       the release's evaluation code: parameters requiring grad, ``retain_graph=True``;
* jemeval:     the registered ``gradnorm`` score (frozen parameters, input gradient only);
* +channels_last, +bf16, +both: the same score called on a channels_last model/input and/or
  under bf16 autocast, as an evaluation loop would apply the fast path without changing the
  score plugin's ``(model, x)`` signature. Their agreement with the fp32 scores is printed
  (Spearman rank correlation, which is what AUROC depends on).
"""
from __future__ import annotations

import argparse
import copy

import numpy as np
import torch
from scipy.stats import spearmanr
from timing import add_common_args, header, interleave, setup

from jemeval.builtins.scores import gradnorm
from jemeval.energy.factory import create_model
from jemeval.runtime.fastpath import FastPath


def naive_gradnorm(f, x: torch.Tensor) -> torch.Tensor:
    """The release's grad-norm score: x_k requires grad, parameters untouched, retain_graph."""
    x_k = x.clone().requires_grad_(True)
    f_prime = torch.autograd.grad(f(x_k).logsumexp(1).sum(), [x_k], retain_graph=True)[0]
    return -f_prime.view(x.size(0), -1).norm(p=2, dim=1)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="wrn:depth=16,widen=4")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--batches", type=int, default=2, help="batches scored per timed call")
    parser.add_argument("--input-shape", default="3,32,32")
    parser.add_argument("--classes", type=int, default=10)
    add_common_args(parser, repeats=3)
    args = parser.parse_args(argv)
    device = setup(args)
    shape = tuple(int(s) for s in args.input_shape.split(","))
    base = create_model(args.arch, args.classes, shape).to(device).eval()
    data = [torch.rand((args.batch, *shape), device=device) * 2 - 1 for _ in range(args.batches)]
    n = args.batch * args.batches

    configs = {"jemeval": FastPath(), "+channels_last": FastPath(channels_last=True), "+bf16": FastPath(bf16=True),
               "+channels_last+bf16": FastPath(channels_last=True, bf16=True)}
    scores: dict[str, list[torch.Tensor]] = {}

    def scorer(name, model, fp):
        def run():
            out = []
            for x in data:
                with fp.autocast(device.type):
                    out.append(gradnorm(model, fp.to_input(x)))
            scores[name] = out
        return run

    variants = {"naive": lambda: scores.__setitem__("naive", [naive_gradnorm(base, x) for x in data])}
    for name, fp in configs.items():
        variants[name] = scorer(name, fp.prepare(copy.deepcopy(base)).run.eval(), fp)

    print(header(f"grad-norm score throughput: {args.arch}, {args.batches} batches of {args.batch}", device))
    t = interleave(variants, args.repeats, device)
    ref = torch.cat(scores["jemeval"]).cpu().numpy()
    print(f"{'variant':22s} {'img/s cpu':>10s} {'img/s wall':>11s}  {'vs naive (wall)':>15s}  "
          f"{'Spearman vs fp32':>16s}  max rel. diff")
    for name, r in t.items():
        s = torch.cat(scores[name]).float().cpu().numpy()
        rho = spearmanr(ref, s).statistic
        rel = float(np.max(np.abs(s - ref) / np.abs(ref)))
        speedup = t["naive"]["wall"] / r["wall"]
        print(f"{name:22s} {n / r['cpu']:10.1f} {n / r['wall']:11.1f}  {speedup:14.2f}x  {rho:16.4f}  {rel:.2e}")


if __name__ == "__main__":
    main()
