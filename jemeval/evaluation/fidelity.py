"""Sample quality: Frechet distances in any model's feature space, and IS / FID / KID.

Two families of numbers, because the published ones cannot be reproduced everywhere:

* **Inception Score, FID and KID** through torch-fidelity (``pip install 'jemeval[fidelity]'``)
  with its TF1-compatible InceptionV3. jemeval never downloads the Inception weights: pass the
  file (``--inception-weights``, or ``$JEMEVAL_INCEPTION_WEIGHTS``). The file is read once, loaded
  with ``weights_only=True`` and checked, so a wrong or unsafe file is one clear error; the library
  gets an in-memory copy of those verified tensors, never the path (it would re-open the file with
  full pickle, and the file could have been swapped in the meantime). Images are
  mapped from [-1, 1] to uint8 RGB (gray channels repeated) and resized to 299 x 299 by the
  library; on 8 x 8 digits these numbers say little, which is recorded as a note.
* **A Frechet distance in the feature space of any jemeval checkpoint** (``--features PATH``):
  the input of the network's final Linear layer (its penultimate features). It works offline and
  on small images such as digits, and :func:`frechet_distance` is plain numpy.

Which samples were scored (fresh chains or replay buffer, steps, the top-confident filter) is
part of every result: published IS/FID depend on it (the JEM paper's evaluation, docs/reproducing.md).
"""
from __future__ import annotations

import hashlib
import io
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from jemeval.energy.model import EnergyModel
from jemeval.errors import CheckpointError, JemevalError, UsageError, did_you_mean
from jemeval.results import Result
from jemeval.runtime.devices import resolve_device

INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"
INCEPTION_URL = f"https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/{INCEPTION_FILE}"
INCEPTION_SHA256_PREFIX = "6726825d"  # torch.hub convention: the file name carries its hash prefix
WEIGHTS_ENV = "JEMEVAL_INCEPTION_WEIGHTS"
INCEPTION_METRICS = ("is", "fid", "kid")
METRICS = (*INCEPTION_METRICS, "fd")
_INCEPTION_KEYS = {"Conv2d_1a_3x3.conv.weight": (32, 3, 3, 3), "fc.weight": (1008, 2048)}


