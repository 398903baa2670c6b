"""Shared fixtures. Models are trained once per test session and kept small: CI has 2 CPU cores."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def _train_digits_classifier(path, epochs=15, seed=0):
    """A plain cross-entropy CNN on digits (about 2 s): the classifier baseline fixture."""
    import jemeval
    from jemeval.checkpoints import save_checkpoint

    torch.manual_seed(seed)
    ds = jemeval.load_dataset("digits", "train")
    model = jemeval.create_model("cnn", 10, (1, 8, 8), width=16)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(ds), generator=g)
        for i in range(0, len(ds), 64):
            idx = perm[i:i + 64]
            loss = torch.nn.functional.cross_entropy(model(ds.x[idx]), ds.y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    save_checkpoint(path, model, dataset="digits", config={"fixture": "digits_classifier", "epochs": epochs})
    return path


@pytest.fixture(scope="session")
def digits_classifier_ckpt(tmp_path_factory):
    """Path to a checkpoint of a plain digits classifier (cnn, width 16, ~97% test accuracy)."""
    return _train_digits_classifier(tmp_path_factory.mktemp("clf") / "classifier.pt")
