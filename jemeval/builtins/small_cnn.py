"""A small convolutional network sized for 8 x 8 (digits) and 28 x 28 inputs.

Built in the JEM spirit: no BatchNorm (sampling and training see the same function), LeakyReLU(0.2)
(non-zero gradients everywhere help SGLD), global average pooling. On 8 x 8 digits it trains to
> 95% accuracy in seconds on a laptop CPU, which makes it the embedded default.

``stride=2`` makes the first convolution a strided one: the rest of the network then runs on a
quarter of the positions (a quarter of the work of the full-resolution layers) and sees twice as
far. A dataset of 32 x 32 images or larger without settings of its own gets it (``cnn:stride=2``,
:data:`jemeval.training.recipes.STRIDED_FROM`); the layers and their names are the same for every
stride, so ``stride=1`` is the digits network exactly.
"""
from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int, input_shape=(1, 8, 8), *, width: int = 32, stride: int = 1,
                 leak: float = 0.2):
        super().__init__()
        c = input_shape[0]
        w = int(width)
        act = lambda: nn.LeakyReLU(leak)  # noqa: E731
        self.features = nn.Sequential(
            nn.Conv2d(c, w, 3, stride=int(stride), padding=1), act(),
            nn.Conv2d(w, 2 * w, 3, padding=1), act(),
            nn.Conv2d(2 * w, 2 * w, 3, stride=2, padding=1), act(),
            nn.Conv2d(2 * w, 4 * w, 3, padding=1), act(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(4 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    # timm's feature protocol, which EnergyModel.features reads: pooled penultimate features, the linear head
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def forward_head(self, h: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return h if pre_logits else self.head(h)

    def get_classifier(self) -> nn.Module:
        return self.head