# -- Frechet distance --------------------------------------------------------------------------
def feature_statistics(features: np.ndarray | torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (unbiased, float64) of N x D features."""
    f = np.asarray(features.detach().cpu() if torch.is_tensor(features) else features, dtype=np.float64)
    if f.ndim != 2 or len(f) < 2:
        raise UsageError(f"need at least 2 feature vectors (N x D) for a Frechet distance, got shape {f.shape}")
    return f.mean(axis=0), np.atleast_2d(np.cov(f, rowvar=False))


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^(1/2)) between two Gaussians.

    Tr (S1 S2)^(1/2) is computed as Tr (S1^(1/2) S2 S1^(1/2))^(1/2), a symmetric PSD matrix, with
    symmetric eigendecompositions: stable for the singular covariances that few samples in many
    dimensions give, and never complex. Rounding below zero is clipped (the distance is >= 0).
    """
    mu1, mu2 = np.atleast_1d(np.asarray(mu1, np.float64)), np.atleast_1d(np.asarray(mu2, np.float64))
    s1, s2 = np.atleast_2d(np.asarray(sigma1, np.float64)), np.atleast_2d(np.asarray(sigma2, np.float64))
    if mu1.shape != mu2.shape or s1.shape != s2.shape or s1.shape != (mu1.size, mu1.size):
        raise ValueError(f"mismatched Gaussian statistics: means {mu1.shape}, {mu2.shape}; covariances {s1.shape}, {s2.shape}")
    w, v = np.linalg.eigh((s1 + s1.T) / 2)
    s1_half = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    middle = s1_half @ s2 @ s1_half
    tr_covmean = np.sqrt(np.clip(np.linalg.eigvalsh((middle + middle.T) / 2), 0, None)).sum()
    diff = mu1 - mu2
    return max(float(diff @ diff + np.trace(s1) + np.trace(s2) - 2.0 * tr_covmean), 0.0)


def frechet_distance_from_features(f1: np.ndarray | torch.Tensor, f2: np.ndarray | torch.Tensor) -> float:
    return frechet_distance(*feature_statistics(f1), *feature_statistics(f2))


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


def features_fd(features_model: EnergyModel, samples: torch.Tensor, reference: torch.Tensor,
                batch_size: int = 256) -> dict[str, Any]:
    if tuple(samples.shape[1:]) != tuple(features_model.input_shape):
        raise UsageError(f"--features model takes {tuple(features_model.input_shape)} images but the samples are "
                         f"{tuple(samples.shape[1:])}; use a checkpoint trained on the same kind of images")
    f1, layer = extract_features(features_model, samples, batch_size)
    f2, _ = extract_features(features_model, reference, batch_size)
    return {"value": frechet_distance_from_features(f1, f2), "layer": layer, "dim": int(f1.shape[1])}


# -- IS / FID / KID through torch-fidelity -----------------------------------------------------
def missing_weights_message() -> str:
    return (f"IS/FID/KID need torch-fidelity's InceptionV3 weights, which jemeval never downloads: get "
            f"{INCEPTION_FILE} ({INCEPTION_URL}, or ~/.cache/torch/hub/checkpoints/ where torch-fidelity has run) "
            f"and pass --inception-weights FILE or set {WEIGHTS_ENV}; --features CHECKPOINT gives an offline Frechet distance")


def require_torch_fidelity():
    try:
        import torch_fidelity
    except ImportError:
        raise JemevalError("IS/FID/KID need torch-fidelity: pip install 'jemeval[fidelity]' (or pip install torch-fidelity); "
                           "--features CHECKPOINT works without it") from None
    return torch_fidelity


#: the last weights file validated in this process, by (path, size, mtime): its identity and the
#: tensors read from it. Only these tensors ever reach torch-fidelity; the file is not opened again.
_VERIFIED: dict[tuple[str, int, float], tuple[dict[str, Any], dict[str, torch.Tensor]]] = {}


def check_inception_weights(path: str | os.PathLike | None) -> dict[str, Any]:
    """Read an Inception weights file once, validate it, and keep its tensors; returns its identity.

    The bytes are read into memory once, hashed, and loaded with ``weights_only=True``; what
    torch-fidelity later gets is an in-memory copy of these verified tensors
    (:func:`verified_weights`), never the user's path. torch-fidelity itself loads with
    ``weights_only=False``, so a file swapped after this check (same size and mtime) must not be
    what it opens.
    """
    if not path:
        raise UsageError(missing_weights_message())
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"--inception-weights {str(p)!r} does not exist; " + missing_weights_message().split(": ", 1)[1])
    stat = p.stat()
    key = (str(p.resolve()), stat.st_size, stat.st_mtime)
    if key in _VERIFIED:  # the CLI checks before sampling; fidelity() must not reload ~95 MB
        return dict(_VERIFIED[key][0])
    data = p.read_bytes()
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch.load fails in many ways; each becomes one line
        first = ": ".join(filter(None, [type(exc).__name__, (str(exc).strip().splitlines() or [""])[0][:160]]))
        raise CheckpointError(f"--inception-weights {str(p)!r} is not a tensor-only PyTorch weights file ({first}); "
                              f"expected torch-fidelity's {INCEPTION_FILE}") from None
    problems = [k for k, shape in _INCEPTION_KEYS.items()
                if not (isinstance(state, dict) and torch.is_tensor(state.get(k)) and tuple(state[k].shape) == shape)]
    if problems:
        raise CheckpointError(f"--inception-weights {str(p)!r} is not torch-fidelity's InceptionV3 (no {problems[0]!r} "
                              f"of shape {list(_INCEPTION_KEYS[problems[0]])}); expected {INCEPTION_FILE}")
    sha = hashlib.sha256(data).hexdigest()
    identity = {"path": str(p), "sha256": sha, "is_release_file": sha.startswith(INCEPTION_SHA256_PREFIX)}
    tensors = OrderedDict((k, v) for k, v in state.items() if isinstance(k, str) and torch.is_tensor(v))
    if isinstance(getattr(state, "_metadata", None), dict):  # module versions: load_state_dict reads them
        tensors._metadata = state._metadata
    _VERIFIED.clear()  # one ~95 MB state at a time
    _VERIFIED[key] = (identity, tensors)
    return dict(identity)


