"""Fitting OOD detectors: the images they fit on, one shared pass over them, the on-disk cache.

A detector (:class:`jemeval.Detector`) is fitted once per (model, detector, options, fit data):

* **Fit data**: the in-distribution training images, the ``train`` split of the ID dataset (or of
  ``fit_on``) minus the validation images ``jemeval train`` held out when the checkpoint records
  them (``val_size``/``split_seed``); those held-out images (or the dataset's own ``val`` split)
  are the in-distribution half of the tuning data (:mod:`jemeval.evaluation.ood.tune`). Without
  either and with tuning, a seeded 10% (at most 5000) of the fit images is held out instead. The
  test split is never fitted on; a set without one (a single-split folder or npz, or the ``train``
  split evaluated) is fitted on a seeded half that the evaluation leaves out
  (:func:`jemeval.evaluation.ood.sets.load_id_set`).
* **One pass**: detectors that declare ``uses_features`` share one forward pass over the fit data (features,
  logits and labels, :func:`jemeval.evaluation.batching.run_batches`); the others get the dataset.
* **Cache** (read and written as the run's :class:`~jemeval.context.CachePolicy` says, in its
  ``dir``): a fitted ``state_dict()`` is stored by :mod:`jemeval.caches.detectors` (which owns the
  files: atomic writes, ``weights_only=True`` reads, a checksum of the state), keyed by the SHA-256
  of the model's weights and architecture, the detector (name, plugin and its version), its options
  and a fingerprint of the fit data (the images themselves for in-memory sets, the contents of the
  files a set reads), so a second run does not refit. A cached state is used only once it scores
  two fit images (one tiny batch): a state of the right key but the wrong shapes is refitted with a
  note instead of failing in the middle of the evaluation.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from jemeval import __version__
from jemeval.caches.detectors import CACHE_FORMAT, cache_path, load_state, save_state
from jemeval.components.detector import state_bytes
from jemeval.context import RunContext, takes_context
from jemeval.data import (
    ArrayDataset,
    ClassSubset,
    dataset_sha256,
    declared_splits,
    default_val_size,
    held_out_indices,
    load_dataset,
    split_indices,
    subsample,
    take,
)
from jemeval.errors import UsageError
from jemeval.evaluation.batching import ScoreFn, run_batches
from jemeval.evaluation.inputs import check_input_shape, model_data_options
from jemeval.evaluation.ood.sets import fit_part, same_dataset, shares_fit_images
from jemeval.plugins import get_plugin_manager, get_registry
from jemeval.provenance import content_sha256
from jemeval.runtime.shards import rank_and_world
from jemeval.stored_images import StoredImages


@dataclass
class FitSets:
    """The images detectors fit on, the in-distribution tuning images (held out from them), and what
    both are (for provenance)."""

    fit: Dataset
    tune_id: Dataset | None
    info: dict[str, Any] = field(default_factory=dict)


@takes_context
def fit_sets(model, id_name: str, *, fit_on: str | None = None, fit_n: int | None = None, tune: bool = False,
             split: str = "test", context: RunContext) -> FitSets:
    """The fit and tuning images of ``model`` (see the module docstring); ``split`` is the split of the
    in-distribution set evaluated, whose images are never among them; the context gives the seed of
    every seeded choice and where the datasets are."""
    spec, seed, data_root, download = fit_on or id_name, context.seed, context.data_root, context.download
    train = load_dataset(spec, "train", data_root, download, **model_data_options(model))
    try:  # as the OOD sets are checked: a wrong shape is one line, not a convolution's RuntimeError
        check_input_shape(model, train, spec)
    except UsageError as exc:
        raise UsageError(f"fit_on: {exc}" if fit_on else str(exc), param="fit_on" if fit_on else "id") from None
    info: dict[str, Any] = {"data": spec, "split": "train"}
    held, tune_id = None, None
    if (fit_on is None or same_dataset(fit_on, id_name)) and shares_fit_images(train, split):
        # the evaluated images are these: fit on the seeded part load_id_set leaves out of the evaluation
        train = take(train, fit_part(len(train), seed)[0])
        info["split"] = f"a seeded {len(train)} of its images, left out of the in-distribution evaluation"
    elif "val" in (declared_splits(train) or ()):  # the dataset's own validation split: all of train fits
        if tune:
            tune_id = load_dataset(spec, "val", data_root, download, **model_data_options(model))
            info["held_out"] = f"{spec} val split, for tuning"
    else:
        held = held_out_indices(model, spec, len(train))
        if held is not None:
            info["held_out"] = f"the {len(held)} train images jemeval train held out (checkpoint val_size / split_seed)"
    if held is None and tune and tune_id is None:
        held = split_indices(len(train), max(1, default_val_size(len(train))), seed)[1]
        info["held_out"] = f"seeded random {len(held)} of the fit images (seed {seed}), for tuning"
    fit = train if held is None else take(train, np.setdiff1d(np.arange(len(train)), held))
    fit = subsample(fit, fit_n, seed, name="fit_n")
    info["n"] = len(fit)
    return FitSets(fit, tune_id if held is None else take(train, held), info)


# -- fingerprints ---------------------------------------------------------------------------------
def _hash_tensor(h, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def model_fingerprint(model) -> str:
    """SHA-256 of what the model computes: architecture, options, normalisation and every weight."""
    h = hashlib.sha256(json.dumps([getattr(model, a, None) for a in ("arch", "arch_options", "normalization",
                                                                      "num_classes", "input_shape")],
                                  sort_keys=True, default=str).encode())
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        _hash_tensor(h, t)
    return h.hexdigest()


def dataset_fingerprint(ds: Dataset) -> str:
    """SHA-256 naming a dataset's images: its spec, size and info, the images of an in-memory set, the
    indices of a subset, the contents of the files it reads (its spec's files, its ``info["path"]``)."""
    h = hashlib.sha256(json.dumps([getattr(ds, "spec", None), len(ds), getattr(ds, "info", None)], sort_keys=True,
                                  default=str).encode())
    if isinstance(ds, ArrayDataset):
        _hash_tensor(h, ds.x)
        _hash_tensor(h, ds.y)
    elif isinstance(ds, StoredImages):  # a file's bytes are hashed below; a generated set is its info and shape
        h.update(f"stored:{ds.stored.shape}:{ds.storage}".encode())
    elif isinstance(ds, (Subset, ClassSubset)):
        h.update(np.asarray(ds.indices, dtype=np.int64).tobytes())
        h.update(dataset_fingerprint(ds.dataset if isinstance(ds, Subset) else ds.base).encode())
    spec = getattr(ds, "spec", None)
    path = (getattr(ds, "info", None) or {}).get("path")
    if isinstance(spec, str):
        h.update(f"spec files:{dataset_sha256(spec)}".encode())
    if path and Path(path).exists():
        h.update(f"path:{content_sha256([path])}".encode())
    return h.hexdigest()


# -- fitting ------------------------------------------------------------------------------------
class DetectorFitter:
    """Fits detectors on one :class:`FitSets`: cached states first, then one shared pass for the rest."""

    def __init__(self, model, sets: FitSets, *, context: RunContext):
        self.model, self.sets, self.context = model, sets, context
        self._outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._fingerprints: tuple[str, str] | None = None
        self._done: dict[int, dict[str, Any]] = {}  # id(detector) -> what fit() did

    def ensure(self, score: ScoreFn) -> dict[str, Any]:
        """:meth:`fit`, unless this fitter already fitted this very detector (a tuned candidate)."""
        return self._done[id(score.fn)] if id(score.fn) in self._done else self.fit(score)

    def fit(self, score: ScoreFn) -> dict[str, Any]:
        """Fit ``score``'s detector in place (from the cache when it holds it); what was done, for provenance."""
        self._done[id(score.fn)] = report = {**self._fit(score), "state_bytes": state_bytes(score.fn)}
        return report

    def _fit(self, score: ScoreFn) -> dict[str, Any]:
        key, policy = self._key(score), self.context.cache
        path = cache_path(score.name, key, policy.dir)
        loaded = load_state(score.fn, path, key, score.label) if policy.read else False
        note = loaded if isinstance(loaded, str) else None
        if loaded is True:
            note = self._unusable(score, path)
            if note is None:
                return {"fit": "cached", "cache": str(path)}
        if score.fn.uses_features:
            features, logits, labels = self._shared_outputs()
            if score.fn.needs_labels and not bool((labels >= 0).any()):
                raise UsageError(f"score {score.label!r} needs labelled fit data; {self.sets.info['data']!r} has no "
                                 "labels: choose labelled in-distribution data with fit_on", param="fit_on")
            score.fn.fit_features(self.model, features, logits, labels, **score.options)
        else:
            score.fn.fit(self.model, self.sets.fit, **score.options)
        main = rank_and_world()[0] == 0  # under --nproc rank 0 alone writes the cache
        saved = policy.write and main and save_state(score.fn, path, key, score.label)
        return {"fit": "fitted", "cache": str(path) if saved else None, **({"note": note} if note else {})}

    def _unusable(self, score: ScoreFn, path: Path) -> str | None:
        """None when the detector, just loaded from ``path``, scores two fit images (a finite score
        each); else the note of its refit (warned too)."""
        probe = take(self.sets.fit, np.arange(min(2, len(self.sets.fit))))
        if not len(probe):
            return None
        try:
            out = run_batches(self.model, probe, scores=[score], context=self.context, batch_size=len(probe),
                              progress=False, check_finite=False).scores
            values = np.asarray(out[score.label], dtype=np.float64)
            if values.shape == (len(probe),) and np.isfinite(values).all():
                return None
            problem = f"gave scores of shape {values.shape}"
        except Exception as exc:  # noqa: BLE001 - a state that does not fit the model is refitted, never fatal
            problem = f"does not fit the model ({type(exc).__name__})"
        note = f"cached state {str(path)!r} of score {score.label!r} {problem}; refitted"
        warnings.warn(note, stacklevel=3)
        return note

    def _shared_outputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._outputs is None:
            out = run_batches(self.model, self.sets.fit, keep_logits=True, keep_features=True, context=self.context,
                              desc=f"fit {self.sets.info['data']} train")
            self._outputs = (torch.from_numpy(out.features), torch.from_numpy(out.logits),
                             torch.from_numpy(out.labels))
        return self._outputs

    def _key(self, score: ScoreFn) -> str:
        if self._fingerprints is None:
            self._fingerprints = (model_fingerprint(self.model), dataset_fingerprint(self.sets.fit))
        component = get_registry().component("score", score.name)
        versions = get_plugin_manager().versions()
        return json.dumps({"format": CACHE_FORMAT, "detector": score.name, "plugin": component.plugin,
                           "version": versions.get(component.plugin) or __version__, "jemeval": __version__,
                           "class": f"{type(score.fn).__module__}.{type(score.fn).__qualname__}",
                           "options": score.options, "model": self._fingerprints[0],
                           "fit_data": self._fingerprints[1]}, sort_keys=True, default=str)
