"""Image grids: samples one row per class, distal adversarials one row per target; pixels from [-1, 1].

The mosaic itself is ``torchvision.utils.make_grid`` (:func:`grid_image`); matplotlib adds the labels.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from jemeval.plots import pyplot, save_figure


def to_display(x: torch.Tensor) -> np.ndarray:
    """N x C x H x W in [-1, 1] -> N x H x W x C in [0, 1] (values outside are clipped)."""
    x = ((x.detach().float().cpu() + 1.0) / 2.0).clamp(0, 1)
    return x.permute(0, 2, 3, 1).numpy()


def grid_image(x: torch.Tensor, ncol: int, pad: int = 1) -> torch.Tensor:
    """N x C x H x W in [-1, 1] -> one 3 x H' x W' image in [0, 1] (``torchvision.utils.make_grid``):
    ``ncol`` images per row, ``pad`` white pixels around and between them, empty cells white, gray
    images repeated to RGB. What the trainer's loggers receive (TensorBoard, wandb take this layout).

    make_grid returns a lone image unpadded and makes a short single row only as wide as its images;
    both are padded here to the layout of every other grid (a row of ``ncol`` cells, a white border).
    """
    from torchvision.utils import make_grid

    imgs = ((x.detach().float().cpu() + 1.0) / 2.0).clamp(0, 1)  # NaN (a blank cell) stays NaN
    n, ncol = len(imgs), max(1, int(ncol))
    if n == 1 and ncol == 1:
        return torch.nn.functional.pad(make_grid(imgs, nrow=1, padding=0), (pad, pad, pad, pad), value=1.0)
    if n < ncol:
        imgs = torch.cat([imgs, imgs.new_ones(ncol - n, *imgs.shape[1:])])
    return make_grid(imgs, nrow=ncol, padding=pad, pad_value=1.0)


def mosaic(x: torch.Tensor, ncol: int, pad: int = 1) -> np.ndarray:
    """N x C x H x W in [-1, 1] -> one H' x W' x C array in [0, 1], ``ncol`` images per row, white gaps
    (:func:`grid_image`, with gray images back to one channel)."""
    grid = grid_image(x, ncol, pad)
    channels = x.shape[1] if x.ndim == 4 else 1
    return np.ascontiguousarray(grid[:channels].permute(1, 2, 0).numpy())


def _save_mosaic(x: torch.Tensor, path: str | Path, *, ncol: int, row_labels: Sequence[str] | None = None,
                title: str | None = None) -> Path:
    plt = pyplot()
    canvas = mosaic(x, ncol)
    h, w = canvas.shape[:2]
    scale = 6.0 / max(h, w)
    width = max(2.0, w * scale + (0.6 if row_labels else 0))
    fig, ax = plt.subplots(figsize=(width, max(2.0, h * scale + (0.4 if title else 0))))
    if canvas.shape[-1] == 1:
        ax.imshow(canvas[..., 0], cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    else:
        ax.imshow(canvas, interpolation="nearest")
    ax.set_xticks([])
    if row_labels:
        cell = (h - 1) / len(row_labels)
        ax.set_yticks([1 + cell * (i + 0.5) for i in range(len(row_labels))], list(row_labels), fontsize=8)
        ax.tick_params(length=0)
    else:
        ax.set_yticks([])
    for s in ax.spines.values():
        s.set_visible(False)
    if title:
        ax.set_title(title, fontsize=9)
    save_figure(fig, path)
    return Path(path)


def save_image_grid(x: torch.Tensor, path: str | Path, *, nrow: int | None = None,
                    row_labels: Sequence[str] | None = None, title: str | None = None,
                    captions: Sequence[str] | None = None) -> Path:
    """Save ``x`` (N x C x H x W in [-1, 1]) as a PNG grid of ``nrow`` images per row.

    ``row_labels`` names each row (e.g. the class); ``captions`` labels each image (e.g. a
    confidence). Grayscale images are drawn in gray, colour images as RGB. Without captions the
    grid is drawn as ONE image (a mosaic): ~50 ms instead of seconds for one axis per image, which
    matters for the trainer's per-epoch grids.
    """
    n = len(x)
    ncol = nrow or int(np.ceil(np.sqrt(n)))
    if captions is None:
        return _save_mosaic(x, path, ncol=ncol, row_labels=row_labels, title=title)
    plt = pyplot()
    imgs = to_display(x)
    nrows = int(np.ceil(n / ncol)) if n else 1
    size = 1.0 if imgs.shape[1] <= 16 else 1.2
    figsize = (ncol * size + (0.8 if row_labels else 0), nrows * size + (0.4 if title else 0))
    fig, axes = plt.subplots(nrows, ncol, figsize=figsize, squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.set_xticks([])
        ax.set_yticks([])
        for s in ax.spines.values():
            s.set_visible(False)
        if i < n:
            img = imgs[i]
            if img.shape[-1] == 1:
                ax.imshow(img[..., 0], cmap="gray", vmin=0, vmax=1, interpolation="nearest")
            else:
                ax.imshow(img, interpolation="nearest")
            if captions is not None and i < len(captions):
                ax.set_title(captions[i], fontsize=6)
        if row_labels is not None and i % ncol == 0 and i // ncol < len(row_labels):
            ax.set_ylabel(str(row_labels[i // ncol]), rotation=0, ha="right", va="center", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    save_figure(fig, path)
    return Path(path)


# -- grids of a command's output -------------------------------------------------------------------
def grid_rows(samples, per_row: int) -> tuple[torch.Tensor, list[str], list[str]]:
    """Images of :class:`~jemeval.artifacts.Samples` laid out one row per class (at most ``per_row``
    each): the target class of conditional samples, the predicted class of unconditional ones. Short
    rows are padded with NaN images, which matplotlib leaves blank."""
    group = samples.target if samples.conditional else samples.predicted
    prefix = "y=" if samples.conditional else "pred "
    blank = torch.full_like(samples.x[:1], float("nan"))
    rows, labels, captions = [], [], []
    per_row = max(1, min(per_row, int(torch.bincount(group - group.min()).max()) if len(group) else 1))
    for c in torch.unique(group).tolist():
        idx = torch.nonzero(group == c).flatten()[:per_row]
        pad = per_row - len(idx)
        rows.append(torch.cat([samples.x[idx], blank.expand(pad, *blank.shape[1:])]))
        labels.append(f"{prefix}{c}")
        captions += [f"{int(p)} {float(q):.2f}" for p, q in zip(samples.predicted[idx], samples.confidence[idx])]
        captions += [""] * pad
    return torch.cat(rows), labels, captions


def save_samples_grid(samples, path: str | Path, per_row: int = 10) -> Path:
    """A PNG grid of :class:`~jemeval.artifacts.Samples`, one row per class (:func:`grid_rows`), each
    image captioned "predicted confidence", titled with how the samples were drawn."""
    x, labels, captions = grid_rows(samples, per_row)
    per_row = len(captions) // max(len(labels), 1)
    s = samples.settings
    sgld = s["sgld"]
    kind = "class-conditional, rows = target class" if samples.conditional else "unconditional, rows = predicted class"
    title = (f"SGLD samples ({kind}); init {s['init']}, {sgld['steps']} SGLD steps, "
             f"step {sgld['step_size']:g}, noise {sgld['noise']:g}"
             + (f", top {s['top_confident']:g}% confident" if s["top_confident"] else ""))
    return save_image_grid(x, path, nrow=per_row, row_labels=labels, title=title, captions=captions)


def save_distal_grid(result, path: str | Path) -> Path:
    """The images of a ``distal`` result, one row per target, each captioned with p(target | x)."""
    settings = result.provenance["settings"]
    steps, k = settings["steps"], settings["refinement"]["refine_steps"]
    return save_image_grid(result.extra["images"].x, path, nrow=settings["n"],
                           row_labels=[f"y={t}" for t in settings["targets"]],
                           captions=[f"{float(c):.2f}" for c in result.extra["confidences"]],
                           title=f"distal adversarials: p(target | x) after {steps} steps, K={k}")
