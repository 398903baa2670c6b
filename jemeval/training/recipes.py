"""Named sets of training defaults: per dataset (the paper's for CIFAR/SVHN, a laptop recipe for
digits) and named recipes laid over them (``recipe="fast"``).

:func:`jemeval.training.config.resolve_config` merges, lowest first: the dataclass defaults, the
dataset's (:data:`DATASET_DEFAULTS`), the recipe's (:data:`RECIPES`), the objective's
(:func:`objective_defaults`), and what the user sets. A recipe is only defaults: every setting it
chooses can still be given explicitly, and the run records ``recipe`` with the resolved settings.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from jemeval.data import default_val_size
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
#: step size, Adam 4e-3, an energy L2 penalty of 0.01 (without it 1 run in 8 diverged), 18 epochs with lr
#: x0.1 at epoch 17 (accuracy and log p(x) AUROC jump in the epoch after the decay), and bf16 autocast
#: where the CPU computes bf16 natively (:func:`native_cpu_bf16`; CUDA decides for itself). Measured with
#: benchmarks/time_to_accuracy.py on 10 seeds against the release recipe's same seeds: 0.40x its CPU time
#: with bf16 (0.51x in float32), test accuracy and log p(x) AUROC vs interp at or above that seed's release
#: run in 9 of 10 seeds, the means above the release's, no divergence (docs/training.md, "Recipes").
FAST_DIGITS = {
    "sampler": "sgld",
    "sgld_steps": 10,
    "sgld_lr": 2.0,
    "lr": 4e-3,
    "energy_l2": 0.01,
    "epochs": 18,
    "decay_epochs": (17,),
    "decay_rate": 0.1,
}
#: recipes that turn bf16 on where the CPU has native bf16 units (a default: ``bf16=False`` still wins)
NATIVE_BF16_RECIPES = ("fast",)


def native_cpu_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX): there bf16 autocast is faster
    (the fast recipe 0.40x the release's CPU time instead of 0.51x on an AMD EPYC with AVX512-BF16);
    elsewhere it is emulated and slower, so it stays off."""
    import torch

    checks = (getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None))
    return any(bool(check()) for check in checks if check is not None)


#: Named recipes: sets of defaults laid over the dataset's, per dataset base name. ``paper`` adds
#: nothing (the dataset defaults above: the paper's settings for CIFAR/SVHN, the laptop recipe for
#: digits); ``fast`` is defined only where it was measured.
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "paper": {},
    "fast": {"digits": FAST_DIGITS},
    "finetune": {},  # any dataset, from a classifier (--init): scaled from the run's own settings, finetune_defaults
}

#: ``recipe="finetune"`` continues a classifier (``init``) as a JEM. A classifier's logits are large
#: far from the data (log p~ of SGLD samples from noise ~ +850 against ~15 on digits), so the release's
#: SGLD (step 1) finds samples the p(x) term then pulls up hard, and Adam, normalising each weight's
#: step, follows that term alone while the cross-entropy's gradient is ~0: every setting with the
#: release's step size or p(x) weight lost 15-50 points of validation accuracy within 2-3 epochs or hit
#: the energy-gap check (docs/training.md, "Warm start from a classifier"). So the negatives are short
#: chains (``short_run``) of 5 steps of 0.1. Started from uniform noise alone they teach log p(x) to
#: reject noise and, with every epoch, to accept averaged images more (interp AUROC 0.858 after one
#: epoch, 0.780 after six); three quarters of them start from a Gaussian per class fit to the training
#: images (``gaussian_starts``, JEM++'s informative initialisation), which keeps interp AUROC up while a
#: p(x) weight of 0.16 puts uniform noise below the data in three epochs. A fine-tune of fixed length
#: keeps its end (``best_by="last"``): validation accuracy moves by a few of its images between epochs
#: while the p(x) term improves each one. Measured on digits (10 seeds, from a 40-epoch classifier):
#: test accuracy 0.987, log p(x) AUROC vs uniform 0.9996 and vs interp 0.865, 8 seeds at or above the
#: release's means on all three, where uniform starts, p(x) weight 0.02, 4 epochs and best.pt by
#: validation accuracy gave 4 (docs/training.md, "Epoch by epoch": 16 settings).
FINETUNE = {"px_weight": 0.16, "sgld_lr": 0.1, "sgld_steps": 5, "short_run": True, "gaussian_starts": 0.75,
            "best_by": "last", "energy_l2": 0.0, "warmup_iters": 0, "px_warmup_iters": 0, "decay_epochs": ()}
#: Why, where a setting has a reason of its own (the others: LARGE_LOGITS)
LARGE_LOGITS = "a classifier's large logits off the data"
FINETUNE_WHY = {"gaussian_starts": "chains from per-class Gaussians keep log p(x) of blended images low",
                "best_by": "validation accuracy moves by a few images an epoch, the p(x) term gains in each"}
