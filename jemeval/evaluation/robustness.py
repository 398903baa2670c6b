"""Adversarial robustness with SGLD refinement (the JEM paper's evaluation, docs/reproducing.md), as a plain function.

``robust(model, norm=..., refine_steps=[0, 1, 10], attacks=["pgd"])`` attacks a fixed, seeded
random subset of the test set and returns one record per (attack, refinement steps K, gradient
mode, epsilon). The attacked model is :class:`~jemeval.sampling.refinement.RefinedClassifier` (K SGLD steps
in ``chains`` noisy copies, logits averaged); how the attacker differentiates through it is the
``grad_mode`` (full / bpda / eot).

Nothing the attack says about its own success is trusted: every adversarial is re-classified by a
fresh refined classifier (new noise), and an input counts as robust at epsilon only if it is
classified correctly both clean and after the attack (a cleanly misclassified input is never robust).

The result carries the adaptive-defence sanity checks (Carlini et al. 2019; Tramer et al. 2020) as
notes and in ``extra["checks"]``: accuracy at epsilon 0 equals clean accuracy, accuracy does not
increase with epsilon, K = 0 accuracy is near zero at the largest epsilon, and a gradient-free
attack does not beat the white-box one (a sign of obfuscated gradients).
"""
from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from jemeval.components import NORMS, pixel_to_model_scale
from jemeval.energy.model import EnergyModel
from jemeval.errors import JemevalError, UsageError
from jemeval.evaluation.threat import check_norm, perturbation_norm, project_to_ball
from jemeval.evaluation.batching import check_input_shape, prepare_model, training_dataset
from jemeval.provenance import provenance
from jemeval.results import Result
from jemeval.runtime.devices import resolve_device
from jemeval.sampling.recorded import recorded_sgld
from jemeval.sampling.refinement import GRAD_MODES, RefinedClassifier, sampler_note
from jemeval.sampling.sgld import frozen

#: Defaults in [0, 1] pixel units. The largest is big enough that an undefended model should be
#: (almost) always fooled: a sanity check of the attack, not a realistic threat model.
DEFAULT_EPSILONS = {
    "linf": [0.0, 2 / 255, 4 / 255, 8 / 255, 16 / 255, 32 / 255, 64 / 255, 128 / 255],
    "l2": [0.0, 0.25, 0.5, 1.0, 2.0, 4.0],
}
#: K = 0 robust accuracy at the largest epsilon above this is flagged (the attack may be too weak)
LARGE_EPSILON_MAX_ACCURACY = 0.1
#: a gradient-free attack beating the white-box one by more than this is flagged
OBFUSCATION_TOLERANCE = 0.02
#: seconds between progress-bar refreshes inside one attack call (see :class:`Heartbeat`)
PROGRESS_REFRESH_S = 1.0
RECORD_COLUMNS = ["attack", "norm", "grad_mode", "refine_steps", "epsilon", "robust_accuracy", "clean_accuracy",
                  "n", "median_min_perturbation", "seconds"]


# -- argument checking -------------------------------------------------------------------------------
def check_epsilons(epsilons: Iterable[float], norm: str, input_shape: Sequence[int]) -> list[float]:
    """Epsilons in pixel units: finite, >= 0, Linf <= 1, L2 <= the largest possible L2 distance."""
    eps = [float(e) for e in epsilons]
    if not eps:
        raise UsageError("no epsilons given; pass e.g. --epsilons 0,8/255,16/255")
    dims = int(np.prod(input_shape))
    limit = 1.0 if norm == "linf" else math.sqrt(dims)
    for e in eps:
        if not math.isfinite(e) or e < 0 or e > limit + 1e-9:
            raise UsageError(
                f"epsilon {e:g} is out of range for {norm}: epsilons are in [0, 1] pixel units, so {norm} "
                f"epsilons must lie in [0, {limit:g}]" + (f" (sqrt of {dims} input dimensions)" if norm == "l2" else "")
                + "; e.g. --epsilons 0,8/255,16/255 for linf or 0,0.5,1 for l2"
            )
    return sorted(set(eps))