def verified_weights(weights: dict[str, Any]) -> io.BytesIO:
    """An in-memory file of the tensors :func:`check_inception_weights` verified for ``weights``.

    Written by ``torch.save`` from plain tensors here, so torch-fidelity's ``torch.load(...,
    weights_only=False)`` unpickles only what jemeval wrote: nothing on disk can be swapped in.
    """
    state = next((tensors for identity, tensors in _VERIFIED.values() if identity["sha256"] == weights.get("sha256")), None)
    if state is None:  # identity from an earlier check whose tensors were dropped: verify again
        again = check_inception_weights(weights.get("path"))
        if again["sha256"] != weights.get("sha256"):
            raise CheckpointError(f"--inception-weights {weights.get('path')!r} changed since it was checked "
                                  f"(sha256 {str(weights.get('sha256'))[:12]}... -> {again['sha256'][:12]}...); run again")
        return verified_weights(again)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def to_uint8_rgb(x: torch.Tensor) -> torch.Tensor:
    """[-1, 1] images -> uint8 RGB (gray repeated to 3 channels), what torch-fidelity expects."""
    u8 = ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    if u8.shape[1] == 1:
        u8 = u8.expand(-1, 3, -1, -1)
    if u8.shape[1] != 3:
        raise UsageError(f"IS/FID/KID need 1- or 3-channel images, got {u8.shape[1]} channels")
    return u8.contiguous()


class Uint8Images(Dataset):
    """An in-memory uint8 image tensor as the Dataset torch-fidelity reads (no files, no cache)."""

    def __init__(self, x: torch.Tensor):
        self.x = to_uint8_rgb(x)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i]


def inception_metrics(samples: torch.Tensor, reference: torch.Tensor | None, weights: dict[str, Any], *,
                      metrics: Sequence[str] = INCEPTION_METRICS, batch_size: int = 64,
                      device: torch.device | str = "cpu", seed: int = 0, isc_splits: int = 10,
                      kid_subset_size: int = 1000) -> tuple[dict[str, tuple[float, float | None]], dict[str, Any]]:
    """{metric: (value, std or None)} and the library settings used, via torch_fidelity.calculate_metrics.

    Nothing is cached, nothing is downloaded: inputs are in-memory Datasets and the weights file
    is given (checked by :func:`check_inception_weights`).
    """
    tf = require_torch_fidelity()
    binary = [m for m in metrics if m in ("fid", "kid")]
    n1, n2 = len(samples), (len(reference) if reference is not None else None)
    if n1 < 2 or (binary and (n2 or 0) < 2):
        raise UsageError("IS/FID/KID need at least 2 samples and 2 reference images")
    opts = {
        "feature_extractor": "inception-v3-compat",
        "isc": "is" in metrics, "fid": "fid" in metrics, "kid": "kid" in metrics,
        "isc_splits": max(1, min(isc_splits, n1)), "kid_subset_size": min(kid_subset_size, n1, n2 or n1),
        "batch_size": batch_size, "rng_seed": seed,
    }
    try:
        out = tf.calculate_metrics(
            input1=Uint8Images(samples), input2=Uint8Images(reference) if binary else None,
            cuda=torch.device(device).type == "cuda", cache=False, verbose=False, save_cpu_ram=True,
            datasets_download=False, feature_extractor_weights_path=verified_weights(weights), **opts,
        )
    except RuntimeError as exc:  # e.g. load_state_dict: keys or shapes not InceptionV3's
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [type(exc).__name__]
        detail = next((ln for ln in lines if ln.startswith(("Missing key", "Unexpected key", "size mismatch"))), lines[0])
        raise CheckpointError(f"torch-fidelity could not use --inception-weights {weights['path']!r} "
                              f"({detail[:160]}{'...' if len(detail) > 160 else ''}); expected {INCEPTION_FILE}") from None
    except ValueError as exc:  # torch-fidelity's argument checks
        raise UsageError(f"torch-fidelity rejected the settings: {str(exc).splitlines()[0][:200]}") from None
    values = {
        "is": (out.get("inception_score_mean"), out.get("inception_score_std")),
        "fid": (out.get("frechet_inception_distance"), None),
        "kid": (out.get("kernel_inception_distance_mean"), out.get("kernel_inception_distance_std")),
    }
    return {m: values[m] for m in metrics}, {**opts, "torch_fidelity_version": getattr(tf, "__version__", None)}


