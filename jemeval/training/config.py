"""Training settings: one dataclass, per-dataset defaults, validation with one-line errors.

A run is fully described by its :class:`TrainConfig`; the checkpoint stores ``config.to_dict()``
(including ``"sgld"`` and ``"sigma"``, which ``jemeval sample``/``robust`` read back as their
defaults). Defaults come in three layers: the dataclass's generic small defaults, then
:data:`DATASET_DEFAULTS` for the dataset's base name (the paper's settings for CIFAR/SVHN, a
laptop-sized recipe for the embedded ``digits``), then what the user sets explicitly.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from jemeval.errors import UsageError, did_you_mean
from jemeval.registry import parse_spec
from jemeval.sampling.proximal import ProximalSGLD
from jemeval.sampling.sgld import BN_MODES, SGLD

OBJECTIVES = ("jem", "factored")
SAMPLERS = ("sgld", "proximal")
OPTIMIZERS = ("adam", "sgd")

#: The JEM release's settings (the paper's Algorithm 1 and the release's defaults, docs/training.md): WRN-28-10 without BatchNorm, Adam 1e-4,
#: batch 64, 20 SGLD steps of size 1 with noise 0.01, sigma 0.03, a 10,000-image buffer with 5%
#: re-initialisation, 1,000 warm-up iterations, lr x0.3 at epochs 50 and 100 of 150, 5,000
#: validation images.
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

#: Options a ``--resume`` may change: they do not alter what the run computes up to its last epoch.
RESUMABLE_CHANGES = frozenset({"epochs", "device", "progress", "out", "data_root", "download", "max_recoveries",
                               "resume", "overwrite", "compile", "test_eval", "grid_every",
                               "inject_divergence"})

RESUME_OR_OVERWRITE = ("--resume continues the run in --out and --overwrite replaces it: give one of them, "
                       "not both")


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
    buffer_size: int = 10000
    reinit_freq: float = 0.05
    short_run: bool = False  # non-persistent chains from U(-1, 1) every iteration
    # data
    sigma: float = 0.03
    augment: str = "auto"  # auto (the dataset's own recipe), none, or "pad=4,flip=1"
    labels_per_class: int | None = None
    val_size: int | None = None  # None: 10% of the training images, at most 5000
    split_seed: int = 1234  # fixed: the validation split and the labelled subset do not move with --seed
    data_root: str | None = None
    download: bool = False
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
    check_every: int = 10  # iterations between divergence checks / progress updates (one host sync)
    # speed switches (jemeval.runtime.fastpath.FastPath; None = automatic: on for CUDA; channels_last only on CPU)
    bf16: bool | None = None
    channels_last: bool | None = None
    compile: bool | None = None
    # outputs
    progress: bool | None = None  # None: tqdm decides (on for a terminal)
    grid_every: int = 1  # epochs between sample grids (0: never)
    eval_batch_size: int = 500
    eval_sigma: float = 0.0  # noise on validation/test inputs (recorded)
    test_eval: bool = True  # evaluate best.pt on the test split at the end
    resume: bool = False  # continue the run in out_dir from its last.pt
    overwrite: bool = False  # replace the run in out_dir (without it, a new run refuses a folder holding one)
    # Python-only test hook: {"step": S, "kind": "nan"|"energy", "times": 1} forces a divergence
    inject_divergence: dict | None = None

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

    def sgld(self) -> SGLD | ProximalSGLD:
        """The sampler training uses: JEM's SGLD, or JEM++'s proximal SGLD (``--sampler proximal``,
        ``sgld_steps`` outer steps of size ``sgld_lr`` with noise ``sgld_std``, clamped to [-1, 1])."""
        if self.sampler == "proximal":
            return ProximalSGLD(steps=self.sgld_steps, inner_steps=self.inner_steps, step_size=self.sgld_lr,
                                inner_step_size=self.inner_step_size, grad_clip=self.inner_grad_clip,
                                noise=self.sgld_std, bn_mode=self.sgld_bn_mode)
        return SGLD(steps=self.sgld_steps, step_size=self.sgld_lr, noise=self.sgld_std, bn_mode=self.sgld_bn_mode)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (loads with weights_only=True), plus the keys readers rely on."""
        d = asdict(self)
        d["decay_epochs"] = list(self.decay_epochs)
        d["out"] = self.out_dir
        d["sgld"] = self.sgld().settings()
        d["sampling"] = self.samples
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        if "decay_epochs" in kwargs:
            kwargs["decay_epochs"] = tuple(int(e) for e in kwargs["decay_epochs"])
        return cls(**kwargs)

    def replace(self, **changes: Any) -> TrainConfig:
        return replace(self, **changes)

    # -- validation ----------------------------------------------------------------------------
    def validate(self) -> TrainConfig:
        """Raise :class:`UsageError` (one line) for the first impossible setting."""
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise UsageError(message)

        need(self.objective in OBJECTIVES, f"unknown objective {self.objective!r}{did_you_mean(self.objective, OBJECTIVES)}; choose jem or factored")
        need(self.optimizer in OPTIMIZERS, f"unknown optimizer {self.optimizer!r}{did_you_mean(self.optimizer, OPTIMIZERS)}; choose adam or sgd")
        need(self.sampler in SAMPLERS, f"unknown sampler {self.sampler!r}{did_you_mean(str(self.sampler), SAMPLERS)}; choose sgld or proximal")
        need(self.inner_steps >= 0, f"--inner-steps must be >= 0, got {self.inner_steps}")
        need(self.inner_step_size > 0 and math.isfinite(self.inner_step_size),
             f"--inner-step-size must be > 0, got {self.inner_step_size}")
        need(self.inner_grad_clip > 0 and math.isfinite(self.inner_grad_clip),
             f"--inner-grad-clip must be > 0, got {self.inner_grad_clip}")
        need(self.sgld_bn_mode in BN_MODES, f"SGLD BatchNorm mode must be eval or train, got {self.sgld_bn_mode!r}")
        need(self.epochs >= 1, f"--epochs must be >= 1, got {self.epochs}")
        need(self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}")
        for name in ("px_weight", "pyx_weight", "pxy_weight", "energy_l2", "sigma", "eval_sigma", "sgld_std", "weight_decay"):
            value = getattr(self, name)
            need(math.isfinite(value) and value >= 0, f"--{name.replace('_', '-')} must be a number >= 0, got {value}")
        need(self.lr > 0 and math.isfinite(self.lr), f"--lr must be > 0, got {self.lr}")
        need(self.sgld_lr > 0 and math.isfinite(self.sgld_lr), f"--sgld-lr must be a finite number > 0, got {self.sgld_lr}")
        need(self.sgld_steps >= 1 or not self.samples, f"--sgld-steps must be >= 1 when p(x) is trained, got {self.sgld_steps}")
        need(self.buffer_size >= 1, f"--buffer-size must be >= 1, got {self.buffer_size}")
        need(0.0 <= self.reinit_freq <= 1.0, f"--reinit-freq must lie in [0, 1], got {self.reinit_freq}")
        need(0.0 < self.decay_rate <= 1.0, f"--decay-rate must lie in (0, 1], got {self.decay_rate}")
        need(self.warmup_iters >= 0, f"--warmup-iters must be >= 0, got {self.warmup_iters}")
        need(all(e >= 1 for e in self.decay_epochs), f"--decay-epochs must be positive epoch numbers, got {list(self.decay_epochs)}")
        need(0.0 <= self.momentum < 1.0, f"--momentum must lie in [0, 1), got {self.momentum}")
        need(self.val_size is None or self.val_size >= 0, f"--val-size must be >= 0, got {self.val_size}")
        need(self.labels_per_class is None or self.labels_per_class >= 1,
             f"--labels-per-class must be >= 1, got {self.labels_per_class}")
        need(self.max_recoveries >= 0, f"--max-recoveries must be >= 0, got {self.max_recoveries}")
        need(self.check_every >= 1, f"check_every must be >= 1, got {self.check_every}")
        need(self.grid_every >= 0, f"grid_every must be >= 0, got {self.grid_every}")
        need(not (self.resume and self.overwrite), RESUME_OR_OVERWRITE)
        need(self.pyx_weight > 0 or self.samples, "every loss weight is 0: set --pyx-weight, --px-weight or --pxy-weight above 0")
        if self.objective == "factored":
            need(self.pyx_weight == 0 and self.px_weight == 0,
                 "--objective factored trains only the class-conditional contrast (weight --pxy-weight): "
                 "leave --pyx-weight and --px-weight at 0")
            need(self.pxy_weight > 0, "--objective factored needs --pxy-weight > 0")
            need(self.labels_per_class is None, "--objective factored needs every label: drop --labels-per-class")
        if self.short_run:
            need(self.samples, "--short-run needs sampling: set --px-weight or --pxy-weight above 0")
        if self.class_cond_px:
            need(self.px_weight > 0, "class-conditional p(x) negatives need --px-weight > 0")
        aug = self.augment if isinstance(self.augment, str) else ""
        if aug not in ("auto", "none"):
            from jemeval.training.augment import parse_augment

            parse_augment(aug)  # raises UsageError when malformed
        return self