#: A source with BatchNorm gets the first recipe instead: on timm resnet10t (digits, seeds 0-4, the same
#: classifiers) FINETUNE gave accuracy 0.977, uniform 0.971, interp 0.854, this 0.983, 0.983, 0.885. Its
#: samples' pass normalises with the samples' own batch statistics and evaluation with the data's, so
#: the noise the p(x) term lowers is not the noise evaluation sees (the likely reason; not tested).
FINETUNE_BATCHNORM = {"px_weight": 0.01, "sgld_lr": 0.01, "energy_l2": 0.0, "warmup_iters": 0,
                      "px_warmup_iters": 0, "decay_epochs": ()}
#: (settings, lr factor, epoch factor, the two factors in words) by whether the source has BatchNorm
FINETUNE_RECIPES = {False: (FINETUNE, 1 / 3, 0.15, "a third", "15%"),
                    True: (FINETUNE_BATCHNORM, 0.1, 0.1, "a tenth", "a tenth")}
FINETUNE_MIN_EPOCHS = 2


def finetune_defaults(epochs: int, lr: float, *, batchnorm: bool = False) -> tuple[dict[str, Any], dict[str, str]]:
    """(settings, why) of ``recipe="finetune"`` for a run whose own recipe trains ``epochs`` epochs at
    ``lr``, from a source with BatchNorm layers or without."""
    fixed, lr_factor, epoch_factor, lr_words, epoch_words = FINETUNE_RECIPES[bool(batchnorm)]
    settings = {**fixed, "epochs": max(FINETUNE_MIN_EPOCHS, round(epoch_factor * epochs)), "lr": lr_factor * lr}
    source = "a source with BatchNorm: recipes.FINETUNE_BATCHNORM" if batchnorm else "recipes.FINETUNE"
    why = {"epochs": f"{epoch_words} of the {epochs} epochs training from scratch would take, at least "
                     f"{FINETUNE_MIN_EPOCHS}",
           "lr": f"{lr_words} of the {lr:g} training from scratch would use",
           **{k: f"recipe finetune ({source}): {FINETUNE_WHY.get(k, LARGE_LOGITS)}" for k in fixed}}
    return settings, why


def finetune_changes(epochs: int, lr: float, given: Mapping[str, Any], derived: dict | None, *,
                     samples: bool = True, batchnorm: bool = False) -> dict[str, Any]:
    """The settings ``recipe="finetune"`` changes in a run resolved to ``epochs`` at ``lr`` (those the
    user did not set, ``given``: name -> value), with ``derived`` (what was derived, and why) extended by
    them. A run the user left without sampling (``samples`` False: p(x) weight set to 0) gets no short-run chains;
    ``batchnorm``: the source has BatchNorm layers (:func:`finetune_defaults`)."""
    settings, why = finetune_defaults(epochs, lr, batchnorm=batchnorm)
    keys = [k for k in settings if k not in given and (samples or k not in ("short_run", "gaussian_starts"))]
    derived = dict(derived or {})
    derived["settings"] = {**derived.get("settings", {}), **{k: why[k] for k in keys}}
    derived["from"] = {**derived.get("from", {}), "recipe": "finetune"}
    return {**{k: settings[k] for k in keys}, "derived": derived}


def objective_defaults(objective: str | None) -> dict[str, Any]:
    """The factored ablation trains only the class-conditional contrast."""
    if objective == "factored":
        return {"pyx_weight": 0.0, "px_weight": 0.0, "pxy_weight": 1.0}
    return {}


def dataset_defaults(dataset: str) -> dict[str, Any]:
    """The defaults for a dataset spec (by its base name); generic small defaults otherwise."""
    return dict(DATASET_DEFAULTS.get(parse_spec(dataset).name, {}))


def recipe_defaults(recipe: str, dataset: str) -> dict[str, Any]:
    """The defaults a named recipe lays over the dataset's (a one-line error where it is not defined)."""
    if recipe not in RECIPES:
        raise UsageError(f"unknown recipe {recipe!r}{did_you_mean(str(recipe), RECIPES)}; choose "
                         f"{' or '.join(RECIPES)}", param="recipe")
    if recipe in ("paper", "finetune"):  # finetune scales the resolved run (config.resolve_config)
        return {}
    name = parse_spec(dataset).name
    if name not in RECIPES[recipe]:
        raise UsageError(f"recipe {recipe!r} is defined for {', '.join(RECIPES[recipe])} only (where it was "
                         f"measured), not {name!r}; use recipe 'paper' and set the settings yourself, e.g. "
                         "sgld_steps=10, sgld_lr=2.0", param="recipe")
    defaults = dict(RECIPES[recipe][name])
    if recipe in NATIVE_BF16_RECIPES and native_cpu_bf16():
        defaults["bf16"] = True
    return defaults


