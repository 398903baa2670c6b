"""Cost of JEM training relative to plain classifier training, measured in one run.

Prints, for one architecture and batch:
* the time of one plain forward+backward (cross-entropy, parameter gradients) of the batch;
* the time of one SGLD step (jemeval.sampling.sgld.SGLD: input gradient only, parameters frozen) on a
  batch of the same size, and its ratio to the plain forward+backward (ideally <= 1: no parameter
  gradients are computed while sampling);
* one full JEM training iteration (jemeval.training.step.TrainStep: buffer draw, K SGLD steps, one
  forward of data + samples together, backward, Adam step), its ratio to the plain step, and the
  training throughput in images/s (plain classifier throughput alongside).

    python benchmarks/train_step.py --arch cnn --batch 64 --steps 20 --input-shape 1,8,8
    python benchmarks/train_step.py --arch wrn:depth=28,widen=10 --batch 64 --steps 20 --input-shape 3,32,32 \
        --device cuda --bf16

The ratios come from the same process and device, measured back to back, so they compare fairly
even on a busy machine; absolute times do not.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, repeats: int, device: torch.device) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="cnn", help="architecture spec (default: cnn)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=20, help="SGLD steps per training iteration")
    p.add_argument("--input-shape", default="1,8,8", help="C,H,W (default 1,8,8: digits)")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--device", default="auto")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions (median reported)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    from jemeval.energy.factory import create_model
    from jemeval.runtime.devices import resolve_device
    from jemeval.runtime.fastpath import FastPath
    from jemeval.sampling.buffer import ReplayBuffer
    from jemeval.sampling.sgld import SGLD
    from jemeval.training.augment import Augment
    from jemeval.training.objectives import Weights
    from jemeval.training.step import StepOptions, TrainStep

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    shape = tuple(int(s) for s in args.input_shape.split(","))
    torch.manual_seed(0)
    model = create_model(args.arch, args.num_classes, shape).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.rand((args.batch, *shape), device=device) * 2 - 1
    y = torch.randint(0, args.num_classes, (args.batch,), device=device)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16))

    def plain_fb():
        with autocast():
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()

    def plain_step():
        plain_fb()
        opt.step()

    sgld = SGLD(steps=args.steps)
    model.train()

    def sgld_steps():
        sgld.sample(model, x, steps=args.steps, fastpath=fastpath)

    g = torch.Generator(device=device).manual_seed(0)
    buffer = ReplayBuffer(max(1000, args.batch), shape, num_classes=args.num_classes, device=device, generator=g)
    fastpath = FastPath(bf16=args.bf16, channels_last=args.channels_last)
    step = TrainStep(model, opt, sgld=sgld, buffer=buffer, weights=Weights(pyx=1, px=1), num_classes=args.num_classes,
                     input_shape=shape, augment=Augment(), generator=g,
                     options=StepOptions(sigma=0.03, fastpath=fastpath))

    def jem_step():
        step(x, y)

    for fn in (plain_step, sgld_steps, jem_step):  # warm-up (allocator, kernels, lazy init)
        fn()
    t_fb = timed(plain_fb, args.repeats, device)
    t_plain = timed(plain_step, args.repeats, device)
    t_sgld = timed(sgld_steps, args.repeats, device) / max(args.steps, 1)
    t_jem = timed(jem_step, args.repeats, device)
    result = {
        "arch": args.arch, "batch": args.batch, "input_shape": list(shape), "sgld_steps": args.steps,
        "device": str(device), "bf16": args.bf16, "threads": torch.get_num_threads(),
        "plain_forward_backward_s": t_fb,
        "sgld_step_s": t_sgld,
        "sgld_step_over_forward_backward": t_sgld / t_fb,
        "jem_iteration_s": t_jem,
        "jem_iteration_over_plain_iteration": t_jem / t_plain,
        "jem_images_per_s": args.batch / t_jem,
        "plain_images_per_s": args.batch / t_plain,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.arch}, batch {args.batch}, input {shape}, {args.steps} SGLD steps, {device}"
              f"{' bf16' if args.bf16 else ''}, {torch.get_num_threads()} threads")
        print(f"  plain forward+backward       {1e3 * t_fb:9.2f} ms")
        print(f"  one SGLD step                {1e3 * t_sgld:9.2f} ms   = {t_sgld / t_fb:.2f} x forward+backward")
        print(f"  JEM training iteration       {1e3 * t_jem:9.2f} ms   = {t_jem / t_plain:.1f} x plain iteration")
        print(f"  training throughput          {args.batch / t_jem:9.0f} images/s "
              f"(plain classifier: {args.batch / t_plain:.0f})")
    return result


if __name__ == "__main__":
    main()
