"""The fast path: switches that make training and SGLD cheaper without changing what is computed.

JEM spends ~95% of its time in the network (an iteration is about steps + 1 forward/backward
passes), so speed comes from making each pass cheaper and from not doing passes twice:

* ``bf16``: the network's forward runs under ``torch.autocast(dtype=bfloat16)``. SGLD's arithmetic
  (gradient step, noise, clamping), the replay buffer and every loss stay fp32: logits are cast to
  float before logsumexp / cross-entropy, so only the network's matmuls and convolutions are
  rounded, far below the SGLD noise (std 0.01 vs a bf16 relative error of 2^-8 on the gradient).
* ``channels_last``: NHWC weights and activations; cuDNN and oneDNN convolutions avoid layout
  reorders (worth ~10% on this project's CPU benchmarks, more on tensor-core GPUs).
* ``compile``: ``torch.compile`` of the model used by SGLD and training. The compiled wrapper is
  kept *separate* from the eager module (:class:`PreparedModel`): checkpoints, optimizers and
  ``state_dict`` keys use the eager module, so compiled and eager runs write identical files.
* ``pin_memory``: page-locked host batches copied with ``non_blocking=True``.

:meth:`FastPath.for_device` turns bf16, channels_last and pinned memory on for CUDA and only
channels_last on for CPU (each switch can be overridden). ``compile`` is off by default everywhere:
on an H100 at the paper's settings it gave nothing in steady state (the SGLD step is bound by cuDNN's
convolution kernels) and cost ~20 s of warm-up per run, and on CPU it was *slower* than eager for WRN
(docs/performance.md, benchmarks/README.md). On CPU, bf16 is fast only on CPUs with AVX512-BF16/AMX
(and catastrophically slow for small convolutions in some builds) and changes results slightly.
Nothing here synchronises the host with the device.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

AUTOCAST_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class FastPath:
    """Speed switches for one device; every switch is recorded (:meth:`settings`) with results.

    bf16:           autocast the network forward to bfloat16 (SGLD arithmetic/buffer/losses fp32)
    channels_last:  NHWC memory format for the model's weights and 4-D inputs
    compile:        wrap the model in ``torch.compile`` (eager module kept for checkpoints)
    compile_mode:   ``torch.compile`` mode (None = default; "max-autotune" for long GPU runs)
    pin_memory:     page-locked host batches, copied to the device with ``non_blocking=True``
    """

    bf16: bool = False
    channels_last: bool = False
    compile: bool = False
    compile_mode: str | None = None
    pin_memory: bool = False

    @classmethod
    def for_device(cls, device: torch.device | str, **overrides: Any) -> FastPath:
        """bf16, channels_last and pinned memory on for CUDA; on CPU only ``channels_last`` (8-29%
        faster conv passes in benchmarks/, rounding-level differences); ``overrides`` (None = keep
        the default) win.

        On a CUDA device without bf16 support (pre-Ampere) ``bf16`` defaults to off. bf16 stays
        off on CPU (fast only with native bf16 units). ``compile`` is off on every device: no
        steady-state gain measured on CUDA or CPU, and a slow start (docs/performance.md).
        """
        device = torch.device(device)
        on = device.type == "cuda"
        bf16_ok = on and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        base = cls(bf16=bf16_ok, channels_last=True, compile=False, pin_memory=on)
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown fast-path switch(es): {sorted(unknown)}")
        return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The network's compute dtype under autocast, or None for plain fp32."""
        return AUTOCAST_DTYPE if self.bf16 else None

    def settings(self) -> dict[str, Any]:
        """Plain-data switches for provenance records."""
        return dataclasses.asdict(self)

    # -- the model ------------------------------------------------------------------------------
    def prepare(self, model: nn.Module, *, wrap: Callable[[nn.Module], nn.Module] | None = None) -> PreparedModel:
        """Apply channels_last (in place, to the eager module), then ``wrap`` (e.g. a
        :class:`~jemeval.runtime.distributed.DistContext`'s DistributedDataParallel), then compile.

        ``run`` is what training calls, ``sample`` what SGLD calls (compiled, never the DDP
        wrapper: sampling needs no gradient reduction), ``eager`` what checkpoints save.
        """
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        compiled = torch.compile(model, mode=self.compile_mode) if self.compile else model
        if wrap is None:
            return PreparedModel(eager=model, run=compiled, sample=compiled)
        wrapped = wrap(model)
        if wrapped is model:  # e.g. a single-process DistContext
            return PreparedModel(eager=model, run=compiled, sample=compiled)
        run = torch.compile(wrapped, mode=self.compile_mode) if self.compile else wrapped
        return PreparedModel(eager=model, run=run, sample=compiled)

    def autocast(self, device_type: str | torch.device) -> contextlib.AbstractContextManager:
        """Context for the network forward: bf16 autocast when on, a no-op otherwise."""
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device_type).type, dtype=AUTOCAST_DTYPE)

    def to_input(self, x: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
        """Move a batch to ``device`` (non-blocking when pinned) in the model's memory format."""
        if device is not None:
            x = x.to(device, non_blocking=self.pin_memory)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x


@dataclass(frozen=True)
class PreparedModel:
    """An eager module and the callables that run it (all the same object unless compiled/wrapped).

    Train with ``run``, sample with ``sample`` (both share ``eager``'s parameters); save and build
    optimizers with ``eager``: a compiled module's ``state_dict`` keys carry an ``_orig_mod.``
    prefix, a DDP module's a ``module.`` prefix.
    """

    eager: nn.Module
    run: nn.Module
    sample: nn.Module

    @property
    def compiled(self) -> bool:
        return hasattr(self.sample, "_orig_mod")


def unwrap(model: nn.Module) -> nn.Module:
    """The eager module behind ``torch.compile`` and/or DistributedDataParallel wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def has_batchnorm(model: nn.Module) -> bool:
    """True when the model has BatchNorm layers (whose train-mode statistics mix a batch)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def joint_logits(
    model: nn.Module,
    *batches: torch.Tensor,
    fastpath: FastPath | None = None,
    shared: bool | None = None,
) -> list[torch.Tensor]:
    """fp32 logits of each batch (e.g. data and SGLD samples for the JEM loss), in order.

    With ``shared`` (default: when the model has no BatchNorm) all batches go through **one**
    forward pass over their concatenation: one larger pass is cheaper than several (better kernel
    utilisation, one weight read, one autograd graph) and gives the same logits. With BatchNorm in
    train mode a shared pass would mix data and sample statistics, which changes the model, so the
    batches then get separate passes (as the JEM release does; the training step keeps the samples'
    out of the running statistics, :mod:`jemeval.runtime.batchnorm`). When the labelled batch is the data
    batch (fully supervised training) its logits serve both the classifier loss and log p~(x_data),
    which saves the release's third pass.
    """
    fp = fastpath or FastPath()
    if shared is None:
        shared = not has_batchnorm(unwrap(model))
    device_type = batches[0].device.type
    dtype = batches[0].dtype
    with fp.autocast(device_type):
        if shared:
            logits = to_fp32(model(fp.to_input(torch.cat([b.to(dtype) for b in batches]))))
            return list(logits.split([len(b) for b in batches]))
        return [to_fp32(model(fp.to_input(b))) for b in batches]


def to_fp32(t: torch.Tensor) -> torch.Tensor:
    """Undo autocast's reduced precision (bf16/fp16 -> fp32); other dtypes pass unchanged."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t
