"""The IGEBM energy network (Du & Mordatch 2019, openai/ebm_code_release), ported to PyTorch.

A class-conditional ResNet gives a scalar energy E(x, y), lower = more probable. jemeval reads a
model as logits, so :class:`IGEBM` returns ``-E(x, y)`` for every class y: under a uniform prior
p(y) this makes softmax(logits) = p(y | x), and logsumexp(logits) = log sum_y exp(-E(x, y)).

The network follows the release's ``ResNet32`` family (``models.py`` / ``utils.py`` there):

* stem: spectrally normalised 3x3 conv (no bias) -> LeakyReLU(0.2);
* residual blocks, each ``act(pool(conv2(act(conv1(h + b1[y]))) + b2[y]) * (g2[y] + c2) + skip(h)))``:
  a per-class bias added to each conv's *input*, a per-class gain (plus a shared offset) on the
  second conv's output, a spectrally normalised 3x3 shortcut conv when the width changes, 2x2
  average pooling on the first block of each stage;
* head: ReLU (or LeakyReLU) -> *sum* over positions -> linear to one energy (no spectral norm).

Spectral normalisation is the release's own: one power iteration per forward from a stored
vector ``u``, which is written back only in training mode (the release's ``spec_eval`` flag is
"eval mode" here), and the residual branch's second conv is only shrunk when its norm exceeds 1
(the release's ``lower_bound`` variant, which lets that conv start near zero so each block
starts as the identity).

All K class energies come from one batched pass: the stem runs once per image, then the batch
is expanded to N x K (image, class) pairs for the conditional blocks.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

#: stage width multipliers, blocks per stage and head activation of the release's networks
VARIANTS: dict[str, dict] = {
    "resnet32": {"multipliers": (1, 2, 2), "blocks": 2, "head": "relu"},     # models.ResNet32 (cifar10_cond)
    "large": {"multipliers": (1, 2, 4), "blocks": 3, "head": "leaky"},       # ResNet32Large (class-conditional)
    "larger": {"multipliers": (1, 2, 4), "blocks": 5, "head": "leaky"},      # ResNet32Larger
    "wider": {"multipliers": (1, 2, 4), "blocks": 3, "head": "relu"},        # ResNet32Wider (stem width 128)
}
HEADS = ("relu", "leaky")
LEAK = 0.2  # tf.nn.leaky_relu's default slope


def _l2_normalize(v: torch.Tensor) -> torch.Tensor:
    """tf.nn.l2_normalize over all elements: v / sqrt(max(sum v^2, 1e-12))."""
    return v * torch.rsqrt(torch.clamp((v * v).sum(), min=1e-12))


class SNConv2d(nn.Module):
    """A bias-free 3x3 convolution whose weight is divided by its spectral norm (release semantics).

    ``weight`` is stored in PyTorch layout (out, in, k, k); ``u`` (out,) is the power-iteration
    vector. ``lower_bound=True`` divides only when the norm exceeds 1.
    """

    def __init__(self, c_in: int, c_out: int, kernel_size: int = 3, *, lower_bound: bool = False, iterations: int = 1):
        super().__init__()
        self.lower_bound = lower_bound
        self.iterations = int(iterations)
        self.padding = kernel_size // 2
        init_std = 1e-10 if lower_bound else 1.0  # the release: N(0, 1), and ~0 for the residual's last conv
        self.weight = nn.Parameter(torch.randn(c_out, c_in, kernel_size, kernel_size) * init_std)
        self.register_buffer("u", torch.randn(c_out))

    def normalized_weight(self) -> torch.Tensor:
        w = self.weight.reshape(self.weight.shape[0], -1)  # (out, in*k*k): the release's matrix, transposed
        with torch.no_grad():
            u = self.u
            for _ in range(self.iterations):
                v = _l2_normalize(w.t() @ u)
                u = _l2_normalize(w @ v)
            if self.training:
                self.u.copy_(u)
            u, v = u.clone(), v.clone()
        sigma = u @ (w @ v)
        if self.lower_bound:
            sigma = sigma + 1e-6
            return self.weight / sigma * torch.clamp(sigma, max=1.0)
        return self.weight / sigma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.normalized_weight(), padding=self.padding)


class CondResBlock(nn.Module):
    """The release's ``smart_res_block`` with class-conditional biases and gain."""

    def __init__(self, c_in: int, c_out: int, num_classes: int, *, downsample: bool):
        super().__init__()
        self.downsample = downsample
        self.conv1 = SNConv2d(c_in, c_out)
        self.conv2 = SNConv2d(c_out, c_out, lower_bound=True)
        self.shortcut = SNConv2d(c_in, c_out) if c_in != c_out else None
        self.bias1 = nn.Parameter(torch.zeros(num_classes, c_in))    # release: <block>_res_c1/gb
        self.bias2 = nn.Parameter(torch.zeros(num_classes, c_out))   # release: <block>_res_c2/gb
        self.gain2 = nn.Parameter(torch.ones(num_classes, c_out))    # release: <block>_res_c2/g
        self.gain_offset2 = nn.Parameter(torch.zeros(c_out))         # release: <block>_res_c2/cb

    def forward(self, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = F.leaky_relu(self.conv1(h + self.bias1[y][:, :, None, None]), LEAK)
        scale = self.gain2[y] + self.gain_offset2
        out = self.conv2(out + self.bias2[y][:, :, None, None]) * scale[:, :, None, None]
        out = out + (h if self.shortcut is None else self.shortcut(h))
        if self.downsample:
            out = F.avg_pool2d(out, 2)
        return F.leaky_relu(out, LEAK)


class IGEBM(nn.Module):
    """Class-conditional IGEBM; ``forward(x)`` returns logits = -E(x, y) for every class (N x K).

    width:       channels of the first stage (the release: 128; 32 suits 8x8 digits)
    variant:     resnet32 | large | larger | wider: stage multipliers, blocks and head of the release's nets
    blocks:      residual blocks per stage (default: the variant's)
    stem_width:  channels of the stem conv (default: ``width``; the release's wider net: 128)
    head:        relu | leaky, the activation before the spatial sum (default: the variant's)
    unit_input:  feed the network (x + 1) / 2, the [0, 1] images the TensorFlow release was trained on
    """

    def __init__(self, num_classes: int, input_shape: Sequence[int] = (3, 32, 32), *, width: int = 32,
                 variant: str = "resnet32", blocks: int | None = None, stem_width: int | None = None,
                 head: str | None = None, unit_input: bool = False):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"unknown IGEBM variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        spec = VARIANTS[variant]
        head = head or spec["head"]
        if head not in HEADS:
            raise ValueError(f"unknown IGEBM head {head!r}; choose relu or leaky")
        blocks = int(blocks if blocks is not None else spec["blocks"])
        if blocks < 1 or int(width) < 1:
            raise ValueError(f"IGEBM needs width >= 1 and blocks >= 1, got width={width}, blocks={blocks}")
        self.num_classes = int(num_classes)
        self.unit_input = bool(unit_input)
        self.head = head
        c = int(stem_width or width)
        self.stem = SNConv2d(int(input_shape[0]), c)
        layers = []
        for mult in spec["multipliers"]:
            for i in range(blocks):
                layers.append(CondResBlock(c, int(width) * mult, self.num_classes, downsample=(i == 0)))
                c = int(width) * mult
        self.blocks = nn.ModuleList(layers)
        self.energy_head = nn.Linear(c, 1)
        nn.init.xavier_uniform_(self.energy_head.weight)
        nn.init.zeros_(self.energy_head.bias)

    def pooled(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """The head's input, summed over positions: (N x D) for labels ``y``, (N*K x D) for every class
        (image-major) when ``y`` is None."""
        if self.unit_input:
            x = (x + 1) / 2
        h = F.leaky_relu(self.stem(x), LEAK)
        n = h.shape[0]
        if y is None:  # one pass over all (image, class) pairs
            h = h.repeat_interleave(self.num_classes, dim=0)
            labels = torch.arange(self.num_classes, device=h.device).repeat(n)
        else:
            labels = y.to(h.device).long()
        for block in self.blocks:
            h = block(h, labels)
        h = F.relu(h) if self.head == "relu" else F.leaky_relu(h, LEAK)
        return h.sum(dim=(2, 3))

    def energy(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """E(x, y): (N,) for labels ``y`` (N,), or (N x K) for every class when ``y`` is None."""
        e = self.energy_head(self.pooled(x, y)).squeeze(1)
        return e.view(x.shape[0], self.num_classes) if y is None else e

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -self.energy(x)

    # timm's feature protocol (EnergyModel.features): the features of a class-conditional energy are each
    # class's pooled head input, concatenated (N x K*D); the head is linear in them, block by block.
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.pooled(x).reshape(x.shape[0], -1)

    def forward_head(self, h: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if pre_logits:
            return h
        return -self.energy_head(h.reshape(h.shape[0], self.num_classes, -1)).squeeze(-1)

    def get_classifier(self) -> nn.Module:
        """A linear layer (a copy, K x K*D, block-diagonal) with ``get_classifier()(features) == forward(x)``."""
        w, b = self.energy_head.weight.detach(), self.energy_head.bias.detach()
        head = nn.Linear(w.shape[1] * self.num_classes, self.num_classes).to(w.device, w.dtype)
        with torch.no_grad():
            head.weight.copy_(-torch.block_diag(*[w] * self.num_classes))
            head.bias.fill_(-float(b[0]))
        return head.requires_grad_(False)

    def class_logits(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """-E(x, y) for the given labels only (N,): what ``EnergyModel.log_pxy`` and class-conditional
        SGLD use, K times cheaper than ``forward(x)`` followed by a gather."""
        return -self.energy(x, y)
