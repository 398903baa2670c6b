"""What a run trains with, built once: data, model, optimizer, replay buffer, monitor, random stream.

:func:`build` wires them in a fixed order: :func:`seed_everything` first (the one place a run's
random streams are seeded), before the model's initialisation and the buffer's uniform start, so a
seed gives the same run. Only the iteration itself (:class:`~.step.TrainStep`) is rebuilt during a
run: divergence recovery may change its SGLD steps and energy penalty (:func:`make_step`, with
:meth:`~.divergence.Adjustments.applied_to`) and reseeds (:func:`seed_everything` again).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from jemeval.energy.factory import create_model
from jemeval.energy.model import EnergyModel
from jemeval.errors import UsageError
from jemeval.runtime import distributed as D
from jemeval.runtime.distributed import DistContext
from jemeval.runtime.fastpath import FastPath
from jemeval.sampling.buffer import ChainStarts, ReplayBuffer
from jemeval.sampling.gaussian_starts import GaussianStarts
from jemeval.training import ddp
from jemeval.training.augment import Augment, augment_for
from jemeval.training.config import TrainConfig
from jemeval.training.divergence import Adjustments, DivergenceMonitor, RecoveryPolicy
from jemeval.training.objectives import Weights
from jemeval.training.splits import TrainingData, prepare_data
from jemeval.training.step import StepOptions, TrainStep
from jemeval.training.warmstart import warm_start


@dataclass
class Parts:
    """The run's fixed parts (see the module docstring); ``model`` is the eager module that
    checkpoints save, ``forward``/``sample`` what training and SGLD call (compiled, DDP-wrapped)."""

    config: TrainConfig
    out: Path
    device: torch.device
    ctx: DistContext
    fastpath: FastPath
    generator: torch.Generator
    data: TrainingData
    augment: Augment
    model: EnergyModel
    forward: nn.Module
    sample: nn.Module
    optimizer: torch.optim.Optimizer
    buffer: ReplayBuffer | None
    monitor: DivergenceMonitor
    policy: RecoveryPolicy
    init_note: str | None = None  # a warm start's line: the source, and whether its head was kept
    gaussian_starts: GaussianStarts | None = None  # fit to the labelled training images when asked for


def build(config: TrainConfig, ctx: DistContext, device: torch.device) -> Parts:
    """Every part of a fresh run of ``config`` on this rank (a resume then restores last.pt into them)."""
    fastpath = FastPath.for_device(device, bf16=config.bf16, channels_last=config.channels_last,
                                   compile=config.compile, pin_memory=False)
    generator = torch.Generator(device=device)
    seed_everything(config.seed, generator, ctx)
    data = prepare_data(config, device)
    augment = augment_for(config.augment, data.info, data.input_shape)
    model, config, init_note = initial_model(config, data)
    model = model.to(device)
    prepared = fastpath.prepare(model, wrap=ctx.wrap)  # the eager module is kept for checkpoints
    optimizer = make_optimizer(config, model)
    gaussians = fit_gaussian_starts(config, data)
    buffer = make_buffer(config, data, ctx, device, generator, gaussians)
    monitor = DivergenceMonitor(config.max_abs_loss, config.max_abs_energy, config.energy_gap_band,
                                config.gap_patience)
    return Parts(config=config, out=Path(config.out_dir), device=device, ctx=ctx, fastpath=fastpath,
                 generator=generator, data=data, augment=augment, model=model, forward=prepared.run,
                 sample=prepared.sample, optimizer=optimizer, buffer=buffer, monitor=monitor,
                 policy=RecoveryPolicy(config.seed, sampling=config.samples), init_note=init_note,
                 gaussian_starts=gaussians)


def initial_model(config: TrainConfig, data: TrainingData) -> tuple[EnergyModel, TrainConfig, str | None]:
    """(the network a run starts from, the config, a warm start's line). A fresh network from the
    seeded generators; with ``init`` the source's weights copied in (:mod:`.warmstart`, which records
    the head decision in the config's ``init_from``); a resume builds the same network and restores
    last.pt, never reading the source again."""
    init = config.init_from
    model = create_model(config.arch, data.num_classes, data.input_shape, metadata={"dataset": config.dataset},
                         normalization=(init or {}).get("normalization"))
    if not init or config.resume:
        return model, config, None
    record, line = warm_start(model, init, data.info.get("class_names"), download=config.download)
    return model, config.replace(init_from=record), line


def seed_everything(seed: int, generator: torch.Generator | None = None, ctx: DistContext | None = None) -> None:
    """Seed, once, every random stream a run draws from: torch's global generators (initialisation,
    dropout; CUDA's too), NumPy's, Python's, and the trainer's own ``generator`` (shuffling, buffer
    draws, SGLD noise, augmentation, sigma noise): ``seed`` itself in a single process, this rank's
    independent stream under DDP (:func:`jemeval.runtime.distributed.rank_generator`). A fresh run
    calls it before building anything; a rollback calls it with the recovery seed."""
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))
    random.seed(seed)
    if generator is None:
        return
    if ctx is not None and ctx.distributed:
        generator.set_state(D.rank_generator(seed, ctx.rank, generator.device).get_state())
    else:
        generator.manual_seed(seed)


def fit_gaussian_starts(config: TrainConfig, data: TrainingData) -> GaussianStarts | None:
    """The per-class Gaussians a fraction ``gaussian_starts`` of the chains start from, fit to the labelled
    training images; the same on every rank and on a resume (float64, on the CPU)."""
    if not (config.gaussian_starts > 0 and config.samples):
        return None
    x, y = data.labelled_images()
    return GaussianStarts.fit(x, y, data.input_shape)


def make_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    params = model.parameters()
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, betas=(0.9, 0.999), weight_decay=config.weight_decay)
    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)


def make_buffer(config: TrainConfig, data: TrainingData, ctx: DistContext, device: torch.device,
                generator: torch.Generator, gaussians: GaussianStarts | None = None) -> ReplayBuffer | None:
    """This rank's share of the persistent chains (None for the plain classifier and short-run chains)."""
    if not config.samples or config.short_run:
        return None
    share = ddp.buffer_share(config.buffer_size, ctx)  # each rank keeps buffer_size // world chains
    if config.class_blocks and share < data.num_classes:
        raise UsageError(f"buffer_size={config.buffer_size} gives {share} chains per process, fewer than the "
                         f"{data.num_classes} classes; class-conditional sampling needs at least one per class",
                         param="buffer_size")
    return ReplayBuffer(share, data.input_shape, num_classes=data.num_classes, reinit_freq=config.reinit_freq,
                        device=device, generator=generator, starts=_starts(config, gaussians))


def make_step(parts: Parts, adjustments: Adjustments) -> TrainStep:
    """One training iteration with the settings now in force (rebuilt after every recovery)."""
    config = adjustments.applied_to(parts.config)
    weights = Weights(pyx=config.pyx_weight, px=config.px_weight, pxy=config.pxy_weight, l2=config.energy_l2)
    options = StepOptions(sigma=config.sigma, short_run=config.short_run, class_cond_px=config.class_cond_px,
                          starts=_starts(config, parts.gaussian_starts), fastpath=parts.fastpath)
    return TrainStep(parts.model, parts.optimizer, sgld=config.sgld(), buffer=parts.buffer, weights=weights,
                     num_classes=parts.data.num_classes, input_shape=parts.data.input_shape, augment=parts.augment,
                     generator=parts.generator, options=options, forward=parts.forward, sample_forward=parts.sample)


def _starts(config: TrainConfig, gaussians: GaussianStarts | None) -> ChainStarts | None:
    return None if gaussians is None else gaussians.mixture(config.gaussian_starts)