# -- the command's function --------------------------------------------------------------------
def resolve_metrics(metrics: str | Sequence[str] | None, *, have_features: bool, have_weights: bool) -> tuple[list[str], list[str]]:
    """The metrics to compute and notes. Default: IS/FID/KID (+ fd with --features); with
    --features and no Inception weights, only fd (with a note) instead of an error."""
    notes = []
    if metrics is None:
        chosen = list(INCEPTION_METRICS) + (["fd"] if have_features else [])
        if have_features and not have_weights:
            chosen = ["fd"]
            notes.append("IS/FID/KID skipped: no Inception weights (--inception-weights FILE or $" + WEIGHTS_ENV + ")")
    else:
        chosen = [m.strip().lower() for m in (metrics.split(",") if isinstance(metrics, str) else metrics) if m.strip()]
        for m in chosen:
            if m not in METRICS:
                raise UsageError(f"unknown metric {m!r}{did_you_mean(m, METRICS)}: choose from {', '.join(METRICS)}")
        if not chosen:
            raise UsageError(f"--metrics is empty: choose from {', '.join(METRICS)}")
    if "fd" in chosen and not have_features:
        raise UsageError("metric 'fd' needs --features CHECKPOINT (the model whose feature space measures the distance)")
    return list(dict.fromkeys(chosen)), notes


def reference_images(spec: str | torch.Tensor | Dataset, split: str, n: int | None, seed: int,
                     data_root: str | None) -> tuple[torch.Tensor, dict[str, Any]]:
    from jemeval.data import load_dataset, subsample, to_arrays

    if torch.is_tensor(spec):
        return spec, {"dataset": "<tensor>", "n": len(spec)}
    ds = spec if isinstance(spec, Dataset) else load_dataset(spec, split=split, root=data_root)
    x, _ = to_arrays(subsample(ds, n, seed, name="ref_n"))
    return x, {"dataset": getattr(ds, "spec", str(spec)), "split": split, "n": len(x), "subsample_seed": seed}


