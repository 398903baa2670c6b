"""Figures of merit computed from one run's per-input outcomes, in the three forms an analysis of
seed groups reads (:mod:`jemeval.evaluation.mrmc`).

A test that treats inputs as random needs each run's figure of merit (FOM) three ways: on the
inputs (``value``), without each input in turn (``leave_one_out``, the jackknife) and on resampled
inputs (``resampled``: a resample is a row of multiplicity counts, so a bootstrap of 2000 resamples
is a matrix product, not 2000 calls). Each class below holds one run's outcomes and computes each
form once (``replicates`` is kept per number of resamples and seed), so a report comparing many
models reads every run's pieces once, whatever the number of pairs.

Every form is exact, not an approximation: ``value`` equals :mod:`jemeval.evaluation.metrics`;
``leave_one_out`` and ``resampled`` equal ``value`` on the reduced or repeated inputs (tested).

* :class:`AUROC` and :class:`FPR95`: ``(labels, scores)``, labels 1 = in-distribution (positive);
  resamples are drawn within each class (the numbers of in-distribution and OOD inputs are fixed by
  the design, as in DeLong's test);
* :class:`Accuracy`: ``(correct,)``; :class:`NLL` and :class:`ECE`: ``(probs, labels)``.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from jemeval.errors import UsageError
from jemeval.evaluation.metrics import DEFAULT_BINS, bin_edges
from jemeval.evaluation.placements import binary_labels, finite, placements


class Outcomes:
    """One run's per-input outcomes for one figure of merit (subclasses define the FOM)."""

    name: ClassVar[str] = ""
    #: whether the first array is ID/OOD labels: resamples then keep each class's size
    labelled: ClassVar[bool] = False
    #: "delong" where DeLong's structural components give the covariance directly
    covariances: ClassVar[tuple[str, ...]] = ("jackknife", "bootstrap")

    def __init__(self, *arrays) -> None:
        self.arrays = arrays
        self._replicates: dict[tuple[int, int], np.ndarray] = {}

    @property
    def n(self) -> int:
        return len(self.arrays[0])

    @property
    def strata(self) -> np.ndarray | None:
        """Per input, the group a bootstrap resamples within (None: all inputs together)."""
        return self.arrays[0] if self.labelled else None

    def value(self) -> float:
        raise NotImplementedError

    def leave_one_out(self) -> np.ndarray:
        raise NotImplementedError

    def resampled(self, counts: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def replicates(self, n_boot: int, seed: int) -> np.ndarray:
        """The FOM on each of the resamples :func:`bootstrap_counts` draws (kept: computed once)."""
        key = (int(n_boot), int(seed))
        if key not in self._replicates:
            self._replicates[key] = np.concatenate([self.resampled(c) for c in bootstrap_counts(
                self.n, self.strata, n_boot, seed)])
        return self._replicates[key]


def bootstrap_counts(n: int, strata: np.ndarray | None, n_boot: int, seed: int, chunk: int = 250):
    """Multiplicity counts of ``n_boot`` resamples of n inputs, ``chunk`` rows at a time, drawn by
    ``numpy.random.default_rng(seed)``: within each stratum (e.g. ID and OOD) its own size with
    replacement. The draws depend on (n, strata, n_boot, seed) only, so every run of every model
    on the same inputs is resampled the same way: the resamples are paired."""
    rng = np.random.default_rng(seed)
    groups = [np.arange(n)] if strata is None else [np.flatnonzero(strata == s) for s in np.unique(strata)]
    for start in range(0, int(n_boot), chunk):
        rows = min(chunk, int(n_boot) - start)
        counts = np.zeros((rows, n), dtype=np.float64)
        for index in groups:
            counts[:, index] = rng.multinomial(len(index), np.full(len(index), 1.0 / len(index)), size=rows)
        yield counts


class _MeanOfInputs(Outcomes):
    """A FOM that is the mean of a per-input quantity ``self.per_input``."""

    per_input: np.ndarray

    def value(self) -> float:
        return float(np.mean(self.per_input))

    def leave_one_out(self) -> np.ndarray:
        return (self.per_input.sum() - self.per_input) / (self.n - 1)

    def resampled(self, counts: np.ndarray) -> np.ndarray:
        return counts @ self.per_input / self.n


class Accuracy(_MeanOfInputs):
    """Accuracy (or robust accuracy) from per-input correct/incorrect outcomes ``(correct,)``."""

    name = "accuracy"

    def __init__(self, correct) -> None:
        correct = np.asarray(correct).reshape(-1)
        if correct.dtype != bool and not np.isin(correct, (0, 1)).all():
            raise UsageError("correct must hold booleans or 0/1 (one per input)", param="correct")
        super().__init__(correct.astype(bool))
        self.per_input = correct.astype(np.float64)


def _probs_labels(probs, labels) -> tuple[np.ndarray, np.ndarray]:
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    if probs.ndim != 2 or len(probs) != len(labels):
        raise UsageError(f"probs must be inputs x classes and labels one per input, got {probs.shape} and "
                         f"{labels.shape}", param="probs")
    return probs, labels


class NLL(_MeanOfInputs):
    """Mean negative log-likelihood of the true labels, ``(probs, labels)`` (metrics.nll)."""

    name = "nll"

    def __init__(self, probs, labels) -> None:
        probs, labels = _probs_labels(probs, labels)
        super().__init__(labels, probs)
        p = probs[np.arange(len(labels)), labels]
        self.per_input = -np.log(np.maximum(p, np.finfo(np.float64).tiny))


class ECE(Outcomes):
    """Expected calibration error over equal-width bins of the max probability, ``(probs, labels)``
    (metrics.ece). With d_i = correct_i - confidence_i and D_b the sum of d over bin b,
    ECE = sum_b |D_b| / n: removing or repeating inputs changes only the sums D_b."""

    name = "ece"

    def __init__(self, probs, labels, bins: int = DEFAULT_BINS) -> None:
        probs, labels = _probs_labels(probs, labels)
        super().__init__(labels, probs)
        confidence = probs.max(axis=1)
        edges = bin_edges(bins)
        self.bin = np.clip(np.searchsorted(edges[1:], confidence, side="left"), 0, bins - 1)
        self.gap = (probs.argmax(axis=1) == labels).astype(np.float64) - confidence
        self.sums = np.bincount(self.bin, weights=self.gap, minlength=bins)

    def value(self) -> float:
        return float(np.abs(self.sums).sum() / self.n)

    def leave_one_out(self) -> np.ndarray:
        own = self.sums[self.bin]
        return (np.abs(self.sums).sum() - np.abs(own) + np.abs(own - self.gap)) / (self.n - 1)

    def resampled(self, counts: np.ndarray) -> np.ndarray:
        spread = np.zeros((self.n, len(self.sums)))
        spread[np.arange(self.n), self.bin] = self.gap
        return np.abs(counts @ spread).sum(axis=1) / self.n


class _Labelled(Outcomes):
    labelled = True

    def __init__(self, labels, scores) -> None:
        labels, scores = binary_labels(labels), finite(scores, "scores")
        if labels.size != scores.size:
            raise UsageError(f"labels and scores must be one per input, got {labels.size} and {scores.size}",
                             param="scores")
        m, k = int(labels.sum()), int((~labels).sum())
        if m < 2 or k < 2:
            raise UsageError(f"{self.name} needs at least 2 in-distribution and 2 OOD inputs, got {m} and {k}",
                             param="labels")
        super().__init__(labels, scores)
        self.labels, self.scores = labels, scores


class AUROC(_Labelled):
    """AUROC, in-distribution positive, ties counted 1/2 (metrics.auroc), ``(labels, scores)``."""

    name = "auroc"
    covariances = ("delong", "jackknife", "bootstrap")

    def __init__(self, labels, scores) -> None:
        super().__init__(labels, scores)
        self.auc, self.v10, self.v01 = placements(self.scores[self.labels], self.scores[~self.labels])

    def value(self) -> float:
        return self.auc

    def leave_one_out(self) -> np.ndarray:
        """Without positive i: (m AUC - V10_i) / (m - 1); without negative j: (k AUC - V01_j) / (k - 1)."""
        m, k = self.v10.size, self.v01.size
        out = np.empty(self.n)
        out[self.labels] = (m * self.auc - self.v10) / (m - 1)
        out[~self.labels] = (k * self.auc - self.v01) / (k - 1)
        return out

    def resampled(self, counts: np.ndarray) -> np.ndarray:
        """Weighted Mann-Whitney: each positive's weight times the weight of negatives below it (ties 1/2)."""
        order = np.argsort(self.scores, kind="mergesort")
        ordered, positive = self.scores[order], self.labels[order]
        first = np.r_[True, ordered[1:] != ordered[:-1]]
        group = np.cumsum(first) - 1
        starts = np.flatnonzero(first)
        ends = np.r_[starts[1:], ordered.size]
        weights = counts[:, order]
        negatives = np.cumsum(weights * ~positive, axis=1)
        below = np.where(starts > 0, negatives[:, np.maximum(starts - 1, 0)], 0.0)
        credit = below + 0.5 * (negatives[:, ends - 1] - below)
        wins = (weights[:, positive] * credit[:, group[positive]]).sum(axis=1)
        return wins / (weights[:, positive].sum(axis=1) * negatives[:, -1])


class FPR95(_Labelled):
    """OOD inputs accepted at the threshold that keeps ceil(95% of) the in-distribution inputs
    (metrics.fpr95), ``(labels, scores)``."""

    name = "fpr95"

    def __init__(self, labels, scores) -> None:
        super().__init__(labels, scores)
        self.ids, self.oods = np.sort(self.scores[self.labels]), np.sort(self.scores[~self.labels])

    @staticmethod
    def _position(m: int) -> int:
        return m - (-(-95 * m // 100))  # the kept in-distribution inputs start here (sorted ascending)

    def value(self) -> float:
        return float(np.mean(self.oods >= self.ids[self._position(self.ids.size)]))

    def leave_one_out(self) -> np.ndarray:
        """Without an OOD input: one fewer accepted or not; without an ID input the threshold is one of
        two sorted ID scores, by whether the input was below the cut."""
        m, k = self.ids.size, self.oods.size
        accepted = self.value() * k
        out = np.empty(self.n)
        out[~self.labels] = (accepted - (self.scores[~self.labels] >= self.ids[self._position(m)])) / (k - 1)
        q = self._position(m - 1)
        rank = np.searchsorted(self.ids, self.scores[self.labels], side="left")  # a tied input's first copy
        at_q, above = (np.mean(self.oods >= self.ids[j]) for j in (q, min(q + 1, m - 1)))
        out[self.labels] = np.where(rank <= q, above, at_q)
        return out

    def resampled(self, counts: np.ndarray) -> np.ndarray:
        id_order, ood_order = np.argsort(self.scores[self.labels]), np.argsort(self.scores[~self.labels])
        id_counts = counts[:, self.labels][:, id_order]
        ood_counts = counts[:, ~self.labels][:, ood_order]
        cut = self._position(self.ids.size)
        first_kept = np.argmax(np.cumsum(id_counts, axis=1) > cut, axis=1)
        threshold = self.ids[first_kept]
        at_or_above = np.cumsum(ood_counts[:, ::-1], axis=1)[:, ::-1]
        start = np.searchsorted(self.oods, threshold, side="left")
        padded = np.concatenate([at_or_above, np.zeros((len(counts), 1))], axis=1)
        return np.take_along_axis(padded, start[:, None], axis=1)[:, 0] / self.oods.size


#: figure of merit name -> its class (robust accuracy is an accuracy)
FIGURES: dict[str, type[Outcomes]] = {"accuracy": Accuracy, "robust_accuracy": Accuracy, "nll": NLL, "ece": ECE,
                                      "auroc": AUROC, "fpr95": FPR95}


def figure(name_or_class) -> type[Outcomes]:
    """The Outcomes class of a figure-of-merit name (or the class itself)."""
    if isinstance(name_or_class, type) and issubclass(name_or_class, Outcomes):
        return name_or_class
    if name_or_class not in FIGURES:
        raise UsageError(f"unknown figure of merit {name_or_class!r}; known: {', '.join(FIGURES)}", param="fom")
    return FIGURES[name_or_class]
