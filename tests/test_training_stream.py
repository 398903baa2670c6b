"""Issue 37, item 2: training holds an npz's images as stored (uint8, memory-mapped) and converts each
batch, instead of the whole set as float; the run is bit for bit the one trained on the same images
held whole as float tensors (the path every set took before)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import jemeval
from jemeval import testing
from jemeval.data import ArrayDataset
from jemeval.formats.native import read_checkpoint
from jemeval.stored_images import StoredRows
from jemeval.training import resolve_config, train
from jemeval.training.splits import prepare_data

TINY = {"arch": "cnn:width=8", "epochs": 2, "batch_size": 16, "lr": 2e-3, "warmup_iters": 2, "decay_epochs": (),
        "sgld_steps": 2, "buffer_size": 40, "val_size": 20, "progress": False, "check_every": 2, "device": "cpu",
        "augment": "pad=1,flip=1"}


def floats(x: np.ndarray) -> torch.Tensor:
    """uint8 N x H x W x C -> the float32 N x C x H x W in [-1, 1] the npz loader has always made."""
    return torch.from_numpy(x.transpose(0, 3, 1, 2).astype(np.float32) / np.float32(255.0) * np.float32(2)
                            - np.float32(1)).contiguous()


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 150)
    x = np.clip(y[:, None, None, None] * 60 + rng.integers(0, 100, (150, 8, 8, 3)), 0, 255).astype(np.uint8)
    return x[:110], y[:110], x[110:], y[110:]


class InMemory:
    """The same images as a plugin set held whole as float tensors (what training did with every set)."""

    def __init__(self, arrays):
        self.arrays = arrays

    @jemeval.hookimpl
    def register_datasets(self, register):
        def held(split, root, download):
            x, y = self.arrays[:2] if split == "train" else self.arrays[2:]
            ds = ArrayDataset(floats(x), torch.from_numpy(y), num_classes=3, name="held")
            ds.splits = ("train", "test")
            return ds

        register("test-held-floats", held)


def test_npz_training_is_streamed_and_equals_training_on_float_tensors(tmp_path, arrays):
    x, y, xt, yt = arrays
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, x_test=xt, y_test=yt)
    streamed_config = resolve_config(f"npz:{tmp_path / 'd.npz'}", **{**TINY, "out": str(tmp_path / "s")})
    data = prepare_data(streamed_config, torch.device("cpu"))
    assert isinstance(data.x, StoredRows) and data.x.base.stored.dtype == np.uint8  # never whole as float
    assert isinstance(data.x.base.stored, np.memmap) and isinstance(data.x_val, StoredRows)
    streamed = train(streamed_config).records[0]
    with testing.registered_plugin(InMemory(arrays), name="test-held-floats"):
        held = train(resolve_config("test-held-floats", **{**TINY, "out": str(tmp_path / "h")})).records[0]
    a, b = read_checkpoint(streamed["last"]), read_checkpoint(held["last"])
    assert a["state_dict"].keys() == b["state_dict"].keys()
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    assert torch.equal(a["replay_buffer"], b["replay_buffer"])
    metrics = [[{k: v for k, v in r.items() if k not in ("seconds", "images_per_s")}
                for r in c["training_state"]["metrics"]] for c in (a, b)]
    assert metrics[0] == metrics[1] and len(metrics[0]) == 2
    assert (streamed["best_val_acc"], streamed["test_acc"]) == (held["best_val_acc"], held["test_acc"])
    assert streamed["test_acc"] is not None
