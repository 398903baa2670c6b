"""IS, FID, KID and precision/recall by torch-fidelity, on in-memory images, with reference features cached.

torch-fidelity's own feature extractors (InceptionV3, VGG16: :mod:`jemeval.evaluation.fidelity.inception`
verifies their weights) and its metric functions do the work; jemeval only decides what runs where:

* ``is`` on InceptionV3's logits (the metric is defined on them); ``fid`` and ``kid`` on
  InceptionV3's 2048-d pool features; ``precision``, ``recall``, ``f_score`` (Kynkaanniemi et al.
  2019, k = 3 neighbours) on VGG16's fc2 features: torch-fidelity's defaults. ``feature_extractor``
  moves fid, kid and precision/recall onto another network.
* Each network runs once over the samples and once over the reference images, for every metric
  it serves.
* ``ref_cache`` (a ``.npz`` file) keeps the reference features: a later run with the same reference
  images (checked by the SHA-256 of their pixels) and the same weights (by SHA-256) skips the
  forward passes over the reference set, the expensive part for 50,000 CIFAR-10 images. The file
  holds float arrays and a JSON string, read with ``allow_pickle=False`` (torch-fidelity's own cache
  unpickles, so it is never used). A file that holds another reference set is refused, not replaced;
  arrays that do not match their stored SHA-256 are computed again with a note. The same file keeps
  the reference features of ``fidelity(features=M)``'s Frechet distance (:func:`open_ref_cache`).
"""
from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Sequence
from typing import Any

import torch

from jemeval.caches.reference_features import ReferenceCache
from jemeval.errors import CheckpointError, UsageError
from jemeval.evaluation.fidelity.inception import (
    EXTRACTORS,
    INCEPTION,
    Uint8Images,
    extractor,
    require_torch_fidelity,
    verified_weights,
)

LIBRARY_METRICS = ("is", "fid", "kid", "precision", "recall", "f_score")
#: torch-fidelity's metric behind each name, and the extractor it runs on by default
TF_METRIC = {"is": "isc", "fid": "fid", "kid": "kid", "precision": "prc", "recall": "prc", "f_score": "prc"}
DEFAULT_EXTRACTOR = {"isc": INCEPTION, "fid": INCEPTION, "kid": INCEPTION, "prc": "vgg16"}
#: how images reach each network, for the provenance
NETWORK_INPUT = {INCEPTION: [299, 299], "vgg16": [224, 224]}
PRC_NEIGHBORHOOD = 3
KID_SUBSETS = 100


def metric_extractors(metrics: Sequence[str], feature_extractor: str | None = None) -> dict[str, list[str]]:
    """Extractor name -> the jemeval metrics it computes (``is`` always on InceptionV3)."""
    if feature_extractor is not None:
        extractor(feature_extractor)  # refuses unknown ones and those whose weights are code
    groups: dict[str, list[str]] = {}
    for m in metrics:
        tf_metric = TF_METRIC[m]
        name = INCEPTION if tf_metric == "isc" else feature_extractor or DEFAULT_EXTRACTOR[tf_metric]
        groups.setdefault(name, []).append(m)
    return groups


def _layers(name: str, metrics: Sequence[str]) -> dict[str, str]:
    """jemeval metric -> the network's feature layer for it (torch-fidelity's choice)."""
    from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY

    cls = FEATURE_EXTRACTORS_REGISTRY[name]
    return {m: cls.get_default_feature_layer_for_metric(TF_METRIC[m]) for m in metrics}


def _network(name: str, layers: list[str], weights: dict[str, Any], device: torch.device):
    from torch_fidelity.utils import create_feature_extractor

    try:
        return create_feature_extractor(name, layers, cuda=device.type == "cuda", verbose=False,
                                        feature_extractor_weights_path=verified_weights(weights))
    except RuntimeError as exc:  # load_state_dict: keys or shapes not the network's
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
        detail = next((ln for ln in lines if ln.startswith(("Missing key", "Unexpected key", "size mismatch"))),
                      lines[0])
        detail = detail[:160] + ("..." if len(detail) > 160 else "")
        e = extractor(name)
        raise CheckpointError(f"torch-fidelity could not use the {e.title} weights {weights['path']!r} "
                              f"({detail}); expected {e.file}") from None


def _features(network, images: torch.Tensor, batch_size: int, device: torch.device) -> dict[str, torch.Tensor]:
    from torch_fidelity.utils import get_featuresdict_from_dataset

    return get_featuresdict_from_dataset(Uint8Images(images), network, batch_size, device.type == "cuda",
                                         save_cpu_ram=True, verbose=False)