def fidelity(
    samples: Any,
    reference: str | torch.Tensor | Dataset | None = None,
    *,
    features: Sequence[str | os.PathLike | EnergyModel] | str | os.PathLike | EnergyModel | None = None,
    inception_weights: str | os.PathLike | None = None,
    metrics: str | Sequence[str] | None = None,
    ref_split: str = "train",
    ref_n: int | None = None,
    data_root: str | None = None,
    batch_size: int = 256,
    device: str | torch.device | None = None,
    seed: int = 0,
    kid_subset_size: int = 1000,
    isc_splits: int = 10,
) -> Result:
    """Score generated samples against a reference dataset; one record per (metric, features).

    ``samples``: a :class:`~jemeval.evaluation.generation.Samples`, an N x C x H x W tensor in
    [-1, 1], or a ``.npz`` written by ``jemeval sample --save``. ``reference``: a dataset spec
    (default: the generating model's dataset), a Dataset or a tensor. ``features``: checkpoint
    path(s) or EnergyModel(s) for the Frechet distance ``fd``. ``inception_weights`` defaults to
    ``$JEMEVAL_INCEPTION_WEIGHTS``.
    """
    from jemeval.evaluation.batching import prepare_model
    from jemeval.evaluation.generation import Samples, load_samples
    from jemeval.provenance import provenance

    device = resolve_device(device or "cpu")
    inception_weights = inception_weights or os.environ.get(WEIGHTS_ENV) or None
    feature_models = [] if features is None else (list(features) if isinstance(features, (list, tuple)) else [features])
    chosen, notes = resolve_metrics(metrics, have_features=bool(feature_models), have_weights=bool(inception_weights))

    # which samples, and how they were made
    if isinstance(samples, Samples):
        x, origin = samples.x, {"source": "generated", "generation": samples.settings,
                               "checkpoint": samples.result.provenance.get("checkpoint"),
                               "dataset": (samples.result.provenance.get("model") or {}).get("dataset")}
    elif torch.is_tensor(samples):
        x, origin = samples.detach().cpu(), {"source": "<tensor>"}
    else:
        x, prov = load_samples(samples)
        origin = {"source": str(samples), "generation": prov.get("settings"), "checkpoint": prov.get("checkpoint"),
                  "dataset": (prov.get("model") or {}).get("dataset")}
    reference = reference if reference is not None else origin.get("dataset")
    if reference is None:
        raise UsageError("no reference dataset: pass --ref DATASET (e.g. digits)")

    weights = check_inception_weights(inception_weights) if set(chosen) & set(INCEPTION_METRICS) else None
    if weights is not None:
        require_torch_fidelity()
    need_ref = any(m != "is" for m in chosen)
    ref_x, ref_info = reference_images(reference, ref_split, ref_n, seed, data_root) if need_ref else (None, None)
    if ref_x is not None and tuple(ref_x.shape[1:]) != tuple(x.shape[1:]):
        raise UsageError(f"reference images are {tuple(ref_x.shape[1:])} but the samples are {tuple(x.shape[1:])}")

    records: list[dict[str, Any]] = []
    settings: dict[str, Any] = {"metrics": chosen, "samples": origin, "n_samples": len(x), "reference": ref_info,
                                "image_shape": list(x.shape[1:])}
    if weights is not None:
        wanted = [m for m in chosen if m in INCEPTION_METRICS]
        values, lib = inception_metrics(x, ref_x, weights, metrics=wanted, batch_size=min(batch_size, 64),
                                        device=device, seed=seed, isc_splits=isc_splits, kid_subset_size=kid_subset_size)
        for m in wanted:
            value, std = values[m]
            records.append({"metric": m, "value": value, "std": std, "features": "inception-v3-compat",
                            "n_samples": len(x), "n_ref": None if m == "is" else len(ref_x)})
        settings["inception"] = {"weights": weights, **lib, "resized_to": [299, 299], "channels": "gray repeated to RGB"
                                 if x.shape[1] == 1 else "RGB"}
        if min(x.shape[2:]) < 32:
            notes.append(f"Inception metrics on {x.shape[2]}x{x.shape[3]} images upsampled to 299x299 say little; "
                         "compare the 'fd' values of a model trained on these images")
        if not weights["is_release_file"]:
            notes.append("the Inception weights are not torch-fidelity's release file (sha256 differs): "
                         "IS/FID/KID are not comparable with published numbers")
    if "fd" in chosen:
        settings["features"] = []
        for fm in feature_models:
            model = prepare_model(fm, device)
            out = features_fd(model, x, ref_x, batch_size)
            ckpt = model.metadata.get("checkpoint") or {}
            label = ckpt.get("path") or f"<{model.arch}>"
            records.append({"metric": "fd", "value": out["value"], "std": None, "features": label,
                            "n_samples": len(x), "n_ref": len(ref_x)})
            settings["features"].append({"checkpoint": ckpt or None, "arch": model.arch, "layer": out["layer"],
                                         "dim": out["dim"]})
            if ckpt.get("sha256") and ckpt.get("sha256") == (origin.get("checkpoint") or {}).get("sha256"):
                notes.append(f"fd with features of {label}, the model that generated the samples: it judges its own "
                             "samples; prefer an independently trained classifier")
    return Result(records, provenance=provenance(command="fidelity", device=device, seed=seed, settings=settings),
                  extra={"settings": settings}, notes=notes)