def check_refine_steps(steps: Iterable[int]) -> list[int]:
    out = []
    for k in steps:
        if int(k) != k or int(k) < 0:
            raise UsageError(f"--refine-steps must be integers >= 0 (0 = no refinement), got {k}")
        out.append(int(k))
    if not out:
        raise UsageError("--refine-steps is empty; give e.g. 0,1,10")
    return list(dict.fromkeys(out))


def check_grad_modes(modes: Iterable[str]) -> list[str]:
    from jemeval.errors import did_you_mean

    out = []
    for m in modes:
        if m not in GRAD_MODES:
            raise UsageError(f"unknown --grad-mode {m!r}{did_you_mean(m, GRAD_MODES)}; use one of {', '.join(GRAD_MODES)}")
        out.append(m)
    if not out:
        raise UsageError(f"--grad-mode is empty; use one of {', '.join(GRAD_MODES)}")
    return list(dict.fromkeys(out))


def make_attack(spec: Any, norm: str, *, context: dict[str, Any]):
    """(name, attack callable) from a registered attack spec such as ``pgd`` or ``pgd:steps=100``,
    or from an attack callable itself (Python callers; named by its ``name`` or ``__name__``).

    ``context`` options (steps, restarts, the seed) are offered to factories that name them.
    """
    from jemeval.plugins import get_registry
    from jemeval.registry import call_with_supported, check_options, parse_spec

    if callable(spec) and not isinstance(spec, str):
        name = getattr(spec, "name", None) or getattr(spec, "__name__", None) or type(spec).__name__
        name, attack = str(name), spec
    else:
        parsed = parse_spec(spec)
        factory = get_registry().get("attack", parsed.name)
        if parsed.variant is not None:
            raise UsageError(f"attack spec {spec!r}: write options as NAME:key=value, e.g. pgd:steps=100")
        check_options(factory, parsed.options, f"attack {parsed.name!r}", skip=1)
        name, attack = parsed.name, call_with_supported(factory, norm, context=context, **parsed.options)
    norms = getattr(attack, "norms", NORMS)
    if norm not in norms:
        raise UsageError(f"attack {name!r} does not support norm {norm!r}; it supports {', '.join(norms)}")
    return name, attack


# -- helpers -------------------------------------------------------------------------------------------
@contextlib.contextmanager
def seeded(seed: int, device: torch.device):
    """Seed torch (and numpy, for foolbox's Pointwise attack); restore both RNGs afterwards."""
    np_state = np.random.get_state()
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            np.random.seed(seed % 2**32)
            yield
    finally:
        np.random.set_state(np_state)


class Heartbeat:
    """A forward hook that keeps a progress bar moving during one long attack call.

    An attack call on a batch runs for minutes (steps x restarts x refinement chains); the bar
    only advances when it returns. The hook counts the attacked model's forward passes and shows
    the count as the bar's postfix, refreshed at most every ``interval`` seconds.
    """

    def __init__(self, bar, interval: float | None = None) -> None:
        self.bar, self.interval = bar, PROGRESS_REFRESH_S if interval is None else interval
        self.passes, self.shown = 0, time.monotonic()

    def __call__(self, module, inputs, output) -> None:
        self.passes += 1
        now = time.monotonic()
        if now - self.shown >= self.interval:
            self.shown = now
            self.bar.set_postfix_str(f"{self.passes} model passes", refresh=True)

    @contextlib.contextmanager
    def watching(self, module: torch.nn.Module):
        handle = module.register_forward_hook(self)
        try:
            yield self
        finally:
            handle.remove()


