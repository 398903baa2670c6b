"""Named sets of training defaults: per dataset (the paper's for CIFAR/SVHN, a laptop recipe for
digits) and named recipes laid over them (``recipe="fast"``).

:func:`jemeval.training.config.resolve_config` merges, lowest first: the dataclass defaults, the
dataset's (:data:`DATASET_DEFAULTS`), the recipe's (:data:`RECIPES`), the objective's, and what the
user sets. A recipe is only defaults: every setting it chooses can still be given explicitly, and
the run records ``recipe`` with the resolved settings.
"""
from __future__ import annotations

from typing import Any

from jemeval.errors import UsageError, did_you_mean
from jemeval.registry import parse_spec

#: The JEM release's settings (the paper's Algorithm 1 and the release's defaults, docs/training.md):
#: WRN-28-10 without BatchNorm, Adam 1e-4, batch 64, 20 SGLD steps of size 1 with noise 0.01, sigma
#: 0.03, a 10,000-image buffer with 5% re-initialisation, 1,000 warm-up iterations, lr x0.3 at epochs
#: 50 and 100 of 150, 5,000 validation images.
PAPER = {
    "arch": "wrn:depth=28,widen=10,norm=none",
    "epochs": 150,
    "batch_size": 64,
    "lr": 1e-4,
    "optimizer": "adam",
    "warmup_iters": 1000,
    "decay_epochs": (50, 100),
    "decay_rate": 0.3,
    "sgld_steps": 20,
    "sgld_lr": 1.0,
    "sgld_std": 0.01,
    "sigma": 0.03,
    "buffer_size": 10000,
    "reinit_freq": 0.05,
    "val_size": 5000,
}

#: Settings for sklearn's 8x8 digits that reach >= 95% test accuracy in well under two minutes on
#: two CPU cores, with log p(x) separating digits from uniform noise (docs/training.md has figures).
DIGITS = {
    "arch": "cnn:width=32",
    "epochs": 20,
    "batch_size": 64,
    "lr": 3e-3,
    "optimizer": "adam",
    "warmup_iters": 20,
    "decay_epochs": (15,),
    "decay_rate": 0.3,
    "sgld_steps": 10,
    "sgld_lr": 1.0,
    "sgld_std": 0.01,
    "sigma": 0.03,
    "buffer_size": 1000,
    "reinit_freq": 0.05,
    "val_size": 150,
}

DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "cifar10": PAPER,
    "cifar100": PAPER,
    "svhn": PAPER,
    "digits": DIGITS,
}

#: The digits recipe ``recipe="fast"`` lays over :data:`DIGITS`: half the release's SGLD steps at twice the
#: step size, Adam 4e-3, an energy L2 penalty of 0.01 (without it 1 run in 8 diverged), 15 epochs with lr
#: x0.1 at epoch 14 (accuracy and log p(x) AUROC jump in the epoch after the decay). Measured with
#: benchmarks/time_to_accuracy.py on 12 seeds: ~0.43x the release sampler's CPU time per run, mean test
#: accuracy and log p(x) AUROCs at or above the release recipe's, no divergence (docs/training.md, "Recipes").
FAST_DIGITS = {
    "sampler": "sgld",
    "sgld_steps": 10,
    "sgld_lr": 2.0,
    "lr": 4e-3,
    "energy_l2": 0.01,
    "epochs": 15,
    "decay_epochs": (14,),
    "decay_rate": 0.1,
}

#: Named recipes: sets of defaults laid over the dataset's, per dataset base name. ``paper`` adds
#: nothing (the dataset defaults above: the paper's settings for CIFAR/SVHN, the laptop recipe for
#: digits); ``fast`` is defined only where it was measured.
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "paper": {},
    "fast": {"digits": FAST_DIGITS},
}


def dataset_defaults(dataset: str) -> dict[str, Any]:
    """The defaults for a dataset spec (by its base name); generic small defaults otherwise."""
    return dict(DATASET_DEFAULTS.get(parse_spec(dataset).name, {}))


def recipe_defaults(recipe: str, dataset: str) -> dict[str, Any]:
    """The defaults a named recipe lays over the dataset's (a one-line error where it is not defined)."""
    if recipe not in RECIPES:
        raise UsageError(f"unknown recipe {recipe!r}{did_you_mean(str(recipe), RECIPES)}; choose "
                         f"{' or '.join(RECIPES)}", param="recipe")
    if recipe == "paper":
        return {}
    name = parse_spec(dataset).name
    if name not in RECIPES[recipe]:
        raise UsageError(f"recipe {recipe!r} is defined for {', '.join(RECIPES[recipe])} only (where it was "
                         f"measured), not {name!r}; use recipe 'paper' and set the settings yourself, e.g. "
                         "sgld_steps=10, sgld_lr=2.0", param="recipe")
    return dict(RECIPES[recipe][name])
