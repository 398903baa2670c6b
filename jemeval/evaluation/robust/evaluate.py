"""Adversarial robustness behind SGLD refinement (JEM's evaluation, docs/reproducing.md), as a plain function.

``robust(model, norm=..., refine_steps=[0, 1, 10], attacks=["pgd"])`` attacks a fixed, seeded
random subset of the test set and returns one record per (attack, refinement steps K, gradient
mode, epsilon). The attacked model is :class:`~jemeval.sampling.refinement.RefinedClassifier` (K SGLD
steps in ``chains`` copies of each input, each noised by ``chain_sigma``, logits averaged); how the
attacker differentiates through it is the ``grad_mode`` (full / bpda / eot / bpda+eot).

Nothing the attack says about its own success is trusted: every adversarial is re-classified by a
fresh refined classifier (new noise, ``draws`` times), and an input counts as robust at epsilon only
if it is classified correctly clean and under every draw after the attack
(:mod:`jemeval.evaluation.robust.attack_loop`); each robust accuracy carries a 95% Wilson interval.

The result carries the adaptive-defence sanity checks (:mod:`jemeval.evaluation.robust.checks`) as
notes and in ``extra["checks"]``; ``extra["minimal_perturbations"]`` holds what minimisation attacks
found, ``extra["per_input"]`` which inputs are robust per record shown (:func:`final_outcomes`: the report's
paired tests). Figure: :func:`jemeval.plots.robustness.plot_robust_result`.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from jemeval.components.adapters import as_attack
from jemeval.components.attack import Attack
from jemeval.context import RunContext, takes_context
from jemeval.data import input_shape_of, load_dataset, no_test_split_note, subsample, to_arrays
from jemeval.deprecations import deprecated_keywords
from jemeval.energy.model import EnergyModel
from jemeval.errors import UsageError, did_you_mean
from jemeval.evaluation.classes import class_alignment
from jemeval.evaluation.inputs import (
    check_input_shape,
    check_min,
    check_refine_steps,
    model_data_options,
    prepare_model,
    stamp,
    training_dataset,
)
from jemeval.evaluation.limits import check_count
from jemeval.evaluation.robust.attack_loop import Batches, Defence, Run, distortion_curve, run_attacks
from jemeval.evaluation.robust.checks import record_flags, sanity_checks
from jemeval.evaluation.robust.convergence import TOLERANCE, check_tolerance, convergence, final_records, mark_converged
from jemeval.evaluation.robust.counts import (  # noqa: F401 - check_counts and check_sweep: their old home
    check_counts,
    check_defence_memory,
    check_robust_counts,
    check_sweep,
)
from jemeval.evaluation.robust.threat import MAX_EPSILON, check_epsilons, check_norm, epsilon_limit
from jemeval.plugins import get_registry
from jemeval.registry import call_with_supported, check_options, parse_spec
from jemeval.results import Result
from jemeval.sampling.recorded import recorded_sgld
from jemeval.sampling.refinement import EOT_MODES, GRAD_MODES, sampler_note
from jemeval.seen_images import check_evaluated

__all__ = ["DEFAULT_EPSILONS", "MAX_EPSILON", "distortion_curve", "make_attack", "robust", "sanity_checks"]

#: inputs per attack call when the run's context sets no batch size
DEFAULT_BATCH_SIZE = 100
#: Defaults in [0, 1] pixel units. The largest is big enough that an undefended model should be
#: (almost) always fooled: a sanity check of the attack, not a realistic threat model.
DEFAULT_EPSILONS = {
    "linf": [0.0, 2 / 255, 4 / 255, 8 / 255, 16 / 255, 32 / 255, 64 / 255, 128 / 255],
    "l2": [0.0, 0.25, 0.5, 1.0, 2.0, 4.0],
}
def check_grad_modes(modes: Iterable[str]) -> list[str]:
    out = []
    for m in modes:
        if m not in GRAD_MODES:
            raise UsageError(f"unknown grad_mode {m!r}{did_you_mean(m, GRAD_MODES)}; use one of "
                             f"{', '.join(GRAD_MODES)}", param="grad_mode")
        out.append(m)
    if not out:
        raise UsageError(f"grad_mode is empty; use one of {', '.join(GRAD_MODES)}", param="grad_mode")
    return list(dict.fromkeys(out))


def check_aa_version(aa_version: str | None) -> None:
    """AutoAttack's version: standard, rand or None (the attack's default, standard)."""
    versions = ("standard", "rand")
    if aa_version is not None and aa_version not in versions:
        raise UsageError(f"unknown aa_version {aa_version!r}{did_you_mean(str(aa_version), versions)}: use standard "
                         "(APGD-CE, APGD-T, FAB-T, Square) or rand (APGD-CE and APGD-DLR with EOT, for randomised "
                         "defences)", param="aa_version")


def check_norm_param(norm: str) -> str:
    """:func:`~jemeval.evaluation.robust.threat.check_norm` for the ``norm`` parameter (its message names it)."""
    try:
        return check_norm(norm, what="norm")
    except UsageError as exc:
        raise UsageError(str(exc), param="norm") from None


def make_attack(spec: Any, norm: str, *, context: dict[str, Any]) -> tuple[str, Attack]:
    """(name, :class:`~jemeval.Attack`) from a registered attack spec such as ``pgd`` or
    ``pgd:steps=100``, or from an attack itself (Python callers; named by its ``name``, else its
    class). A duck-typed attack callable is adapted (:func:`~jemeval.components.adapters.as_attack`).

    ``context`` options (steps, restarts, the seed) are offered to factories that name them.
    """
    if callable(spec) and not isinstance(spec, str):
        attack = as_attack(spec, norm)
        name = attack.label
    else:
        parsed = parse_spec(spec)
        factory = get_registry().get("attack", parsed.name)
        if parsed.variant is not None:
            raise UsageError(f"attack spec {spec!r}: write options as NAME:key=value, e.g. pgd:steps=100")
        check_options(factory, parsed.options, f"attack {parsed.name!r}", skip=1)
        name = parsed.name
        attack = as_attack(call_with_supported(factory, norm, context=context, **parsed.options), norm, name)
    if norm not in attack.norms:
        raise UsageError(f"attack {name!r} does not support norm {norm!r}; it supports {', '.join(attack.norms)}")
    return name, attack


def attack_specs(attacks: Any) -> list[Any]:
    """One attack (a spec or a callable) or a list of them, as a non-empty list."""
    specs = [attacks] if isinstance(attacks, str) or callable(attacks) else list(attacks)
    if not specs:
        raise UsageError("attacks is empty; give e.g. 'pgd'", param="attacks")
    return specs


def plan_runs(ks: list[int], named: list[tuple[str, Attack]], modes: list[str], stochastic) -> list[Run]:
    """Every (attack, K, gradient mode) run, equivalent ones collapsed: gradient-free attacks have no
    gradient mode ("none"); with K = 0 full and bpda coincide (nothing to differentiate through), and
    where ``stochastic(k)`` is false averaging over noise draws changes nothing (eot is full, bpda+eot
    is bpda)."""
    runs = []
    for k in ks:
        for name, attack in named:
            if attack.gradient_free:
                run_modes = ["none"]
            else:
                run_modes = [EOT_MODES.get(m, m) if not stochastic(k) else m for m in modes]
                if k == 0:
                    run_modes = [{"bpda": "full", "bpda+eot": "eot"}.get(m, m) for m in run_modes]
                run_modes = list(dict.fromkeys(run_modes))
            runs.extend(Run(name, attack, k, m) for m in run_modes)
    return runs


def checked_runs(defence: Defence, ks: list[int], variants: list[tuple[str, list[Attack]]], modes: list[str],
                 inputs: Batches) -> list[Run]:
    """The planned runs (:func:`plan_runs`) of the attacks built, once the copies each holds at once
    are known to fit the device (:func:`~jemeval.evaluation.robust.counts.check_defence_memory`)."""
    runs = plan_runs(ks, [(name, attacks[0]) for name, attacks in variants], modes, defence.stochastic)
    return check_defence_memory(defence, runs, inputs)


def attack_inputs(model: EnergyModel, data: str, norm: str, epsilons: Sequence[float] | None, *, n: int | None,
                  context: RunContext, class_map: Any = None) -> Batches:
    """The seeded test subset on the model's device, labels as the model's classes (``class_map``), and the
    epsilons (defaults: the norm's list, without sizes the input cannot hold, e.g. large L2 on tiny images)."""
    full = load_dataset(data, "test", root=context.data_root, download=context.download, **model_data_options(model))
    check_input_shape(model, full, data)
    classes = class_alignment(model, full, data, class_map)
    ds = subsample(classes.apply(full), n, seed=context.seed)
    notes = [note] if (note := no_test_split_note(data, full)) else []
    notes += check_evaluated(model, data, "test", ds, context=context)[0]  # and the images it has seen
    x, y = (t.to(model.device) for t in to_arrays(ds))
    if bool((y < 0).any()):
        raise UsageError(f"robust accuracy needs labelled data, and {data!r} is unlabelled; use a labelled test set "
                         "such as digits")
    if epsilons is None:
        limit = epsilon_limit(norm, input_shape_of(ds))
        epsilons = [e for e in DEFAULT_EPSILONS[norm] if e <= limit]
    return Batches(x, y, check_epsilons(epsilons, norm, input_shape_of(ds)), norm,
                   context.batch(DEFAULT_BATCH_SIZE), notes=notes, class_map=classes.record)


def check_robust_args(norm: str, refine_steps, grad_mode, attacks, *, chains: int, draws: int,
                      aa_version: str | None, chain_sigma: float) -> tuple[str, list[int], list[str], list[Any]]:
    """(norm, the distinct K, the gradient modes, the attack specs), every argument of ``robust``
    checked before any model is loaded (the counts: :func:`check_counts`)."""
    norm = check_norm_param(norm)
    ks = list(dict.fromkeys(check_refine_steps(refine_steps)))
    modes = check_grad_modes([grad_mode] if isinstance(grad_mode, str) else grad_mode)
    specs = attack_specs(attacks)
    check_count("chains", chains)
    check_count("draws", draws)
    check_aa_version(aa_version)
    check_min("chain_sigma", float(chain_sigma), 0)
    return norm, ks, modes, specs


#: how a sweep's counts are compared (the provenance says so)
PAIRED = ("every count attacks the same inputs with the same attack seeds and noise stream (paired); converged: the "
          "last two counts' drop is not significant (exact McNemar) and its upper 95% limit (Newcombe) < tolerance")


# -- the evaluation ---------------------------------------------------------------------------------
@deprecated_keywords(renamed={"sigma": "chain_sigma", "root": "data_root"},
                     outputs={"plot": "jemeval.plots.robustness:plot_robust_result"})
@takes_context(batch_size=DEFAULT_BATCH_SIZE)
def robust(
    model: EnergyModel | str,
    *,
    norm: str,
    refine_steps: int | Sequence[int] = 0,
    attacks: Any = "pgd",
    epsilons: Sequence[float | str] | None = None,
    data: str | None = None,
    n: int | None = 300,
    steps: int | Sequence[int] | None = None,
    restarts: int | None = None,
    grad_mode: str | Sequence[str] = "full",
    chains: int = 5,
    chain_sigma: float = 0.0,
    eot_samples: int | Sequence[int] = 10,
    draws: int = 1,
    aa_version: str | None = None,
    checkpoint: bool | None = None,
    sgld_step_size: float | None = None,
    sgld_noise: float | None = None,
    converge_tolerance: float = TOLERANCE,
    class_map: Any = None,
    context: RunContext,
) -> Result:
    """Robust accuracy of ``model`` under ``attacks`` for every (K, grad mode, epsilon).

    ``epsilons``: [0, 1] pixel units, ``"max"`` the norm's largest (:data:`MAX_EPSILON`). ``steps`` /
    ``restarts`` are offered to attacks that take them (PGD, APGD: iterations and random restarts;
    Boundary: iterations); ``aa_version`` (standard or rand) to AutoAttack as its ``version``.
    ``eot_samples`` only matters with ``grad_mode`` eot or bpda+eot (the noise draws averaged per
    gradient; APGD averages them in its own loop; AutoAttack rand averages its 20 in full/bpda). A list
    of ``eot_samples`` or ``steps`` is a sweep: every count is run (paired) and each (attack, K, grad
    mode, epsilon) curve gets a paired verdict (:mod:`.convergence`, ``converge_tolerance`` in robust-accuracy
    units); every record gets ``flags`` (:func:`.checks.record_flags`). K = 0 is attacked once per attack
    (full and bpda coincide; recorded as ``full``); gradient-free attacks ignore the gradient mode (``none``).
    ``draws``: re-check every adversarial under fresh noise draws; robust only if all classify it correctly
    (>= 5 for a refined model). ``chain_sigma`` (default 0; the JEM release 0.03): noise added to each chain
    before refinement; ``checkpoint``: gradient checkpointing; ``class_map``: :mod:`jemeval.evaluation.classes`."""
    norm, ks, modes, specs = check_robust_args(norm, refine_steps, grad_mode, attacks, chains=chains, draws=draws,
                                               aa_version=aa_version, chain_sigma=chain_sigma)
    sweep = {**check_robust_counts(ks, modes, chains=chains, restarts=restarts, eot_samples=eot_samples, steps=steps),
             "tolerance": check_tolerance(converge_tolerance)}
    model = prepare_model(model, context.device)  # a path loads the checkpoint (its hash goes into provenance)
    data = data or training_dataset(model, param="data")
    inputs = attack_inputs(model, data, norm, epsilons, n=n, context=context, class_map=class_map)
    sgld, _ = recorded_sgld(model, 0, step_size=sgld_step_size, noise=sgld_noise)
    offered = {k: v for k, v in {"restarts": restarts, "crn_seed": context.seed, "version": aa_version}.items()
               if v is not None}
    variants = attack_variants(specs, norm, offered, steps if sweep["steps"] is None else sweep["steps"])
    defence = Defence(model, chains, chain_sigma, sgld, sweep["eot_samples"][-1], checkpoint, context.seed, int(draws))
    runs = checked_runs(defence, ks, variants, modes, inputs)
    records, min_perturbations, notes = run_attacks(defence, sweep_runs(runs, variants, sweep["eot_samples"]), ks,
                                                    inputs, progress=context.progress, outcomes=(outcomes := []))
    checks, verdicts = judge(records, outcomes, defence, ks, inputs, sweep, notes)
    return Result(
        records, stamp("robust", model, context, robust_settings(defence, inputs, ks, modes, variants, data, sweep)),
        extra={"checks": checks, "minimal_perturbations": min_perturbations, "per_input": final_outcomes(
            records, outcomes), **({"convergence": verdicts} if swept_axes(sweep) else {})},
        notes=inputs.notes + [c["message"] for c in checks] + notes,
    )


def final_outcomes(records: list[dict], outcomes: list[dict]) -> list[dict]:
    """The per-input outcomes (row keys, ``correct``: robust or not per input of the seeded subset) of the
    records the tables show: a sweep's last counts only (:func:`.convergence.final_records`)."""
    shown = {id(r) for r in final_records(records)}
    return [o for r, o in zip(records, outcomes, strict=True) if id(r) in shown]


def attack_variants(specs: list[Any], norm: str, offered: dict[str, Any], steps) -> list[tuple[str, list[Attack]]]:
    """Per attack spec (name, its attack at every count of a ``steps`` sweep, else the one attack).
    An attack that takes no steps setting, or whose spec fixes its own (``pgd:steps=100``), is built
    the same at every count: it is one attack, run once."""
    out = []
    for spec in specs:
        counts = steps if isinstance(steps, list) else [steps]
        built = [make_attack(spec, norm, context={**offered, **({} if s is None else {"steps": s})}) for s in counts]
        attacks = [a for _, a in built]
        if len({repr(a.settings.get("steps")) for a in attacks}) < len(attacks):
            attacks = attacks[-1:]
        out.append((built[0][0], attacks))
    return out


def sweep_runs(runs: list[Run], variants: list[tuple[str, list[Attack]]], eot_counts: list[int]) -> list[Run]:
    """Every run of a sweep: each planned run at every steps count of its attack and, in an EOT mode
    (a stochastic K), at every EOT count, in one loop after one clean pass. A planned run's counts
    share its re-check noise stream (``stream``), its inputs and its attack seeds: the counts are
    paired, so a drop between them is the attack's, not the noise's. Without a sweep: ``runs``."""
    by_first = {id(attacks[0]): attacks for _, attacks in variants}
    if len(eot_counts) < 2 and all(len(a) < 2 for a in by_first.values()):
        return runs
    out = []
    for index, run in enumerate(runs):
        counts = eot_counts if run.grad_mode in EOT_MODES and len(eot_counts) > 1 else [None]
        out += [Run(run.name, attack, run.refine_steps, run.grad_mode, eot_samples=e, stream=index)
                for attack in by_first[id(run.attack)] for e in counts]
    return out


def swept_axes(sweep: dict[str, list[int] | None]) -> list[str]:
    """The counts swept (eot_samples, steps): those given as a list of two or more."""
    return [axis for axis in ("eot_samples", "steps") if sweep.get(axis) is not None and len(sweep[axis]) > 1]


def judge(records: list[dict], outcomes: list[dict], defence: Defence, ks: list[int], inputs: Batches,
          sweep: dict[str, Any], notes: list[str]) -> tuple[list[dict], list[dict]]:
    """(the checklist, the convergence verdicts); each record gets its curve's ``converged`` and its
    ``flags``, and ``notes`` a line for a swept count that no run uses (its sweep measured nothing)."""
    deterministic = [k for k in ks if not defence.stochastic(k)]
    verdicts = convergence(records, outcomes, swept=swept_axes(sweep), deterministic_ks=deterministic,
                           tolerance=sweep["tolerance"])
    mark_converged(records, verdicts)
    for axis in swept_axes(sweep):
        if all(v["converged"] is None for v in verdicts if v["axis"] == axis):
            notes.append(f"the {axis} sweep {sweep[axis]} changed no run: " + (
                "EOT samples matter only in the eot and bpda+eot gradient modes at a K with noise"
                if axis == "eot_samples" else "no attack takes a steps setting that its spec leaves open"))
    checks = sanity_checks(records, input_dims=int(np.prod(inputs.x.shape[1:])),
                           num_classes=defence.model.num_classes, verdicts=verdicts)
    record_flags(records, checks, [k for k in ks if defence.stochastic(k)])
    return checks, verdicts


def robust_settings(defence: Defence, inputs: Batches, ks: list[int], modes: list[str],
                    variants: list[tuple[str, list[Attack]]], data: str, sweep: dict[str, Any]) -> dict[str, Any]:
    """Everything that defines a robust evaluation, for the provenance."""
    seed = defence.seed
    return {
        "norm": inputs.norm, "epsilons": inputs.epsilons,
        "epsilon_units": "pixel units in [0, 1] (model space = 2 x epsilon)",
        "refine_steps": ks, "grad_modes": modes, "chains": defence.chains, "sigma": defence.chain_sigma,
        "eot_samples": sweep["eot_samples"] if len(sweep["eot_samples"]) > 1 else defence.eot_samples,
        **({"sweep": {**{a: sweep[a] for a in swept_axes(sweep)}, "paired": PAIRED,
                      "converge_tolerance": sweep["tolerance"]}} if swept_axes(sweep) else {}),
        "gradient_checkpointing": defence.checkpoint,  # as given (None: automatic); where it was on:
        "gradient_checkpointing_steps": [k for k in ks if k and defence.classifier(k, "full").checkpoint],
        "draws": defence.draws, "stochastic_refine_steps": [k for k in ks if defence.stochastic(k)],
        "sgld": {k: v for k, v in defence.sgld.settings().items() if k != "steps"},
        "sgld_note": sampler_note(defence.model), "class_map": inputs.class_map,
        "attacks": {name: dict(a[-1].settings) for name, a in variants},
        "data": str(data), "split": "test", "n": len(inputs.x), "subset_seed": seed, "batch_size": inputs.batch_size,
        "seeds": {"attack": f"{seed} + 7919 * batch (torch and numpy, per attack call)",
                  "clean_chains": f"batch_seed({seed} + 1000 + K, batch) ({seed} + 1000 + K for batch 0)",
                  "recheck_chains": f"batch_seed({seed} + 2000 + 97 * run, batch) (its draws continue the stream)"},
        "robust_definition": "correct on the clean input and on the adversarial under every one of the draws "
                             "(fresh noise each), all re-classified by jemeval; robust_accuracy_mean averages the "
                             "draws; ci_low/ci_high: 95% Wilson interval of robust_accuracy",
    }
