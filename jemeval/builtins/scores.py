"""Built-in OOD scores; higher = more in-distribution.

* ``logpx``: log p~(x) = logsumexp f(x) (the JEM density score)
* ``maxprob``: max_y p(y | x) (the classifier baseline, Hendrycks & Gimpel)
* ``maxlogit``: max_y f(x)[y]
* ``energy``: T * logsumexp(f(x) / T), minus the free energy of Liu et al. (T = 1 equals logpx)
* ``gradnorm``: the paper's "approximate mass", -|| d log p~(x) / dx ||_2 per example over the
  whole input, computed for a batch with one backward pass (no per-example loop; examples are
  independent in an eval-mode network, so the gradient of the batch sum is each one's own).
"""
from __future__ import annotations

import math

import torch

from jemeval.energy.model import log_p
from jemeval.errors import UsageError
from jemeval.hookspecs import hookimpl
from jemeval.sampling.sgld import frozen, input_grad


def logpx(model, x):
    """log p~(x): logsumexp of the logits."""
    with torch.no_grad():
        return log_p(model.logits(x))


def maxprob(model, x):
    """max_y p(y|x): the top softmax probability."""
    with torch.no_grad():
        return model.logits(x).softmax(dim=1).amax(dim=1)


def maxlogit(model, x):
    """max_y f(x)[y]: the top logit."""
    with torch.no_grad():
        return model.logits(x).amax(dim=1)


def energy(model, x, *, T: float = 1.0):
    """T * logsumexp(f(x)/T): negative free energy at temperature T (energy:T=2)."""
    with torch.no_grad():
        return _energy_from_logits(model.logits(x), T)


def _energy_from_logits(logits: torch.Tensor, T: float = 1.0) -> torch.Tensor:
    """The energy score of logits; T must be a finite number > 0 (T = 0 divides by zero, and the
    resulting NaN scores would otherwise be blamed on the model's outputs)."""
    try:
        t = float(T)
    except (TypeError, ValueError):
        raise UsageError(f"score 'energy': the temperature T must be a number > 0, got {T!r}") from None
    if not (math.isfinite(t) and t > 0):
        raise UsageError(f"score 'energy': the temperature T must be a finite number > 0 (e.g. energy:T=1), got {T!r}")
    return t * (logits / t).logsumexp(dim=1)


def gradnorm(model, x):
    """-||d log p~(x)/dx||_2 per example: the paper's approximate-mass score."""
    with frozen(model):
        _, grad = input_grad(model, x)
    return -grad.flatten(1).norm(dim=1)


# The logits-only scores can share one forward pass: the evaluation loop computes logits once and
# calls ``from_logits`` instead of the model (see jemeval.evaluation).
logpx.from_logits = log_p
maxprob.from_logits = lambda logits: logits.softmax(dim=1).amax(dim=1)
maxlogit.from_logits = lambda logits: logits.amax(dim=1)
energy.from_logits = _energy_from_logits


@hookimpl
def register_scores(register):
    register("logpx", logpx)
    register("maxprob", maxprob)
    register("maxlogit", maxlogit)
    register("energy", energy)
    register("gradnorm", gradnorm)
