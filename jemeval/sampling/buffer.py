"""The replay buffer: persistent chains for PCD training and for sampling from a checkpoint.

JEM keeps 10,000 images initialised U(-1, 1); each training iteration draws chain starts (each
re-initialised from U(-1, 1) with probability ``reinit_freq``), runs SGLD on them and writes the
new states back. Class-conditional draws treat the buffer as contiguous class blocks, as the JEM
release does. Write-back is deterministic even when one batch names a slot twice.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

#: Where chains (re)start: ``starts(n, y, generator=..., device=...)`` -> ``n`` images (``y``: the chains'
#: classes, or None); None means JEM's U(-1, 1) (:func:`uniform_like_shape`).
ChainStarts = Callable[..., torch.Tensor]


def last_writer(idx: torch.Tensor, size: int) -> torch.Tensor:
    """For each position of ``idx``, the position of the LAST occurrence of its index.

    Buffer draws are with replacement, so a batch may name the same slot twice; a plain
    ``data[idx] = x`` then lets thread timing pick the winner and CPU runs stop being
    reproducible. Writing ``x[last_writer(idx, size)]`` gives all duplicates the same value.
    No host synchronisation.
    """
    pos = torch.arange(len(idx), device=idx.device)
    last = torch.full((size,), -1, dtype=torch.long, device=idx.device).scatter_reduce_(0, idx, pos, reduce="amax")
    return last[idx]


def uniform_like_shape(n: int, shape: Sequence[int], *, device=None, generator=None) -> torch.Tensor:
    """U(-1, 1) images, the JEM chain initialisation."""
    return torch.rand((n, *shape), generator=generator, device=device) * 2 - 1


class ReplayBuffer:
    """Persistent chains for PCD training and for sampling from a checkpoint.

    ``size`` images initialised U(-1, 1) on ``device``. :meth:`sample` draws chain starts, each
    re-initialised from U(-1, 1) with probability ``reinit_freq``; :meth:`push` writes the chains'
    new states back; ``starts`` replaces U(-1, 1) in both (e.g.
    :meth:`~jemeval.sampling.gaussian_starts.GaussianStarts.mixture`). Class-conditional draws treat the
    buffer as ``num_classes`` contiguous blocks (index = y * (size // K) + offset), as the JEM release does.
    """

    def __init__(
        self,
        size: int,
        input_shape: Sequence[int],
        *,
        num_classes: int | None = None,
        reinit_freq: float = 0.05,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
        starts: ChainStarts | None = None,
    ) -> None:
        if size <= 0:
            raise ValueError(f"replay buffer size must be > 0, got {size}")
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.reinit_freq = float(reinit_freq)
        self.device = torch.device(device)
        self.starts = starts
        self.data = self._fresh(size, None, generator)

    def __len__(self) -> int:
        return self.data.shape[0]

    def sample(
        self, n: int, y: torch.Tensor | None = None, *, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x0, indices): ``n`` chain starts, on the buffer's device."""
        size = len(self)
        if y is None:
            idx = torch.randint(0, size, (n,), generator=generator, device=self.device)
        else:
            if not self.num_classes:
                raise ValueError("class-conditional sampling needs a buffer built with num_classes")
            per_class = size // self.num_classes
            offset = torch.randint(0, per_class, (n,), generator=generator, device=self.device)
            idx = y.to(self.device) * per_class + offset
        x0 = self.data[idx]
        fresh = self._fresh(n, y, generator)
        reinit = torch.rand(n, generator=generator, device=self.device) < self.reinit_freq
        x0 = torch.where(reinit.view(-1, *([1] * len(self.input_shape))), fresh, x0)
        return x0, idx

    def _fresh(self, n: int, y: torch.Tensor | None, generator: torch.Generator | None) -> torch.Tensor:
        if self.starts is None:
            return uniform_like_shape(n, self.input_shape, device=self.device, generator=generator)
        return self.starts(n, y, generator=generator, device=self.device)

    def push(self, idx: torch.Tensor, x: torch.Tensor) -> None:
        """Write chains back; with duplicate indices the last one wins, deterministically."""
        idx = idx.to(self.data.device)
        x = x.detach().to(self.data.device, self.data.dtype)
        self.data[idx] = x[last_writer(idx, len(self))]

    def state_dict(self) -> dict:
        return {"data": self.data, "reinit_freq": self.reinit_freq, "num_classes": self.num_classes}

    @classmethod
    def from_tensor(cls, data: torch.Tensor, *, num_classes=None, reinit_freq=0.05, device="cpu") -> ReplayBuffer:
        buf = cls.__new__(cls)
        buf.input_shape = tuple(data.shape[1:])
        buf.num_classes = num_classes
        buf.reinit_freq = float(reinit_freq)
        buf.device = torch.device(device)
        buf.starts = None
        buf.data = data.to(buf.device, torch.float32).clone()
        return buf
