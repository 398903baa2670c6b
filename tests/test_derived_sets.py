"""Issue 37, item 2: ``interp:``, ``rotate:``, ``flip:`` and ``constant`` are drawn batch by batch from
their base's rows, bit for bit the images the old whole build made (written out here as it was), and
no batch read holds more than the batch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from jemeval.data import iterate_batches, load_dataset, take, to_arrays
from jemeval.derived_images import DerivedArray
from jemeval.errors import UsageError
from jemeval.evaluation.ood.fit import dataset_fingerprint
from jemeval.stored_images import StoredImages


def old_interp(x: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """The whole build jemeval made before issue 37: a seeded permutation without fixed points."""
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(len(x), generator=g)
    same = perm == torch.arange(len(x))
    perm[same] = (perm[same] + 1) % len(x)
    return (x + x[perm]) / 2


def batches(ds, size):
    xs, ys = zip(*iterate_batches(ds, size))
    return torch.cat(xs), torch.cat(ys)


@pytest.fixture
def npz_file(tmp_path):
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (53, 6, 5, 3), dtype=np.uint8), y=rng.integers(0, 4, 53))
    return tmp_path / "d.npz"


@pytest.mark.parametrize("base", ["digits", "npz", "folder"])
def test_derived_sets_equal_the_old_whole_build_bit_for_bit(base, npz_file, tmp_path):
    if base == "npz":
        base = f"npz:{npz_file}"
    elif base == "folder":  # a decoded set (neither in memory nor stored): read through a DataLoader
        from PIL import Image

        rng = np.random.default_rng(1)
        for i in range(11):
            folder = tmp_path / "imgs" / f"c{i % 2}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (7, 7, 3), dtype=np.uint8)).save(folder / f"{i}.png")
        base = f"folder:{tmp_path / 'imgs'}"
    split = "train" if base.startswith("folder") else "test"
    source = load_dataset(base, split)
    x, y = to_arrays(source)
    expected = {
        f"interp:{base}": (old_interp(x), torch.full_like(y, -1)),
        f"interp:{base},seed=5": (old_interp(x, 5), torch.full_like(y, -1)),
        f"rotate:{base}": (torch.rot90(x, 1, dims=(2, 3)).contiguous(), y),
        f"rotate:{base},k=3": (torch.rot90(x, 3, dims=(2, 3)).contiguous(), y),
        f"flip:{base}": (torch.flip(x, dims=(3,)), y),
    }
    for spec, (want_x, want_y) in expected.items():
        ds = load_dataset(spec, split)
        assert isinstance(ds, StoredImages) and isinstance(ds.stored, DerivedArray), spec
        assert ds.input_shape == tuple(want_x.shape[1:]) and len(ds) == len(want_x)
        for size in (7, 256):  # batch boundaries do not matter
            got_x, got_y = batches(ds, size)
            assert got_x.dtype == torch.float32 and torch.equal(got_x, want_x), spec
            assert torch.equal(got_y, want_y), spec
        rows = np.array([9, 2, 2, len(ds) - 1, 0])  # a subset in any order, through take()
        assert torch.equal(batches(take(ds, rows), 3)[0], want_x[torch.from_numpy(rows)]), spec
        assert torch.equal(ds[4][0], want_x[4]) and ds[4][1] == int(want_y[4])


def test_class_subset_of_a_rotated_set_keeps_the_labels():
    x, y = to_arrays(load_dataset("digits", "test"))
    keep = (y < 5).numpy()
    got_x, got_y = batches(load_dataset("rotate:digits[0-4]", "test"), 64)
    assert torch.equal(got_x, torch.rot90(x[keep], 1, dims=(2, 3))) and torch.equal(got_y, y[keep])


def test_constant_is_one_broadcast_image_and_refuses_values_outside_the_range():
    ds = load_dataset("constant", input_shape=(3, 4, 5), n=300, value=0.25)
    old = torch.full((300, 3, 4, 5), 0.25)
    got_x, got_y = batches(ds, 128)
    assert torch.equal(got_x, old) and (got_y == -1).all() and got_x.is_contiguous()
    assert ds.stored.strides[0] == 0  # no memory per image
    got_x[0, 0, 0, 0] = 7  # a batch is its own copy
    assert torch.equal(batches(ds, 128)[0], old)
    with pytest.raises(UsageError, match=r"must lie in \[-1, 1\]"):
        load_dataset("constant", input_shape=(1, 2, 2), value=3)


def test_splits_follow_the_base_and_fingerprints_name_the_base(npz_file, tmp_path):
    assert load_dataset(f"rotate:npz:{npz_file}").splits == ()
    assert load_dataset("interp:digits").splits == ("train", "test")
    # a cached detector fit keyed on an interp set must change when the base's images do
    one = dataset_fingerprint(load_dataset(f"interp:npz:{npz_file}"))
    rng = np.random.default_rng(4)
    other = tmp_path / "other"
    other.mkdir()
    np.savez(other / "d.npz", x=rng.integers(0, 256, (53, 6, 5, 3), dtype=np.uint8), y=rng.integers(0, 4, 53))
    assert dataset_fingerprint(load_dataset(f"interp:npz:{other / 'd.npz'}")) != one
    assert dataset_fingerprint(load_dataset(f"interp:npz:{npz_file}")) == one


def test_a_batch_reads_only_its_rows_and_its_partners(npz_file):
    """The memory promise, by behaviour: reading a batch of the derived set touches the base for
    exactly those rows (and for interp their partners), never the whole set."""
    seen: list[int] = []
    ds = load_dataset(f"interp:npz:{npz_file}")
    base = ds.stored.base
    original = base.rows

    def spy(index):
        seen.extend(np.arange(len(base))[index].tolist())
        return original(index)

    base.rows = spy
    next(iterate_batches(ds, 8))
    assert len(seen) == 16 and set(range(8)) <= set(seen)
