"""Seconds per input of APGD with EOT through K-step SGLD refinement (what `jemeval robust` runs).

    python benchmarks/attack_eot.py [--arch cnn:width=32] [--data digits] [--n 50] [--steps 20]
                                    [--refine-steps 2] [--chains 5] [--eot-samples 10] [--epsilon 8/255]
                                    [--repeats 2] [--threads N] [--device cpu|cuda]
    python benchmarks/attack_eot.py --device cuda --arch wrn:depth=28,widen=10 --data random --n 64

One APGD-CE attack (jemeval's ``apgd-ce``, torchattacks underneath) on one batch at one Linf
epsilon, through :class:`~jemeval.sampling.refinement.RefinedClassifier` exactly as
``jemeval robust`` builds it, per gradient mode; variants run round-robin (benchmarks/timing.py):

* ``K=0``:            the undefended model (the floor);
* ``K full``:         exact gradients through the K SGLD steps, one noise draw per gradient;
* ``K bpda``:         the refinement's backward as the identity, one draw;
* ``K eot``:          exact gradients averaged over ``--eot-samples`` draws (APGD's ``eot_iter``);
* ``K bpda+eot``:     BPDA gradients averaged over ``--eot-samples`` draws.

Reported per variant: seconds per input for the whole attack (``--steps`` APGD iterations), the
same per input and iteration (attack time is linear in the iterations: multiply by 100 for
AutoAttack's setting), and on CUDA the peak GPU memory of one attack call. ``--data digits`` attacks
the first ``--n`` digits test images with a freshly initialised model of ``--arch`` (timings do
not depend on training; the labels are the model's own predictions, so that APGD attacks every
input); ``--data random`` a uniform random batch of ``--input-shape``. fp32 throughout (an attack
evaluation should not change the arithmetic of the model it attacks).
"""
from __future__ import annotations

import argparse

import torch
from timing import add_common_args, header, interleave, setup

from jemeval.builtins.torchattacks_attacks import apgd_ce
from jemeval.data import load_dataset, to_arrays
from jemeval.energy.factory import create_model
from jemeval.sampling.refinement import EOT_MODES, RefinedClassifier
from jemeval.sampling.sgld import SGLD, frozen

MODES = ("full", "bpda", "eot", "bpda+eot")


def batch(args, model, shape: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The attacked inputs (digits test images or a random batch) and as labels the model's own
    predictions: APGD only attacks inputs it sees classified correctly, and every input should be
    attacked for the timing to mean what it says (an untrained model gets most true labels wrong)."""
    if args.data == "digits":
        x = to_arrays(load_dataset("digits", "test"))[0][:args.n]
    else:
        x = torch.rand((args.n, *shape), generator=torch.Generator().manual_seed(args.seed)) * 2 - 1
    x = x.to(device)
    with torch.no_grad():
        return x, model(x).argmax(1)


def attack_call(model, k: int, mode: str, x, y, eps: float, args):
    """One APGD-CE call as jemeval robust makes it (EOT inside APGD, a single-draw classifier)."""
    attack = apgd_ce("linf", steps=args.steps, seed=args.seed)
    eot = args.eot_samples if mode in EOT_MODES else 1
    refined = RefinedClassifier(model, k, chains=args.chains, sigma=args.sigma,
                                sgld=SGLD(step_size=1.0, noise=0.01), grad_mode=mode).eval()

    def run():
        with frozen(model):
            return attack(refined, x, y, [eps], eot_samples=eot)
    return run


def peak_memory_gib(fn, device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**30


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="cnn:width=32")
    parser.add_argument("--data", choices=["digits", "random"], default="digits")
    parser.add_argument("--input-shape", default="3,32,32", help="with --data random")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--n", type=int, default=50, help="inputs in the attacked batch")
    parser.add_argument("--steps", type=int, default=20, help="APGD iterations")
    parser.add_argument("--refine-steps", type=int, default=2)
    parser.add_argument("--chains", type=int, default=5)
    parser.add_argument("--sigma", type=float, default=0.0, help="chain noise (the release used 0.03)")
    parser.add_argument("--eot-samples", type=int, default=10)
    parser.add_argument("--epsilon", default="8/255", help="Linf, pixel units")
    parser.add_argument("--modes", default=",".join(MODES))
    add_common_args(parser, repeats=2)
    args = parser.parse_args(argv)
    device = setup(args)
    shape = (1, 8, 8) if args.data == "digits" else tuple(int(s) for s in args.input_shape.split(","))
    model = create_model(args.arch, args.classes, shape).to(device).eval()
    x, y = batch(args, model, shape, device)
    num, _, den = args.epsilon.partition("/")
    eps = float(num) / float(den or 1)
    k = args.refine_steps
    variants = {"K=0": attack_call(model, 0, "full", x, y, eps, args)}
    for mode in args.modes.split(","):
        variants[f"K={k} {mode}"] = attack_call(model, k, mode, x, y, eps, args)
    variants["K=0"]()  # imports and first-call set-up, untimed (on CUDA the memory pass also warms up)
    memory = {name: peak_memory_gib(fn, device) for name, fn in variants.items()}
    print(header(f"APGD-CE (+EOT) through SGLD refinement: {args.arch}, {args.data} {tuple(x.shape)}, "
                 f"{args.steps} APGD steps, K={k}, {args.chains} chains, EOT {args.eot_samples}, Linf {args.epsilon}",
                 device))
    t = interleave(variants, args.repeats, device, warmup=0)
    floor = t["K=0"]["wall"]
    print("| variant | s/input (wall) | s/input (cpu) | ms/input/step (wall) | vs K=0 (wall) | peak GPU GiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in t.items():
        mem = f"{memory[name]:.2f}" if memory[name] is not None else "-"
        print(f"| {name} | {r['wall'] / args.n:.4f} | {r['cpu'] / args.n:.4f} | "
              f"{1000 * r['wall'] / args.n / args.steps:.3f} | {r['wall'] / floor:.1f}x | {mem} |")


if __name__ == "__main__":
    main()
