"""Per-epoch sample grids: the replay buffer, and class-conditional samples, as PNG files.

Drawn by :func:`jemeval.plots.grids.save_image_grid` as one mosaic image per grid (fast enough
to write every epoch of a two-minute run).
Grids use their own random generator (seeded from the run's seed and the epoch), so writing them
never changes what training draws.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from jemeval.plots.grids import save_image_grid
from jemeval.sampling.buffer import ReplayBuffer, uniform_like_shape
from jemeval.sampling.sgld import SGLD

MAX_CLASS_ROWS = 10
PER_CLASS = 10
#: The names of the grids :func:`save_epoch_grids` writes into samples/ (a regular expression).
GRID_NAMES = r"(?:buffer|conditional)_epoch\d{3,}\.png"


def buffer_images(buffer: ReplayBuffer | None, last_samples: torch.Tensor | None, class_blocks: bool, num_classes: int,
                  generator: torch.Generator) -> tuple[torch.Tensor, list[str] | None, int]:
    """What the buffer grid shows: class rows of the buffer's class blocks, or a random 10 x 10."""
    if buffer is None:  # short-run chains: the last batch of samples
        x = last_samples[:100]
        return x, None, 10
    size = len(buffer)
    if class_blocks and num_classes <= MAX_CLASS_ROWS and size >= num_classes * PER_CLASS:
        per = size // num_classes
        idx = torch.cat([c * per + torch.randperm(per, generator=generator)[:PER_CLASS] for c in range(num_classes)])
        return buffer.data[idx.to(buffer.data.device)], [str(c) for c in range(num_classes)], PER_CLASS
    idx = torch.randperm(size, generator=generator)[:100]
    return buffer.data[idx.to(buffer.data.device)], None, 10


def conditional_samples(model, sgld: SGLD, buffer: ReplayBuffer | None, num_classes: int, input_shape,
                        generator: torch.Generator) -> tuple[torch.Tensor, list[str]]:
    """``PER_CLASS`` chains per class (first 10 classes) run on log p~(x, y) for the configured
    SGLD steps, started from random buffer entries (or U(-1, 1) without a buffer)."""
    device = next(model.parameters()).device
    k = min(num_classes, MAX_CLASS_ROWS)
    y = torch.arange(k).repeat_interleave(PER_CLASS)
    if buffer is not None:
        x0 = buffer.data[torch.randint(0, len(buffer), (len(y),), generator=generator).to(buffer.data.device)]
    else:
        x0 = uniform_like_shape(len(y), input_shape, generator=generator)
    noise_gen = torch.Generator(device=device).manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
    x = sgld.sample(model, x0.to(device), y.to(device), generator=noise_gen)
    return x, [str(c) for c in range(k)]


def save_epoch_grids(out_dir: Path, epoch: int, *, model, sgld: SGLD, buffer: ReplayBuffer | None,
                     last_samples: torch.Tensor | None, class_blocks: bool, num_classes: int, input_shape,
                     seed: int, log_grid: Callable[[str, torch.Tensor, int], None] | None = None) -> list[Path]:
    """Write samples/buffer_epochNNN.png and samples/conditional_epochNNN.png; ``log_grid(tag, images,
    nrow)`` also gets each grid's images (the run's loggers: ``buffer`` and ``conditional``)."""
    g = torch.Generator().manual_seed(seed * 100003 + epoch)
    folder = out_dir / "samples"
    folder.mkdir(exist_ok=True)  # inside the run folder, which the trainer created
    paths = []
    if buffer is not None or last_samples is not None:
        x, labels, ncol = buffer_images(buffer, last_samples, class_blocks, num_classes, g)
        what = "replay buffer" if buffer is not None else "short-run samples"
        paths.append(save_image_grid(x, folder / f"buffer_epoch{epoch:03d}.png", nrow=ncol, row_labels=labels,
                                 title=f"{what}, epoch {epoch}"))
        if log_grid is not None:
            log_grid("buffer", x, ncol)
    x, labels = conditional_samples(model, sgld, buffer, num_classes, input_shape, g)
    start = "the buffer" if buffer is not None else "U(-1, 1)"
    paths.append(save_image_grid(x, folder / f"conditional_epoch{epoch:03d}.png", nrow=PER_CLASS, row_labels=labels,
                             title=f"class-conditional SGLD, {sgld.steps} steps from {start}, epoch {epoch}"))
    if log_grid is not None:
        log_grid("conditional", x, PER_CLASS)
    return paths
