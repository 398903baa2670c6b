"""Calibration: do a model's confidences match its accuracy? (JEM paper section 5.2)

``calibrate(model)`` computes the logits of the evaluation set once (the shared batch loop), turns
them into float64 probabilities and reports ECE, MCE, RMS calibration error, Brier score, NLL and
accuracy, plus the per-bin reliability table (bin conventions in
:mod:`jemeval.evaluation.metrics`: equal-width bins, interval (lo, hi], confidence 0 in
the first bin, 1.0 in the last; empty bins have no confidence/accuracy, they are not "perfectly
calibrated"). ``bins_strategy="equal-mass"`` draws the table in equal-mass bins instead (each
record's own edges: a temperature moves the confidences, hence the cuts); the summary metrics keep
their own binning, recorded per metric in the settings (``binning``).

With ``temperature_scaling`` a single temperature T is fitted (a bounded scalar search, Brent's
method over log T within ``TEMPERATURE_BOUNDS``, minimising the NLL) on images that are never
among those evaluated (:func:`validation_subset`): the dataset's ``val`` split, the train images a
``jemeval train`` checkpoint records as held out, a seeded train subset (noted), or, for a set
without a separate split, a seeded part of it left out of the evaluation (noted and recorded). The
calibrated numbers are reported beside the raw ones: logits / T leave the predictions, hence the
accuracy, unchanged. A set without a test split of its own gets the note of
:func:`jemeval.data.no_test_split_note`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jemeval.context import RunContext, takes_context
from jemeval.data import (
    declared_splits,
    has_test_split,
    holdout_parts,
    load_dataset,
    no_test_split_note,
    subsample,
    take,
)
from jemeval.data import held_out_indices as training_held_out  # not this module's name: its old one warns
from jemeval.deprecations import deprecated_keywords, moved_names
from jemeval.errors import UsageError
from jemeval.evaluation.batching import DEFAULT_BATCH_SIZE, run_batches
from jemeval.evaluation.classes import class_alignment
from jemeval.evaluation.inputs import (
    check_input_shape,
    check_input_sigma,
    check_min,
    model_data_options,
    prepare_model,
    stamp,
    training_dataset,
)
from jemeval.evaluation.limits import check_count
from jemeval.evaluation.metrics import (
    BIN_STRATEGIES,
    DEFAULT_BINS,
    METRIC_BINNING,
    reliability_bins,
    select_metrics,
)
from jemeval.registry import call_with_supported
from jemeval.results import Result
from jemeval.seen_images import check_evaluated

SUMMARY_FIRST = ("calibration", "temperature", "ece", "mce", "rms", "brier", "nll", "accuracy", "n")
DEFAULT_VAL_SIZE = 5000  # the JEM release's validation split size (capped at 20% of the train split)


def softmax64(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Softmax of logits / T in float64 (so confidences near 1 keep their resolution), by
    ``scipy.special.softmax`` (max-shifted, overflow-safe)."""
    from scipy.special import softmax

    return softmax(np.asarray(logits, dtype=np.float64) / float(temperature), axis=1)


