"""Validation and test accuracy during training, through the evaluation commands' batch loop."""
from __future__ import annotations

import torch
from torch import nn


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 500, sigma: float = 0.0,
             seed: int = 0) -> float | None:
    """Top-1 accuracy of ``model`` on (x, y); inputs get N(0, sigma^2) noise from a seeded generator.

    Returns None for an empty set. :func:`jemeval.evaluation.batching.run_batches` computes the
    logits once per batch without gradients and restores the model's mode afterwards.
    """
    from jemeval.data import ArrayDataset
    from jemeval.evaluation.batching import run_batches

    if len(x) == 0:
        return None
    out = run_batches(model, ArrayDataset(x, y), sigma=sigma, seed=seed, batch_size=batch_size, progress=False)
    return float((out.logits.argmax(1) == out.labels).mean())
