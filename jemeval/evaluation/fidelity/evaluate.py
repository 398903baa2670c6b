"""Sample quality: Frechet distances in any model's feature space, and IS / FID / KID / precision / recall.

Two families of numbers, because the published ones cannot be reproduced everywhere:

* **Inception Score, FID, KID and precision/recall** through torch-fidelity with local, verified
  weights (InceptionV3; VGG16 for precision/recall; :mod:`jemeval.evaluation.fidelity.inception`), reference
  features optionally cached (:mod:`jemeval.evaluation.fidelity.extractors`); on 8 x 8 digits these numbers
  say little (a note says so).
* **A Frechet distance in the feature space of any jemeval checkpoint** (``features``):
  the input of the network's final Linear layer (its penultimate features). It works offline and
  on small images such as digits, and :func:`~jemeval.evaluation.fidelity.frechet.frechet_distance` is
  plain numpy. With ``ref_cache``
  the reference features of each such model are kept in the same file as Inception's, keyed on the
  model's weights and checkpoint SHA-256 and on the reference pixels (:func:`fd_cache_key`).

Which samples were scored (fresh chains or replay buffer, steps, the top-confident filter) is
part of every result: published IS/FID depend on it (the JEM paper's evaluation, docs/reproducing.md).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from jemeval.artifacts import Samples, load_samples
from jemeval.caches.reference_features import ReferenceCache
from jemeval.context import CachePolicy, RunContext, takes_context
from jemeval.data import data_hashes, load_dataset, subsample, to_arrays
from jemeval.energy.model import EnergyModel
from jemeval.errors import UsageError, did_you_mean
from jemeval.evaluation.batching import check_finite_outputs
from jemeval.evaluation.fidelity.extractors import LIBRARY_METRICS, library_metrics, metric_extractors, open_ref_cache
from jemeval.evaluation.fidelity.frechet import feature_statistics, frechet_distance, frechet_distance_from_features
from jemeval.evaluation.fidelity.inception import (
    EXTRACTORS,
    INCEPTION_FILE,
    INCEPTION_METRICS,
    WEIGHTS_ENV,
    check_extractor_weights,
    check_inception_weights,
    inception_notes,
    require_torch_fidelity,
    to_uint8_rgb,
    weights_kept,
)
from jemeval.evaluation.inputs import prepare_model, recorded_dataset
from jemeval.evaluation.ood.fit import model_fingerprint
from jemeval.provenance import provenance
from jemeval.results import Result
from jemeval.runtime.devices import resolve_device

__all__ = ["INCEPTION_FILE", "INCEPTION_METRICS", "METRICS", "WEIGHTS_ENV", "check_inception_weights",
           "feature_statistics", "fidelity", "frechet_distance", "frechet_distance_from_features",
           "require_torch_fidelity", "to_uint8_rgb"]

METRICS = (*LIBRARY_METRICS, "fd")
DEFAULT_BATCH_SIZE = 256


# -- features of a jemeval model ---------------------------------------------------------------
def penultimate_layer(model: EnergyModel) -> tuple[str, nn.Linear] | None:
    """The last Linear layer producing the logits (its input = the penultimate features)."""
    found = None
    for name, module in model.net.named_modules():
        if isinstance(module, nn.Linear) and module.out_features == model.num_classes:
            found = (name, module)
    return found


@torch.no_grad()
def extract_features(model: EnergyModel, x: torch.Tensor, batch_size: int = 256) -> tuple[np.ndarray, str]:
    """(N x D float64 features, layer description): the input of the final Linear layer, or the
    logits when the network has none."""
    layer = penultimate_layer(model)
    captured: list[torch.Tensor] = []
    handle = None
    if layer is not None:
        handle = layer[1].register_forward_hook(lambda mod, inputs, out: captured.append(inputs[0].flatten(1)))
    device = model.device
    was_training = model.training
    model.eval()
    try:
        logits = [model.logits(x[i:i + batch_size].to(device)) for i in range(0, len(x), batch_size)]
    finally:
        model.train(was_training)
        if handle is not None:
            handle.remove()
    feats = torch.cat(captured if layer is not None else logits)
    where = f"input of {layer[0]!r} (penultimate)" if layer is not None else "logits"
    return feats.double().cpu().numpy(), where


def finite_features(model: EnergyModel, x: torch.Tensor, batch_size: int, of: str) -> tuple[np.ndarray, str]:
    """:func:`extract_features`, stopped in one line naming the feature checkpoint and the first batch of
    ``of`` whose features are NaN or inf (weights that overflow in float32): before, numpy's
    eigendecomposition of their covariance failed with "Eigenvalues did not converge"."""
    features, layer = extract_features(model, x, batch_size)
    starts = range(0, len(features), batch_size)
    check_finite_outputs("penultimate features", [torch.from_numpy(features[i:i + batch_size]) for i in starts],
                         model, sizes=[len(features[i:i + batch_size]) for i in starts], of=of)
    return features, layer


def fd_cache_key(model: EnergyModel, reference: torch.Tensor) -> tuple[str, dict[str, Any]]:
    """(entry name, weights identity) of ``model``'s reference features in a ref_cache file: the
    SHA-256 of its weights (what it computes), of its checkpoint file, and of the reference pixels
    as the network sees them (floats, finer than the file's uint8 identity)."""
    ckpt = ((getattr(model, "metadata", None) or {}).get("checkpoint") or {}).get("sha256")
    pixels = hashlib.sha256(reference.detach().cpu().float().contiguous().numpy().tobytes()).hexdigest()
    key = hashlib.sha256(f"{model_fingerprint(model)}:{ckpt}:{pixels}".encode()).hexdigest()
    return f"fd-{key[:16]}", {"sha256": key, "checkpoint_sha256": ckpt}


def features_fd(features_model: EnergyModel, samples: torch.Tensor, reference: torch.Tensor,
                batch_size: int = 256, cache: ReferenceCache | None = None) -> dict[str, Any]:
    if tuple(samples.shape[1:]) != tuple(features_model.input_shape):
        raise UsageError(f"features model takes {tuple(features_model.input_shape)} images but the samples are "
                         f"{tuple(samples.shape[1:])}; use a checkpoint trained on the same kind of images",
                         param="features")
    f1, layer = finite_features(features_model, samples, batch_size, "the samples")
    if cache is None:
        f2, _ = finite_features(features_model, reference, batch_size, "the reference images")
    else:
        def compute() -> dict[str, torch.Tensor]:
            f, _ = finite_features(features_model, reference, batch_size, "the reference images")
            return {"penultimate": torch.from_numpy(f)}

        name, weights = fd_cache_key(features_model, reference)
        f2 = cache.features(name, weights, ["penultimate"], compute)["penultimate"].numpy()
    return {"value": frechet_distance_from_features(f1, f2), "layer": layer, "dim": int(f1.shape[1])}


# -- the command's function --------------------------------------------------------------------
def resolve_metrics(metrics: str | Sequence[str] | None, *, have_features: bool,
                    have_weights: bool) -> tuple[list[str], list[str]]:
    """The metrics to compute and notes. Default: IS/FID/KID (+ fd with ``features``); with
    ``features`` and no Inception weights, only fd (with a note) instead of an error. Also
    precision, recall, f_score (torch-fidelity's precision/recall, on VGG16 features)."""
    notes = []
    if metrics is None:
        chosen = list(INCEPTION_METRICS) + (["fd"] if have_features else [])
        if have_features and not have_weights:
            chosen = ["fd"]
            notes.append(f"IS/FID/KID skipped: no Inception weights file given (nor ${WEIGHTS_ENV})")
    else:
        chosen = [m.strip().lower() for m in (metrics.split(",") if isinstance(metrics, str) else metrics) if m.strip()]
        for m in chosen:
            if m not in METRICS:
                raise UsageError(f"unknown metric {m!r}{did_you_mean(m, METRICS)}: choose from {', '.join(METRICS)}")
        if not chosen:
            raise UsageError(f"metrics is empty: choose from {', '.join(METRICS)}", param="metrics")
    if "fd" in chosen and not have_features:
        raise UsageError("metric 'fd' needs features, a checkpoint whose feature space measures the distance",
                         param="features")
    return list(dict.fromkeys(chosen)), notes


def reference_images(spec: str | torch.Tensor | Dataset, split: str, n: int | None,
                     context: RunContext) -> tuple[torch.Tensor, dict[str, Any]]:
    """The reference images (a seeded ``n`` of them) and what they are, for the provenance."""
    if torch.is_tensor(spec):
        return spec, {"dataset": "<tensor>", "n": len(spec)}
    seed = context.seed
    ds = spec if isinstance(spec, Dataset) else load_dataset(spec, split=split, root=context.data_root)
    x, _ = to_arrays(subsample(ds, n, seed, name="ref_n"))
    return x, {"dataset": getattr(ds, "spec", str(spec)), "split": split, "n": len(x), "subsample_seed": seed}


def samples_and_origin(samples: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """The images to score and where they come from: a ``sample`` result, its Samples, a tensor, or
    a file written by :meth:`Samples.save_npz`."""
    if isinstance(samples, Result) and isinstance(samples.extra.get("samples"), Samples):
        samples = samples.extra["samples"]
    if isinstance(samples, Samples):
        return samples.x, {"source": "generated", "generation": samples.settings,
                           "checkpoint": samples.provenance.get("checkpoint"),
                           "dataset": (samples.provenance.get("model") or {}).get("dataset")}
    if torch.is_tensor(samples):
        return samples.detach().cpu(), {"source": "<tensor>"}
    x, prov = load_samples(samples)
    return x, {"source": str(samples), "generation": prov.get("settings"), "checkpoint": prov.get("checkpoint"),
               "dataset": (prov.get("model") or {}).get("dataset")}


def choose_metrics(metrics: str | Sequence[str] | None, *, have_features: bool, inception_weights, vgg16_weights,
                   feature_extractor: str | None) -> tuple[list[str], dict[str, dict[str, Any]], list[str]]:
    """(the metrics, the verified weights of every network they need, notes): refused in one line
    before any image is read (a misspelt metric, a missing or wrong weights file)."""
    paths = {"inception-v3-compat": inception_weights or os.environ.get(WEIGHTS_ENV) or None,
             "vgg16": vgg16_weights or os.environ.get(EXTRACTORS["vgg16"].env) or None}
    chosen, notes = resolve_metrics(metrics, have_features=have_features,
                                    have_weights=bool(paths["inception-v3-compat"]))
    library = [m for m in chosen if m in LIBRARY_METRICS]
    weights = {name: check_extractor_weights(paths[name], name)
               for name in metric_extractors(library, feature_extractor)}
    if weights:
        require_torch_fidelity()
    return chosen, weights, notes


def reference_for(reference: Any, origin: dict[str, Any], chosen: list[str], x: torch.Tensor, split: str,
                  n: int | None, context: RunContext) -> tuple[torch.Tensor | None, dict[str, Any] | None]:
    """The reference images the metrics compare with (None when only ``is`` runs): ``reference``, else
    the dataset the samples' model recorded, if it names no local file."""
    if reference is None and origin.get("dataset"):
        reference = recorded_dataset(str(origin["dataset"]), param="reference")
    if reference is None:
        raise UsageError("no reference dataset: give reference=DATASET (e.g. digits)", param="reference")
    if not any(m != "is" for m in chosen):
        return None, None
    ref_x, ref_info = reference_images(reference, split, n, context)
    if tuple(ref_x.shape[1:]) != tuple(x.shape[1:]):
        raise UsageError(f"reference images are {tuple(ref_x.shape[1:])} but the samples are {tuple(x.shape[1:])}")
    return ref_x, ref_info


def reference_cache(policy: CachePolicy, ref_x: torch.Tensor | None,
                    ref_info: dict | None) -> tuple[ReferenceCache | None, list[str]]:
    """The open reference-features file of the policy (Inception's, VGG16's and each fd model's
    features), used only when the policy reads and writes caches; else None and a note."""
    if policy.reference_features is None or (policy.read and policy.write):
        return open_ref_cache(policy.reference_features, ref_x, ref_info), []
    return None, [f"ref_cache {str(policy.reference_features)!r} left alone: the cache policy neither reads nor "
                  "writes caches; the reference features were computed"]


@takes_context(batch_size=DEFAULT_BATCH_SIZE, cache_keywords=("ref_cache",))
def fidelity(
    samples: Any,
    reference: str | torch.Tensor | Dataset | None = None,
    *,
    features: Sequence[str | os.PathLike | EnergyModel] | str | os.PathLike | EnergyModel | None = None,
    inception_weights: str | os.PathLike | None = None,
    metrics: str | Sequence[str] | None = None,
    ref_split: str = "train",
    ref_n: int | None = None,
    kid_subset_size: int = 1000,
    isc_splits: int = 10,
    feature_extractor: str | None = None,
    vgg16_weights: str | os.PathLike | None = None,
    context: RunContext,
) -> Result:
    """Score generated samples against a reference dataset; one record per (metric, features).

    ``samples``: the result of :func:`jemeval.sample` (or its :class:`~jemeval.artifacts.Samples`),
    an N x C x H x W tensor in [-1, 1], or a ``.npz`` written by ``Samples.save_npz``. ``reference``:
    a dataset spec (default: the generating model's dataset), a Dataset or a tensor. ``features``:
    checkpoint path(s) or EnergyModel(s) for the Frechet distance ``fd``. ``inception_weights``
    defaults to ``$JEMEVAL_INCEPTION_WEIGHTS``, ``vgg16_weights`` (precision/recall) to
    ``$JEMEVAL_VGG16_WEIGHTS``. ``feature_extractor`` (inception-v3-compat or vgg16) moves FID, KID
    and precision/recall onto one network; ``ref_cache`` (.npz, the context's
    ``cache.reference_features``) keeps the reference features for the next run
    (:mod:`jemeval.evaluation.fidelity.extractors`). ``device`` (of the run's
    :class:`~jemeval.context.RunContext`, with ``seed``, ``batch_size`` and ``data_root``) defaults to
    the CPU; with ``cache.memory`` False the verified network weights are not kept once it returns.
    """
    device, seed, batch_size = resolve_device(context.device or "cpu"), context.seed, context.batch(DEFAULT_BATCH_SIZE)
    feature_models = [] if features is None else (list(features) if isinstance(features, (list, tuple)) else [features])
    with weights_kept(context.cache.memory):  # False: no verified weights stay in this process
        chosen, weights, notes = choose_metrics(metrics, have_features=bool(feature_models),
                                                inception_weights=inception_weights, vgg16_weights=vgg16_weights,
                                                feature_extractor=feature_extractor)
        x, origin = samples_and_origin(samples)
        ref_x, ref_info = reference_for(reference, origin, chosen, x, ref_split, ref_n, context)
        settings: dict[str, Any] = {"metrics": chosen, "samples": origin, "n_samples": len(x), "reference": ref_info,
                                    "image_shape": list(x.shape[1:])}
        cache, cache_notes = reference_cache(context.cache, ref_x, ref_info)
        records: list[dict[str, Any]] = []
        library = [m for m in chosen if m in LIBRARY_METRICS]
        if library:
            found, lib = library_metrics(x, ref_x, metrics=library, weights=weights,
                                         feature_extractor=feature_extractor, batch_size=min(batch_size, 64),
                                         device=device, seed=seed, isc_splits=isc_splits,
                                         kid_subset_size=kid_subset_size, ref_info=ref_info, cache=cache)
            records += [{**r, "n_samples": len(x), "n_ref": None if r["metric"] == "is" else len(ref_x)} for r in found]
            settings.update(library_settings(lib, x))
            notes += [n for w in weights.values() for n in inception_notes(x, w)]
        if "fd" in chosen:
            fd, settings["features"], fd_notes = fd_records(feature_models, x, ref_x, origin, batch_size, device, cache)
            records, notes = records + fd, notes + fd_notes
    if cache is not None:
        settings["ref_cache"] = cache.describe()
    notes += cache_notes + (cache.notes if cache is not None else [])
    return Result(records, provenance=provenance(command="fidelity", device=device, seed=seed, settings=settings,
                                                 data=data_hashes([(ref_info or {}).get("dataset")])),
                  extra={"settings": settings}, notes=notes)


def fd_records(feature_models: list, x: torch.Tensor, ref_x: torch.Tensor, origin: dict[str, Any], batch_size: int,
               device: torch.device, cache: ReferenceCache | None) -> tuple[list[dict], list[dict], list[str]]:
    """(records, settings, notes) of the Frechet distance in each feature model's space."""
    records, infos, notes = [], [], []
    for fm in feature_models:
        record, info, note = feature_record(prepare_model(fm, device), x, ref_x, origin, batch_size, cache)
        records.append(record)
        infos.append(info)
        notes += [note] if note else []
    return records, infos, notes


def library_settings(lib: dict[str, Any], x: torch.Tensor) -> dict[str, Any]:
    """The provenance of the torch-fidelity metrics: one entry per network (``inception``, ``vgg16``)
    with its weights, layers, input size and the library's options."""
    common = {k: v for k, v in lib.items() if k not in EXTRACTORS and k != "ref_cache"}
    channels = "gray repeated to RGB" if x.shape[1] == 1 else "RGB"
    out = {("inception" if name == "inception-v3-compat" else name): {**common, **lib[name], "channels": channels}
           for name in EXTRACTORS if name in lib}
    if "ref_cache" in lib:
        out["ref_cache"] = lib["ref_cache"]
    return out


def feature_record(model: EnergyModel, x: torch.Tensor, ref_x: torch.Tensor, origin: dict[str, Any],
                   batch_size: int, cache: ReferenceCache | None = None
                   ) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(record, settings, note or None) of the Frechet distance in ``model``'s feature space."""
    out = features_fd(model, x, ref_x, batch_size, cache)
    ckpt = model.metadata.get("checkpoint") or {}
    label = ckpt.get("path") or f"<{model.arch}>"
    record = {"metric": "fd", "value": out["value"], "std": None, "features": label, "n_samples": len(x),
              "n_ref": len(ref_x)}
    info = {"checkpoint": ckpt or None, "arch": model.arch, "layer": out["layer"], "dim": out["dim"]}
    note = None
    if ckpt.get("sha256") and ckpt.get("sha256") == (origin.get("checkpoint") or {}).get("sha256"):
        note = (f"fd with features of {label}, the model that generated the samples: it judges its own "
                "samples; prefer an independently trained classifier")
    return record, info, note
