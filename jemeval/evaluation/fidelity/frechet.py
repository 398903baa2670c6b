"""The Frechet distance between two feature sets (the F of FID), in plain numpy, robust to the features'
scale: :func:`frechet_distance` of Gaussian statistics, :func:`frechet_distance_from_features` of N x D
features. Non-finite features or statistics are refused in one line (before, numpy's eigendecomposition
of a NaN covariance ended in "unexpected LinAlgError: Eigenvalues did not converge"), and both divide by
a common scale first: the distance is homogeneous of degree 2, so huge features no longer overflow.
tests/test_fidelity.py checks the numbers against scipy's matrix square root and torch-fidelity's own.
"""
from __future__ import annotations

import numpy as np
import torch

from jemeval.errors import JemevalError, UsageError


def feature_statistics(features: np.ndarray | torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (unbiased, float64) of N x D features."""
    return _statistics(_finite_features(features))


def _statistics(f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return f.mean(axis=0), np.atleast_2d(np.cov(f, rowvar=False))


def _finite_features(features: np.ndarray | torch.Tensor) -> np.ndarray:
    """N x D float64 features, at least two, every value finite (else one line saying so: a covariance of
    NaN or inf made numpy's eigendecomposition fail with "Eigenvalues did not converge")."""
    f = np.asarray(features.detach().cpu() if torch.is_tensor(features) else features, dtype=np.float64)
    if f.ndim != 2 or len(f) < 2:
        raise UsageError(f"need at least 2 feature vectors (N x D) for a Frechet distance, got shape {f.shape}")
    if not np.isfinite(f).all():
        rows = np.flatnonzero(~np.isfinite(f).all(axis=1))
        raise JemevalError(f"{len(rows)} of {len(f)} feature vectors hold NaN or inf (the first: row {rows[0]}); a "
                           "Frechet distance needs finite features: use a feature network whose outputs are finite")
    return f


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^(1/2)) between two Gaussians.

    Tr (S1 S2)^(1/2) is computed as Tr (S1^(1/2) S2 S1^(1/2))^(1/2), a symmetric PSD matrix, with
    symmetric eigendecompositions: stable for the singular covariances that few samples in many
    dimensions give, and never complex. Rounding below zero is clipped (the distance is >= 0).
    The statistics are divided by a common scale c first (means by c, covariances by c^2, c the
    largest of |mu| and sqrt|S|) and the distance multiplied by c^2 after: the distance is
    homogeneous of degree 2, and huge features (1e150) no longer overflow the matrix products.
    """
    mu1, mu2 = np.atleast_1d(np.asarray(mu1, np.float64)), np.atleast_1d(np.asarray(mu2, np.float64))
    s1, s2 = np.atleast_2d(np.asarray(sigma1, np.float64)), np.atleast_2d(np.asarray(sigma2, np.float64))
    if mu1.shape != mu2.shape or s1.shape != s2.shape or s1.shape != (mu1.size, mu1.size):
        raise ValueError(f"mismatched Gaussian statistics: means {mu1.shape}, {mu2.shape}; "
                         f"covariances {s1.shape}, {s2.shape}")
    if not all(np.isfinite(a).all() for a in (mu1, mu2, s1, s2)):
        raise JemevalError("the Gaussian statistics of a Frechet distance hold NaN or inf (features too large for "
                           "float64, or non-finite): use features whose mean and covariance are finite")
    c = max(np.abs(mu1).max(), np.abs(mu2).max(), np.sqrt(np.abs(s1).max()), np.sqrt(np.abs(s2).max()))
    c = float(c) if c > 0 else 1.0
    distance = _unit_frechet(mu1 / c, s1 / c / c, mu2 / c, s2 / c / c) * c * c
    if not np.isfinite(distance):
        raise JemevalError(f"the Frechet distance exceeds float64's range (features of scale {c:.3g}); rescale "
                           "the features")
    return distance


def _unit_frechet(mu1: np.ndarray, s1: np.ndarray, mu2: np.ndarray, s2: np.ndarray) -> float:
    """The distance of :func:`frechet_distance` for statistics of scale about 1."""
    try:
        w, v = np.linalg.eigh((s1 + s1.T) / 2)
        s1_half = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
        middle = s1_half @ s2 @ s1_half
        tr_covmean = np.sqrt(np.clip(np.linalg.eigvalsh((middle + middle.T) / 2), 0, None)).sum()
    except np.linalg.LinAlgError as exc:
        raise JemevalError(f"the covariance of the features cannot be square-rooted ({exc}): a Frechet distance "
                           "needs well-conditioned features; use another feature network or more samples") from None
    diff = mu1 - mu2
    return max(float(diff @ diff + np.trace(s1) + np.trace(s2) - 2.0 * tr_covmean), 0.0)


#: features beyond this size are divided by their largest absolute value before their covariance (whose
#: products of two features, summed over N images, would overflow float64 near 1e154)
_SAFE_SCALE = 1e100


def frechet_distance_from_features(f1: np.ndarray | torch.Tensor, f2: np.ndarray | torch.Tensor) -> float:
    """The Frechet distance of two feature sets (N x D each). Features larger than 1e100 (or all below
    1e-100) are divided by their largest absolute value first and the distance multiplied back."""
    a, b = _finite_features(f1), _finite_features(f2)
    scale = max(float(np.abs(a).max()), float(np.abs(b).max()))
    scale = scale if scale > _SAFE_SCALE or 0 < scale < 1 / _SAFE_SCALE else 1.0
    if scale != 1.0:
        a, b = a / scale, b / scale
    distance = frechet_distance(*_statistics(a), *_statistics(b)) * scale * scale
    if not np.isfinite(distance):
        raise JemevalError(f"the Frechet distance exceeds float64's range (features up to {scale:.3g}); rescale "
                           "the features")
    return distance
