"""Peak memory and time of one attack gradient through K SGLD refinement steps, with and without checkpointing.

    python benchmarks/refine_memory.py [--arch cnn:width=32] [--batch 8] [--input-shape 3,32,32]
                                       [--ks 1,2,5,10,20] [--chains 5] [--grad-mode full|eot]
                                       [--variants plain,checkpoint,torch] [--repeats 1]
                                       [--threads N] [--device cpu|cuda]
    python benchmarks/refine_memory.py --device cuda --arch wrn:depth=16,widen=4 --batch 16

One attack gradient is what ``jemeval robust --grad-mode full`` computes per attack iteration: the
forward through :class:`~jemeval.sampling.refinement.RefinedClassifier` (``--chains`` noisy copies
of each input, K SGLD steps, chain-averaged logits) and the backward of the cross-entropy to the
input, through every step. Variants:

* ``plain``:      ``checkpoint=False``, every step's graph stored (the double backward needs it);
* ``checkpoint``: ``checkpoint=True``, jemeval's :class:`~jemeval.sampling.refinement.CheckpointedStep`
  (each step keeps its input and noise; the backward recomputes it);
* ``torch``:      the same chain with ``torch.utils.checkpoint(use_reentrant=False)`` per step (noise
  drawn outside the checkpointed function), kept as the reason jemeval does not use it.

Every (K, variant) runs in a fresh subprocess, one after the other per K (plain, checkpoint, torch,
then the next K), so no allocator cache or earlier peak leaks from one into the next. Peak memory:
on CPU ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` after the first gradient minus its value once
the model and the inputs are built (the process's peak resident memory above that baseline: the
graph, the activations and the allocator's slack); on CUDA ``torch.cuda.max_memory_allocated`` minus
``memory_allocated`` at the same point (what the caching allocator handed out, not its reserve).
Time: the median over ``--repeats`` gradients after that first one (which also serves as the warm-up:
oneDNN's and autograd's first-call set-up), process CPU time and wall time
(benchmarks/timing.py says why CPU time is the steadier figure on a shared machine). fp32, a freshly
initialised model (memory and time do not depend on training), uniform random inputs in [-1, 1].
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch
from timing import add_common_args, header, setup, sync
from torch.nn.functional import cross_entropy

from jemeval.energy.factory import create_model
from jemeval.sampling.refinement import RefinedClassifier
from jemeval.sampling.sgld import SGLD, frozen, input_grad

VARIANTS = ("plain", "checkpoint", "torch")


class TorchCheckpointed(RefinedClassifier):
    """The refinement chain with ``torch.utils.checkpoint`` per step (for comparison only)."""

    def _refine_checkpointed(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        sgld, model = self.sgld, self.model

        def step(x_k: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
            with frozen(model, train=(sgld.bn_mode == "train")):
                _, grad = input_grad(model, x_k, create_graph=True)
            return sgld.update(x_k, grad, noise, create_graph=True)

        for _ in range(self.steps):
            x = checkpoint(step, x, self._randn(x), use_reentrant=False)
        return x


def build(args, device: torch.device, k: int, variant: str):
    """The model, the inputs (labels: the model's own predictions) and the refined classifier."""
    shape = tuple(int(s) for s in args.input_shape.split(","))
    model = create_model(args.arch, args.classes, shape).to(device).eval()
    x = (torch.rand((args.batch, *shape), generator=torch.Generator().manual_seed(args.seed)) * 2 - 1).to(device)
    y = torch.arange(args.batch, device=device) % args.classes
    cls = TorchCheckpointed if variant == "torch" else RefinedClassifier
    eot = args.eot_samples if args.grad_mode == "eot" else 1
    refined = cls(model, k, chains=args.chains, sigma=0.03, sgld=SGLD(step_size=1.0, noise=0.01),
                  grad_mode=args.grad_mode, eot_samples=eot, checkpoint=variant != "plain",
                  generator=torch.Generator(device).manual_seed(args.seed))
    return refined, x, y


def attack_gradient(refined, x, y) -> torch.Tensor:
    z = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(cross_entropy(refined(z), y), z)
    return grad


def child(args) -> None:
    """One (K, variant) in this fresh process: prints one JSON line."""
    device = setup(args)
    refined, x, y = build(args, device, args.child_k, args.child_variant)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    attack_gradient(refined, x, y)  # the memory pass, also the untimed warm-up (first-call set-up)
    sync(device)
    peak = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    walls, cpus = [], []
    for _ in range(args.repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        attack_gradient(refined, x, y)
        sync(device)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    print(json.dumps({"mib": (peak - base) / 2**20, "wall": statistics.median(walls), "cpu": statistics.median(cpus)}))


def run_child(argv: list[str], k: int, variant: str) -> dict:
    cmd = [sys.executable, __file__, *argv, "--child-k", str(k), "--child-variant", variant]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def table(results: dict, ks: list[int], variants: list[str], clock: str) -> list[str]:
    """Markdown rows: memory and time per variant, checkpointed memory vs K=1 and time vs plain."""
    ck = "checkpoint" if "checkpoint" in variants else None
    cols = [f"{v} MiB" for v in variants] + [f"{v} s ({clock})" for v in variants]
    extra = ([f"{ck} mem / K={ks[0]}"] if ck else []) + ([f"{v} / plain time" for v in variants if v != "plain"]
                                                        if "plain" in variants else [])
    rows = ["| K | " + " | ".join(cols + extra) + " |", "|---:|" + "---:|" * (len(cols) + len(extra))]
    for k in ks:
        r = results[k]
        cells = [f"{r[v]['mib']:.0f}" for v in variants] + [f"{r[v][clock]:.2f}" for v in variants]
        if ck:
            cells.append(f"{r[ck]['mib'] / results[ks[0]][ck]['mib']:.2f}x")
        if "plain" in variants:
            cells += [f"{r[v][clock] / r['plain'][clock]:.2f}x" for v in variants if v != "plain"]
        rows.append(f"| {k} | " + " | ".join(cells) + " |")
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="cnn:width=32")
    parser.add_argument("--input-shape", default="3,32,32")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8, help="attacked inputs (x chains copies are refined)")
    parser.add_argument("--ks", default="1,2,5,10,20", help="refinement steps K")
    parser.add_argument("--chains", type=int, default=5)
    parser.add_argument("--grad-mode", choices=["full", "eot"], default="full")
    parser.add_argument("--eot-samples", type=int, default=2, help="noise draws with --grad-mode eot")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child-k", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-variant", default=None, help=argparse.SUPPRESS)
    add_common_args(parser, repeats=1)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1 (the timed gradients after the memory pass)")
    if args.child_k is not None:
        return child(args)
    ks = [int(k) for k in args.ks.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    if unknown := set(variants) - set(VARIANTS):
        parser.error(f"--variants: unknown {', '.join(sorted(unknown))}; choose from {', '.join(VARIANTS)}")
    device = setup(args)
    what = "CUDA max_memory_allocated" if device.type == "cuda" else "ru_maxrss"
    print(header(f"one attack gradient through K refinement steps: {args.arch}, batch {args.batch} x "
                 f"{args.chains} chains, {args.input_shape}, grad mode {args.grad_mode}; peak memory above the "
                 f"built model ({what}), a fresh process per cell", device), flush=True)
    results = {k: {v: run_child(argv, k, v) for v in variants} for k in ks}
    for clock in ("cpu", "wall"):
        print("\n".join(table(results, ks, variants, clock)) + "\n")


if __name__ == "__main__":
    main()