def predict_batches(predictor: torch.nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([predictor(x[i:i + batch_size]).argmax(1) for i in range(0, len(x), batch_size)])


def validate_adversarials(adv: Any, x: torch.Tensor, epsilons: list[float], norm: str, name: str) -> torch.Tensor:
    """An attack's output must be Tensor[E, N, C, H, W], in bounds and in each epsilon ball."""
    expected = (len(epsilons), *x.shape)
    if not torch.is_tensor(adv) or tuple(adv.shape) != expected:
        got = tuple(adv.shape) if torch.is_tensor(adv) else type(adv).__name__
        raise JemevalError(f"attack {name!r} returned {got}, expected a tensor of shape {expected} (epsilons x inputs)")
    adv = adv.detach().to(x.device, x.dtype)
    if not torch.isfinite(adv).all() or adv.min() < -1 - 1e-5 or adv.max() > 1 + 1e-5:
        raise JemevalError(f"attack {name!r} returned adversarials outside the input range [-1, 1] (or non-finite)")
    delta = (adv - x.unsqueeze(0)).flatten(2)
    sizes = delta.abs().amax(2) if norm == "linf" else delta.norm(dim=2)  # E x N, model space
    limits = torch.tensor([pixel_to_model_scale(e) for e in epsilons], device=x.device, dtype=x.dtype).unsqueeze(1)
    excess = sizes - limits * (1 + 1e-5) - 1e-5
    if (excess > 0).any():
        e = int((excess > 0).any(1).nonzero()[0])
        raise JemevalError(
            f"attack {name!r} returned perturbations larger than epsilon {epsilons[e]:g} ({norm}, pixel units): "
            f"largest {float(sizes[e].max()) / 2:.4g}; the attack must stay inside each epsilon ball"
        )
    return adv


def distortion_curve(min_pert: torch.Tensor, max_eps: float, points: int = 101) -> dict[str, list[float]]:
    """Robust accuracy as a function of epsilon from per-example minimal perturbations (pixel
    units; 0 for cleanly misclassified inputs, inf where no adversarial was found)."""
    grid = torch.linspace(0, max_eps, points, dtype=torch.float64)
    d = min_pert.double().cpu()
    acc = (d.unsqueeze(0) > grid.unsqueeze(1)).double().mean(1)
    return {"epsilon": grid.tolist(), "robust_accuracy": acc.tolist()}


# -- the evaluation ---------------------------------------------------------------------------------
def robust(
    model: EnergyModel | str,
    *,
    norm: str,
    refine_steps: int | Sequence[int] = 0,
    attacks: Any = "pgd",
    epsilons: Sequence[float] | None = None,
    data: str | None = None,
    n: int | None = 300,
    seed: int = 0,
    steps: int | None = None,
    restarts: int | None = None,
    grad_mode: str | Sequence[str] = "full",
    chains: int = 5,
    sigma: float = 0.0,
    eot_samples: int = 10,
    checkpoint: bool | None = None,
    sgld_step_size: float | None = None,
    sgld_noise: float | None = None,
    batch_size: int = 100,
    device: str | torch.device = "cpu",
    root: str | None = None,
    download: bool = False,
    progress: bool | None = None,
    plot: str | None = None,
) -> Result:
    """Robust accuracy of ``model`` under ``attacks`` for every (K, grad mode, epsilon).

    ``steps`` / ``restarts`` are offered to attacks that take them (PGD: iterations and random
    restarts; Boundary: iterations). ``eot_samples`` only matters with ``grad_mode="eot"``. With
    K = 0 there is nothing to differentiate through, so the full and bpda modes coincide and K = 0
    is attacked once per attack (recorded as ``full``). Gradient-free attacks ignore the gradient
    mode (recorded as ``none``). ``sigma`` (default 0) is the noise added to each chain before
    refinement; the JEM release used 0.03. ``plot``: also write the accuracy-vs-epsilon PNG there.
    """
    from tqdm.auto import tqdm

    from jemeval.data import input_shape_of, load_dataset, subsample, to_arrays

    norm = check_norm(norm, what="--norm")
    ks = check_refine_steps([refine_steps] if isinstance(refine_steps, int) else refine_steps)
    modes = check_grad_modes([grad_mode] if isinstance(grad_mode, str) else grad_mode)
    attack_specs = [attacks] if isinstance(attacks, str) or callable(attacks) else list(attacks)
    if not attack_specs:
        raise UsageError("no attack given; use e.g. --attack pgd")
    if int(chains) < 1:
        raise UsageError(f"--chains must be >= 1, got {chains}")
    if float(sigma) < 0:
        raise UsageError(f"--sigma must be >= 0, got {sigma}")
    if int(batch_size) < 1:
        raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
    device = resolve_device(device)
    model = prepare_model(model, device)  # a path loads the checkpoint (its hash goes into provenance)

    data = data or training_dataset(model)
    ds = subsample(load_dataset(data, "test", root=root, download=download, input_shape=model.input_shape), n, seed=seed)
    check_input_shape(model, ds, data)
    x, y = (t.to(device) for t in to_arrays(ds))
    if bool((y < 0).any()):
        raise UsageError(f"robust accuracy needs labelled data, and {data!r} is unlabelled; use a labelled test set such as --data digits")
    if epsilons is None:  # the defaults, without sizes the input cannot hold (L2 on tiny inputs)
        limit = 1.0 if norm == "linf" else math.sqrt(float(np.prod(input_shape_of(ds))))
        epsilons = [e for e in DEFAULT_EPSILONS[norm] if e <= limit]
    eps = check_epsilons(epsilons, norm, input_shape_of(ds))

    base_sgld, _ = recorded_sgld(model, 0, step_size=sgld_step_size, noise=sgld_noise)
    context = {"steps": steps, "restarts": restarts, "crn_seed": seed}
    context = {k: v for k, v in context.items() if v is not None}
    named = [make_attack(spec, norm, context=context) for spec in attack_specs]

    # every (attack, K, mode) run, equivalent ones collapsed
    runs = []
    for k in ks:
        for name, attack in named:
            if getattr(attack, "gradient_free", False):
                run_modes = ["none"]
            elif k == 0:  # no refinement: full == bpda; eot only differs when there is noise to average
                run_modes = list(dict.fromkeys("eot" if (m == "eot" and sigma > 0) else "full" for m in modes))
            else:
                run_modes = modes
            runs.extend((name, attack, k, m) for m in run_modes)
    batches = [(i, min(i + batch_size, len(x))) for i in range(0, len(x), batch_size)]

    def refined(k: int, mode: str, generator=None) -> RefinedClassifier:
        return RefinedClassifier(model, k, chains=chains, sigma=sigma, sgld=base_sgld,
                                 grad_mode="full" if mode == "none" else mode,
                                 eot_samples=eot_samples, checkpoint=checkpoint, generator=generator)

    def fresh_generator(offset: int) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(seed + offset)

    # one step per clean-prediction batch and per attacked batch; a heartbeat moves it in between
    bar = tqdm(total=(len(ks) + len(runs)) * len(batches), desc="robust", unit="batch", file=sys.stderr,
               disable=(None if progress is None else not progress))
    clean: dict[int, torch.Tensor] = {}
    for k in ks:  # clean predictions once per K, with their own fresh chains
        bar.set_description(f"robust: clean K={k}")
        predictor = refined(k, "full", fresh_generator(1000 + k))
        parts = []
        for lo, hi in batches:  # the same chunks predict_batches(predictor, x, batch_size) would use
            parts.append(predict_batches(predictor, x[lo:hi], batch_size))
            bar.update(1)
        clean[k] = torch.cat(parts) == y

    records, min_perturbations, checks, notes = [], [], [], []
    for run_index, (name, attack, k, mode) in enumerate(runs):
        start = time.perf_counter()
        bar.set_description(f"robust: {name} K={k} {mode}")
        attacked = refined(k, mode).eval()
        checker = refined(k, "full", fresh_generator(2000 + 97 * run_index))
        correct_adv = torch.zeros(len(eps), len(x), dtype=torch.bool, device=device)
        min_pert = torch.full((len(x),), math.inf, dtype=torch.float64, device=device)
        without_start = 0
        for b, (lo, hi) in enumerate(batches):
            xb, yb = x[lo:hi], y[lo:hi]
            with seeded(seed + 7919 * b, device), frozen(model), Heartbeat(bar).watching(attacked):
                if getattr(attack, "minimization", False) and hasattr(attack, "minimize"):
                    raw = attack.minimize(attacked, xb, yb).detach()
                    adv = torch.stack([project_to_ball(xb, raw, pixel_to_model_scale(e), norm) for e in eps])
                else:
                    raw = None
                    adv = attack(attacked, xb, yb, eps)
            without_start += int(getattr(attack, "last_without_start", 0) or 0)
            adv = validate_adversarials(adv, xb, eps, norm, name)
            preds = predict_batches(checker, adv.reshape(-1, *xb.shape[1:]), batch_size).view(len(eps), -1)
            correct_adv[:, lo:hi] = preds == yb
            if raw is not None:  # verified minimal perturbation, pixel units
                fooled = predict_batches(checker, raw, batch_size) != yb
                size = perturbation_norm(xb, raw, norm).double() / 2
                min_pert[lo:hi] = torch.where(fooled, size, torch.full_like(size, math.inf))
            bar.update(1)
        seconds = time.perf_counter() - start
        is_clean = clean[k]
        robust_acc = (correct_adv & is_clean.unsqueeze(0)).double().mean(1).tolist()
        clean_acc = float(is_clean.double().mean())
        settings = dict(getattr(attack, "settings", {}) or {})
        median = None
        if getattr(attack, "minimization", False) and hasattr(attack, "minimize"):
            min_pert = torch.where(is_clean, min_pert, torch.zeros_like(min_pert))
            median = float(min_pert.median())
            min_perturbations.append({
                "attack": name, "norm": norm, "refine_steps": k, "grad_mode": mode,
                "median": median, "found": int(torch.isfinite(min_pert).sum()),
                "values": [v if math.isfinite(v) else None for v in min_pert.tolist()],
                "curve": distortion_curve(min_pert, max(eps) if max(eps) > 0 else 1.0),
            })
        if without_start:
            notes.append(f"{name} K={k}: {without_start} input(s) had no adversarial starting point and were not attacked")
        for e, acc in zip(eps, robust_acc):
            records.append({
                "attack": name, "norm": norm, "epsilon": e, "refine_steps": k, "robust_accuracy": acc,
                "clean_accuracy": clean_acc, "n": len(x), "grad_mode": mode, "chains": chains, "sigma": sigma,
                "eot_samples": eot_samples if mode == "eot" else None,
                "steps": settings.get("steps"), "restarts": settings.get("restarts"),
                "gradient_free": bool(getattr(attack, "gradient_free", False)),
                "median_min_perturbation": median, "seconds": round(seconds, 3),
            })
    bar.close()

    checks = sanity_checks(records)
    notes = [c["message"] for c in checks] + notes
    attack_settings = {name: dict(getattr(a, "settings", {}) or {}) for name, a in named}
    settings = {
        "norm": norm, "epsilons": eps, "epsilon_units": "pixel units in [0, 1] (model space = 2 x epsilon)",
        "refine_steps": ks, "grad_modes": modes, "chains": chains, "sigma": sigma, "eot_samples": eot_samples,
        "gradient_checkpointing": checkpoint, "sgld": {k: v for k, v in base_sgld.settings().items() if k != "steps"},
        "sgld_note": sampler_note(model),
        "attacks": attack_settings, "data": str(data), "split": "test", "n": len(x), "subset_seed": seed,
        "batch_size": batch_size,
        "seeds": {"attack": f"{seed} + 7919 * batch (torch and numpy, per attack call)",
                  "clean_chains": f"{seed} + 1000 + K", "recheck_chains": f"{seed} + 2000 + 97 * run"},
        "robust_definition": "correct on the clean input and on the adversarial, both re-classified by jemeval",
    }
    result = Result(
        records=records,
        provenance=provenance(command="robust", model=model, device=device,
                              seed=seed, settings=settings),
        extra={"checks": checks, "minimal_perturbations": min_perturbations},
        notes=notes,
    )
    if plot:
        from jemeval.plots.robustness import plot_robustness

        plot_robustness(records, plot, min_perturbations=min_perturbations,
                        title=f"{data}: robust accuracy vs {norm} epsilon (n={len(x)}, chains={chains}, sigma={sigma:g})")
    return result



# -- the adaptive-defence checklist ------------------------------------------------------------------
def sanity_checks(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checks printed with the results; each a dict with check, passed, message."""
    checks: list[dict[str, Any]] = []
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["attack"], r["refine_steps"], r["grad_mode"]), []).append(r)

    for (attack, k, mode), rows in groups.items():
        rows = sorted(rows, key=lambda r: r["epsilon"])
        label = f"{attack} K={k} {mode}"
        zero = [r for r in rows if r["epsilon"] == 0]
        if zero:
            ok = abs(zero[0]["robust_accuracy"] - zero[0]["clean_accuracy"]) < 1e-9
            checks.append({"check": "epsilon0_equals_clean", "attack": attack, "refine_steps": k, "grad_mode": mode,
                           "passed": ok, "message": (
                               f"check ok: {label}: accuracy at epsilon 0 equals clean accuracy ({zero[0]['clean_accuracy']:.4f})"
                               if ok else
                               f"WARNING: {label}: accuracy at epsilon 0 ({zero[0]['robust_accuracy']:.4f}) differs from clean "
                               f"accuracy ({zero[0]['clean_accuracy']:.4f}); with refinement this is re-check noise, without it a bug")})
        accs = [r["robust_accuracy"] for r in rows]
        rises = [(rows[i]["epsilon"], rows[i + 1]["epsilon"]) for i in range(len(rows) - 1) if accs[i + 1] > accs[i] + 1e-12]
        checks.append({"check": "non_increasing", "attack": attack, "refine_steps": k, "grad_mode": mode,
                       "passed": not rises, "message": (
                           f"check ok: {label}: accuracy does not increase with epsilon" if not rises else
                           f"WARNING: {label}: accuracy increases with epsilon between "
                           + ", ".join(f"{a:g}->{b:g}" for a, b in rises) + " (the attack is not finding the adversarials it should)")})
        if k == 0 and not rows[-1].get("gradient_free") and rows[-1]["epsilon"] > 0:
            acc = rows[-1]["robust_accuracy"]
            ok = acc <= LARGE_EPSILON_MAX_ACCURACY
            checks.append({"check": "large_epsilon_near_zero", "attack": attack, "refine_steps": k, "grad_mode": mode,
                           "passed": ok, "message": (
                               f"check ok: {label}: accuracy at the largest epsilon {rows[-1]['epsilon']:g} is {acc:.4f} (near zero)"
                               if ok else
                               f"WARNING: {label}: accuracy at the largest epsilon {rows[-1]['epsilon']:g} is {acc:.4f} > "
                               f"{LARGE_EPSILON_MAX_ACCURACY}: the attack may be too weak (more --steps/--restarts) or the "
                               "largest epsilon too small")})

    # a gradient-free attack beating every white-box run at the same K and epsilon
    by_point: dict[tuple, dict[str, float]] = {}
    for r in records:
        kind = "free" if r.get("gradient_free") else "white"
        slot = by_point.setdefault((r["refine_steps"], r["epsilon"]), {})
        slot[kind] = min(slot.get(kind, math.inf), r["robust_accuracy"])
    beaten = sorted((k, e, v["free"], v["white"]) for (k, e), v in by_point.items()
                    if "free" in v and "white" in v and v["free"] < v["white"] - OBFUSCATION_TOLERANCE)
    if any("free" in v and "white" in v for v in by_point.values()):
        checks.append({"check": "white_box_beats_gradient_free", "passed": not beaten, "message": (
            "check ok: no gradient-free attack beats the white-box attack" if not beaten else
            "WARNING: a gradient-free attack beats the white-box one (a sign of obfuscated gradients) at "
            + ", ".join(f"K={k} eps={e:g} ({f:.3f} < {w:.3f})" for k, e, f, w in beaten))})
    return checks
