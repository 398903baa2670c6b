"""Choosing score hyperparameters on an OOD validation set (OpenOOD's automatic parameter search).

``tune_on=DATASET``: every score with a ``grid`` (ODIN's T and eps, KNN's k, ReAct's percentile,
energy's T, ...; options the user set are kept fixed) is evaluated with each combination of the
candidates on in-distribution tuning images (held out from both training and fitting: the ID set's
``val`` split, the images training held out, or a seeded part of the fit images, see
:func:`jemeval.evaluation.ood.fit.fit_sets`; never an evaluated image) against DATASET, and the
combination with the highest AUROC (the first in grid order on a tie) is used for the test sets.
DATASET must be none of the test sets (nor the in-distribution set): tuning on a test set
overstates every tuned score. All candidates of all scores share one forward pass per batch;
detector candidates are fitted (and cached) like any detector. DATASET is read from its ``train``
split when it has one (mirrored *training* digits for ``flip:digits``), so no test image is tuned
on. The choice and every candidate's AUROC are recorded in the result.
"""
from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from typing import Any

from jemeval.context import RunContext
from jemeval.errors import UsageError
from jemeval.evaluation.batching import ScoreFn, run_batches
from jemeval.evaluation.metrics import auroc
from jemeval.evaluation.ood.fit import DetectorFitter
from jemeval.evaluation.ood.sets import expand_ood_name, load_ood_set, same_dataset


def candidates(score: ScoreFn) -> list[dict[str, Any]]:
    """The option sets to try for ``score``: its grid over the options the user did not set ([] = nothing to tune)."""
    grid = {k: list(v) for k, v in score.fn.grid.items() if k not in score.options}
    if not grid:
        return []
    return [{**score.options, **dict(zip(grid, values))} for values in itertools.product(*grid.values())]


def check_tune_set(tune_on: str, id_name: str, test_sets: Sequence[str]) -> str:
    """The tuning set's label; refused when it is the ID set or one of the test sets."""
    label = expand_ood_name(tune_on, id_name)[0]
    for other in [id_name, *test_sets]:
        if same_dataset(label, other):
            raise UsageError(f"tune_on {tune_on!r} is the dataset {other!r} that is also evaluated; tuning on a test "
                             "set overstates every tuned score: name a set that is not tested (e.g. flip:digits "
                             "for digits' near/far groups)", param="tune_on")
    return label


def _candidate_scores(scores: Sequence[ScoreFn]) -> dict[str, list[ScoreFn]]:
    """score label -> one ScoreFn per candidate (each detector candidate its own unfitted copy)."""
    out = {}
    for s in scores:
        options = candidates(s)
        if options:
            out[s.label] = [ScoreFn(f"{s.label}#{i}", s.name, copy.deepcopy(s.fn) if s.detector else s.fn, o)
                            for i, o in enumerate(options)]
    return out


def tune_scores(model, scores: Sequence[ScoreFn], fitter: DetectorFitter, *, tune_on: str, id_name: str,
                test_sets: Sequence[str], split: str, n: int | None, input_sigma: float,
                context: RunContext) -> tuple[list[ScoreFn], dict[str, Any]]:
    """``scores`` with the tunable ones replaced by their best candidate (fitted), and the record of it."""
    label = check_tune_set(tune_on, id_name, test_sets)
    tune_id = fitter.sets.tune_id
    per_score = _candidate_scores(scores)
    record: dict[str, Any] = {"tune_on": label, "metric": "auroc", "scores": {}}
    if not per_score or tune_id is None:
        return list(scores), record
    tune_split, tune_ood = _tune_set(model, tune_on, id_name, len(tune_id), split=split, n=n, context=context)
    usable, skipped = _fit_candidates(per_score, fitter)
    flat = [c for cands in usable.values() for c in cands]
    outs = [run_batches(model, ds, scores=flat, keep_logits=False, sigma=input_sigma, context=context,
                        seed=context.seed + i, desc=f"tune {'ID' if i == 0 else label}")
            for i, ds in enumerate((tune_id, tune_ood))]
    record.update({"split": tune_split, "n_id": len(tune_id), "n_ood": len(tune_ood),
                   "id": fitter.sets.info.get("held_out")})
    chosen = {}
    for s_label, cands in usable.items():
        values = [auroc(outs[0].scores[c.label], outs[1].scores[c.label]) for c in cands]
        best = cands[max(range(len(cands)), key=lambda i: (values[i], -i))]
        chosen[s_label] = best
        record["scores"][s_label] = {
            "chosen": best.options,
            "candidates": [{"options": c.options, "auroc": v} for c, v in zip(cands, values)] + skipped[s_label]}
    return [ScoreFn(s.label, s.name, chosen[s.label].fn, chosen[s.label].options) if s.label in chosen else s
            for s in scores], record


def _tune_set(model, tune_on: str, id_name: str, size: int, *, split: str, **kwargs):
    """(split, dataset) of the OOD tuning set: its train split, so that not even a test image is tuned on
    (``split`` for a dataset that has no train split)."""
    try:
        return "train", load_ood_set(model, tune_on, id_name, size, split="train", **kwargs)[1]
    except UsageError as exc:
        if split == "train" or "split" not in str(exc):
            raise
    return split, load_ood_set(model, tune_on, id_name, size, split=split, **kwargs)[1]


def _fit_candidates(per_score: dict[str, list[ScoreFn]], fitter: DetectorFitter):
    """Fit every detector candidate; a candidate its detector refuses (KNN's k above the number of fit
    images, ViM's d not below the feature dimension) is skipped and recorded, not fatal."""
    usable: dict[str, list[ScoreFn]] = {}
    skipped: dict[str, list[dict[str, Any]]] = {}
    for s_label, cands in per_score.items():
        usable[s_label], skipped[s_label] = [], []
        for c in cands:
            try:
                if c.detector:
                    fitter.fit(c)
                usable[s_label].append(c)
            except UsageError as exc:
                skipped[s_label].append({"options": c.options, "skipped": str(exc)})
        if not usable[s_label]:
            raise UsageError(f"score {s_label!r}: no candidate of its grid could be fitted "
                             f"({skipped[s_label][0]['skipped']})")
    return usable, skipped
