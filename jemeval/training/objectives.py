"""The loss terms of JEM training (Algorithm 1 of Grathwohl et al. 2020), on logits.

With f the logits network, log p~(x) = logsumexp_y f(x)[y] and log p~(x, y) = f(x)[y]:

* p(y|x):  cross-entropy on the labelled batch.
* p(x):    -(mean log p~(x_data) - mean log p~(x_sample)); its gradient is the maximum-likelihood
           gradient of log p(x) when the samples come from the model (SGLD, persistent chains).
* p(x, y): the same contrast on f(x)[y], with samples drawn class-conditionally for the batch's
           labels. Alone (objective "factored") it is the paper's p(x|y) ablation.
* energy L2: + (mean E(x_data)^2 + mean E(x_sample)^2), the authors' remedy against divergence.

The functions take logits already computed (one forward pass for data and samples together) so
that the trainer decides how to batch the network calls.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from jemeval.energy.model import log_p


def contrast(lp_data: torch.Tensor, lp_sample: torch.Tensor) -> torch.Tensor:
    """-(mean log p~(data) - mean log p~(samples)): lowers data energy, raises sample energy."""
    return -(lp_data.mean() - lp_sample.mean())


def energy_l2(lp_data: torch.Tensor, lp_sample: torch.Tensor) -> torch.Tensor:
    """Mean squared energies of data and samples (E = -log p~, so the sign does not matter)."""
    return lp_data.pow(2).mean() + lp_sample.pow(2).mean()


@dataclass
class Weights:
    pyx: float = 1.0
    px: float = 1.0
    pxy: float = 0.0
    l2: float = 0.0


@dataclass
class Logits:
    """The network outputs one iteration needs (None when a term is off).

    lab / y_lab:   the labelled batch and its labels (cross-entropy, data side of p(x, y))
    data:          the batch the p(x) term sees (all images; ``lab`` itself when fully supervised)
    sample:        the p(x) negatives
    sample_y / y_sample: class-conditional negatives and the labels they were drawn for
    """

    lab: torch.Tensor | None
    y_lab: torch.Tensor | None
    data: torch.Tensor | None = None
    sample: torch.Tensor | None = None
    sample_y: torch.Tensor | None = None
    y_sample: torch.Tensor | None = None


def jem_loss(out: Logits, w: Weights) -> dict[str, torch.Tensor]:
    """Total loss and its parts (all 0-d tensors on the logits' device; nothing is synchronised).

    Returned keys: loss, pyx, px, pxy, l2 (unweighted parts), and the monitored energies:
    e_data / e_sample (mean E = -log p~(x) of data and negatives), abs_energy (largest |E| seen).
    """
    ref = next(t for t in (out.lab, out.data, out.sample_y) if t is not None)
    zero = ref.new_zeros(())
    parts = {"pyx": zero, "px": zero, "pxy": zero, "l2": zero}
    lp_pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    if w.pyx > 0:
        parts["pyx"] = F.cross_entropy(out.lab, out.y_lab)
    if w.px > 0:
        lp_d, lp_q = log_p(out.data), log_p(out.sample)
        parts["px"] = contrast(lp_d, lp_q)
        lp_pairs.append((lp_d, lp_q))
    if w.pxy > 0:
        lp_d = log_p(out.lab, out.y_lab)
        lp_q = log_p(out.sample_y, out.y_sample)
        parts["pxy"] = contrast(lp_d, lp_q)
        lp_pairs.append((lp_d, lp_q))
    if w.l2 > 0 and lp_pairs:
        parts["l2"] = sum(energy_l2(d, q) for d, q in lp_pairs)
    loss = w.pyx * parts["pyx"] + w.px * parts["px"] + w.pxy * parts["pxy"] + w.l2 * parts["l2"]
    # energies for monitoring (E = -logsumexp f); computed without a graph
    with torch.no_grad():
        data_logits = out.data if out.data is not None else out.lab
        e_data = -log_p(data_logits)
        negatives = [t for t in (out.sample, out.sample_y) if t is not None]
        if negatives:
            e_sample = -log_p(torch.cat(negatives))
            abs_energy = torch.maximum(e_data.abs().max(), e_sample.abs().max())
            e_sample_mean = e_sample.mean()
        else:
            abs_energy = e_data.abs().max()
            e_sample_mean = torch.full_like(zero, float("nan"))
    return {"loss": loss, **parts, "e_data": e_data.mean(), "e_sample": e_sample_mean, "abs_energy": abs_energy}
