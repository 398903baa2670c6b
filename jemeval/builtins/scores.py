"""Built-in OOD scores (plain functions); higher = more in-distribution.

* ``logpx``: log p~(x) = logsumexp f(x) (the JEM density score)
* ``maxprob``: max_y p(y | x) (the classifier baseline, Hendrycks & Gimpel), in float64 as
  exp(max_y f - logsumexp f): in float32 confident examples tie at 1.0 and the AUROC moves
* ``maxlogit``: max_y f(x)[y]
* ``energy``: T * logsumexp(f(x) / T), minus the free energy of Liu et al. (T = 1 equals logpx)
* ``entropy``: minus the entropy of p(y | x) (pytorch-ood's ``Entropy``, sign flipped)
* ``gradnorm``: the JEM paper's "approximate mass", -|| d log p~(x) / dx ||_2 per example over the
  whole input, computed for a batch with one backward pass (no per-example loop; examples are
  independent in an eval-mode network, so the gradient of the batch sum is each one's own). This is
  *not* Huang et al.'s GradNorm, which is ``gradnorm-huang``:
* ``gradnorm-huang``: || d KL(u || softmax(f/T)) / dW ||_1 for the last layer's weight W (Huang et
  al. 2021, as pytorch-ood's ``GradNorm`` restricted to that weight): the gradient is an outer
  product, so its L1 norm is ||(softmax(f/T) - 1/K) / T||_1 * ||features||_1, read off one forward.
* ``odin``: ODIN (Liang et al. 2018): max softmax at temperature T of the input moved by eps (pixel
  units, as attack epsilons; 2 eps in the [-1, 1] input space) against the gradient of the
  cross-entropy of the predicted class; one forward-backward-forward per batch.
* ``ash``: ASH (Djurisic et al. 2023, pytorch-ood's ``ASH``) on the pooled penultimate features,
  then the energy of the head's logits; it assumes non-negative (ReLU) features
  (``assumes_nonnegative_features``: ``evaluate_ood`` notes when the model's are not, e.g. after
  LeakyReLU, where pruning the largest activations can invert the score).

Each is a :class:`jemeval.Score` declared with the :func:`jemeval.score` decorator: scores that
read only the logits (``from_logits``) or the features and logits (``from_features``) share the
evaluation loop's one forward pass per batch. ``grid`` holds the hyperparameter candidates
``tune_on`` searches: pytorch-ood's ``hyperparameter_space`` (ODIN's temperature is T here;
OpenOOD's grids; tests/test_detectors.py checks they agree); energy's is OpenOOD's EBO sweep.
Fitted detectors are in :mod:`jemeval.builtins.detectors`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from jemeval.components import pixel_to_model_scale
from jemeval.components.options import choice, fraction, number
from jemeval.components.score import score
from jemeval.energy.model import log_p
from jemeval.hookspecs import hookimpl
from jemeval.sampling.sgld import frozen, input_grad


@score(from_logits=log_p)
def logpx(model, x):
    """log p~(x): logsumexp of the logits."""
    with torch.no_grad():
        return log_p(model.logits(x))


def _maxprob_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """exp(max - logsumexp) of the float64 logits: the top softmax probability without forming the
    others, and without float32's ties at 1.0 (calibrate's probabilities are float64 too)."""
    z = logits.double()
    return torch.exp(z.amax(dim=1) - torch.logsumexp(z, dim=1))


@score(from_logits=_maxprob_from_logits)
def maxprob(model, x):
    """max_y p(y|x): the top softmax probability, in float64."""
    with torch.no_grad():
        return _maxprob_from_logits(model.logits(x))


@score(from_logits=lambda logits: logits.amax(dim=1))
def maxlogit(model, x):
    """max_y f(x)[y]: the top logit."""
    with torch.no_grad():
        return model.logits(x).amax(dim=1)


#: a temperature divides the logits: 0 would divide by zero, and the NaN scores would be blamed on the model
TEMPERATURE = number(gt=0.0, label="the temperature T")


def _energy_from_logits(logits: torch.Tensor, T: float = 1.0) -> torch.Tensor:
    t = float(T)
    return t * log_p(logits / t)


@score(from_logits=_energy_from_logits, grid={"T": [1, 10, 100, 1000]}, ranges={"T": TEMPERATURE})
def energy(model, x, *, T: float = 1.0):
    """T * logsumexp(f(x)/T): negative free energy at temperature T (energy:T=2)."""
    with torch.no_grad():
        return _energy_from_logits(model.logits(x), T)


def _entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    from pytorch_ood.detector import Entropy

    return -Entropy.score(logits)


@score(from_logits=_entropy_from_logits)
def entropy(model, x):
    """Minus the entropy of p(y|x) (pytorch-ood's Entropy, sign flipped)."""
    with torch.no_grad():
        return _entropy_from_logits(model.logits(x))


def _gradnorm_from_input_grad(grad: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    return -grad.flatten(1).norm(dim=1)


@score(from_input_grad=_gradnorm_from_input_grad)
def gradnorm(model, x):
    """-||d log p~(x)/dx||_2 per example: the JEM paper's approximate-mass score."""
    with frozen(model):
        _, grad = input_grad(model, x)
    return -grad.flatten(1).norm(dim=1)


def _gradnorm_huang_from_features(model, features, logits, *, T: float = 1.0) -> torch.Tensor:
    t = float(T)
    k = logits.shape[1]
    d_logits = ((logits.double() / t).softmax(dim=1) - 1.0 / k) / t  # d(mean_c -log softmax_c)/d logits
    return d_logits.abs().sum(dim=1) * features.double().abs().sum(dim=1)


@score(from_features=_gradnorm_huang_from_features, ranges={"T": TEMPERATURE})
def gradnorm_huang(model, x, *, T: float = 1.0):
    """Huang et al.'s GradNorm: L1 norm of the last layer's weight gradient of KL(uniform || p(y|x; T))."""
    with torch.no_grad():
        features, logits = model.features_and_logits(x)
    return _gradnorm_huang_from_features(model, features, logits, T=T)


@score(grid={"T": [1, 10, 100, 1000], "eps": [0.0014, 0.0028]},
       ranges={"T": TEMPERATURE, "eps": number(ge=0.0)})  # eps in pixel units, as attack epsilons
def odin(model, x, *, T: float = 1000.0, eps: float = 0.0014):
    """ODIN: max softmax at temperature T after an eps (pixel units) signed-gradient input step."""
    t = float(T)
    with frozen(model):
        xg = x.detach().requires_grad_(True)
        with torch.enable_grad():
            logits = model.logits(xg) / t
            loss = F.cross_entropy(logits, logits.argmax(dim=1), reduction="sum")  # per-example terms
            (grad,) = torch.autograd.grad(loss, xg)
        with torch.no_grad():
            moved = model.logits(x.detach() - pixel_to_model_scale(float(eps)) * grad.sign())
    return (moved.double() / t).softmax(dim=1).amax(dim=1)


def _ash_from_features(model, features, logits, *, variant: str = "ash-s", percentile: float = 0.90):
    from pytorch_ood.detector import ASH

    head = model.classifier()
    detector = ASH(backbone=None, head=lambda h: head(h.flatten(1)), variant=variant, percentile=float(percentile))
    return -detector.predict_feature_maps(features[:, :, None, None])


# pruning the largest activations presumes ReLU features; percentile 0.90 is OpenOOD v1.5's for its CIFAR
# benchmarks (configs/postprocessors/ash.yml), the paper's 0.65 was chosen on ImageNet
# percentile 1 prunes every activation (ASH-S then divides by their sum, 0); the variants are pytorch-ood's ASH.variants
@score(from_features=_ash_from_features, assumes_nonnegative_features=True,
       grid={"percentile": [0.65, 0.70, 0.75, 0.80, 0.85, 0.90, 0.95]},
       ranges={"variant": choice("ash-s", "ash-b", "ash-p"), "percentile": fraction(lt=1.0)})
def ash(model, x, *, variant: str = "ash-s", percentile: float = 0.90):
    """ASH: prune (and binarize or rescale) the penultimate activations, then the energy of the logits."""
    with torch.no_grad():
        features, logits = model.features_and_logits(x)
    return _ash_from_features(model, features, logits, variant=variant, percentile=percentile)


@hookimpl
def register_scores(register):
    register("logpx", logpx)
    register("maxprob", maxprob)
    register("maxlogit", maxlogit)
    register("energy", energy)
    register("entropy", entropy)
    register("gradnorm", gradnorm, help="-||d log p~(x)/dx||_2: JEM's approximate mass (not Huang et al.'s GradNorm)")
    register("gradnorm-huang", gradnorm_huang)
    register("odin", odin)
    register("ash", ash, help="ASH: prune the penultimate activations, then energy; assumes non-negative (ReLU) "
                              "features (a note says when the model's are not)")
