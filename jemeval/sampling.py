"""SGLD sampling and the replay buffer, shared by training, refinement and generation.

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
autocast for the network and channels_last chains (:mod:`jemeval.fastpath`); the chains, the update
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

from .errors import UsageError
from .fastpath import to_fp32

if TYPE_CHECKING:
    from .fastpath import FastPath

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


def last_writer(idx: torch.Tensor, size: int) -> torch.Tensor:
    """For each position of ``idx``, the position of the LAST occurrence of its index.

    Buffer draws are with replacement, so a batch may name the same slot twice; a plain
    ``data[idx] = x`` then lets thread timing pick the winner and CPU runs stop being
    reproducible. Writing ``x[last_writer(idx, size)]`` gives all duplicates the same value.
    No host synchronisation.
    """
    pos = torch.arange(len(idx), device=idx.device)
    last = torch.full((size,), -1, dtype=torch.long, device=idx.device).scatter_reduce_(0, idx, pos, reduce="amax")
    return last[idx]


def log_p(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
    """log p~(x) (``y`` is None) or log p~(x, y), per example (N,)."""
    return _log_p(model, x, y, None)


def _log_p(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None, autocast_dtype: torch.dtype | None) -> torch.Tensor:
    """:func:`log_p` with the network optionally under autocast; the reduction is always fp32."""
    with _autocast(x, autocast_dtype):
        if y is not None and hasattr(model, "log_pxy"):  # an EnergyModel: lets conditional nets skip other classes
            return to_fp32(model.log_pxy(x, y))
        logits = model(x)
    logits = to_fp32(logits)
    if logits.dim() != 2:
        logits = logits.reshape(logits.shape[0], -1)
    if y is None:
        return logits.logsumexp(dim=1)
    return logits.gather(1, y.view(-1, 1)).squeeze(1)


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
        ``fastpath`` (a :class:`jemeval.fastpath.FastPath`) runs the network under bf16 autocast
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
        """x + step_size * grad + noise * N(0, I) (then the optional clamp), as a fresh tensor.

        Without ``create_graph`` the update is two fused kernels on a new tensor (``add`` with
        ``alpha``, then an in-place ``add_``) and never touches ``x0`` or the replay buffer. The
        noise is drawn even when ``noise == 0`` so the generator's stream does not depend on it.
        """
        noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
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
    if isinstance(steps, bool) or not isinstance(steps, numbers.Real) or not math.isfinite(steps) or steps != int(steps):
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


#: JEM release's SGLD settings, used when neither the caller nor the checkpoint gives them
JEM_SGLD = {"step_size": 1.0, "noise": 0.01, "clamp": None, "bn_mode": "eval"}
#: other names training configs use for the same settings
_SGLD_ALIASES = {"step_size": ("step_size", "lr", "sgld_lr"), "noise": ("noise", "std", "sgld_std"),
                 "clamp": ("clamp",), "bn_mode": ("bn_mode",)}


def recorded_sampler_settings(model: nn.Module) -> dict:
    """The sampler settings a checkpoint recorded (``metadata["config"]["sgld"]``), or ``{}``."""
    config = (getattr(model, "metadata", None) or {}).get("config") or {}
    cfg = config.get("sgld") if isinstance(config, dict) else None
    return cfg if isinstance(cfg, dict) else {}


def trained_sampler(model: nn.Module) -> str | None:
    """The sampler the model was trained with when it was not plain SGLD (e.g. "proximal-sgld")."""
    name = recorded_sampler_settings(model).get("sampler")
    return str(name) if name and name != "sgld" else None


def recorded_sgld(model: nn.Module, steps: int, **overrides) -> tuple["SGLD", str]:
    """The plain SGLD for evaluating ``model``: explicit ``overrides`` (None = not given), else the
    settings the checkpoint recorded, else the JEM release's; plus a note saying where they came from.

    Every command that samples (refinement, sample, robust, distal, eval) builds its sampler here,
    so they all read a checkpoint the same way. A proximal-SGLD checkpoint contributes only the
    plain-SGLD settings (step size, noise, clamp, BatchNorm mode), and the note says so.
    """
    cfg = recorded_sampler_settings(model)
    merged = dict(JEM_SGLD)
    for key, aliases in _SGLD_ALIASES.items():
        found = next((cfg[a] for a in aliases if cfg.get(a) is not None), None)
        if found is not None:
            merged[key] = found
    merged.update({k: v for k, v in overrides.items() if v is not None})
    source = "checkpoint config" if cfg else "JEM release defaults"
    if trained_sampler(model):
        source += (f" (trained with {trained_sampler(model)}; sampling uses plain SGLD with its step size, "
                   "noise, clamp and BatchNorm mode)")
    merged["clamp"] = tuple(merged["clamp"]) if merged["clamp"] is not None else None
    return SGLD(steps=int(steps), step_size=float(merged["step_size"]), noise=float(merged["noise"]),
                clamp=merged["clamp"], bn_mode=str(merged["bn_mode"])), source


def uniform_like_shape(n: int, shape: Sequence[int], *, device=None, generator=None) -> torch.Tensor:
    """U(-1, 1) images, the JEM chain initialisation."""
    return torch.rand((n, *shape), generator=generator, device=device) * 2 - 1


class ReplayBuffer:
    """Persistent chains for PCD training and for sampling from a checkpoint.

    ``size`` images initialised U(-1, 1) on ``device``. :meth:`sample` draws chain starts, each
    re-initialised from U(-1, 1) with probability ``reinit_freq``; :meth:`push` writes the chains'
    new states back. Class-conditional draws treat the buffer as ``num_classes`` contiguous blocks
    (index = y * (size // K) + offset), as the JEM release does.
    """

    def __init__(
        self,
        size: int,
        input_shape: Sequence[int],
        *,
        num_classes: int | None = None,
        reinit_freq: float = 0.05,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
    ) -> None:
        if size <= 0:
            raise ValueError(f"replay buffer size must be > 0, got {size}")
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.reinit_freq = float(reinit_freq)
        self.device = torch.device(device)
        self.data = uniform_like_shape(size, self.input_shape, device=self.device, generator=generator)

    def __len__(self) -> int:
        return self.data.shape[0]

    def sample(
        self, n: int, y: torch.Tensor | None = None, *, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x0, indices): ``n`` chain starts, on the buffer's device."""
        size = len(self)
        if y is None:
            idx = torch.randint(0, size, (n,), generator=generator, device=self.device)
        else:
            if not self.num_classes:
                raise ValueError("class-conditional sampling needs a buffer built with num_classes")
            per_class = size // self.num_classes
            idx = y.to(self.device) * per_class + torch.randint(0, per_class, (n,), generator=generator, device=self.device)
        x0 = self.data[idx]
        fresh = uniform_like_shape(n, self.input_shape, device=self.device, generator=generator)
        reinit = torch.rand(n, generator=generator, device=self.device) < self.reinit_freq
        x0 = torch.where(reinit.view(-1, *([1] * len(self.input_shape))), fresh, x0)
        return x0, idx

    def push(self, idx: torch.Tensor, x: torch.Tensor) -> None:
        """Write chains back; with duplicate indices the last one wins, deterministically."""
        idx = idx.to(self.data.device)
        x = x.detach().to(self.data.device, self.data.dtype)
        self.data[idx] = x[last_writer(idx, len(self))]

    def state_dict(self) -> dict:
        return {"data": self.data, "reinit_freq": self.reinit_freq, "num_classes": self.num_classes}

    @classmethod
    def from_tensor(cls, data: torch.Tensor, *, num_classes=None, reinit_freq=0.05, device="cpu") -> ReplayBuffer:
        buf = cls.__new__(cls)
        buf.input_shape = tuple(data.shape[1:])
        buf.num_classes = num_classes
        buf.reinit_freq = float(reinit_freq)
        buf.device = torch.device(device)
        buf.data = data.to(buf.device, torch.float32).clone()
        return buf
