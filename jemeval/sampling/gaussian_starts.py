"""Chain starts from class-conditional Gaussians fit to the training images (JEM++'s "informative
initialisation", Yang & Ji 2021), mixed with JEM's U(-1, 1).

Why: chains from uniform noise teach log p(x) to reject noise, and nothing else; fine-tuning a
classifier with them alone, log p(x) of averaged images rises with every epoch (docs/training.md,
"Epoch by epoch"). Chains that start from a Gaussian per class (its mean and covariance those of the
class's training images) begin as blurred, blended images, so the p(x) term lowers those too.

:class:`GaussianStarts` is fit once per run, in float64 on the CPU from the training images a batch at a
time (so the fit is the same on every device, process and resume). :meth:`GaussianStarts.starts` draws
``n`` chain starts (short-run chains; a replay buffer's first states and restarts) from the run's
generator, a ``fraction`` of them from the Gaussians (of uniformly drawn classes, or of the chains' own
classes; values clamped to [-1, 1]) and the rest U(-1, 1). Full covariances take K x D x D numbers:
above :data:`FULL_COVARIANCE_MAX` of them (CIFAR-10's 10 x 3072^2 is below it, CIFAR-100's and
ImageNet's above) each class gets a per-value (diagonal) covariance instead.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from jemeval.sampling.buffer import ChainStarts, uniform_like_shape

#: The most numbers the full covariances of all classes may take (K x D x D; 1 GiB in float64 while fitting).
FULL_COVARIANCE_MAX = 2 ** 27
RIDGE = 1e-4  # added to the covariance's diagonal: a class with fewer images than values is still drawable
FIT_BATCH = 1024


class GaussianStarts:
    """A Gaussian per class present in the training images: ``means`` (K, D), ``factors`` (K, D, D) lower
    Cholesky factors of the covariances, or (K, D) standard deviations when diagonal; ``classes`` (K,)
    the labels they belong to."""

    def __init__(self, means: torch.Tensor, factors: torch.Tensor, classes: torch.Tensor,
                 input_shape: Sequence[int]) -> None:
        self.means, self.factors, self.classes = means, factors, classes
        self.input_shape = tuple(input_shape)
        self.slots = _rows_of(classes)

    @property
    def diagonal(self) -> bool:
        return self.factors.dim() == 2

    @classmethod
    def fit(cls, x, y: torch.Tensor, input_shape: Sequence[int]) -> GaussianStarts:
        """Per-class mean and covariance (unbiased, + :data:`RIDGE` on the diagonal) of images ``x``
        (a tensor or anything indexed by a tensor of rows, e.g. StoredRows) with labels ``y``."""
        dims = int(torch.Size(input_shape).numel())
        labels = torch.as_tensor(y).cpu().long()
        classes = torch.unique(labels)
        full = len(classes) * dims * dims <= FULL_COVARIANCE_MAX
        sums = torch.zeros(len(classes), dims, dtype=torch.float64)
        squares = torch.zeros((len(classes), dims, dims) if full else (len(classes), dims), dtype=torch.float64)
        slot = _rows_of(classes)
        for start in range(0, len(labels), FIT_BATCH):
            rows = torch.arange(start, min(start + FIT_BATCH, len(labels)))
            flat = x[rows].detach().to("cpu", torch.float64).reshape(len(rows), dims)
            where = slot[labels[rows]]
            sums.index_add_(0, where, flat)
            if not full:
                squares.index_add_(0, where, flat * flat)
                continue
            for c in torch.unique(where).tolist():
                mine = flat[where == c]
                squares[c] += mine.T @ mine
        counts = torch.bincount(slot[labels], minlength=len(classes)).to(torch.float64)
        means = sums / counts[:, None]
        return cls(means.float(), _factors(squares, means, counts, full).float(), classes, input_shape)

    def starts(self, n: int, fraction: float, y: torch.Tensor | None = None, *, device=None,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` chain starts: U(-1, 1), each replaced with probability ``fraction`` by a draw from the
        Gaussian of a uniformly drawn class, or of class ``y[i]`` when labels are given (a class without
        training images keeps its uniform start)."""
        uniform = uniform_like_shape(n, self.input_shape, device=device, generator=generator)
        means, factors, slots = self._on(uniform.device)
        k = torch.randint(0, len(self.classes), (n,), generator=generator, device=device)
        z = torch.randn(n, means.shape[1], generator=generator, device=device)
        pick = torch.rand(n, generator=generator, device=device) < fraction
        if y is not None:
            y = y.to(uniform.device)
            wanted = torch.where(y < len(slots), slots[y.clamp(max=len(slots) - 1)], -1)
            pick, k = pick & (wanted >= 0), wanted.clamp(min=0)
        noise = factors[k] * z if self.diagonal else _correlated(factors, k, z)
        gaussian = (means[k] + noise).clamp(-1, 1).reshape(uniform.shape)
        return torch.where(pick.view(-1, *([1] * len(self.input_shape))), gaussian, uniform)

    def mixture(self, fraction: float) -> ChainStarts:
        """:meth:`starts` with ``fraction`` bound: what a replay buffer or a training step calls."""
        def starts(n: int, y: torch.Tensor | None = None, *, generator=None, device=None) -> torch.Tensor:
            return self.starts(n, fraction, y, device=device, generator=generator)
        return starts

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The means, factors and label -> row table on ``device`` (moved there once)."""
        if self.means.device != device:
            self.means, self.factors, self.slots = (t.to(device) for t in (self.means, self.factors, self.slots))
        return self.means, self.factors, self.slots


def _rows_of(classes: torch.Tensor) -> torch.Tensor:
    """Label -> the row of its Gaussian (-1 for a label without training images)."""
    rows = torch.full((int(classes.max()) + 1,), -1, dtype=torch.long)
    rows[classes] = torch.arange(len(classes))
    return rows


def _correlated(factors: torch.Tensor, k: torch.Tensor, z: torch.Tensor, *,
                every_class: bool | None = None) -> torch.Tensor:
    """``factors[k[i]] @ z[i]`` for every chain i. On a GPU (``every_class``) every class's product is
    computed and one kept (no data-dependent shapes, so no host synchronisation); on the CPU, where that
    would cost K times the arithmetic (10 x 64 x 3072^2 for a CIFAR batch), one product per class present."""
    if every_class is None:
        every_class = z.device.type != "cpu"
    if every_class:
        return torch.einsum("kij,nj->kni", factors, z)[k, torch.arange(len(z), device=z.device)]
    out = torch.empty_like(z)
    for c in torch.unique(k).tolist():
        mine = k == c
        out[mine] = z[mine] @ factors[c].T
    return out


def _factors(squares: torch.Tensor, means: torch.Tensor, counts: torch.Tensor, full: bool) -> torch.Tensor:
    """Cholesky factors (full) or standard deviations (diagonal) of the unbiased covariances + RIDGE."""
    ddof = (counts - 1).clamp(min=1)
    if not full:
        var = (squares - counts[:, None] * means * means) / ddof[:, None]
        return (var.clamp(min=0) + RIDGE).sqrt()
    cov = (squares - counts[:, None, None] * means[:, :, None] * means[:, None, :]) / ddof[:, None, None]
    eye = torch.eye(means.shape[1], dtype=cov.dtype)
    return torch.linalg.cholesky((cov + cov.transpose(1, 2)) / 2 + RIDGE * eye)