# -- datasets without defaults of their own: settings derived from the data ----------------------
#: What :func:`scaled_defaults` derives (each only where the user did not set it). A dataset with a
#: table above keeps it exactly; an ``npz:``/``folder:``/plugin set of 500 images would otherwise get
#: settings made for 150 CIFAR epochs (a 1000-iteration warm-up in a 140-iteration run).
SCALED_KEYS = ("arch", "epochs", "lr", "warmup_iters", "px_weight", "px_warmup_iters", "decay_epochs", "val_size",
               "buffer_size")
#: Images at least this many pixels a side train the default ``cnn`` with a strided first convolution
#: (``cnn:stride=2``): on 32 x 32 RGB folders a third of the CPU time an epoch, no accuracy lost in the runs
#: measured (docs/data.md, "Your own RGB images"); smaller images (digits' 8 x 8) keep the full network.
STRIDED_FROM, STRIDED_ARCH, DEFAULT_ARCH = 32, "cnn:stride=2", "cnn"
#: A small set gets more epochs: at least the digits recipe's run (20 epochs of 25 iterations), at most 200 epochs
GENERIC_EPOCHS, MIN_ITERATIONS, MAX_EPOCHS = 20, 500, 200
WARMUP_FRACTION, MAX_WARMUP = 0.05, 1000  # the paper's 1000 iterations are ~1% of its run; short runs need more
#: The p(x) weight rises over this share of the run: at full weight from the first iteration, a 600-image
#: 10-class RGB folder sat at chance in epochs 2-4 and ended at 0.635 test accuracy; over 20% of the run
#: it ended at 0.635 too, over 40% at 0.765-0.775 with no epoch at chance, over 70% at 0.820 (one run each,
#: seed 0; the only fractions tried, all at p(x) weight 1; docs/data.md, "Your own RGB images"). The
#: paper's CIFAR run and the digits recipe keep full weight from the start.
PX_WARMUP_FRACTION = 0.4
#: The p(x) contrast's weight against the cross-entropy's 1: at the paper's 1 (with the 40% warm-up) a
#: 600-image 10-class RGB folder ended 14-17 points below the plain classifier's test accuracy (0.775 /
#: 0.770 against 0.940 / 0.915, seeds 0 / 1); at 0.1 within 5 (0.975 / 0.955), log p(x) still separating
#: uniform noise completely (AUROC 1.000, the classifier's 0.07 / 0.46) but interpolations less well (0.62 /
#: 0.58 against 0.66 / 0.75); docs/data.md, "Your own RGB images". The paper's CIFAR runs and the digits
#: recipe keep 1.
PX_WEIGHT = 0.1
DECAY_FRACTIONS = (0.8, 0.9)  # the release's 160 and 180 of 200 epochs: a short run learns at full rate longest
#: (training images, lr) of the two measured recipes; lr is log-linear in the set size between them
LR_SMALL, LR_LARGE = (1647, DIGITS["lr"]), (45000, PAPER["lr"])
MAX_BUFFER = PAPER["buffer_size"]


