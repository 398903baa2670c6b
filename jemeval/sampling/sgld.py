"""SGLD: the sampler JEM uses in practice, shared by training, refinement and generation.

The update is the one JEM uses in practice (gradient *ascent* on log p~):

    x <- x + step_size * d/dx sum_batch log p~(x [, y]) + noise * N(0, I)

with log p~(x) = logsumexp f(x) (unconditional) or log p~(x, y) = f(x)[y] (class-conditional).
While sampling, the network's parameters are frozen (``requires_grad=False``) so that no autograd
graph is built for them and no parameter gradient is computed or accumulated: each step is one
forward and one backward for the input gradient only. The model's train/eval mode and every
parameter's ``requires_grad`` flag are restored afterwards, even when sampling raises.

A step is as cheap as an input gradient can be: parameters frozen (autograd prunes every weight
branch), no graph kept between steps, the update fused into two kernels on a fresh tensor, the trace
kept on the device (no ``.item()``). The optional ``fastpath`` of :meth:`SGLD.sample` adds bf16
autocast for the network and channels_last chains (:mod:`jemeval.runtime.fastpath`); the chains, the update
and the replay buffer stay fp32. Measurements: benchmarks/README.md.
"""
from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from jemeval.energy.model import log_p
from jemeval.errors import UsageError
from jemeval.runtime.fastpath import to_fp32

if TYPE_CHECKING:
    from jemeval.runtime.fastpath import FastPath

BN_MODES = ("eval", "train")


@contextlib.contextmanager
def frozen(model: nn.Module, *, train: bool | None = None) -> Iterator[nn.Module]:
    """Freeze parameters (and optionally set train/eval mode); restore both on exit.

    With ``train=True`` BatchNorm layers normalise with each batch's own statistics (JEM++'s
    sampling mode) but their running statistics are restored afterwards: sampling never changes
    the model a checkpoint or a later evaluation sees.
    """
    was_training = model.training
    flags = [(p, p.requires_grad) for p in model.parameters()]
    norm_state = _batchnorm_buffers(model) if train else []
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        if train is not None:
            model.train(train)
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        with torch.no_grad():
            for buf, saved in norm_state:
                buf.copy_(saved)
        model.train(was_training)


