"""Shared fixtures. Models are trained once per test session and kept small: CI has 2 CPU cores."""
from __future__ import annotations

import os

# Before torch is imported: idle OpenMP threads sleep instead of spinning, which otherwise makes
# small CPU ops orders of magnitude slower whenever the machine is oversubscribed.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # CI has 2 cores; one thread per process avoids oversubscription stalls


def _train_digits_classifier(path, epochs=15, seed=0):
    """A plain cross-entropy CNN on digits (about 2 s): the classifier baseline fixture."""
    import jemeval
    from jemeval.formats.native import save_checkpoint

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


# -- JEM fixtures from the built-in trainer (jemeval.training) ------------------------------------
#: A shortened version of `jemeval train digits` (fewer epochs and SGLD steps, no grids): ~94% test
#: accuracy and log p(x) AUROC ~1.0 against U(-1, 1) noise; about 15 s of one CPU core.
DIGITS_JEM_FIXTURE = {"epochs": 12, "sgld_steps": 5, "decay_epochs": (9,), "grid_every": 0, "test_eval": False,
                      "progress": False, "seed": 0, "device": "cpu"}


def _train_digits_jem(out, **changes):
    from jemeval.training import train

    summary = train("digits", out=str(out), **{**DIGITS_JEM_FIXTURE, **changes})
    return summary["best"]


@pytest.fixture(scope="session")
def digits_jem_ckpt(tmp_path_factory):
    """Path to best.pt of a small JEM trained on digits with `jemeval train` settings (cnn width 32,
    12 epochs, 5 SGLD steps, buffer 1000, sigma 0.03); its config holds "sgld" and "sigma"."""
    return _train_digits_jem(tmp_path_factory.mktemp("jem"))


@pytest.fixture(scope="session")
def digits_baseline_ckpt(tmp_path_factory):
    """Path to best.pt of the same run with --px-weight 0: the plain classifier baseline (no sampling)."""
    return _train_digits_jem(tmp_path_factory.mktemp("jem_baseline"), px_weight=0.0)
