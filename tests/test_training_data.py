"""The training data (jemeval.training.splits, augment): a fixed validation split and labelled
subset, and tensor-level augmentation checked against a per-image reference."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from jemeval.errors import UsageError
from jemeval.training.augment import Augment, augment_for, parse_augment
from jemeval.training.splits import labelled_subset, split_indices


def test_augment_matches_per_image_reference():
    x = torch.randn(6, 3, 8, 8)
    aug = Augment(pad=2, flip=True)
    out = aug(x, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)  # replay the same draws: oy, ox, flip
    oy, ox = torch.randint(0, 5, (6,), generator=g), torch.randint(0, 5, (6,), generator=g)
    flip = torch.rand(6, generator=g) < 0.5
    for i in range(6):
        ref = F.pad(x[i:i + 1], (2, 2, 2, 2), mode="reflect")[0, :, oy[i]:oy[i] + 8, ox[i]:ox[i] + 8]
        if flip[i]:
            ref = ref.flip(2)
        assert torch.equal(out[i], ref)
    assert parse_augment("pad=4,flip=0") == Augment(4, False) and parse_augment("none") == Augment()
    assert augment_for("auto", {"augment": {"pad": 4, "flip": True}}, (3, 32, 32)) == Augment(4, True)
    with pytest.raises(UsageError, match="too large") as exc:
        augment_for("pad=8", {}, (1, 8, 8))
    assert exc.value.param == "augment"


def test_validation_split_and_labelled_subset_are_fixed_and_exact():
    tr, va = split_indices(100, 20, seed=1234)
    assert len(va) == 20 and len(np.intersect1d(tr, va)) == 0 and len(tr) + len(va) == 100
    assert np.array_equal(va, split_indices(100, 20, seed=1234)[1])
    labels = np.repeat(np.arange(4), 10)
    sub = labelled_subset(labels, 3, 4, seed=7)
    assert np.array_equal(np.bincount(labels[sub]), [3, 3, 3, 3])
    assert np.array_equal(sub, labelled_subset(labels, 3, 4, seed=7))
    with pytest.raises(UsageError, match="more than") as exc:
        labelled_subset(labels, 11, 4, seed=7)
    assert exc.value.param == "labels_per_class"