def scaled_defaults(n_images: int, batch_size: int, *, epochs: int | None = None,
                    own_val: bool = False, arch: str = DIGITS["arch"],
                    input_shape: tuple[int, ...] | None = None) -> tuple[dict, dict]:
    """(settings, why) for a set of ``n_images`` training-split images trained for ``epochs`` (None:
    derived too).

    Why each: 20 epochs of a few hundred images are too few iterations to learn anything (a 500-image
    set: 140), so a small set trains for at least 500 iterations (the digits recipe's run; at most
    200 epochs); the warm-up is a fraction of the run's iterations, so it ends; the decays are fractions
    of the epochs, so they happen; the lr is the digits recipe's (3e-3) for small sets and the paper's
    (1e-4) for CIFAR-sized ones, because few iterations need larger steps, but only for the digits
    recipe's architecture family (``cnn``), where both ends were measured: any other ``arch`` keeps the
    paper's 1e-4 (WRN-28-10 without normalisation diverged within 11 iterations at 3e-3 on an H200,
    every recovery too); validation takes 10%
    (at most 5000) unless the set has its own ``val`` split; the replay buffer holds about one chain
    per training image (at least a batch, at most the paper's 10000), so chains are revisited
    within the run.
    """
    val = 0 if own_val else default_val_size(n_images)
    n_train = max(n_images - val, 1)
    per_epoch = n_train // min(batch_size, n_train)  # as jemeval.training.ddp.batch_plan counts them
    settings, why = {}, {}
    if strided_arch_fits(arch, input_shape):
        arch = settings["arch"] = STRIDED_ARCH
        why["arch"] = (f"{input_shape[1]} x {input_shape[2]} images (at least {STRIDED_FROM} a side): the first "
                       "convolution strided: a third of the time an epoch, no accuracy lost where measured")
    if epochs is None:
        epochs = settings["epochs"] = min(MAX_EPOCHS, max(GENERIC_EPOCHS, -(-MIN_ITERATIONS // per_epoch)))
        why["epochs"] = (f"{GENERIC_EPOCHS}, or more for at least {MIN_ITERATIONS} iterations at {per_epoch} an epoch "
                         f"({n_train} images in batches of {batch_size}), at most {MAX_EPOCHS}")
    total = per_epoch * epochs
    run = f"{total} iterations: {epochs} epochs of {per_epoch} ({n_train} images in batches of {batch_size})"
    settings.update(warmup_iters=min(MAX_WARMUP, max(1, round(WARMUP_FRACTION * total))), px_weight=PX_WEIGHT,
                    px_warmup_iters=round(PX_WARMUP_FRACTION * total),
                    decay_epochs=decay_epochs_for(epochs), lr=lr_for(n_train, arch),
                    buffer_size=min(MAX_BUFFER, max(n_train, batch_size)))
    why.update({"warmup_iters": f"{WARMUP_FRACTION:.0%} of the run's {run}, at most {MAX_WARMUP}",
                "px_weight": f"{PX_WEIGHT:g} (the paper's 1 is for its CIFAR run): at 1 a small RGB folder's JEM "
                             "ended 14-17 points below the plain classifier, at 0.1 within 5 (above it in 3 runs)",
                "px_warmup_iters": f"{PX_WARMUP_FRACTION:.0%} of the run's {total} iterations: the classifier learns "
                                   "first (at full p(x) weight a small RGB folder sat near chance)",
                "decay_epochs": f"{' and '.join(f'{f:g}' for f in DECAY_FRACTIONS)} of the {epochs} epochs (the "
                                "release's 160, 180 of 200), those before the last",
                "lr": lr_reason(n_train, arch),
                "buffer_size": f"one chain per training image ({n_train}), at least a batch, at most {MAX_BUFFER}"})
    if not own_val:
        settings["val_size"] = val
        why["val_size"] = f"10% of the {n_images} training-split images, at most 5000"
    return settings, why


def keys_to_derive(given: set[str], *, init: bool, objective: str) -> list[str]:
    """The :data:`SCALED_KEYS` a run derives from its data: those not ``given``, except a warm start's
    architecture (its source's) and, outside the JEM objective, the p(x) weight (the factored ablation has none)."""
    return [k for k in SCALED_KEYS if k not in given and not (k == "arch" and init)
            and not (k == "px_weight" and objective != "jem")]


def strided_arch_fits(arch: str, input_shape: tuple[int, ...] | None) -> bool:
    """Whether the default ``cnn`` on images of ``input_shape`` becomes :data:`STRIDED_ARCH`."""
    return (arch == DEFAULT_ARCH and input_shape is not None and len(input_shape) == 3
            and min(input_shape[1:]) >= STRIDED_FROM)


def decay_epochs_for(epochs: int) -> tuple[int, ...]:
    """:data:`DECAY_FRACTIONS` of ``epochs``, rounded; a decay at or after the last epoch never happens, so none."""
    return tuple(sorted({e for e in (round(f * epochs) for f in DECAY_FRACTIONS) if 1 <= e < epochs}))


def scales_lr(arch: str) -> bool:
    """Whether the lr is scaled with the set size for ``arch``: only in the family it was measured on."""
    return parse_spec(arch).name == parse_spec(DIGITS["arch"]).name


def lr_reason(n_train: int, arch: str) -> str:
    """Why :func:`lr_for` chose its lr, for ``derived`` and ``--print-config``."""
    if not scales_lr(arch):
        return (f"the paper's {LR_LARGE[1]:g}: the larger small-set lr was measured only for "
                f"{parse_spec(DIGITS['arch']).name!r} models, not {parse_spec(arch).name!r}")
    return (f"for {n_train} training images: {LR_SMALL[1]:g} (the digits recipe's) up to {LR_SMALL[0]}, "
            f"{LR_LARGE[1]:g} (the paper's) from {LR_LARGE[0]}, log-linear between")


def lr_for(n_train: int, arch: str = DIGITS["arch"]) -> float:
    """The lr for ``n_train`` training images of an ``arch`` model (two significant digits): see
    :data:`LR_SMALL`; the paper's for an architecture outside the digits recipe's family."""
    if not scales_lr(arch):
        return LR_LARGE[1]
    (n0, lr0), (n1, lr1) = LR_SMALL, LR_LARGE
    t = min(max((math.log(n_train) - math.log(n0)) / (math.log(n1) - math.log(n0)), 0.0), 1.0)
    return float(f"{math.exp(math.log(lr0) + t * (math.log(lr1) - math.log(lr0))):.2g}")
