"""JEM++'s proximal SGLD ("PYLD", Yang & Ji, ICCV 2021): few full steps, cheap inner steps.

JEM++ borrows YOPO's idea (Zhang et al. 2019, "You Only Propagate Once"): a full forward/backward
gives both the input gradient eta = d/dx sum log p~(x) and p = the gradient w.r.t. the *first
layer's output* h1 = L1(x). Between full steps, the rest of the network is frozen into p and only
the first layer is re-evaluated: the inner steps ascend the Hamiltonian H(x) = <L1(x), p>, whose
gradient is p mapped back through the first layer (L1's transpose for a conv/linear layer).

What :class:`ProximalSGLD` does, per outer step (the JEM++ release's ``sample_q`` with
``in_steps > 0``; defaults from its CIFAR-10 script: 5 outer x 5 inner steps, ``sgld_lr`` 1,
``pyld_lr`` 0.2, ``eps`` 1, no noise)::

    value, eta, p = one full forward + backward at x      (eta: input grad, p: grad at L1's output)
    x <- x + step_size * eta                               (an SGLD step, not yet clamped)
    repeat inner_steps times:
        g <- d/dx <L1(x), p>                               (forward + backward of L1 only)
        x <- clamp(x + inner_step_size * clamp(g, -grad_clip, grad_clip), *clamp)
    x <- x + noise * N(0, I)

With ``inner_steps == 0`` the step is clamped before the noise, as in the release.

Facts and deviations, stated plainly:

* For an affine first layer applied (directly or after an affine input normalisation) to x, the
  Hamiltonian's gradient is the *constant* L1^T p, which equals eta. The inner steps then repeat
  the outer direction with a per-coordinate clip and a projection onto the box: PYLD amounts to a
  few large, box-projected SGLD steps. ``recompute_first_layer=True`` (default, faithful) still
  re-runs the first layer each inner step, which is what a non-affine prefix would need; ``False``
  reuses eta and gives the same samples for affine prefixes (tested) at zero network cost.
* The split must be exact: every gradient path from x must pass through the first layer. This is
  verified once per model (eta must equal the Hamiltonian's gradient at the same x; one host sync,
  cached afterwards). A model that fails, or has no conv/linear layer, or calls the first layer
  more than once per forward, is sampled with plain :class:`~jemeval.sampling.sgld.SGLD` (same steps,
  step size, noise, clamp, BatchNorm mode) after a ``RuntimeWarning``.
* JEM++ samples with BatchNorm in train mode; jemeval's default ``bn_mode`` is ``"eval"`` (sampling
  never changes the model) and ``"train"`` is one setting away.
* The release's leftover ``-H.backward()`` after the loop (it adds a gradient to conv1's weight
  that the next ``zero_grad`` discards) is not reproduced: sampling computes no weight gradient.
* ``torch.compile`` wrappers are bypassed (the eager module is sampled): gradients w.r.t. an
  intermediate output cannot be taken across a compiled graph.
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from jemeval.errors import UsageError
from jemeval.runtime.fastpath import to_fp32, unwrap
from jemeval.sampling.sgld import SGLD, _autocast, _log_p, check_sampler_fields, frozen

if TYPE_CHECKING:
    from jemeval.runtime.fastpath import FastPath

SPLIT_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


@dataclass(frozen=True)
class _Split:
    """Where a verified model splits: its first layer, and whether that layer sees x itself."""

    layer: nn.Module
    direct: bool  # the layer's input *is* the model's input: inner steps call the layer alone


#: verdicts of the exactness check, per model object: a split, or None (not splittable)
_SPLITS: weakref.WeakKeyDictionary[nn.Module, _Split | None] = weakref.WeakKeyDictionary()


class _StopForward(Exception):
    """Raised by a hook on the first layer to end a forward pass there (the inner steps' trick)."""


def first_layer(model: nn.Module) -> nn.Module | None:
    """The first conv/linear layer the input meets, or None.

    The JEM WRN layout answers directly (``model.net.f.conv1``). Otherwise a probe forward on one
    zero input (``model.input_shape``, eval mode, no grad) records which conv/linear layer runs
    first and stops there; a model without ``input_shape`` falls back to the first conv/linear in
    registration order. :class:`ProximalSGLD` verifies the split before trusting it.
    """
    model = unwrap(model)
    net = getattr(model, "net", model)
    conv1 = getattr(getattr(net, "f", None), "conv1", None)
    if isinstance(conv1, nn.Conv2d):
        return conv1
    candidates = [m for m in model.modules() if isinstance(m, SPLIT_LAYERS)]
    if not candidates:
        return None
    shape = getattr(model, "input_shape", None)
    if shape is None:
        return candidates[0]
    first: list[nn.Module] = []

    def pre_hook(module, args):
        first.append(module)
        raise _StopForward

    handles = [m.register_forward_pre_hook(pre_hook) for m in candidates]
    try:
        ref = next(iter(model.parameters()), None)
        x = torch.zeros((1, *shape), device=ref.device if ref is not None else None,
                        dtype=ref.dtype if ref is not None and ref.is_floating_point() else None)
        with frozen(model, train=False), torch.no_grad():
            try:
                model(x)
            except _StopForward:
                pass
    finally:
        for h in handles:
            h.remove()
    return first[0] if first else None


@contextlib.contextmanager
def _capture(layer: nn.Module, *, stop: bool) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Collect ``layer``'s (input, output) pairs during a forward pass (and end it there with ``stop``)."""
    outputs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def hook(module, args, out):
        outputs.append((args[0] if args else None, out))
        if stop:
            raise _StopForward

    handle = layer.register_forward_hook(hook)
    try:
        yield outputs
    finally:
        handle.remove()


@dataclass
class ProximalSGLD:
    """JEM++'s proximal SGLD with :class:`~jemeval.sampling.sgld.SGLD`'s call (see the module docstring).

    steps:                 outer (full forward/backward) steps; JEM++ uses 5 (JEM's SGLD: 20)
    inner_steps:           first-layer-only steps after each outer step (JEM++: 5)
    step_size:             the outer SGLD step's gradient multiplier (``sgld_lr``, 1.0)
    inner_step_size:       the inner steps' multiplier (``pyld_lr``, 0.2)
    grad_clip:             each inner gradient is clipped to [-grad_clip, grad_clip] (``eps``, 1.0)
    noise:                 std of the Gaussian noise after each outer step (``sgld_std``, 0.0)
    clamp:                 the box the inner steps project onto (the data range [-1, 1])
    bn_mode:               "eval" (jemeval's default) or "train" (what JEM++ does)
    recompute_first_layer: re-run the first layer for each inner gradient (faithful); False reuses
                           the outer input gradient, identical for an affine first layer
    """

    steps: int = 5
    inner_steps: int = 5
    step_size: float = 1.0
    inner_step_size: float = 0.2
    grad_clip: float = 1.0
    noise: float = 0.0
    clamp: tuple[float, float] | None = (-1.0, 1.0)
    bn_mode: str = "eval"
    recompute_first_layer: bool = True

    def __post_init__(self) -> None:
        check_sampler_fields(self, floats=("step_size", "noise", "inner_step_size", "grad_clip"))
        if self.inner_steps < 0:
            raise UsageError(f"inner steps must be >= 0, got {self.inner_steps}")
        if self.grad_clip <= 0:
            raise UsageError(f"inner gradient clip must be > 0, got {self.grad_clip}")

    def settings(self) -> dict:
        """Plain-data settings for provenance records (``sampler`` names the algorithm)."""
        d = asdict(self)
        d["clamp"] = list(self.clamp) if self.clamp is not None else None
        d["sampler"] = "proximal-sgld"
        return d

    def fallback(self) -> SGLD:
        """The plain SGLD used when the model cannot be split at its first layer."""
        return SGLD(steps=self.steps, step_size=self.step_size, noise=self.noise, clamp=self.clamp,
                    bn_mode=self.bn_mode)

    def sample(
        self,
        model: nn.Module,
        x0: torch.Tensor,
        y: torch.Tensor | None = None,
        *,
        steps: int | None = None,
        generator: torch.Generator | None = None,
        return_trace: bool = False,
        fastpath: FastPath | None = None,
    ):
        """Run the chains from ``x0`` (``steps`` overrides the outer step count); returns the
        samples and, with ``return_trace``, the mean log p~ before each outer step and after the
        last (length steps + 1, kept on the device). Parameters, their ``requires_grad`` flags and
        the train/eval mode are restored afterwards; no parameter gradient is computed.
        """
        model = unwrap(model)
        n_steps = self.steps if steps is None else int(steps)
        split = _SPLITS.get(model, False)
        if split is None:  # known not to split
            return self.fallback().sample(model, x0, y, steps=n_steps, generator=generator,
                                          return_trace=return_trace, fastpath=fastpath)
        dtype = fastpath.autocast_dtype if fastpath is not None else None
        trace: list[torch.Tensor] = []
        with frozen(model, train=(self.bn_mode == "train")):
            x = x0.detach()
            if fastpath is not None and fastpath.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            first = None
            if split is False and n_steps > 0:  # first use: find the split and verify it once
                split, first = self._verify(model, x, y, dtype)
                if split is None:
                    return self.fallback().sample(model, x0, y, steps=n_steps, generator=generator,
                                                  return_trace=return_trace, fastpath=fastpath)
            for step in range(n_steps):
                value, eta, p = first if step == 0 and first is not None else self._full_pass(model, split, x, y, dtype)
                if return_trace:
                    trace.append(value.detach().mean())
                x = torch.add(x, eta, alpha=self.step_size)
                for _ in range(self.inner_steps):
                    g = self._inner_grad(model, split, x, y, p, dtype) if self.recompute_first_layer else eta
                    x = x.add_(g.clamp(-self.grad_clip, self.grad_clip), alpha=self.inner_step_size)
                    if self.clamp is not None:
                        x = x.clamp_(*self.clamp)
                if self.inner_steps == 0 and self.clamp is not None:
                    x = x.clamp_(*self.clamp)
                if self.noise:
                    noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
                    x = x.add_(noise, alpha=self.noise)
            if return_trace:
                with torch.no_grad():
                    trace.append(_log_p(model, x, y, dtype).mean())
        if return_trace:
            return x, (torch.stack(trace) if trace else torch.zeros(0))
        return x

    # -- the two kinds of pass --------------------------------------------------------------------
    @staticmethod
    def _full_pass(model, split: _Split, x, y, dtype):
        """(log p~, d/dx, d/dh1) from one forward and one backward (no weight gradients)."""
        x = x.detach().requires_grad_(True)
        with torch.enable_grad(), _capture(split.layer, stop=False) as outs:
            value = _log_p(model, x, y, dtype)
            eta, p = torch.autograd.grad(value.sum(), [x, outs[0][1]])
        return value, eta, p

    @staticmethod
    def _inner_grad(model, split: _Split, x, y, p, dtype):
        """d/dx <L1(x), p>: only the first layer runs (directly when it sees x itself, otherwise
        the model's forward is ended right after it)."""
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            if split.direct:
                with _autocast(x, dtype):
                    h = split.layer(x)
            else:
                with _capture(split.layer, stop=True) as outs:
                    try:
                        _log_p(model, x, y, dtype)
                    except _StopForward:
                        pass
                h = outs[0][1]
            (g,) = torch.autograd.grad((to_fp32(h) * to_fp32(p)).sum(), x)
        return g

    def _verify(self, model, x, y, dtype):
        """Find the first layer and check the split is exact at ``x`` (one host sync); cache the
        verdict. Returns (split or None, the full pass at ``x`` for the first outer step)."""
        layer = first_layer(model)
        reason, first, split = None, None, None
        if layer is None:
            reason = "it has no conv/linear layer"
        else:
            x_req = x.detach().requires_grad_(True)
            with torch.enable_grad(), _capture(layer, stop=False) as outs:
                value = _log_p(model, x_req, y, dtype)
                if len(outs) != 1:
                    reason = f"its first layer runs {len(outs)} times per forward pass"
                else:
                    first = (value, *torch.autograd.grad(value.sum(), [x_req, outs[0][1]]))
            if reason is None:
                eta, p = first[1], first[2]
                split = _Split(layer, direct=outs[0][0] is x_req)
                g = self._inner_grad(model, split, x, y, p, dtype)
                err = float((g - eta).norm() / eta.norm().clamp_min(1e-30))
                tol = 1e-3 if dtype is None else 5e-2
                if not err <= tol:
                    reason = (f"the input gradient does not pass only through its first layer "
                              f"{type(layer).__name__} (relative mismatch {err:.2g})")
        if reason is not None:
            warnings.warn(f"ProximalSGLD: cannot split {type(model).__name__} at its first layer: {reason}; "
                          "sampling with plain SGLD instead", RuntimeWarning, stacklevel=3)
            split, first = None, None
        _SPLITS[model] = split
        return split, first
