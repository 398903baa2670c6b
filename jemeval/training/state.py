"""Random-number state for exact resumption, as plain tensors/lists (loads with weights_only=True).

A resumed run must draw the same random numbers as the uninterrupted one: the trainer's own
generator (shuffling, buffer draws, SGLD noise, augmentation, sigma noise), torch's global CPU
generator (initialisation, dropout), every CUDA generator, NumPy's and Python's. The JEM release
stored none of these and could not resume exactly.
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng(generator: torch.Generator | None = None) -> dict[str, Any]:
    np_state = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": {"version": int(py_version), "state": torch.tensor(py_state, dtype=torch.int64),
                   "gauss_next": py_gauss},
    }
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def restore_rng(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss_next"]))
    if generator is not None and "generator" in state:
        generator.set_state(state["generator"].cpu())


def reseed(seed: int, generator: torch.Generator | None = None) -> None:
    """Seed every generator the trainer uses (fresh runs and divergence recovery)."""
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))
    random.seed(seed)
    if generator is not None:
        generator.manual_seed(seed)