def temperature_nll(logits: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    """Mean negative log-likelihood of ``labels`` under softmax(logits / T), float64, by
    ``scipy.special.logsumexp`` (no probability is formed, so no log(0) for confident mistakes)."""
    from scipy.special import logsumexp

    z = np.asarray(logits, dtype=np.float64) / float(temperature)
    y = np.asarray(labels, dtype=np.int64)
    return float((logsumexp(z, axis=1) - z[np.arange(len(y)), y]).mean())


def bins_table(probs: np.ndarray, labels: np.ndarray, bins: int, strategy: str = "uniform") -> list[dict[str, Any]]:
    """The reliability table as records: lower, upper, count, confidence, accuracy (None when empty);
    equal-mass bins may be fewer than ``bins`` (ties merge cuts)."""
    table = reliability_bins(probs, labels, bins, strategy)
    rows = []
    for i in range(len(table["count"])):
        count = int(table["count"][i])
        rows.append({
            "lower": float(table["lower"][i]), "upper": float(table["upper"][i]), "count": count,
            "confidence": float(table["confidence"][i]) if count else None,
            "accuracy": float(table["accuracy"][i]) if count else None,
        })
    return rows


def calibration_record(probs: np.ndarray, labels: np.ndarray, bins: int = DEFAULT_BINS,
                       metrics: Sequence[str] | None = None, strategy: str = "uniform") -> dict[str, Any]:
    """The built-in calibration metrics (ece, mce, rms, brier, nll), or the ``metrics`` named
    (plugin ones too), plus accuracy, n and the per-bin table in ``strategy`` bins. Metrics that
    accept ``bins`` get it."""
    labels = np.asarray(labels).reshape(-1)
    if len(labels) == 0:
        raise UsageError("no examples to calibrate on")
    if (labels < 0).any():
        raise UsageError("calibration needs a labelled dataset (this one has unlabelled examples, y = -1)")
    if labels.max() >= probs.shape[1]:
        raise UsageError(f"the dataset has label {int(labels.max())} but the model has only {probs.shape[1]} "
                         "classes")
    record: dict[str, Any] = {}
    for name, fn in select_metrics("calibration", metrics):
        record[name] = float(call_with_supported(fn, probs, labels, context={"bins": int(bins)}))
    record["accuracy"] = float(np.mean(probs.argmax(axis=1) == labels))
    record["n"] = len(labels)
    record["bins"] = bins_table(probs, labels, bins, strategy)
    return record


def check_bins_strategy(strategy) -> None:
    """One line naming the option when the reliability table's binning is not one jemeval knows."""
    if strategy not in BIN_STRATEGIES:
        raise UsageError(f"bins_strategy must be one of {', '.join(BIN_STRATEGIES)}, got {strategy!r}",
                         param="bins_strategy")


TEMPERATURE_BOUNDS = (0.05, 20.0)


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The temperature T in ``TEMPERATURE_BOUNDS`` minimising the NLL of softmax(logits / T).

    The NLL is convex in 1/T, so a bounded scalar search (Brent, float64) finds the optimum
    reliably. The bounds matter: when every validation image is classified correctly the NLL keeps
    falling as T -> 0 and an unbounded fit returns a degenerate, wildly over-confident T; the
    caller reports a T at a bound as such.
    """
    from scipy.optimize import minimize_scalar

    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    lo, hi = np.log(TEMPERATURE_BOUNDS[0]), np.log(TEMPERATURE_BOUNDS[1])

    def nll(log_t: float) -> float:
        return temperature_nll(z, y, float(np.exp(log_t)))

    best = minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10, "maxiter": 1000})
    # Brent never evaluates the end points themselves; a monotone NLL has its minimum there
    candidates = [best.x, lo, hi]
    return float(np.exp(min(candidates, key=nll)))


def temperature_at_bound(t: float) -> bool:
    lo, hi = TEMPERATURE_BOUNDS
    return t <= lo * 1.001 or t >= hi * 0.999


def validation_subset(model, *, data: str, val_size: int, split: str = "test", evaluated=None,
                      context: RunContext):
    """(images to fit T on, what they are, notes, images to evaluate), never the same images.

    In order: the dataset's own ``val`` split; the train split of a dataset whose test images are
    its own: the images training held out when the checkpoint records them, else a seeded random
    subset (noted: the model may have trained on them); for a set with no split apart from the one
    evaluated (a single-split folder or npz, or the train split asked for), a seeded part of it,
    left out of the evaluation (:func:`jemeval.data.holdout_parts`)."""
    seed, data_root, download = context.seed, context.data_root, context.download
    if int(val_size) <= 0:
        raise UsageError(f"val_size must be positive, got {val_size}", param="val_size")
    if evaluated is None:
        evaluated = load_dataset(data, split, data_root, download)
    if "val" in (declared_splits(evaluated) or ()) and split != "val":
        ds = subsample(load_dataset(data, "val", data_root, download), int(val_size), seed)
        return ds, {"source": f"{data} val split", "n": len(ds)}, [], evaluated
    if split != "train" and has_test_split(evaluated):
        train = load_dataset(data, "train", data_root, download)
        held_out = training_held_out(model, data, len(train))
        if held_out is not None:
            info = {"source": f"{data} train images held out from training (checkpoint val_size / split_seed)",
                    "n": len(held_out)}
            return take(train, held_out), info, [], evaluated
        ds = subsample(train, min(int(val_size), max(1, len(train) // 5)), seed)
        note = (f"T was fitted on {len(ds)} random train-split images; if the model was trained on them, T is fitted "
                "to over-confident training predictions (a held-out split gives a fairer T)")
        return ds, {"source": f"seeded random subset of {data} train", "n": len(ds), "seed": int(seed)}, [note], \
            evaluated
    fitted, rest = holdout_parts(len(evaluated), min(int(val_size), max(1, len(evaluated) // 5)), seed)
    info = {"source": f"a seeded part of the {split} images of {data}, left out of the evaluation", "n": len(fitted),
            "seed": int(seed), "evaluated": len(rest)}
    note = (f"{data} has no split to fit T on apart from the images evaluated: T was fitted on a seeded {len(fitted)} "
            f"of its {len(evaluated)} images, and the other {len(rest)} are evaluated")
    return take(evaluated, fitted), info, [note], take(evaluated, rest)


@deprecated_keywords(renamed={"sigma": "input_sigma"},
                     outputs={"plot": "jemeval.plots.calibration:plot_calibration_result"})
@takes_context(batch_size=DEFAULT_BATCH_SIZE)
def calibrate(
    model,
    data: str | None = None,
    *,
    split: str = "test",
    bins: int = DEFAULT_BINS,
    n: int | None = None,
    input_sigma: float = 0.0,
    temperature_scaling: bool = False,
    val_size: int = DEFAULT_VAL_SIZE,
    metrics: Sequence[str] | None = None,
    bins_strategy: str = "uniform",
    class_map: Any = None,
    context: RunContext,
) -> Result:
    """Calibration of ``model`` (EnergyModel or checkpoint path) on ``data`` (default: the model's
    training dataset, test split). One record (``calibration="none"``), plus a temperature-scaled
    one with ``temperature_scaling``. Each has ece, mce, rms, brier, nll (or the ``metrics``
    named, plugin metrics too), accuracy, n, bins (the reliability table, in ``bins_strategy`` bins:
    "uniform" or "equal-mass"; recorded in the settings). ``input_sigma``: noise added to every input. The
    run's :class:`~jemeval.context.RunContext` (seed, device, ...). ``extra["per_input"]``: :func:`per_input_outcomes`.
    Figure: :func:`jemeval.plots.calibration.plot_calibration_result`. ``class_map``: :mod:`.classes`."""
    check_min("bins", int(bins), 1)
    check_count("bins", bins)
    check_input_sigma(input_sigma)
    check_bins_strategy(bins_strategy)
    select_metrics("calibration", metrics)  # fail on a misspelt metric before computing anything
    model = prepare_model(model, context.device)
    data = data or training_dataset(model, param="data")
    ds = load_dataset(data, split, context.data_root, context.download, **model_data_options(model))
    check_input_shape(model, ds, data)
    classes = class_alignment(model, ds, data, class_map)
    notes = [note] if (note := no_test_split_note(data, ds)) else []
    if temperature_scaling:  # the images T is fitted on never are among those evaluated
        val_ds, val_info, fit_notes, ds = validation_subset(model, data=data, val_size=val_size, split=split,
                                                            evaluated=ds, context=context)
    ds = subsample(classes.apply(ds), n, context.seed)
    seen_notes, seen = check_evaluated(model, data, split, ds, context=context)
    notes += seen_notes
    out = run_batches(model, ds, sigma=input_sigma, context=context, desc=f"calibrate {data}")
    raw = calibration_record(softmax64(out.logits), out.labels, bins, metrics, bins_strategy)
    records = [{"calibration": "none", "temperature": 1.0, **raw}]
    names = [name for name, _ in select_metrics("calibration", metrics)]
    settings: dict[str, Any] = {"data": data, "split": split, "bins": int(bins), "bins_strategy": bins_strategy,
                                "binning": {k: METRIC_BINNING[k] for k in names if k in METRIC_BINNING},
                                "n": n, "sigma": float(input_sigma), "seed": int(context.seed),
                                "noise_seed": out.settings["noise_seed"], "batch_size": out.settings["batch_size"],
                                "temperature_scaling": bool(temperature_scaling), "metrics": names,
                                "dataset_info": getattr(ds, "info", None), "class_map": classes.record, **seen}
    if temperature_scaling:
        val = run_batches(model, classes.apply(val_ds), sigma=input_sigma, context=context, seed=context.seed + 1,
                          desc="validation")
        record, validation, more_notes = temperature_scaled(out, val, bins=bins, metrics=metrics, data=data,
                                                            strategy=bins_strategy)
        records.append(record)
        settings["validation"] = {**val_info, **validation}
        notes += fit_notes + more_notes
    records = [summary_first(r) for r in records]
    return Result(records, stamp("calibrate", model, context, settings),
                  extra={"per_input": per_input_outcomes(records, out)}, notes=notes)


def summary_first(record: dict[str, Any]) -> dict[str, Any]:
    """The record with the :data:`SUMMARY_FIRST` keys first (as tables print them)."""
    return {k: record[k] for k in SUMMARY_FIRST if k in record} | {k: v for k, v in record.items()
                                                                  if k not in SUMMARY_FIRST}


def per_input_outcomes(records: list[dict[str, Any]], out) -> list[dict[str, Any]]:
    """Per record, the float64 probabilities softmax(logits / T) of the evaluated inputs at the
    record's temperature (1 for "none") and their labels, in the seeded subset's order: what the
    report's paired bootstrap of ECE and NLL resamples (:mod:`jemeval.reports.compare`). Kept at full
    float64 precision (the JSON round-trips them exactly), so a difference it computes is the one the
    records show."""
    labels = np.asarray(out.labels).reshape(-1).tolist()
    return [{"calibration": r["calibration"], "probs": softmax64(out.logits, r["temperature"]).tolist(),
             "labels": labels} for r in records]


def temperature_scaled(out, val, *, bins: int, metrics, data: str, strategy: str = "uniform"):
    """(record, validation settings, notes) of temperature scaling: T fitted on the validation
    outputs ``val``, the calibration of ``out`` re-measured at that T, and notes where T says little."""
    if (val.labels < 0).any():
        raise UsageError(f"temperature scaling needs labels, and the images of {data!r} it is fitted on include "
                         "unlabelled ones")
    temperature = fit_temperature(val.logits, val.labels)
    scaled = calibration_record(softmax64(out.logits, temperature), out.labels, bins, metrics, strategy)
    validation = {"noise_seed": val.settings["noise_seed"], "optimizer": "bounded Brent search on log T",
                  "bounds": list(TEMPERATURE_BOUNDS)}
    note = temperature_note(temperature, val.logits, val.labels)
    return {"calibration": "temperature", "temperature": temperature, **scaled}, validation, [note] if note else []


def temperature_note(temperature: float, logits: np.ndarray, labels: np.ndarray) -> str | None:
    """The note on a fitted T that does not measure calibration, giving the reason that was measured:
    how many of the validation images are classified correctly, and which way T ran. At the lower
    bound the NLL kept falling as T shrank (every image right, or nearly); at the upper bound it kept
    falling as the predictions flattened (the logits say little about these labels). None otherwise."""
    n, correct = len(labels), int((np.asarray(logits).argmax(1) == np.asarray(labels)).sum())
    lo, hi = TEMPERATURE_BOUNDS
    measured = f"{correct} of the {n} validation images are classified correctly (accuracy {correct / max(n, 1):.3g})"
    at_bound, lower = temperature_at_bound(temperature), temperature < (lo * hi) ** 0.5
    if at_bound and lower:
        why = (f"sits at the lower bound of {list(TEMPERATURE_BOUNDS)}: {measured}, so sharpening the predictions "
               "keeps lowering their NLL and these images cannot identify T")
    elif at_bound:
        why = (f"sits at the upper bound of {list(TEMPERATURE_BOUNDS)}: {measured}, so flattening the predictions "
               "towards uniform keeps lowering their NLL: the logits say little about these labels (are the "
               "model's classes the data's?)")
    elif correct == n:
        why = f"was fitted on images that are all classified correctly ({measured}), which cannot identify T"
    else:
        return None
    return f"the fitted temperature T = {temperature:.3g} {why}; do not read the temperature-scaled row as calibrated"


#: 0.2's name of this module that moved beside :func:`jemeval.data.split_indices` (reading it warns)
__getattr__ = moved_names(__name__, {"held_out_indices": "jemeval.data"})
