"""EnergyModel: any logits network read as a joint energy-based model.

A classifier f(x) -> K logits defines (Grathwohl et al. 2020):
    log p~(x, y) = f(x)[y]
    log p~(x)    = logsumexp_y f(x)[y]          (the unnormalised log density)
    E(x)         = -log p~(x)
    p(y | x)     = softmax(f(x))
Shifting every logit by a constant changes log p~(x) but not p(y|x): the generative reading lives
in the part of the logits an ordinary classifier ignores.

Inputs are N x C x H x W tensors in [-1, 1]. An optional per-channel ``normalization`` (mean, std)
is applied *inside* the model, so every caller (sampler, attacks, scores) still works in [-1, 1].

OOD detectors (Mahalanobis, KNN, ViM, ReAct, ...) read the penultimate features and the linear head
that maps them to the logits. A network offers them through timm's protocol, ``forward_features(x)``,
``forward_head(h, pre_logits=True)`` and ``get_classifier()``: every timm model has it, and jemeval's
own networks (``wrn``, ``cnn``, the IGEBM plugin's ``igebm``) implement it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from jemeval.errors import UsageError

#: the methods a network needs for :meth:`EnergyModel.features` (timm's names)
FEATURE_PROTOCOL = ("forward_features", "forward_head", "get_classifier")


def log_p(logits: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
    """log p~(x) = logsumexp_y f(x)[y] (``y`` None) or log p~(x, y) = f(x)[y], per example (N,).

    The one place the JEM reading of logits is written: the model, the sampler, the scores, the
    training objective and the generation report all call it. Logits of any float type are read in
    float32 at least, so a bf16 network never rounds the density itself.
    """
    if logits.dim() != 2:
        logits = logits.reshape(logits.shape[0], -1)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if y is None:
        return logits.logsumexp(dim=1)
    return logits.gather(1, y.view(-1, 1).to(logits.device)).squeeze(1)


class EnergyModel(nn.Module):
    """Wraps a logits network; ``model(x)`` returns logits (N x K)."""

    def __init__(
        self,
        net: nn.Module,
        *,
        num_classes: int,
        input_shape: Sequence[int],
        arch: str | None = None,
        arch_options: dict[str, Any] | None = None,
        normalization: dict[str, Sequence[float]] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.net = net
        self.num_classes = int(num_classes)
        self.input_shape = tuple(int(s) for s in input_shape)
        self.arch = arch
        self.arch_options = dict(arch_options or {})
        self.normalization = None
        if normalization:
            c = self.input_shape[0]
            mean = torch.as_tensor(normalization["mean"], dtype=torch.float32).reshape(1, -1, 1, 1).expand(1, c, 1, 1)
            std = torch.as_tensor(normalization["std"], dtype=torch.float32).reshape(1, -1, 1, 1).expand(1, c, 1, 1)
            self.register_buffer("_norm_mean", mean.clone(), persistent=False)
            self.register_buffer("_norm_std", std.clone(), persistent=False)
            # (x - mean) / std as one fused pass, x * (1 / std) + (-mean / std): on a 224 x 224 batch the
            # two passes, each writing a batch-sized tensor, were 5% of a small network's forward
            self.register_buffer("_norm_scale", 1.0 / std, persistent=False)
            self.register_buffer("_norm_shift", -mean / std, persistent=False)
            self.normalization = {"mean": list(map(float, mean.flatten())), "std": list(map(float, std.flatten()))}
        #: free-form information carried from the checkpoint (dataset, provenance, source format...)
        self.metadata: dict[str, Any] = dict(metadata or {})

    # -- the energy-based reading ----------------------------------------------------------------
    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.normalization is None else torch.addcmul(self._norm_shift, x, self._norm_scale)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(self._normalize(x))
        if out.dim() != 2:
            out = out.reshape(out.shape[0], -1)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(x)

    def log_px(self, x: torch.Tensor) -> torch.Tensor:
        """log p~(x) = logsumexp of the logits (N,)."""
        return log_p(self.logits(x))

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        """E(x) = -log p~(x) (N,); lower = more probable."""
        return -self.log_px(x)

    def log_pxy(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """log p~(x, y) = f(x)[y] (N,).

        A net with a ``class_logits(x, y)`` method computes only those entries: a class-conditional
        energy (IGEBM) would otherwise evaluate all K classes to keep one.
        """
        if hasattr(self.net, "class_logits"):
            return self.net.class_logits(self._normalize(x), y)
        return log_p(self.logits(x), y)

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        """p(y | x) = softmax of the logits (N x K)."""
        return self.logits(x).softmax(dim=1)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(x).argmax(dim=1)

    # -- penultimate features ----------------------------------------------------------------------
    def features_and_logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N x D penultimate features, N x K logits) from one forward pass of the network.

        The logits equal :meth:`logits`; ``classifier()(features)`` gives them too (up to rounding), which
        is what ViM, ReAct, DICE and ASH rely on. A network without the feature protocol raises one line
        naming the architecture.
        """
        net = self._feature_net()
        maps = net.forward_features(self._normalize(x))
        features, logits = net.forward_head(maps, pre_logits=True), net.forward_head(maps)
        return features.reshape(features.shape[0], -1), logits.reshape(logits.shape[0], -1)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """N x D penultimate features (the input of the last linear layer)."""
        return self.features_and_logits(x)[0]

    def classifier(self) -> nn.Module:
        """The last layer, features -> logits: a linear module with ``weight`` (K x D) and ``bias`` (K)."""
        return self._feature_net().get_classifier()

    def _feature_net(self) -> nn.Module:
        missing = [m for m in FEATURE_PROTOCOL if not callable(getattr(self.net, m, None))]
        if missing:
            raise UsageError(
                f"architecture {self.arch or type(self.net).__name__!r} gives no penultimate features: its network "
                f"({type(self.net).__name__}) lacks {', '.join(missing)} (timm's feature protocol); use scores that "
                "need only logits or input gradients (logpx, maxprob, energy, entropy, gradnorm, odin)")
        return self.net

    @property
    def device(self) -> torch.device:
        for p in self.parameters():
            return p.device
        for b in self.buffers():
            return b.device
        return torch.device("cpu")

    def extra_repr(self) -> str:
        return f"arch={self.arch!r}, num_classes={self.num_classes}, input_shape={self.input_shape}"