def _batchnorm_buffers(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(buffer, copy) for every running statistic of the model's BatchNorm layers."""
    saved = []
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            for buf in (module.running_mean, module.running_var, module.num_batches_tracked):
                if buf is not None:
                    saved.append((buf, buf.detach().clone()))
    return saved


def model_log_p(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
    """log p~(x) (``y`` is None) or log p~(x, y) of ``model`` at ``x``, per example (N,)."""
    return _log_p(model, x, y, None)


def _log_p(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None,
           autocast_dtype: torch.dtype | None) -> torch.Tensor:
    """:func:`model_log_p` with the network optionally under autocast; the reduction is fp32."""
    with _autocast(x, autocast_dtype):
        if y is not None and hasattr(model, "log_pxy"):  # an EnergyModel: lets conditional nets skip other classes
            return to_fp32(model.log_pxy(x, y))
        logits = model(x)
    return log_p(to_fp32(logits), y)


def _autocast(x: torch.Tensor, dtype: torch.dtype | None):
    return contextlib.nullcontext() if dtype is None else torch.autocast(x.device.type, dtype=dtype)


def input_grad(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor | None = None, *, create_graph: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p~(x [, y]), d/dx of its batch sum), computed w.r.t. the input only.

    Call it inside :func:`frozen` (or on a model whose parameters do not require grad) to avoid
    building graph nodes for the parameters. Examples are independent (eval-mode networks have no
    cross-example terms), so the gradient of the sum is each example's own gradient.
    """
    return _input_grad(model, x, y, create_graph, None)


def _input_grad(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor | None, create_graph: bool, autocast_dtype: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor]:
    if not x.requires_grad:
        x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        value = _log_p(model, x, y, autocast_dtype)
        # Only x is requested: autograd prunes every parameter branch, and no graph outlives the call.
        (grad,) = torch.autograd.grad(value.sum(), x, create_graph=create_graph)
    return value, grad


@dataclass
class SGLD:
    """Stochastic gradient Langevin dynamics as used by JEM (settings are recorded in results).

    steps:      number of updates
    step_size:  alpha, the gradient's multiplier (JEM: 1.0)
    noise:      std of the Gaussian noise added each step (JEM: 0.01)
    clamp:      optional (lo, hi) to clamp samples after each step (SADA-JEM clamps to [-1, 1])
    bn_mode:    "eval" (JEM) or "train" (JEM++ keeps BatchNorm in train mode while sampling)
    """

    steps: int = 20
    step_size: float = 1.0
    noise: float = 0.01
    clamp: tuple[float, float] | None = None
    bn_mode: str = "eval"

    def __post_init__(self) -> None:
        check_sampler_fields(self)

    def settings(self) -> dict:
        """Plain-data settings for provenance records."""
        d = asdict(self)
        d["clamp"] = list(self.clamp) if self.clamp is not None else None
        return d

    def sample(
        self,
        model: nn.Module,
        x0: torch.Tensor,
        y: torch.Tensor | None = None,
        *,
        steps: int | None = None,
        create_graph: bool = False,
        generator: torch.Generator | None = None,
        return_trace: bool = False,
        fastpath: FastPath | None = None,
    ):
        """Run the chains from ``x0``; returns the samples (and, with ``return_trace``, the mean
        log p~ before each step and after the last, a tensor of length steps + 1).

        ``create_graph=True`` keeps the graph through the steps w.r.t. the *input* (never the
        parameters), so an attacker can differentiate through the refinement.
        The trace stays on the device: no host synchronisation inside the loop.
        ``fastpath`` (a :class:`jemeval.runtime.fastpath.FastPath`) runs the network under bf16 autocast
        and/or on channels_last chains; the chains, the update and the trace stay fp32. Without it
        (the default) every step is plain fp32, as before.
        """
        n_steps = self.steps if steps is None else int(steps)
        dtype = fastpath.autocast_dtype if fastpath is not None else None
        trace = []
        with frozen(model, train=(self.bn_mode == "train")):
            x = x0 if create_graph else x0.detach()
            if fastpath is not None and fastpath.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            for _ in range(n_steps):
                value, grad = _input_grad(model, x, y, create_graph, dtype)
                if return_trace:
                    trace.append(value.detach().mean())
                x = self._update(x, grad, generator, create_graph)
            if return_trace:
                with torch.no_grad():
                    trace.append(_log_p(model, x.detach(), y, dtype).mean())
        out = x if create_graph else x.detach()
        if return_trace:
            return out, (torch.stack(trace) if trace else torch.zeros(0))
        return out

    def _update(self, x: torch.Tensor, grad: torch.Tensor, generator: torch.Generator | None,
                create_graph: bool) -> torch.Tensor:
        """One step with fresh noise. The noise is drawn even when ``noise == 0`` so the
        generator's stream does not depend on it."""
        noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return self.update(x, grad, noise, create_graph=create_graph)

    def update(self, x: torch.Tensor, grad: torch.Tensor, noise: torch.Tensor, *,
               create_graph: bool = False) -> torch.Tensor:
        """The SGLD update, the one place it is written: x + step_size * grad + self.noise * noise
        (then the optional clamp), as a fresh tensor.

        Without ``create_graph`` it is two fused kernels on a new tensor (``add`` with ``alpha``,
        then an in-place ``add_``) and never touches ``x`` (a chain start or the replay buffer).
        With it, the result stays differentiable w.r.t. ``x`` (refinement's exact gradients).
        """
        if create_graph:
            x = x + self.step_size * grad + self.noise * noise
            return x.clamp(*self.clamp) if self.clamp is not None else x
        x = torch.add(x.detach(), grad, alpha=self.step_size).add_(noise, alpha=self.noise)
        return x.clamp_(*self.clamp) if self.clamp is not None else x


def check_sampler_fields(sampler, floats: Sequence[str] = ("step_size", "noise")) -> None:
    """Validate the fields every sampler shares (steps, step size, noise, bn_mode, clamp) with one-line errors.

    Every command that samples builds its sampler through a constructor that calls this, so a NaN or
    infinite step size, noise or clamp bound (``--sgld-lr nan``) is refused here, once, instead of
    turning every chain into NaN and printing accuracy 0. ``floats`` names the float fields to
    check (a sampler adds its own). ``UsageError`` is a ``ValueError``, so Python callers can catch
    either; the command line shows the message as one line whichever command built the sampler.
    """
    kind = type(sampler).__name__
    steps = sampler.steps
    number = isinstance(steps, numbers.Real) and not isinstance(steps, bool)
    whole = number and math.isfinite(steps) and steps == int(steps)
    if not whole:
        raise UsageError(f"{kind} steps must be a whole number >= 0, got {steps!r}")
    if int(steps) < 0:
        raise UsageError(f"{kind} steps must be >= 0, got {steps}")
    for name in floats:
        finite_number(getattr(sampler, name), f"{kind} {name}")
    if sampler.bn_mode not in BN_MODES:
        raise UsageError(f"BatchNorm mode while sampling must be one of {', '.join(BN_MODES)}, got {sampler.bn_mode!r}")
    if sampler.clamp is not None:
        if isinstance(sampler.clamp, (str, bytes)) or not hasattr(sampler.clamp, "__len__") or len(sampler.clamp) != 2:
            raise UsageError(f"{kind} clamp must be two numbers (lo, hi), got {sampler.clamp!r}")
        lo, hi = (finite_number(v, f"{kind} clamp bound") for v in sampler.clamp)
        if lo > hi:
            raise UsageError(f"{kind} clamp must be (lo, hi) with lo <= hi, got {sampler.clamp!r}")
        sampler.clamp = (lo, hi)


def finite_number(value, name: str) -> float:
    """``float(value)``, or a one-line UsageError naming ``name`` when it is not a finite number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(number):
        raise UsageError(f"{name} must be a finite number, got {value!r}")
    return number
