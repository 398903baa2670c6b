"""The "before" column: one Algorithm-1 iteration written plainly, the way the JEM release does it.

This is a faithful, un-sabotaged rendering of the release's training loop (``sample_p_0``,
``sample_q`` and the loss of train_wrn_ebm.py), written here from its description:

* the replay buffer is an fp32 tensor on the CPU; chain starts are drawn there, mixed with fresh
  U(-1, 1) noise (reinit_freq), and copied to the device every iteration;
* ``x_k`` requires grad while the parameters keep ``requires_grad=True``; each step calls
  ``autograd.grad(f(x_k).sum(), [x_k], retain_graph=True)`` and updates ``x_k.data`` in place;
* the samples are copied back to the CPU buffer;
* the loss runs separate forward passes for the p(x) data batch, the samples and the labelled
  batch (the release draws the last two from different loaders), then one backward and one step;
* one ``.item()`` per iteration (the release's |loss| > 1e8 divergence check).

Nothing here is slowed on purpose: every choice is what the release does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def naive_sample_q(f, buffer: torch.Tensor, batch_size: int, *, n_steps: int = 20, sgld_lr: float = 1.0,
                   sgld_std: float = 0.01, reinit_freq: float = 0.05, device=None):
    """The release's ``sample_q``: persistent chains from a CPU buffer, SGLD on ``device``."""
    device = device if device is not None else next(f.parameters()).device
    f.eval()
    inds = torch.randint(0, len(buffer), (batch_size,))
    buffer_samples = buffer[inds]
    random_samples = torch.FloatTensor(batch_size, *buffer.shape[1:]).uniform_(-1, 1)
    choose_random = (torch.rand(batch_size) < reinit_freq).float()[:, None, None, None]
    samples = choose_random * random_samples + (1 - choose_random) * buffer_samples
    x_k = samples.to(device).requires_grad_(True)
    for _ in range(n_steps):
        f_prime = torch.autograd.grad(f(x_k).logsumexp(1).sum(), [x_k], retain_graph=True)[0]
        x_k.data += sgld_lr * f_prime + sgld_std * torch.randn_like(x_k)
    f.train()
    final_samples = x_k.detach()
    buffer[inds] = final_samples.cpu()
    return final_samples


def naive_iteration(f, x_lab: torch.Tensor, y_lab: torch.Tensor, buffer: torch.Tensor, optimizer, *,
                    x_p_d: torch.Tensor | None = None, n_steps: int = 20, sgld_lr: float = 1.0,
                    sgld_std: float = 0.01, reinit_freq: float = 0.05, px_weight: float = 1.0,
                    pyx_weight: float = 1.0) -> torch.Tensor:
    """One iteration of Algorithm 1 as the release runs it; returns the (detached) loss.

    ``f`` maps images to logits; ``x_p_d`` is the p(x) batch (the release draws it from a second
    loader; by default the labelled batch is reused, still through its own forward pass).
    """
    x_p_d = x_lab if x_p_d is None else x_p_d
    L = 0.0
    if px_weight > 0:
        x_q = naive_sample_q(f, buffer, x_p_d.shape[0], n_steps=n_steps, sgld_lr=sgld_lr, sgld_std=sgld_std,
                             reinit_freq=reinit_freq, device=x_p_d.device)
        fp = f(x_p_d).logsumexp(1).mean()
        fq = f(x_q).logsumexp(1).mean()
        L = L + px_weight * -(fp - fq)
    if pyx_weight > 0:
        logits = f(x_lab)
        L = L + pyx_weight * F.cross_entropy(logits, y_lab)
    if L.abs().item() > 1e8:
        raise RuntimeError("loss diverged")
    optimizer.zero_grad()
    L.backward()
    optimizer.step()
    return L.detach()
