"""One JEM training iteration: the release-style naive reference vs jemeval, in one run.

    python benchmarks/train_iteration.py [--arch wrn:depth=16,widen=4] [--batch 64] [--steps 20]
        [--repeats 2] [--threads N] [--device cpu|cuda]
        [--variants naive,jemeval,jemeval+cl,jemeval+cl+bf16,trainer]

The paper's settings (batch 64, 20 SGLD steps, step size 1, noise 0.01, buffer 10,000, reinit
0.05, Adam 1e-4) on WRN-16-4 (28-10 would take minutes per iteration on a CPU). Variants:

* naive:           benchmarks/naive_reference.py, the release's loop written plainly (the "before");
* jemeval:         the same iteration from jemeval's parts: the shared SGLD sampler (frozen
                   parameters, no retained graph), the replay buffer on the device, and ONE
                   forward over cat([data, samples]) whose data logits also give the
                   cross-entropy (no BatchNorm in the WRN), default fast path of the device;
* jemeval+cl[+bf16]: the same with channels_last (and bf16 autocast for the network);
* trainer:         jemeval.training's own ``TrainStep`` with the device's default fast path.

Printed: median iteration times, speedups over naive, and iteration / ((steps + 1) x fwd+bwd).
"""
from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F
from naive_reference import naive_iteration
from timing import add_common_args, fmt_ms, header, interleave, setup

from jemeval.energy.factory import create_model
from jemeval.runtime.fastpath import FastPath, joint_logits
from jemeval.sampling.buffer import ReplayBuffer
from jemeval.sampling.sgld import SGLD

SWITCHES = {"jemeval": {}, "jemeval+cl": {"channels_last": True},
            "jemeval+cl+bf16": {"channels_last": True, "bf16": True}}


def jemeval_iteration(model, x_lab, y_lab, buffer: ReplayBuffer, optimizer, sampler: SGLD, *,
                      fastpath: FastPath, generator: torch.Generator, steps: int | None = None) -> torch.Tensor:
    """Algorithm 1 from jemeval components (what the trainer's step does, written out)."""
    x0, idx = buffer.sample(x_lab.shape[0], generator=generator)
    x_q = sampler.sample(model, x0, steps=steps, generator=generator, fastpath=fastpath)
    buffer.push(idx, x_q)
    model.train()
    logits_d, logits_q = joint_logits(model, x_lab, x_q, fastpath=fastpath)
    loss = F.cross_entropy(logits_d, y_lab) - (logits_d.logsumexp(1).mean() - logits_q.logsumexp(1).mean())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def trainer_step(model, shape, num_classes: int, device, generator, fastpath: FastPath):
    """jemeval.training's TrainStep at the same settings, or (None, reason) if unavailable."""
    try:
        from jemeval.training.augment import Augment
        from jemeval.training.objectives import Weights
        from jemeval.training.step import StepOptions, TrainStep
    except ImportError as err:  # the trainer is optional for this benchmark
        return None, f"jemeval.training has no TrainStep ({err})"
    prepared = fastpath.prepare(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.999))
    try:
        step = TrainStep(model, opt, sgld=SGLD(), buffer=ReplayBuffer(10000, shape, device=device, generator=generator),
                         weights=Weights(), num_classes=num_classes, input_shape=shape, augment=Augment(),
                         generator=generator, options=StepOptions(sigma=0.0, fastpath=fastpath), forward=prepared.run)
    except TypeError as err:
        return None, f"TrainStep's signature changed ({err})"
    return step, None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="wrn:depth=16,widen=4")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--input-shape", default="3,32,32")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--variants", default="naive,jemeval,jemeval+cl+bf16,trainer")
    add_common_args(parser, repeats=2)
    args = parser.parse_args(argv)
    device = setup(args)
    shape = tuple(int(s) for s in args.input_shape.split(","))
    base = create_model(args.arch, args.classes, shape).to(device)
    x = torch.rand((args.batch, *shape), device=device) * 2 - 1
    y = torch.randint(0, args.classes, (args.batch,), device=device)
    g = torch.Generator(device=device).manual_seed(args.seed)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    notes, full, warm = [], {}, {}

    for name in names:
        model = copy.deepcopy(base)
        if name == "naive":
            opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.999))
            buf = torch.FloatTensor(10000, *shape).uniform_(-1, 1)
            full[name] = lambda m=model, o=opt, b=buf: naive_iteration(m, x, y, b, o, n_steps=args.steps)
            warm[name] = lambda m=model, o=opt, b=buf: naive_iteration(m, x, y, b, o, n_steps=1)
        elif name in SWITCHES:
            fp = FastPath.for_device(device, **SWITCHES[name])
            run = fp.prepare(model).run
            opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.999))
            buf = ReplayBuffer(10000, shape, device=device, generator=g)
            sampler = SGLD(steps=args.steps)
            for key, steps in ((full, None), (warm, 1)):
                key[name] = (lambda r=run, o=opt, b=buf, fp=fp, s=steps, smp=sampler:
                             jemeval_iteration(r, x, y, b, o, smp, fastpath=fp, generator=g, steps=s))
        elif name == "trainer":
            fp = FastPath.for_device(device)
            step, reason = trainer_step(model, shape, args.classes, device, g, fp)
            if step is None:
                notes.append(f"trainer: not timed: {reason}")
                continue
            step.sgld.steps = args.steps
            full[name] = lambda s=step: s(x, y)
            warm[name] = lambda s=step: s(x, y)
            notes.append(f"trainer: jemeval.training.step.TrainStep, fast path {fp.settings()}")
        else:
            parser.error(f"unknown variant {name!r}")

    fb_model = copy.deepcopy(base)

    def fwd_bwd():
        fb_model.train()
        F.cross_entropy(fb_model(x), y).backward()
        for p in fb_model.parameters():
            p.grad = None

    print(header(f"JEM training iteration: {args.arch}, batch {args.batch}, {args.steps} SGLD steps", device))
    interleave({**warm, "fwd+bwd": fwd_bwd}, 1, device, warmup=0)  # warm-up: primitives, allocator
    t = interleave({**full, "fwd+bwd": fwd_bwd}, args.repeats, device, warmup=0)
    fb = t.pop("fwd+bwd")
    print(f"training fwd+bwd (fp32, batch {args.batch}): cpu {fmt_ms(fb['cpu'])} ms, wall {fmt_ms(fb['wall'])} ms")
    ref = t.get("naive")
    print(f"{'variant':18s} {'cpu ms':>9s} {'wall ms':>9s}   speedup vs naive (cpu, wall)   "
          "iter/((steps+1) x fwd+bwd) (cpu, wall)")
    for name, r in t.items():
        speed = (f"{ref['cpu'] / r['cpu']:6.2f}x {ref['wall'] / r['wall']:6.2f}x" if ref else "   n/a")
        unit = (args.steps + 1)
        print(f"{name:18s} {fmt_ms(r['cpu'])} {fmt_ms(r['wall'])}   {speed:>28s}   "
              f"{r['cpu'] / (unit * fb['cpu']):6.3f} {r['wall'] / (unit * fb['wall']):6.3f}")
    for note in notes:
        print("#", note)


if __name__ == "__main__":
    main()
