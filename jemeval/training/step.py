"""One training iteration: negatives by SGLD, one forward pass, the loss, one optimizer step.

Kept apart from the epoch loop so that the benchmark (benchmarks/train_step.py) times exactly what
training runs. Nothing here synchronises with the host: the returned statistics are device tensors.

Speed notes
* Data and negatives go through the network in ONE forward pass (concatenated) when the math
  allows it, i.e. unless a BatchNorm layer is in train mode (batch statistics would mix them; the
  samples' separate pass then leaves the running statistics to the data).
* SGLD is the shared :class:`jemeval.sampling.sgld.SGLD` (or JEM++'s ProximalSGLD): parameters frozen
  while sampling, so no parameter graph is built and no parameter gradient is computed.
* The replay buffer, the data and every random draw live on the training device.
* bf16 autocast, channels_last and torch.compile through the shared
  :class:`jemeval.runtime.fastpath.FastPath` (on for CUDA; only channels_last on CPU by default);
  SGLD arithmetic, the buffer and the losses stay fp32.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from jemeval.runtime.batchnorm import running_statistics_kept
from jemeval.runtime.fastpath import FastPath, has_batchnorm, joint_logits
from jemeval.sampling.buffer import ChainStarts, ReplayBuffer, uniform_like_shape
from jemeval.sampling.proximal import ProximalSGLD
from jemeval.sampling.sgld import SGLD
from jemeval.training.augment import Augment
from jemeval.training.objectives import Logits, Weights, jem_loss


@dataclass
class StepOptions:
    sigma: float = 0.0
    short_run: bool = False
    class_cond_px: bool = False
    starts: ChainStarts | None = None  # where short-run chains start (None: U(-1, 1))
    fastpath: FastPath = field(default_factory=FastPath)


class TrainStep:
    """Callable performing one JEM iteration on a labelled batch (and the p(x) batch)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, sgld: SGLD | ProximalSGLD,
                 buffer: ReplayBuffer | None, weights: Weights, num_classes: int, input_shape,
                 augment: Augment, generator: torch.Generator, options: StepOptions,
                 forward: nn.Module | None = None, sample_forward: nn.Module | None = None) -> None:
        """``forward`` runs the training pass (compiled and/or DistributedDataParallel-wrapped);
        ``sample_forward`` is what the sampler calls (never the DDP wrapper: sampling needs no
        gradient reduction); both default to ``model``."""
        self.model = model
        self.forward_model = forward if forward is not None else model  # torch.compile'd / DDP, or the model
        self.sample_model = sample_forward if sample_forward is not None else self.forward_model
        self.optimizer = optimizer
        self.sgld = sgld
        self.buffer = buffer
        self.weights = weights
        self.num_classes = int(num_classes)
        self.input_shape = tuple(input_shape)
        self.augment = augment
        self.generator = generator
        self.options = options
        self.batchnorm = has_batchnorm(model)
        self.last_samples: torch.Tensor | None = None  # for the sample grids of short-run chains
        device = next(model.parameters()).device
        self.device = device
        self.fastpath = options.fastpath

    # -- inputs ---------------------------------------------------------------------------------
    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """Augmentation, then the sigma noise (as the release does for every training input)."""
        if self.augment.active:
            x = self.augment(x, self.generator)
        if self.options.sigma > 0:
            noise = torch.randn(x.shape, generator=self.generator, device=x.device, dtype=x.dtype)
            x = x + self.options.sigma * noise
        return x

    # -- negatives ------------------------------------------------------------------------------
    def negatives(self, n: int, y: torch.Tensor | None = None) -> torch.Tensor:
        """``n`` SGLD samples (class-conditional for labels ``y``): persistent or short-run chains."""
        if self.options.short_run or self.buffer is None:
            starts = self.options.starts
            x0, idx = (uniform_like_shape(n, self.input_shape, device=self.device, generator=self.generator)
                       if starts is None else starts(n, y, generator=self.generator, device=self.device)), None
        else:
            x0, idx = self.buffer.sample(n, y, generator=self.generator)
        x = self.sgld.sample(self.sample_model, x0, y, generator=self.generator, fastpath=self.fastpath)
        if idx is not None:
            self.buffer.push(idx, x)  # duplicate slots: the last write wins, deterministically
        self.last_samples = x
        return x

    # -- the iteration --------------------------------------------------------------------------
    def __call__(self, x_lab: torch.Tensor, y_lab: torch.Tensor, x_data: torch.Tensor | None = None, *,
                 sampling_scale: float = 1.0) -> dict[str, torch.Tensor]:
        """One update. ``x_data`` is the p(x) batch when it differs from the labelled one
        (semi-supervised); ``sampling_scale`` multiplies the p(x) and p(x, y) weights (the p(x) warm-up,
        :func:`jemeval.training.trainer.sampling_weight_scale`)."""
        w = self.weights
        if sampling_scale != 1.0:
            w = replace(w, px=w.px * sampling_scale, pxy=w.pxy * sampling_scale)
        x_lab = self.prepare(x_lab)
        x_px = self.prepare(x_data) if (x_data is not None and w.px > 0) else None
        n = x_lab.shape[0]
        x_q = y_q = x_qy = None
        if w.px > 0:
            if self.options.class_cond_px:
                y_q = torch.randint(0, self.num_classes, (n,), generator=self.generator, device=self.device)
            x_q = self.negatives(n, y_q)
        if w.pxy > 0:
            x_qy = self.negatives(n, y_lab)
        extra = (("data", x_px), ("sample", x_q), ("sample_y", x_qy))
        parts = [("lab", x_lab)] + [(k, v) for k, v in extra if v is not None]
        self.model.train()
        logits = self.logits([v for k, v in parts if k in ("lab", "data")],
                             [v for k, v in parts if k not in ("lab", "data")])
        outs = dict(zip([k for k, _ in parts], logits))
        out = Logits(lab=outs["lab"], y_lab=y_lab, data=outs.get("data", outs["lab"] if w.px > 0 else None),
                     sample=outs.get("sample"), sample_y=outs.get("sample_y"),
                     y_sample=y_lab if x_qy is not None else None)
        terms = jem_loss(out, w)
        loss = terms["loss"]
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        stats = {k: v.detach() for k, v in terms.items()}
        stats["loss"] = loss.detach()
        stats["correct"] = (out.lab.detach().argmax(1) == y_lab).sum()
        return stats

    def logits(self, data: list[torch.Tensor], samples: list[torch.Tensor]) -> list[torch.Tensor]:
        """Train-mode logits of the data batches, then of the sample batches, in that order.

        One forward over all of them unless the network has BatchNorm; then separate passes (batch
        statistics must not mix), and the samples' passes leave the running statistics as the data
        set them (:mod:`jemeval.runtime.batchnorm`: the eval-mode network is the data's)."""
        if not self.batchnorm:
            return joint_logits(self.forward_model, *data, *samples, fastpath=self.fastpath, shared=True)
        logits = joint_logits(self.forward_model, *data, fastpath=self.fastpath, shared=False)
        if samples:
            with running_statistics_kept(self.model):
                logits += joint_logits(self.forward_model, *samples, fastpath=self.fastpath, shared=False)
        return logits
