"""How often does a seed-group test call two equally good training methods different?

Simulates two methods of exactly equal quality, each trained k times, scored on the same inputs,
and counts how often each test says p < 0.05 (it should be 0.05), then plants a difference and
counts how often it is found (the power). The tests:

* ``pooled``: what `jemeval report` 0.3 did: DeLong (AUROC) or exact McNemar (accuracy) on the
  seed pairs' outcomes concatenated (run i of A with run i of B);
* ``nested`` / ``crossed``: :func:`jemeval.evaluation.mrmc.or_hillis_outcomes` as `jemeval report` runs
  it (DeLong covariance for AUROC, jackknife for accuracy; the default ddf rule: Hillis' from 5 runs a
  side, the upper-80 rule below), seeds and inputs random; ``... plain-hillis``: Hillis' ddf at every
  size, for contrast.

How the data arise (the scenarios): every input has a difficulty shared by both methods; each
method's runs share per-input effects of their own (runs of one recipe err on the same hard
inputs: ``shared``); each run has its own luck in how well it separates (a per-seed effect); and in
``offsets`` each run's scores are shifted by a per-seed constant, which leaves its AUROC unchanged
but moves its scores against the other runs' when they are concatenated.

    python benchmarks/seed_groups_null.py                 # the table of docs/evaluation.md (~2 min)
    python benchmarks/seed_groups_null.py --reps 200      # quicker
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

from jemeval.evaluation import paired
from jemeval.evaluation.mrmc import or_hillis_outcomes

#: scenario -> (sd of each method's own per-input effect, sd of the per-seed offset, sd of the per-seed
#: separation (AUROC) or logit (accuracy) effect)
SCENARIOS = {"shared": (0.8, 0.0, 0.08), "offsets": (0.8, 1.0, 0.08)}


def draw_scores(rng, seeds: tuple[int, int], n: int, scenario: str, delta: float = 0.0):
    """(labels, scores A [k_a, 2n], scores B [k_b, 2n]): n in-distribution then n OOD inputs; method
    B's separation is ``delta`` larger (0: the null)."""
    method_sd, offset_sd, seed_sd = SCENARIOS[scenario]
    labels = np.r_[np.ones(n), np.zeros(n)]
    difficulty = rng.normal(0.0, 1.0, 2 * n)

    def group(k: int, shift: float) -> np.ndarray:
        own = rng.normal(0.0, method_sd, 2 * n)
        separation = 1.0 + shift + rng.normal(0.0, seed_sd, (k, 1))
        offsets = rng.normal(0.0, offset_sd, (k, 1))
        return labels * separation + difficulty + own + offsets + rng.normal(0.0, 0.6, (k, 2 * n))

    return labels, group(seeds[0], 0.0), group(seeds[1], delta)


def draw_correct(rng, seeds: tuple[int, int], n: int, scenario: str, delta: float = 0.0):
    """(correct A [k_a, n], correct B [k_b, n]) at about 0.9 accuracy; B's logits ``delta`` higher."""
    method_sd, _, seed_sd = SCENARIOS[scenario]
    difficulty = rng.normal(0.0, 1.0, n)

    def group(k: int, shift: float) -> np.ndarray:
        own = rng.normal(0.0, method_sd, n)
        latent = 1.9 + shift + rng.normal(0.0, 2 * seed_sd, (k, 1)) - difficulty - own
        return latent + rng.normal(0.0, 0.6, (k, n)) > 0

    return group(seeds[0], 0.0), group(seeds[1], delta)


def p_values(kind: str, draw, seeds: tuple[int, int]) -> dict[str, float]:
    """Each test's p-value on one draw."""
    pairs = min(seeds)
    out = {}
    if kind == "auroc":
        labels, a, b = draw
        out["pooled"] = paired.delong_test(np.tile(labels, pairs), a[:pairs].ravel(), b[:pairs].ravel())["p_value"]
        runs_a, runs_b = [(labels, s) for s in a], [(labels, s) for s in b]
        covariance = "delong"
    else:
        a, b = draw
        out["pooled"] = paired.mcnemar_exact(a[:pairs].ravel(), b[:pairs].ravel())["p_value"]
        runs_a, runs_b = [(c,) for c in a], [(c,) for c in b]
        covariance = "jackknife"
    fom = "auroc" if kind == "auroc" else "accuracy"
    for design in (["nested", "crossed"] if seeds[0] == seeds[1] else ["nested"]):
        for ddf in (None, "hillis"):  # None: the rule jemeval uses (upper-80 below 5 runs a side)
            name = f"{design}{' plain-hillis' if ddf else ''}"
            out[name] = or_hillis_outcomes(fom, runs_a, runs_b, covariance=covariance, design=design,
                                           ddf=ddf)["p_value"]
    return out


def rejection_rates(kind: str, scenario: str, seeds: tuple[int, int], *, reps: int, n: int = 450,
                    delta: float = 0.0, seed: int = 0) -> dict[str, float]:
    """The share of ``reps`` draws in which each test gives p < 0.05."""
    rng = np.random.default_rng(seed)
    draw = draw_scores if kind == "auroc" else draw_correct
    hits: dict[str, int] = {}
    for _ in range(reps):
        for test, p in p_values(kind, draw(rng, seeds, n, scenario, delta), seeds).items():
            hits[test] = hits.get(test, 0) + (p < 0.05)
    return {test: count / reps for test, count in hits.items()}


def monte_carlo_half_width(rate: float, reps: int) -> float:
    return 1.96 * math.sqrt(max(rate * (1 - rate), 0.05 * 0.95) / reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--n", type=int, default=450, help="inputs per class (AUROC) / inputs (accuracy)")
    args = parser.parse_args()
    start = time.perf_counter()
    print(f"share of p < 0.05 over {args.reps} draws (+- {monte_carlo_half_width(0.05, args.reps):.3f} at 0.05); "
          f"{args.n} inputs")
    for kind in ("accuracy", "auroc"):
        for scenario in SCENARIOS if kind == "auroc" else ["shared"]:
            for seeds in ((2, 2), (3, 3), (5, 5), (3, 2)):
                null = rejection_rates(kind, scenario, seeds, reps=args.reps, n=args.n)
                power = rejection_rates(kind, scenario, seeds, reps=args.reps, n=args.n,
                                        delta=0.25 if kind == "auroc" else 0.5, seed=1)
                print(f"{kind:8s} {scenario:8s} {seeds[0]} vs {seeds[1]}: "
                      + "; ".join(f"{t} {null[t]:.3f} (power {power[t]:.2f})" for t in null))
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
