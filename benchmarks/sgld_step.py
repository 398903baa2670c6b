"""Cost of one SGLD step relative to one training forward+backward, per fast-path setting.

    python benchmarks/sgld_step.py [--arch wrn:depth=16,widen=4] [--batch 32] [--input-shape 3,32,32]
                                   [--repeats 5] [--threads N] [--device cpu|cuda] [--compile]

An SGLD step needs one forward and one backward for the *input* gradient only; a training step
needs the same plus every weight gradient. Printed (medians, variants interleaved in one run):

* train fwd+bwd: model in train mode, cross-entropy, ``backward()`` filling weight gradients;
* jemeval step:  ``SGLD(steps=1).sample`` (frozen parameters, no retained graph, fused update);
* naive step:    the original code's step: ``x_k.requires_grad``, parameters left requiring grad,
                 ``autograd.grad(..., retain_graph=True)``, ``x_k.data += lr * g + std * randn``;
* forward only:  a no-grad forward, the floor's unit (a step costs about forward + backward-data).

Each fast-path setting (channels_last, bf16 autocast, both; ``--compile`` adds torch.compile) is
applied to both the training pass and the step, and the step is also compared with the plain
fp32 training pass (what the issue's 0.55 bar is measured against). The last columns are the
achieved GFLOP/s (wall clock) of the training pass and of the step: the FLOPs of each call counted
once with torch's formulas (``timing.flops_of``; the same math under every setting), to hold
against the processor's practical peak: a large matmul in fp32 and in bf16 (``timing.gemm_ceiling``),
whose FLOP/s are printed with the share of it the step reaches.
"""
from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F
from timing import add_common_args, flops_of, fmt_ms, gemm_ceiling, header, interleave, setup

from jemeval.energy.factory import create_model
from jemeval.runtime.fastpath import FastPath
from jemeval.sampling.sgld import SGLD


def naive_step(f, x0: torch.Tensor, lr: float = 1.0, std: float = 0.01) -> torch.Tensor:
    """One step written the way the JEM release writes it (parameters keep requires_grad)."""
    f.eval()
    x_k = x0.clone().requires_grad_(True)
    f_prime = torch.autograd.grad(f(x_k).logsumexp(1).sum(), [x_k], retain_graph=True)[0]
    x_k.data += lr * f_prime + std * torch.randn_like(x_k)
    f.train()
    return x_k.detach()


def train_pass(model, fp: FastPath, x: torch.Tensor, y: torch.Tensor) -> None:
    """Forward + backward of a plain training step (weight gradients computed, then dropped)."""
    model.train()
    with fp.autocast(x.device.type):
        logits = model(fp.to_input(x))
    F.cross_entropy(logits.float(), y).backward()
    for p in model.parameters():
        p.grad = None


