"""Accuracy and NLL, optionally after SGLD refinement of the inputs (JEM's defence, section 4).

``evaluate(model, "digits", refine_steps=[0, 1, 10])`` gives one record per number of refinement
steps K. K = 0 classifies the inputs as they are; K > 0 wraps the model in
:class:`jemeval.sampling.refinement.RefinedClassifier` (each input duplicated into ``chains`` copies, each
copy noised by ``chain_sigma`` and moved K SGLD steps up log p~(x), logits averaged over the
chains). ``input_sigma`` is the evaluation input noise applied once per input by the shared batch
loop before anything else (the JEM release used 0.03), so K = 0 with chains is not needed to
reproduce plain noisy evaluation. A dataset without a test split of its own (a single-split folder
or npz) is evaluated whole, with the note of :func:`jemeval.data.no_test_split_note`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from jemeval.context import RunContext, takes_context
from jemeval.data import load_dataset, no_test_split_note, subsample
from jemeval.deprecations import deprecated_keywords
from jemeval.errors import UsageError
from jemeval.evaluation.batching import DEFAULT_BATCH_SIZE, BatchOutputs, run_batches
from jemeval.evaluation.calibration import softmax64
from jemeval.evaluation.classes import class_alignment
from jemeval.evaluation.inputs import (
    check_input_shape,
    check_input_sigma,
    check_min,
    check_refine_steps,
    model_data_options,
    prepare_model,
    stamp,
    training_dataset,
)
from jemeval.evaluation.limits import check_count, check_memory
from jemeval.evaluation.metrics import nll as nll_metric
from jemeval.results import Result
from jemeval.runtime.shards import batch_seed
from jemeval.seen_images import check_evaluated
from jemeval.stored_images import StoredRows


@deprecated_keywords(renamed={"sigma": "input_sigma", "step_size": "sgld_step_size", "noise": "sgld_noise"})
@takes_context(batch_size=DEFAULT_BATCH_SIZE)
def evaluate(
    model,
    data: str | None = None,
    *,
    split: str = "test",
    n: int | None = None,
    input_sigma: float = 0.0,
    refine_steps: int | Sequence[int] = 0,
    chains: int = 5,
    chain_sigma: float = 0.0,
    sgld_step_size: float | None = None,
    sgld_noise: float | None = None,
    class_map: Any = None,
    context: RunContext,
) -> Result:
    """Accuracy and NLL of ``model`` (EnergyModel or checkpoint path) on ``data`` (default: the
    model's training dataset, test split), one record per number of refinement steps.

    Refinement SGLD settings default to those recorded in the checkpoint's training config (else
    JEM's: step size 1.0, noise 0.01); ``sgld_step_size``/``sgld_noise`` override them. Every
    setting is recorded in the provenance (``settings.refinement``, per K). ``class_map`` maps the
    data's classes to the model's where they differ (:mod:`jemeval.evaluation.classes`). ``seed``, ``device``,
    ``batch_size``, ``progress``, ``data_root`` and ``download``: the run's
    :class:`~jemeval.context.RunContext`. ``extra["per_input"]``: per K, ``{"refine_steps": K, "correct":
    [bool per input]}``, the inputs in the seeded subset's order (the report's paired tests).
    """
    steps_list = check_refine_steps(refine_steps)
    check_count("chains", chains)
    check_min("chain_sigma", chain_sigma, 0)
    check_input_sigma(input_sigma)
    model = prepare_model(model, context.device)
    data = data or training_dataset(model, param="data")
    ds, classes, notes, seen = evaluated_set(model, data, split, n, class_map, context=context)
    if any(steps_list) and len(ds):  # K > 0: every input of a batch refined in chains copies at once
        check_memory("chains", [("batch_size", min(context.batch(DEFAULT_BATCH_SIZE), len(ds))), ("chains", chains)],
                     model.input_shape, model.device)
    records: list[dict[str, Any]] = []
    per_input: list[dict[str, Any]] = []  # per K, which inputs are classified correctly (paired tests)
    refinement_settings: dict[str, Any] = {}
    for k in steps_list:
        classifier, settings = _classifier(model, k, chains=chains, chain_sigma=chain_sigma, step_size=sgld_step_size,
                                           noise=sgld_noise, seed=context.seed)
        out = run_batches(classifier, ds, sigma=input_sigma, context=context,
                          before_batch=_chain_streams(classifier, context.seed),
                          desc=f"eval {data}" + (f" (K={k})" if k else ""))
        records.append({"data": data, "split": split, "refine_steps": k, **accuracy_and_nll(out, data),
                        "sigma": float(input_sigma)})
        per_input.append({"refine_steps": k, "correct": correct_per_input(out)})
        refinement_settings[str(k)] = settings
    note = no_test_split_note(data, ds)
    return Result(records, stamp("eval", model, context, {
        "data": data, "split": split, "n": n, "sigma": float(input_sigma),
        "noise_seed": int(context.seed) if input_sigma > 0 else None, "seed": int(context.seed),
        "batch_size": context.batch(DEFAULT_BATCH_SIZE), "refine_steps": steps_list,
        "refinement": refinement_settings, "dataset_info": getattr(ds, "info", None), "class_map": classes.record,
        **seen}), extra={"per_input": per_input}, notes=([note] if note else []) + notes)


def evaluated_set(model, data: str, split: str, n: int | None, class_map: Any, *, context: RunContext):
    """(the seeded subset of ``data``'s ``split`` with its labels as the model's classes, the class
    alignment, the notes and provenance of the images the checkpoint has seen among them)."""
    ds = load_dataset(data, split, context.data_root, context.download, **model_data_options(model))
    check_input_shape(model, ds, data)
    classes = class_alignment(model, ds, data, class_map)
    ds = subsample(classes.apply(ds), n, context.seed)
    notes, seen = check_evaluated(model, data, split, ds, context=context)
    return ds, classes, notes, seen


def accuracy_and_nll(out: BatchOutputs, data: str) -> dict[str, Any]:
    """accuracy, nll and n of one pass over a labelled dataset."""
    if (out.labels < 0).any():
        raise UsageError(f"dataset {data!r} is unlabelled; accuracy needs labels (e.g. data=digits)", param="data")
    if out.labels.max() >= out.logits.shape[1]:
        raise UsageError(f"dataset {data!r} has label {int(out.labels.max())} but the model has "
                         f"{out.logits.shape[1]} classes")
    probs = softmax64(out.logits)
    return {"accuracy": float(np.mean(probs.argmax(axis=1) == out.labels)), "nll": nll_metric(probs, out.labels),
            "n": len(out.labels)}


def correct_per_input(out: BatchOutputs) -> list[bool]:
    """Whether each input (in the order of the seeded subset, the same for every model) is classified
    correctly, as :func:`accuracy_and_nll` counts it: the exact McNemar test of
    :mod:`jemeval.reports.compare` pairs two models' lists input by input."""
    return (softmax64(out.logits).argmax(axis=1) == out.labels).tolist()


