"""Training settings: one dataclass, per-dataset defaults, validation with one-line errors.

A run is fully described by its :class:`TrainConfig`; the checkpoint stores ``config.to_dict()``
(including ``"sgld"`` and ``"sigma"``, which ``jemeval sample``/``robust`` read back as their
defaults). Defaults come in four layers: the dataclass's generic small defaults, then
:data:`DATASET_DEFAULTS` for the dataset's base name (the paper's settings for CIFAR/SVHN, a
laptop-sized recipe for the embedded ``digits``), then a named recipe's (:data:`RECIPES`, e.g.
``recipe="fast"`` on digits), then what the user sets explicitly. A dataset without defaults of its
own gets what the user did not set derived from its size (:func:`derive_from_data`).
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from jemeval.data import absolute_spec, declared_splits, load_dataset, to_arrays
from jemeval.deprecations import moved_names
from jemeval.errors import JemevalError, UsageError, did_you_mean
from jemeval.evaluation.limits import check_count
from jemeval.formats.load import is_model_source
from jemeval.registry import parse_spec
from jemeval.sampling.proximal import ProximalSGLD
from jemeval.sampling.sgld import BN_MODES, SGLD
from jemeval.training.augment import parse_augment
from jemeval.training.loggers import check_loggers
from jemeval.training.recipes import (
    DATASET_DEFAULTS,
    RECIPES,
    dataset_defaults,
    finetune_changes,
    keys_to_derive,
    objective_defaults,
    recipe_defaults,
    scaled_defaults,
)

OBJECTIVES = ("jem", "factored")
SAMPLERS = ("sgld", "proximal")
OPTIMIZERS = ("adam", "sgd")

#: Settings a resume may change: they do not alter what the run computes up to its last epoch.
RESUMABLE_CHANGES = frozenset({"epochs", "device", "progress", "out", "data_root", "download", "max_recoveries",
                               "max_val_drop", "resume", "overwrite", "compile", "test_eval", "grid_every",
                               "config_file", "log_to", "log_every", "workers"})

#: Records a resume keeps from the stored run whatever the caller's config says: a warm start's source
#: record (with the head decision its first session made; a resume never reads the source again)
STORED_ON_RESUME = frozenset({"init_from"})

RESUME_OR_OVERWRITE = ("resume=True continues the run in its folder and overwrite=True replaces it: give one of "
                       "them, not both")


@dataclass
class TrainConfig:
    """Every setting of a training run (recorded whole in each checkpoint and in the summary).

    Weights: ``pyx_weight`` (cross-entropy, p(y|x)), ``px_weight`` (the p(x) contrast on
    logsumexp f, Algorithm 1), ``pxy_weight`` (the p(x, y) contrast on f(x)[y] with
    class-conditional samples). ``px_weight = pxy_weight = 0`` is the plain classifier: no sampling.
    ``objective="factored"`` is the paper's p(x|y) ablation: only the class-conditional contrast on
    f(x)[y] with class-conditional negatives, no cross-entropy (its weight is ``pxy_weight``).
    """

    dataset: str = "digits"
    recipe: str = "paper"  # a named set of defaults over the dataset's (RECIPES); recorded, fixed on a resume
    arch: str = "cnn"
    epochs: int = 20
    out: str | None = None  # default runs/<dataset name>
    seed: int = 0
    device: str = "auto"
    # objective
    objective: str = "jem"
    px_weight: float = 1.0
    pyx_weight: float = 1.0
    pxy_weight: float = 0.0
    px_warmup_iters: int = 0  # the p(x), p(x, y) weights rise linearly to theirs over these iterations (0: at once)
    class_cond_px: bool = False  # p(x) negatives drawn class-conditionally (y ~ uniform), contrast on logsumexp
    energy_l2: float = 0.0  # authors' remedy: + energy_l2 * (mean E(data)^2 + mean E(samples)^2)
    # sampler
    sgld_steps: int = 20
    sgld_lr: float = 1.0
    sgld_std: float = 0.01
    sgld_bn_mode: str = "eval"
    sampler: str = "sgld"  # sgld (JEM) or proximal (JEM++'s PYLD: sgld_steps outer steps, each + inner_steps)
    inner_steps: int = 5  # proximal only: first-layer-only steps after each outer step (JEM++: 5)
    inner_step_size: float = 0.2  # proximal only: the inner steps' multiplier (JEM++'s pyld_lr)
    inner_grad_clip: float = 1.0  # proximal only: inner gradients clipped to +-this (JEM++'s eps)
    recompute_first_layer: bool = True  # proximal only: False reuses the outer gradient (same samples, affine L1)
    buffer_size: int = 10000
    reinit_freq: float = 0.05
    short_run: bool = False  # non-persistent chains from U(-1, 1) every iteration
    gaussian_starts: float = 0.0  # this fraction of chain (re)starts from per-class Gaussians of the training images
    # data
    sigma: float = 0.03
    augment: str = "auto"  # auto (the dataset's own recipe), none, or "pad=4,flip=1"
    labels_per_class: int | None = None
    val_size: int | None = None  # None: 10% of the training images, at most 5000
    split_seed: int = 1234  # fixed: the validation split and the labelled subset do not move with seed
    data_root: str | None = None
    download: bool = False
    workers: int | None = None  # processes decoding an image folder (changes no number; None: min(8, CPUs - 1))
    # optimisation
    batch_size: int = 64
    lr: float = 1e-4
    optimizer: str = "adam"
    momentum: float = 0.9
    weight_decay: float = 0.0
    warmup_iters: int = 1000
    decay_epochs: tuple[int, ...] = (160, 180)
    decay_rate: float = 0.3
    # divergence detection and recovery
    max_recoveries: int = 5
    max_abs_loss: float = 1e8  # the release's crash threshold
    max_abs_energy: float = 1e5
    energy_gap_band: float = 1e3  # |mean E(samples) - mean E(data)| must stay inside this band ...
    gap_patience: int = 20  # ... except for at most this many consecutive iterations
    max_val_drop: float = 0.2  # an epoch whose validation accuracy is more than this below the best is rolled back
    check_every: int = 10  # iterations between divergence checks / progress updates (one host sync)
    # speed switches (jemeval.runtime.fastpath.FastPath; None = automatic: bf16 on CUDA, channels_last on, compile off)
    bf16: bool | None = None
    channels_last: bool | None = None
    compile: bool | None = None
    # outputs
    progress: bool | None = None  # None: tqdm decides (on for a terminal)
    grid_every: int = 1  # epochs between sample grids (0: never)
    log_to: tuple[str, ...] = ()  # loggers besides metrics.csv: tensorboard, wandb, a plugin's (training/loggers.py)
    log_every: int = 10  # iterations between the loggers' train/* scalars
    eval_batch_size: int = 500
    eval_sigma: float = 0.0  # noise on validation/test inputs (recorded)
    test_eval: bool = True  # evaluate best.pt on the test split at the end
    best_by: str = "val_acc"  # best.pt: the first epoch of the best validation accuracy, or "last": the last epoch
    resume: bool = False  # continue the run in out_dir from its last.pt
    overwrite: bool = False  # replace the run in out_dir (without it, a new run refuses a folder holding one)
    config_file: dict | None = None  # the --config file that set some of these: {"file", "sha256", "keys"}
    derived: dict | None = None  # settings derived from the data (a set without defaults): {"from", "settings"}
    # warm start (training/warmstart.py): the classifier whose weights the run starts from, and its record
    init: str | None = None  # a model source or file, as --model reads it (a path is recorded absolute)
    init_from: dict | None = None  # source, name, sha256, arch, classes, normalisation; the head decision

    def __post_init__(self) -> None:
        # one logger may be given as a string ("tensorboard"), several as a list; stored as a tuple
        self.log_to = (self.log_to,) if isinstance(self.log_to, str) else tuple(self.log_to or ())
        # a path in the spec is recorded absolute: the checkpoint names the same files from any cwd
        self.dataset = absolute_spec(self.dataset)
        if isinstance(self.init, str) and self.init and not is_model_source(self.init):
            self.init = os.path.abspath(os.path.expanduser(self.init))

    # -- derived -------------------------------------------------------------------------------
    @property
    def dataset_name(self) -> str:
        return parse_spec(self.dataset).name

    @property
    def out_dir(self) -> str:
        return self.out if self.out else f"runs/{self.dataset_name}"

    @property
    def samples(self) -> bool:
        """Whether training draws SGLD samples at all (false for the plain classifier)."""
        return self.px_weight > 0 or self.pxy_weight > 0

    @property
    def class_blocks(self) -> bool:
        """Whether samples are drawn class-conditionally, from a buffer kept as class blocks."""
        return self.pxy_weight > 0 or self.class_cond_px

    def sgld(self) -> SGLD | ProximalSGLD:
        """The sampler training uses: JEM's SGLD, or JEM++'s proximal SGLD (``sampler="proximal"``,
        ``sgld_steps`` outer steps of size ``sgld_lr`` with noise ``sgld_std``, clamped to [-1, 1])."""
        if self.sampler == "proximal":
            return ProximalSGLD(steps=self.sgld_steps, inner_steps=self.inner_steps, step_size=self.sgld_lr,
                                inner_step_size=self.inner_step_size, grad_clip=self.inner_grad_clip,
                                noise=self.sgld_std, bn_mode=self.sgld_bn_mode,
                                recompute_first_layer=self.recompute_first_layer)
        return SGLD(steps=self.sgld_steps, step_size=self.sgld_lr, noise=self.sgld_std, bn_mode=self.sgld_bn_mode)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (loads with weights_only=True), plus the keys readers rely on."""
        d = asdict(self)
        d["decay_epochs"] = list(self.decay_epochs)
        d["log_to"] = list(self.log_to)
        d["out"] = self.out_dir
        d["sgld"] = self.sgld().settings()
        d["sampling"] = self.samples
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """The configuration stored in a checkpoint; keys that are no settings (``sgld``, ``resolved``,
        or ``inject_divergence`` of 0.1's runs) are ignored."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        if "decay_epochs" in kwargs:
            kwargs["decay_epochs"] = tuple(int(e) for e in kwargs["decay_epochs"])
        return cls(**kwargs)

    def replace(self, **changes: Any) -> TrainConfig:
        return replace(self, **changes)

    # -- validation ----------------------------------------------------------------------------
    def validate(self) -> TrainConfig:
        """Raise :class:`UsageError` (one line, naming the parameter) for the first impossible setting."""
        self._check_choices()
        self._check_numbers()
        self._check_combinations()
        aug = self.augment if isinstance(self.augment, str) else ""
        if aug not in ("auto", "none"):
            parse_augment(aug)  # raises UsageError when malformed
        check_loggers(self.log_to)  # unknown names, options, missing packages: before any file is written
        return self

    def _check_choices(self) -> None:
        for param, choices in (("objective", OBJECTIVES), ("optimizer", OPTIMIZERS), ("sampler", SAMPLERS),
                               ("best_by", ("val_acc", "last"))):
            value = getattr(self, param)
            _need(value in choices, param, f"unknown {param} {value!r}{did_you_mean(str(value), choices)}; choose "
                  f"{' or '.join(choices)}")
        _need(self.recipe in RECIPES, "recipe", f"unknown recipe {self.recipe!r}"
              f"{did_you_mean(str(self.recipe), RECIPES)}; choose {' or '.join(RECIPES)}")
        _need(self.sgld_bn_mode in BN_MODES, "sgld_bn_mode",
              f"sgld_bn_mode (SGLD's BatchNorm mode) must be eval or train, got {self.sgld_bn_mode!r}")

    def _check_numbers(self) -> None:
        for param in ("px_weight", "pyx_weight", "pxy_weight", "energy_l2", "sigma", "eval_sigma", "sgld_std",
                      "weight_decay"):
            value = getattr(self, param)
            _need(math.isfinite(value) and value >= 0, param, f"{param} must be a number >= 0, got {value}")
        for param, ok, rule in (
            ("epochs", self.epochs >= 1, "be >= 1"), ("batch_size", self.batch_size >= 1, "be >= 1"),
            ("lr", self.lr > 0 and math.isfinite(self.lr), "be > 0"),
            ("sgld_lr", self.sgld_lr > 0 and math.isfinite(self.sgld_lr), "be a finite number > 0"),
            ("sgld_steps", self.sgld_steps >= 1 or not self.samples, "be >= 1 when p(x) is trained"),
            ("inner_steps", self.inner_steps >= 0, "be >= 0"),
            ("inner_step_size", self.inner_step_size > 0 and math.isfinite(self.inner_step_size), "be > 0"),
            ("inner_grad_clip", self.inner_grad_clip > 0 and math.isfinite(self.inner_grad_clip), "be > 0"),
            ("buffer_size", self.buffer_size >= 1, "be >= 1"),
            ("reinit_freq", 0.0 <= self.reinit_freq <= 1.0, "lie in [0, 1]"),
            ("gaussian_starts", 0.0 <= self.gaussian_starts <= 1.0, "lie in [0, 1]"),
            ("decay_rate", 0.0 < self.decay_rate <= 1.0, "lie in (0, 1]"),
            ("warmup_iters", self.warmup_iters >= 0, "be >= 0"),
            ("px_warmup_iters", self.px_warmup_iters >= 0, "be >= 0"),
            ("decay_epochs", all(e >= 1 for e in self.decay_epochs), "be positive epoch numbers"),
            ("momentum", 0.0 <= self.momentum < 1.0, "lie in [0, 1)"),
            ("val_size", self.val_size is None or self.val_size >= 0, "be >= 0"),
            ("labels_per_class", self.labels_per_class is None or self.labels_per_class >= 1, "be >= 1"),
            ("max_recoveries", self.max_recoveries >= 0, "be >= 0"),
            ("check_every", self.check_every >= 1, "be >= 1"),
            ("max_val_drop", 0.0 < self.max_val_drop <= 1.0, "lie in (0, 1] (1 turns the check off)"),
            ("grid_every", self.grid_every >= 0, "be >= 0"),
            ("workers", self.workers is None or (isinstance(self.workers, int) and not isinstance(self.workers, bool)
                                                 and self.workers >= 0),
             "be a whole number >= 0"),
            ("log_every", self.log_every >= 1, "be >= 1"),
        ):
            value = getattr(self, param)
            _need(ok, param, f"{param} must {rule}, got {list(value) if param == 'decay_epochs' else value}")
        for param, kind in (("epochs", "epochs"), ("sgld_steps", "sgld_steps"), ("inner_steps", "sgld_steps"),
                            ("buffer_size", "buffer_size")):
            check_count(param, getattr(self, param), kind, low=0)  # a few zeros too many: refused, not run

    def _check_combinations(self) -> None:
        _need(not (self.resume and self.overwrite), "overwrite", RESUME_OR_OVERWRITE)
        _need(self.pyx_weight > 0 or self.samples, "pyx_weight",
              "every loss weight is 0: set pyx_weight, px_weight or pxy_weight above 0")
        if self.objective == "factored":
            _need(self.pyx_weight == 0 and self.px_weight == 0, "pyx_weight",
                  "the factored objective trains only the class-conditional contrast (weight pxy_weight): "
                  "leave pyx_weight and px_weight at 0")
            _need(self.pxy_weight > 0, "pxy_weight", "the factored objective needs pxy_weight > 0")
            _need(self.labels_per_class is None, "labels_per_class",
                  "the factored objective needs every label: drop labels_per_class")
        _need(self.samples or not self.short_run, "short_run",
              "short_run=True needs sampling: set px_weight or pxy_weight above 0")
        _need(self.samples or not self.gaussian_starts, "gaussian_starts",
              "gaussian_starts (where SGLD chains start) needs sampling: set px_weight or pxy_weight above 0")
        _need(self.recipe != "finetune" or bool(self.init), "recipe",
              "recipe 'finetune' continues a classifier's training as a JEM: name the classifier with init "
              "(--init SOURCE: a checkpoint, timm:NAME, torchvision:NAME, ...)")
        _need(self.px_weight > 0 or not self.class_cond_px, "class_cond_px",
              "class-conditional p(x) negatives (class_cond_px=True) need px_weight > 0")


def _need(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise UsageError(message, param=param)


def resolve_config(dataset: str, **overrides: Any) -> TrainConfig:
    """A validated :class:`TrainConfig`: dataclass defaults < dataset defaults < recipe < objective < overrides.

    ``None`` values in ``overrides`` mean "not given" and keep the defaults (click's habit).
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise UsageError(f"unknown training setting {unknown[0]!r}{did_you_mean(unknown[0], known)}")
    merged: dict[str, Any] = {"dataset": dataset}
    merged.update(dataset_defaults(dataset))
    merged.update(recipe_defaults(given.get("recipe", "paper"), dataset))
    merged.update(objective_defaults(given.get("objective")))
    merged.update(given)
    if merged.get("init") and not merged.get("init_from"):
        from jemeval.training.warmstart import init_settings  # loads the source: only for a warm start

        merged.update(init_settings(merged, given))
    if "decay_epochs" in merged:
        merged["decay_epochs"] = tuple(int(e) for e in merged["decay_epochs"])
    config = TrainConfig(**merged).validate()
    if parse_spec(dataset).name not in DATASET_DEFAULTS:  # the paper's and the digits recipe stay exactly as they are
        keys = keys_to_derive(set(given), init=bool(config.init), objective=config.objective)
        config = derive_from_data(config, keys, now=True)
    if config.recipe == "finetune":
        samples = "px_weight" not in given or config.samples  # --px-weight 0: no chains to run short
        batchnorm = bool((config.init_from or {}).get("batchnorm"))
        config = config.replace(**finetune_changes(config.epochs, config.lr, given, config.derived,
                                                   samples=samples, batchnorm=batchnorm)).validate()
    return config


def derive_from_data(config: TrainConfig, keys: list[str] | None = None, *, now: bool = False) -> TrainConfig:
    """``config`` with ``keys`` (default: those left pending) derived from the size of its training
    split (:func:`~.recipes.scaled_defaults`) and recorded in ``derived``: what, and from what.

    ``now=True`` (resolving, ``--print-config``) reads the data without downloading; where they
    cannot be read yet the keys stay pending (``derived["pending"]``) and the run derives them when
    it starts (:meth:`~.trainer.Trainer.run`, after any download), so a setting is never silently
    left at a value made for another dataset.
    """
    if keys is None:
        keys = list((config.derived or {}).get("pending", ()))
    if not keys:
        return config
    try:
        ds = load_dataset(config.dataset, "train", root=config.data_root, download=config.download and not now)
        n_images = _length(ds)
    except JemevalError as exc:
        if not now:
            raise
        return config.replace(derived={"pending": list(keys), "why": f"the data cannot be read yet ({exc})"})
    own_val = "val" in (declared_splits(ds) or ())
    epochs = None if "epochs" in keys else config.epochs
    settings, why = scaled_defaults(n_images, config.batch_size, epochs=epochs, own_val=own_val,
                                   arch=config.arch, input_shape=getattr(ds, "input_shape", None))
    keys = [k for k in keys if k in settings]
    source = {"train_images": n_images, "own_val_split": own_val, "epochs": settings.get("epochs", config.epochs),
              "batch_size": config.batch_size}
    return config.replace(**{k: settings[k] for k in keys},
                          derived={"from": source, "settings": {k: why[k] for k in keys}}).validate()


def _length(ds) -> int:
    try:
        return len(ds)
    except TypeError:  # a dataset without __len__: count what it yields
        return len(to_arrays(ds)[0])


def resume_config(stored: dict[str, Any], **overrides: Any) -> TrainConfig:
    """The stored config of a run, with the few settings a resume may change.

    Any other explicitly given setting that differs from the stored one is an error: a resumed
    run must compute exactly what the uninterrupted run would have.
    """
    config = TrainConfig.from_dict(stored)
    given = {k: v for k, v in overrides.items() if v is not None and k not in STORED_ON_RESUME}
    if isinstance(given.get("init"), str) and not is_model_source(given["init"]):
        given["init"] = os.path.abspath(os.path.expanduser(given["init"]))  # as the run recorded it
    if given.get("overwrite"):
        raise UsageError(RESUME_OR_OVERWRITE, param="overwrite")
    changed = []
    for key, value in given.items():
        if key in RESUMABLE_CHANGES:
            continue
        current = getattr(config, key, None)
        if isinstance(current, tuple):
            value = tuple(value)
        if current != value:
            changed.append(f"{key}={value!r} (run has {current!r})")
    if changed:
        raise UsageError(
            f"resume=True continues the stored run; these settings differ from it: {', '.join(changed)}; "
            "drop them or start a new run with another out", param="out"
        )
    changes = {k: v for k, v in given.items() if k in RESUMABLE_CHANGES and hasattr(config, k)}
    changes.update(resume=True, overwrite=False)  # a run started with overwrite=True resumes without it
    return config.replace(**changes).validate()


#: names that moved (0.2's resume_path, 0.3's resume_from): they keep working from here for one release, with a
#: warning; resume_from reads last.pt, so it lives with the checkpoint's other readers (config imports none of them)
__getattr__ = moved_names(__name__, {"resume_path": "jemeval.training.checkpointing",
                                     "resume_from": "jemeval.training.checkpointing"})
