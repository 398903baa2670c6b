"""Batch augmentation on tensors, on the training device (no per-image Python, no DataLoader).

The JEM release augments CIFAR with reflect-pad 4 + random 32 crop + horizontal flip (SVHN: no
flip), then scales to [-1, 1] and adds sigma noise. Here the images are already in [-1, 1]; padding
by reflection commutes with that affine scaling, so the result is the same. The recipe comes from
the dataset itself (``ds.info["augment"]``, e.g. ``{"pad": 4, "flip": True}``) unless the user
names one (``pad=2,flip=0``) or ``none``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from jemeval.errors import UsageError


@dataclass(frozen=True)
class Augment:
    """Random crop after reflect padding by ``pad`` pixels, and random horizontal flips."""

    pad: int = 0
    flip: bool = False

    @property
    def active(self) -> bool:
        return self.pad > 0 or self.flip

    def settings(self) -> dict:
        return {"pad": self.pad, "flip": self.flip, "mode": "reflect"}

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Augment a batch N x C x H x W; each image gets its own crop offset and flip."""
        n, _, h, w = x.shape
        if self.pad > 0:
            p = self.pad
            padded = F.pad(x, (p, p, p, p), mode="reflect")
            oy = torch.randint(0, 2 * p + 1, (n,), generator=generator, device=x.device)
            ox = torch.randint(0, 2 * p + 1, (n,), generator=generator, device=x.device)
            rows = (oy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]  # N,1,H,1
            cols = (ox[:, None] + torch.arange(w, device=x.device))[:, None, None, :]  # N,1,1,W
            batch = torch.arange(n, device=x.device)[:, None, None, None]
            chans = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
            x = padded[batch, chans, rows, cols]
        if self.flip:
            flip = torch.rand(n, generator=generator, device=x.device) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(3), x)
        return x


def parse_augment(text: str) -> Augment:
    """``"pad=4,flip=1"`` -> Augment(4, True); ``"none"`` -> no augmentation."""
    text = (text or "").strip()
    if text in ("", "none"):
        return Augment()
    values: dict[str, int] = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if key == "flip" and not eq:
            value, eq = "1", "="
        if key not in ("pad", "flip") or not eq:
            raise UsageError(f"bad augment {text!r}: write 'auto', 'none' or e.g. 'pad=4,flip=1'", param="augment")
        try:
            values[key] = int(value)
        except ValueError:
            raise UsageError(f"bad augment {text!r}: {key} takes an integer, e.g. 'pad=4,flip=1'",
                             param="augment") from None
    if values.get("pad", 0) < 0:
        raise UsageError(f"bad augment {text!r}: pad must be >= 0", param="augment")
    return Augment(pad=values.get("pad", 0), flip=bool(values.get("flip", 0)))


def augment_for(setting: str, dataset_info: dict | None, input_shape) -> Augment:
    """Resolve ``auto`` from the dataset's own recipe; check the padding fits the image."""
    if setting == "auto":
        recipe = (dataset_info or {}).get("augment") or {}
        aug = Augment(pad=int(recipe.get("pad", 0)), flip=bool(recipe.get("flip", False)))
    else:
        aug = parse_augment(setting)
    if aug.pad and aug.pad >= min(input_shape[-2:]):
        raise UsageError(f"augment pad={aug.pad} is too large for {input_shape[-2]}x{input_shape[-1]} images",
                         param="augment")
    return aug
