"""A generated image folder of 10 classes of 32 x 32 RGB images, the layout a user's own photos have.

    write_rgb_folder(root, n_train=600, n_test=200, seed=0)   # root/train/<class>/*.png, root/test/<class>/*.png

The classes are 5 shapes (disk, square, ring, plus, triangle) x 2 colour families (warm, cool): a
shape of random place and size, its colour jittered around the family's, on a randomly tinted
background with a random linear gradient, a faint random stripe texture and pixel noise. Learnable
(a plain classifier reaches 90% and more, docs/data.md) but not trivial: neither the colour nor the
position alone tells the class. Deterministic from ``seed``: the same seed writes the same bytes
(PNG is lossless and PIL's encoder is deterministic), and train and test draw from separate
streams of it, so no test image is a training image. ``easy=True`` makes a set a few iterations
learn (larger shapes, no texture, little noise) for the CI test.

Used by benchmarks/rgb_folder.py (the table in docs/data.md) and tests/test_rgb_folder.py.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

SIZE = 32
SHAPES = ("disk", "square", "ring", "plus", "triangle")
FAMILIES = {"warm": (1.0, 0.35, 0.15), "cool": (0.15, 0.45, 1.0)}
#: class folder names, in label order (sorted, as image folders index their classes)
CLASSES = tuple(sorted(f"{family}_{shape}" for family in FAMILIES for shape in SHAPES))


def images(labels: np.ndarray, rng: np.random.Generator, *, easy: bool = False) -> np.ndarray:
    """uint8 images (N x 32 x 32 x 3) of the classes ``labels`` (indices into :data:`CLASSES`), all at once."""
    n = len(labels)
    family = np.array([FAMILIES[CLASSES[c].split("_")[0]] for c in range(len(CLASSES))])[labels]
    shape = np.array([SHAPES.index(CLASSES[c].split("_")[1]) for c in range(len(CLASSES))])[labels]
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
    low, high = (8.0, 12.0) if easy else (6.0, 10.0)
    cy, cx = (rng.uniform(low + 3, SIZE - low - 3, (n, 1, 1)) for _ in range(2))
    r = rng.uniform(low, high, (n, 1, 1))
    dy, dx = yy - cy, xx - cx
    dist, box = np.hypot(dy, dx), np.maximum(abs(dy), abs(dx))
    masks = np.stack([dist < r, box < 0.8 * r, abs(dist - r) < 1.2 + 0.15 * r,
                      (np.minimum(abs(dy), abs(dx)) < 0.2 * r) & (box < r),
                      (abs(dy) < r) & (abs(dx) < 0.5 + 0.5 * (dy + r))])  # 5 x N x 32 x 32
    mask = masks[shape, np.arange(n)]
    tilt = rng.uniform(-0.3, 0.3, (n, 3, 2, 1, 1))
    x = rng.uniform(-0.6, 0.2, (n, 3, 1, 1)) + (tilt[:, :, 0] * (yy - 16) + tilt[:, :, 1] * (xx - 16)) / 16
    if not easy:  # a faint stripe texture of random direction and period on the background
        angle, period = rng.uniform(0, np.pi, (n, 1, 1)), rng.uniform(3, 8, (n, 1, 1))
        stripes = np.sin(2 * np.pi * (np.cos(angle) * xx + np.sin(angle) * yy) / period)
        x += 0.1 * stripes[:, None]
    x += rng.normal(0, 0.03 if easy else 0.06, x.shape)
    colour = family + rng.normal(0, 0.15 if easy else 0.2, (n, 3))
    x = np.where(mask[:, None], x + colour[:, :, None, None], x)
    return (np.clip(x, -1, 1) * 127.5 + 127.5).round().astype(np.uint8).transpose(0, 2, 3, 1)


def write_split(folder: Path, n: int, rng: np.random.Generator, *, easy: bool = False) -> None:
    """``n`` images, the classes in turn (n // 10 or n // 10 + 1 each), as folder/<class>/<index>.png."""
    from PIL import Image

    labels = np.arange(n) % len(CLASSES)
    pixels = images(labels, rng, easy=easy)
    for name in CLASSES:
        (folder / name).mkdir(parents=True, exist_ok=True)
    for i, (image, label) in enumerate(zip(pixels, labels)):
        Image.fromarray(image).save(folder / CLASSES[label] / f"{i:05d}.png")


def write_rgb_folder(root, n_train: int = 600, n_test: int = 200, *, seed: int = 0, easy: bool = False) -> str:
    """Write root/train and root/test (see the module's docstring); returns the spec ``folder:ROOT``."""
    root = Path(root)
    train_rng, test_rng = (np.random.default_rng([seed, stream]) for stream in (0, 1))
    write_split(root / "train", n_train, train_rng, easy=easy)
    write_split(root / "test", n_test, test_rng, easy=easy)
    return f"folder:{root}"