def _values(metrics: Sequence[str], layers: dict[str, str], f1: dict, f2: dict | None,
            options: dict[str, Any]) -> dict[str, tuple[float, float | None]]:
    """{metric: (value, std or None)} from the two feature sets, by torch-fidelity's metric functions."""
    from torch_fidelity.metric_fid import fid_featuresdict_to_statistics, fid_statistics_to_metric
    from torch_fidelity.metric_isc import isc_featuresdict_to_metric
    from torch_fidelity.metric_kid import kid_featuresdict_to_metric
    from torch_fidelity.metric_prc import prc_featuresdict_to_metric

    out: dict[str, tuple[float, float | None]] = {}
    for m in metrics:
        layer = layers[m]
        if m == "is":
            r = isc_featuresdict_to_metric(f1, layer, **options)
            out[m] = (r["inception_score_mean"], r["inception_score_std"])
        elif m == "fid":
            stats = [fid_featuresdict_to_statistics(f, layer) for f in (f1, f2)]
            out[m] = (fid_statistics_to_metric(*stats, verbose=False)["frechet_inception_distance"], None)
        elif m == "kid":
            r = kid_featuresdict_to_metric(f1, f2, layer, **options)
            out[m] = (r["kernel_inception_distance_mean"], r["kernel_inception_distance_std"])
        else:
            key = "prc" + layer
            if key not in out:  # precision, recall and f_score come from one computation
                r = prc_featuresdict_to_metric(f1, f2, layer, **options)
                out[key] = (r["precision"], r["recall"], r["f_score"])  # type: ignore[assignment]
            out[m] = (out[key][("precision", "recall", "f_score").index(m)], None)
    return {m: out[m] for m in metrics}


def check_counts(metrics: Sequence[str], n_samples: int, n_ref: int | None) -> None:
    """Refuse sample counts the metrics cannot use (one line)."""
    two = [m for m in metrics if m in ("is", "fid", "kid")]
    if two and (n_samples < 2 or (any(m != "is" for m in two) and (n_ref or 0) < 2)):
        raise UsageError("IS/FID/KID need at least 2 samples and 2 reference images")
    prc = [m for m in metrics if TF_METRIC[m] == "prc"]
    if prc and min(n_samples, n_ref or 0) <= PRC_NEIGHBORHOOD:
        raise UsageError(f"precision/recall need more than {PRC_NEIGHBORHOOD} samples and reference images (k = "
                         f"{PRC_NEIGHBORHOOD} nearest neighbours), got {n_samples} and {n_ref}")


def library_metrics(samples: torch.Tensor, reference: torch.Tensor | None, *, metrics: Sequence[str],
                    weights: dict[str, dict[str, Any]], feature_extractor: str | None = None, batch_size: int = 64,
                    device: torch.device | str = "cpu", seed: int = 0, isc_splits: int = 10,
                    kid_subset_size: int = 1000, ref_cache: str | os.PathLike | None = None,
                    ref_info: dict | None = None,
                    cache: ReferenceCache | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One record per metric (``metric``, ``value``, ``std``, ``features``) and the settings used.

    ``weights``: extractor name -> the identity :func:`~jemeval.evaluation.fidelity.inception.check_extractor_weights`
    returned for its file (every extractor the metrics need). The reference features come from
    ``cache`` (an open :class:`ReferenceCache`), or the file ``ref_cache``, when given.
    """
    tf = require_torch_fidelity()
    device = torch.device(device)
    n1, n2 = len(samples), None if reference is None else len(reference)
    check_counts(metrics, n1, n2)
    options = {"isc_splits": max(1, min(isc_splits, n1)), "samples_shuffle": True, "rng_seed": seed,
               "kid_subsets": KID_SUBSETS, "kid_subset_size": min(kid_subset_size, n1, n2 or n1),
               "prc_neighborhood": PRC_NEIGHBORHOOD, "save_cpu_ram": True, "verbose": False}
    if cache is None:
        cache = open_ref_cache(ref_cache, reference, ref_info)
    records, settings = [], {"torch_fidelity_version": getattr(tf, "__version__", None), **options}
    for name, wanted in metric_extractors(metrics, feature_extractor).items():
        layers = _layers(name, wanted)
        network = _network(name, sorted(set(layers.values())), weights[name], device)
        f1 = _features(network, samples, batch_size, device)
        f2 = None
        if any(m != "is" for m in wanted):
            needed = sorted({layers[m] for m in wanted if m != "is"})
            compute = functools.partial(_features, network, reference, batch_size, device)
            f2 = cache.features(name, weights[name], needed, compute) if cache else compute()
        for m, (value, std) in _values(wanted, layers, f1, f2, options).items():
            records.append({"metric": m, "value": value, "std": std, "features": name})
        settings[name] = {"weights": weights[name], "metrics": list(wanted), "layers": layers,
                          "resized_to": NETWORK_INPUT.get(name)}
    if cache is not None:
        settings["ref_cache"] = cache.describe()
    order = {m: i for i, m in enumerate(metrics)}
    return sorted(records, key=lambda r: order[r["metric"]]), settings


def open_ref_cache(ref_cache: str | os.PathLike | None, reference: torch.Tensor | None,
                   ref_info: dict | None = None) -> ReferenceCache | None:
    """The reference-features file ``ref_cache`` of these reference images (None without either)."""
    if ref_cache is None or reference is None:
        return None
    return ReferenceCache(ref_cache, reference_identity(reference), ref_info)


def reference_identity(images: torch.Tensor) -> dict[str, Any]:
    """What makes a reference set the same one: the SHA-256 of the uint8 RGB pixels the networks see, and the shape."""
    return {"pixels_sha256": hashlib.sha256(Uint8Images(images).x.numpy().tobytes()).hexdigest(),
            "shape": list(images.shape)}


__all__ = ["EXTRACTORS", "LIBRARY_METRICS", "library_metrics", "metric_extractors", "open_ref_cache"]