def _classifier(model, steps: int, *, chains: int, chain_sigma: float, step_size, noise, seed: int):
    """The model itself for K = 0, else a seeded RefinedClassifier, with its settings."""
    if steps == 0:
        return model, {"refine_steps": 0}
    from jemeval.sampling.recorded import recorded_sgld
    from jemeval.sampling.refinement import RefinedClassifier

    sgld, _ = recorded_sgld(model, steps, step_size=step_size, noise=noise)
    device = model.device
    generator = torch.Generator(device=device).manual_seed(int(seed) + 1)
    refined = RefinedClassifier(model, steps, chains=chains, sigma=chain_sigma, sgld=sgld, generator=generator)
    return refined, {**refined.settings(), "generator_seed": int(seed) + 1,
                     "generator_streams": "per batch b: batch_seed(generator_seed, b), generator_seed for batch 0"}


def _chain_streams(classifier, seed: int):
    """Batch b's refinement chains draw from their own stream (seed + 1 for batch 0), so any number
    of processes gives the same chains (:mod:`jemeval.runtime.shards`); None for K = 0."""
    generator = getattr(classifier, "generator", None)
    if generator is None:
        return None
    return lambda b: generator.manual_seed(batch_seed(int(seed) + 1, b))


def accuracy_on_arrays(model, x: torch.Tensor | StoredRows, y: torch.Tensor, *, batch_size: int = DEFAULT_BATCH_SIZE,
                       sigma: float = 0.0, seed: int = 0) -> float | None:
    """Top-1 accuracy of ``model`` on tensors (x, y), None for an empty set (the trainer's validation
    and test accuracy). Inputs get N(0, sigma^2) noise from a generator seeded with ``seed``;
    :func:`run_batches` computes the logits once per batch without gradients and restores the
    model's mode afterwards. Non-finite logits are left to the trainer's divergence checks (a
    collapse is rolled back there), so this one does not stop on them."""
    from jemeval.data import ArrayDataset

    if len(x) == 0:
        return None
    ds = x.dataset() if isinstance(x, StoredRows) else ArrayDataset(x, y)  # images kept as stored: read per batch
    out = run_batches(model, ds, sigma=sigma, context=RunContext(seed=seed, batch_size=batch_size,
                                                                                progress=False), check_finite=False)
    return float((out.logits.argmax(1) == out.labels).mean())
