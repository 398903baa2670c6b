"""The pre-activation Wide ResNet of the JEM release, with the same module names.

Layout (the JEM release's wideresnet.py, see docs/interop.md): stages 16 / 16k / 32k / 64k,
(depth - 4) / 6 blocks per stage.
Block: norm -> LeakyReLU(0.2) -> conv3x3 (bias) -> dropout -> norm -> LeakyReLU(0.2) -> conv3x3
(bias, carries the stride); shortcut conv1x1 with bias when stride or width changes. Head: norm ->
LeakyReLU(0.2) -> global average pool -> Linear(64k, K) named ``class_output``.

Parameter names match the release (``f.conv1``, ``f.layer1.0.conv1``, ``f.bn1``, ``class_output``)
so its checkpoints load directly; its unused ``f.linear`` and ``energy_output`` heads are dropped
on load. The pooling is adaptive, which equals the release's ``avg_pool2d(out, 8)`` on 32 x 32
inputs and also works on smaller images.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

NORMS = (None, "batch")


def make_norm(channels: int, norm: str | None) -> nn.Module:
    if norm is None:
        return nn.Identity()
    if norm == "batch":
        return nn.BatchNorm2d(channels, momentum=0.9)  # the release's setting
    raise ValueError(f"unknown norm {norm!r}; choose none or batch")


class WideBasic(nn.Module):
    def __init__(self, in_planes: int, planes: int, dropout: float, stride: int, norm: str | None, leak: float):
        super().__init__()
        self.lrelu = nn.LeakyReLU(leak)
        self.bn1 = make_norm(in_planes, norm)
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, padding=1, bias=True)
        self.dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
        self.bn2 = make_norm(planes, norm)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=True)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.dropout(self.conv1(self.lrelu(self.bn1(x))))
        out = self.conv2(self.lrelu(self.bn2(out)))
        return out + self.shortcut(x)


class WideResNetBackbone(nn.Module):
    """Everything up to the pooled features (the release's ``Wide_ResNet`` minus its unused head)."""

    def __init__(self, depth: int, widen: int, *, in_channels: int = 3, norm: str | None = None,
                 dropout: float = 0.0, leak: float = 0.2):
        super().__init__()
        if (depth - 4) % 6 != 0 or depth < 10:
            raise ValueError(f"WRN depth must be 6n + 4 (10, 16, 22, 28, ...), got {depth}")
        n = (depth - 4) // 6
        stages = [16, 16 * widen, 32 * widen, 64 * widen]
        self.lrelu = nn.LeakyReLU(leak)
        self.conv1 = nn.Conv2d(in_channels, stages[0], kernel_size=3, stride=1, padding=1, bias=True)
        in_planes = stages[0]
        layers = []
        for planes, stride in zip(stages[1:], (1, 2, 2)):
            blocks = []
            for s in [stride] + [1] * (n - 1):
                blocks.append(WideBasic(in_planes, planes, dropout, s, norm, leak))
                in_planes = planes
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = layers
        self.bn1 = make_norm(stages[3], norm)
        self.last_dim = stages[3]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(x)
        out = self.layer3(self.layer2(self.layer1(out)))
        out = self.lrelu(self.bn1(out))
        return F.adaptive_avg_pool2d(out, 1).flatten(1)


class WRN(nn.Module):
    """WRN classifier with the release's parameter names (``f`` backbone, ``class_output`` head)."""

    def __init__(self, num_classes: int, input_shape=(3, 32, 32), *, depth: int = 28, widen: int = 10,
                 norm: str | None = None, dropout: float = 0.0):
        super().__init__()
        self.f = WideResNetBackbone(depth, widen, in_channels=input_shape[0], norm=norm, dropout=dropout)
        self.class_output = nn.Linear(self.f.last_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.class_output(self.f(x))

    # timm's feature protocol, which EnergyModel.features reads: pooled penultimate features, the linear head
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(x)

    def forward_head(self, h: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return h if pre_logits else self.class_output(h)

    def get_classifier(self) -> nn.Module:
        return self.class_output