def print_results(t: dict[str, dict[str, float]], settings: list[str], flops: dict[str, int],
                  ceiling: dict[str, float]) -> None:
    """The table (times, ratios, GFLOP/s per setting), the naive step and the floor's unit, and the
    step's share of the matmul ceiling of its precision."""
    train32 = t["train/fp32"]
    print(f"# GFLOP per call (torch's formulas): train {flops['train'] / 1e9:.1f}, step {flops['step'] / 1e9:.1f}, "
          f"forward {flops['forward'] / 1e9:.1f}")
    print(f"{'setting':20s} {'train ms':>9s} {'step ms':>9s}   step/train same setting   step/train fp32"
          "   GFLOP/s (wall)")
    print(f"{'':20s} {'cpu':>9s} {'cpu':>9s}   {'cpu':>6s} {'wall':>6s}              {'cpu':>6s} {'wall':>6s}"
          f"   {'train':>6s} {'step':>6s}")
    for name in settings:
        tr, st = t[f"train/{name}"], t[f"step/{name}"]
        print(f"{name:20s} {fmt_ms(tr['cpu'])} {fmt_ms(st['cpu'])}   "
              f"{st['cpu'] / tr['cpu']:6.3f} {st['wall'] / tr['wall']:6.3f}              "
              f"{st['cpu'] / train32['cpu']:6.3f} {st['wall'] / train32['wall']:6.3f}   "
              f"{flops['train'] / 1e9 / tr['wall']:6.1f} {flops['step'] / 1e9 / st['wall']:6.1f}")
    for name, work in (("naive step", flops["step"]), ("forward only", flops["forward"])):
        r = t[name]
        print(f"{name:20s} {'':9s} {fmt_ms(r['cpu'])}   "
              f"{r['cpu'] / train32['cpu']:6.3f} {r['wall'] / train32['wall']:6.3f}   (vs fp32 train)"
              f"   {'':6s} {work / 1e9 / r['wall']:6.1f}")
    js, ns = t["step/fp32"], t["naive step"]
    print(f"jemeval fp32 step / naive step: cpu {js['cpu'] / ns['cpu']:.3f}, wall {js['wall'] / ns['wall']:.3f}")
    shares = [f"{name} {flops['step'] / t[f'step/{name}']['wall'] / ceiling['bf16' if 'bf16' in name else 'fp32']:.0%}"
              for name in settings]
    print(f"GEMM ceiling (one large matmul): fp32 {ceiling['fp32'] / 1e9:.1f} GFLOP/s, "
          f"bf16 {ceiling['bf16'] / 1e9:.1f} GFLOP/s; step / ceiling of its precision (wall): {', '.join(shares)}")
    fw = t["forward only"]
    print(f"fp32 floor estimate (2 x forward) / train: cpu {2 * fw['cpu'] / train32['cpu']:.3f}, "
          f"wall {2 * fw['wall'] / train32['wall']:.3f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="wrn:depth=16,widen=4")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--input-shape", default="3,32,32")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile (slow to start on CPU)")
    add_common_args(parser, repeats=5)
    args = parser.parse_args(argv)
    device = setup(args)
    shape = tuple(int(s) for s in args.input_shape.split(","))
    base = create_model(args.arch, args.classes, shape).to(device)
    x = torch.rand((args.batch, *shape), device=device) * 2 - 1
    y = torch.randint(0, args.classes, (args.batch,), device=device)
    sgld = SGLD(steps=1, step_size=1.0, noise=0.01)
    g = torch.Generator(device=device).manual_seed(args.seed)

    configs = {"fp32": FastPath(), "channels_last": FastPath(channels_last=True), "bf16": FastPath(bf16=True),
               "channels_last+bf16": FastPath(channels_last=True, bf16=True)}
    if args.compile:
        configs["compile"] = FastPath(compile=True)
    variants, compile_s = {}, {}
    for name, fp in configs.items():
        prepared = fp.prepare(copy.deepcopy(base))
        run = prepared.run
        if fp.compile:  # compile both graphs (train and frozen-sampling) before timing
            t0 = time.perf_counter()
            train_pass(run, fp, x, y)
            sgld.sample(run, x, generator=g, fastpath=fp)
            compile_s[name] = time.perf_counter() - t0
        variants[f"train/{name}"] = lambda run=run, fp=fp: train_pass(run, fp, x, y)
        variants[f"step/{name}"] = lambda run=run, fp=fp: sgld.sample(run, x, generator=g, fastpath=fp)
    naive_model = copy.deepcopy(base)
    variants["naive step"] = lambda: naive_step(naive_model, x)

    def forward_only():
        with torch.no_grad():
            base.eval()(x)
    variants["forward only"] = forward_only

    print(header(f"SGLD step vs training forward+backward: {args.arch}, batch {args.batch}, input {shape}", device))
    flops = {"train": flops_of(variants["train/fp32"]), "step": flops_of(variants["step/fp32"]),
             "forward": flops_of(forward_only)}
    t = interleave(variants, args.repeats, device)
    ceiling = {"fp32": gemm_ceiling(device, torch.float32), "bf16": gemm_ceiling(device, torch.bfloat16)}
    print_results(t, list(configs), flops, ceiling)
    for name, s in compile_s.items():
        print(f"torch.compile start-up ({name}): {s:.1f} s")


if __name__ == "__main__":
    main()