def dataset_defaults(dataset: str) -> dict[str, Any]:
    """The defaults for a dataset spec (by its base name); generic small defaults otherwise."""
    return dict(DATASET_DEFAULTS.get(parse_spec(dataset).name, {}))


def objective_defaults(objective: str | None) -> dict[str, Any]:
    """The factored ablation trains only the class-conditional contrast."""
    if objective == "factored":
        return {"pyx_weight": 0.0, "px_weight": 0.0, "pxy_weight": 1.0}
    return {}


def resolve_config(dataset: str, **overrides: Any) -> TrainConfig:
    """A validated :class:`TrainConfig`: dataclass defaults < dataset defaults < objective < overrides.

    ``None`` values in ``overrides`` mean "not given" and keep the defaults (click's habit).
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise UsageError(f"unknown training setting {unknown[0]!r}{did_you_mean(unknown[0], known)}")
    merged: dict[str, Any] = {"dataset": dataset}
    merged.update(dataset_defaults(dataset))
    merged.update(objective_defaults(given.get("objective")))
    merged.update(given)
    if "decay_epochs" in merged:
        merged["decay_epochs"] = tuple(int(e) for e in merged["decay_epochs"])
    return TrainConfig(**merged).validate()


def resume_config(stored: dict[str, Any], **overrides: Any) -> TrainConfig:
    """The stored config of a run, with the few settings a resume may change.

    Any other explicitly given setting that differs from the stored one is an error: a resumed
    run must compute exactly what the uninterrupted run would have.
    """
    config = TrainConfig.from_dict(stored)
    given = {k: v for k, v in overrides.items() if v is not None}
    if given.get("overwrite"):
        raise UsageError(RESUME_OR_OVERWRITE)
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
            f"--resume continues the stored run; these settings differ from it: {', '.join(changed)}; "
            "drop them or start a new run with another --out"
        )
    changes = {k: v for k, v in given.items() if k in RESUMABLE_CHANGES and hasattr(config, k)}
    changes.update(resume=True, overwrite=False)  # a run started with overwrite=True resumes without it
    return config.replace(**changes).validate()


def resume_path(out: str | os.PathLike) -> Path:
    """``out/last.pt``, which a resume continues (a one-line error when there is none)."""
    path = Path(out) / "last.pt"
    if not path.exists():
        raise UsageError(f"--resume: no {str(path)!r} to continue; run without --resume or pass the run's --out")
    return path


def load_resume_checkpoint(out: str) -> dict[str, Any]:
    """The ``last.pt`` of the run in ``out``, checked to hold what a resume needs (one-line errors)."""
    from jemeval.formats.native import read_checkpoint

    path = resume_path(out)
    ckpt = read_checkpoint(path)
    if not (isinstance(ckpt, dict) and isinstance(ckpt.get("training_state"), dict) and isinstance(ckpt.get("config"), dict)):
        raise UsageError(f"--resume: {str(path)!r} holds no training state (best.pt carries none; only last.pt "
                         "written by jemeval train can be resumed)")
    return ckpt


def resume_from(dataset: str, **given: Any) -> TrainConfig:
    """The config that continues the run in ``given["out"]`` (default ``runs/DATASET``).

    ``given`` holds only what the caller set explicitly: everything else comes from the stored run,
    and an explicit setting that differs from it is an error (see :func:`resume_config`).
    """
    if given.get("overwrite"):
        raise UsageError(RESUME_OR_OVERWRITE)
    out = given.get("out") or f"runs/{parse_spec(dataset).name}"
    stored = load_resume_checkpoint(out)["config"]
    if stored.get("dataset") not in (None, dataset):
        raise UsageError(f"--resume: the run in {str(out)!r} is on {stored.get('dataset')!r}, not {dataset!r}")
    return resume_config(stored, **{**given, "out": str(out)})
