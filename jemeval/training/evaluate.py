"""Validation and test accuracy during training: logits computed once, in batches, without gradients."""
from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 500, sigma: float = 0.0,
             seed: int = 0) -> float | None:
    """Top-1 accuracy of ``model`` on (x, y); inputs get N(0, sigma^2) noise from a seeded generator.

    Returns None for an empty set. The model is put in eval mode and restored afterwards.
    """
    if len(x) == 0:
        return None
    device = next(model.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed) if sigma > 0 else None
    was_training = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    try:
        for i in range(0, len(x), batch_size):
            xb = x[i:i + batch_size].to(device, non_blocking=True)
            if sigma > 0:
                xb = xb + sigma * torch.randn(xb.shape, generator=g, device=device)
            correct += (model(xb).argmax(1) == y[i:i + batch_size].to(device, non_blocking=True)).sum()
    finally:
        model.train(was_training)
    return correct.item() / len(x)
