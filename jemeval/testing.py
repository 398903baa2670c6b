"""A test kit for plugin authors (and for jemeval's own tests).

::

    from jemeval import testing

    def test_my_score():
        with testing.registered_plugin(my_plugin_module):
            testing.check_score("my_score")

* :func:`registered_plugin`: register a plugin object for the duration of a ``with`` block (or a
  test), the way datasette's tests do; the registry is rebuilt with it and restored afterwards.
* :func:`tiny_model`, :func:`tiny_dataset`: small, fast, deterministic stand-ins.
* :func:`check_model`, :func:`check_dataset`, :func:`check_score`, :func:`check_detector`,
  :func:`check_metric`, :func:`check_attack`: contract checks that raise ``AssertionError`` with a
  message saying which part of the contract a component breaks. Detectors and attacks are checked
  as the bases :class:`jemeval.Detector` and :class:`jemeval.Attack` declare them (a duck-typed one
  of 0.2 is adapted first, with its DeprecationWarning, as the evaluation adapts it).
"""
from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from jemeval.components import NORMS, is_detector, metric_task
from jemeval.components.adapters import as_attack, new_detector
from jemeval.components.attack import Attack
from jemeval.components.detector import Detector, NotFittedError
from jemeval.components.score import as_score
from jemeval.data import ArrayDataset, to_arrays
from jemeval.energy.model import EnergyModel, log_p
from jemeval.evaluation.robust.threat import perturbation_norm
from jemeval.plugins import get_plugin_manager
from jemeval.sampling.sgld import frozen, input_grad


@contextlib.contextmanager
def registered_plugin(plugin: object, name: str | None = None, version: str | None = None) -> Iterator[str]:
    """Register ``plugin`` (module or object with ``@jemeval.hookimpl`` functions) inside the block."""
    pm = get_plugin_manager()
    plugin_name = pm.register(plugin, name=name, version=version)
    try:
        yield plugin_name
    finally:
        pm.unregister(plugin_name)


class TinyNet(nn.Module):
    """A two-layer LeakyReLU network on flattened inputs: enough to have a real energy surface. It gives
    penultimate features (the hidden layer) through timm's protocol, as EnergyModel.features reads."""

    def __init__(self, num_classes: int, input_shape: Sequence[int], hidden: int = 32):
        super().__init__()
        d = int(np.prod(input_shape))
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(d, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.body(x)

    def forward_features(self, x):
        return self.body[2](self.body[1](self.body[0](x)))

    def forward_head(self, h, pre_logits: bool = False):
        return h if pre_logits else self.body[3](h)

    def get_classifier(self) -> nn.Module:
        return self.body[3]


def tiny_model(num_classes: int = 3, input_shape: Sequence[int] = (1, 4, 4), seed: int = 0) -> EnergyModel:
    """A small random :class:`EnergyModel` in eval mode."""
    torch.manual_seed(seed)
    return EnergyModel(TinyNet(num_classes, input_shape), num_classes=num_classes, input_shape=input_shape,
                       arch="tiny").eval()


def tiny_dataset(n: int = 32, input_shape: Sequence[int] = (1, 4, 4), num_classes: int = 3, seed: int = 0):
    """``n`` random images in [-1, 1] with balanced labels (an :class:`~jemeval.data.ArrayDataset`)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand((n, *input_shape), generator=g) * 2 - 1
    y = torch.arange(n) % num_classes
    return ArrayDataset(x, y, num_classes=num_classes, name="tiny")


def _component(kind: str, obj_or_name: Any) -> Any:
    if isinstance(obj_or_name, str):
        return get_plugin_manager().registry.get(kind, obj_or_name)
    return obj_or_name


def _score_and_options(score_or_spec: Any, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(registered score or detector, options) of a score spec as the command line reads it
    (``margin:prob=True``, ``odin:T=1000,eps=0.0014``: the one parser,
    :func:`jemeval.evaluation.batching.resolve_score`), with the keyword ``options`` over the spec's,
    all checked by name and range as the evaluation checks them; an object is taken as it is."""
    if not isinstance(score_or_spec, str):
        return score_or_spec, dict(options)
    from jemeval.evaluation.batching import check_score_options, resolve_score

    resolved = resolve_score(score_or_spec)
    merged = {**resolved.options, **options}
    check_score_options(resolved.fn, merged, resolved.name)
    return _component("score", resolved.name), merged


def check_model(factory_or_name: Any, num_classes: int = 3, input_shape: Sequence[int] = (3, 32, 32),
                **options) -> nn.Module:
    """A model factory builds an nn.Module mapping N x C x H x W to N x K finite logits, differentiable in x."""
    factory = _component("model", factory_or_name)
    net = factory(num_classes, tuple(input_shape), **options)
    assert isinstance(net, nn.Module), f"model factory returned {type(net).__name__}, not an nn.Module"
    net.eval()
    x = (torch.rand(2, *input_shape) * 2 - 1).requires_grad_(True)
    out = net(x)
    assert out.shape == (2, num_classes), f"model gives logits of shape {tuple(out.shape)}, expected (2, {num_classes})"
    assert torch.isfinite(out).all(), "model gives non-finite logits"
    (g,) = torch.autograd.grad(log_p(out).sum(), x)
    assert g.abs().sum() > 0, "logits do not depend on the input (zero input gradient)"
    return net


def check_dataset(factory_or_name: Any, split: str = "test", **options) -> Any:
    """A dataset factory yields (x, y) with x a float C x H x W tensor in [-1, 1] and y an int (-1 if unlabelled)."""
    from pathlib import Path

    factory = _component("dataset", factory_or_name)
    ds = factory(split, Path("."), False, **options)
    assert len(ds) > 0, "dataset is empty"
    for i in {0, len(ds) - 1}:
        x, y = ds[i]
        assert torch.is_tensor(x) and x.dtype == torch.float32 and x.dim() == 3, "x must be a float32 C x H x W tensor"
        assert float(x.min()) >= -1.0 - 1e-6 and float(x.max()) <= 1.0 + 1e-6, "x must lie in [-1, 1]"
        assert isinstance(int(y), int) and int(y) >= -1, "y must be a class index or -1 for unlabelled sets"
    return ds


def check_score(score_or_name: Any, model: EnergyModel | None = None, n: int = 8, **options) -> torch.Tensor:
    """A score maps (model, x) to a finite Tensor[N]; it is per-example (batch-independent), leaves the
    model's mode, parameters and their gradients untouched, and is deterministic for an eval-mode model.
    ``score_or_name``: the score, or a spec as ``--score`` takes it (``margin:prob=True``)."""
    obj, options = _score_and_options(score_or_name, options)
    assert not is_detector(obj), "a detector is checked with check_detector (it must be fitted first)"
    score = as_score(obj)
    model = model or tiny_model()
    model.eval()
    x = torch.rand(n, *model.input_shape, generator=torch.Generator().manual_seed(1)) * 2 - 1
    before = [p.detach().clone() for p in model.parameters()]
    flags = [p.requires_grad for p in model.parameters()]
    s = score(model, x, **options)
    assert torch.is_tensor(s) and s.shape == (n,), f"score must return Tensor[{n}], got {getattr(s, 'shape', type(s))}"
    assert torch.isfinite(s).all(), "score returned non-finite values"
    assert not model.training, "score left the model in train mode"
    assert [p.requires_grad for p in model.parameters()] == flags, "score changed parameters' requires_grad"
    assert all(p.grad is None for p in model.parameters()), "score accumulated parameter gradients"
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters())), "score changed the parameters"
    halves = torch.cat([score(model, x[: n // 2], **options), score(model, x[n // 2:], **options)])
    assert torch.allclose(halves.detach(), s.detach(), rtol=1e-4, atol=1e-5), \
        "score of an example depends on the rest of the batch"
    _check_declared_forms(score, model, x, s, options)
    return s


def _check_declared_forms(score: Any, model: EnergyModel, x: torch.Tensor, s: torch.Tensor, options: dict) -> None:
    """A score's ``from_logits`` / ``from_features`` / ``from_input_grad`` forms give what the score gives."""
    _check_input_grad_form(score, model, x, s, options)
    if score.from_logits is None and score.from_features is None:
        return
    with torch.no_grad():
        features, logits = model.features_and_logits(x)
    if score.from_logits is not None:
        assert torch.allclose(score.from_logits(logits, **options).double(), s.double(), rtol=1e-5, atol=1e-6), \
            "from_logits(logits) differs from score(model, x)"
    if score.from_features is not None:
        from_features = score.from_features(model, features, logits, **options)
        assert torch.allclose(from_features.double(), s.double(), rtol=1e-5, atol=1e-6), \
            "from_features(model, features, logits) differs from score(model, x)"


def _check_input_grad_form(score: Any, model: EnergyModel, x: torch.Tensor, s: torch.Tensor, options: dict) -> None:
    form = getattr(score, "from_input_grad", None)
    if form is None:
        return
    with frozen(model, train=False):
        _, grad = input_grad(model, x)
        with torch.no_grad():
            logits = model.logits(x)
    assert torch.allclose(form(grad, logits, **options).double(), s.double(), rtol=1e-5, atol=1e-6), \
        "from_input_grad(grad, logits) differs from score(model, x)"


def check_detector(detector_or_name: Any, model: EnergyModel | None = None, dataset: Any = None, n: int = 8,
                   **options) -> torch.Tensor:
    """A detector is a :class:`jemeval.Detector` that refuses to score before it is fitted, fits on
    in-distribution data (``dataset``, default 64 tiny images), then scores as a score must
    (:func:`check_score`). What it declares holds: a ``cacheable`` one's ``state_dict()`` holds tensors
    and plain values (``torch.load(weights_only=True)`` reads it) and restores the same scores in a
    fresh copy; with ``uses_features``, ``score_features`` equals ``score`` and ``fit_features`` fits
    as ``fit`` does. ``detector_or_name``: the detector, or a spec as ``--score`` takes it (``knn:k=10``)."""
    obj, options = _score_and_options(detector_or_name, options)
    assert is_detector(obj), "a detector subclasses jemeval.Detector (fit(model, dataset, **options), score(model, x))"
    model = (model or tiny_model()).eval()
    dataset = dataset if dataset is not None else tiny_dataset(64, model.input_shape, model.num_classes)
    detector = new_detector(obj)
    assert isinstance(detector, Detector)
    x = torch.rand(n, *model.input_shape, generator=torch.Generator().manual_seed(1)) * 2 - 1
    if detector.needs_fit:
        try:
            detector.score(model, x)
        except NotFittedError:
            pass
        else:
            raise AssertionError("score(model, x) before fit(...) must raise jemeval's NotFittedError")
    detector.fit(model, dataset, **options)
    s = check_score(lambda m, x: detector.score(m, x), model, n)
    if detector.cacheable:
        _check_state_dict(obj, detector, model, x, s)
    if detector.uses_features:
        _check_feature_forms(obj, detector, model, dataset, x, s, options)
    return s


def _check_state_dict(obj: Any, detector: Detector, model: EnergyModel, x: torch.Tensor, s: torch.Tensor) -> None:
    buffer = io.BytesIO()
    torch.save(detector.state_dict(), buffer)
    try:
        state = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    except Exception as exc:
        raise AssertionError(f"state_dict() must hold tensors and plain values only ({exc})") from None
    fresh = new_detector(obj)
    fresh.load_state_dict(state)
    assert torch.allclose(fresh.score(model, x).double(), s.double(), rtol=1e-5, atol=1e-6), \
        "load_state_dict(state_dict()) does not restore the fitted detector's scores"


def _check_feature_forms(obj: Any, detector: Detector, model: EnergyModel, dataset: Any, x: torch.Tensor,
                         s: torch.Tensor, options: dict) -> None:
    with torch.no_grad():
        features, logits = model.features_and_logits(x)
    assert torch.allclose(detector.score_features(features, logits).double(), s.double(), rtol=1e-5, atol=1e-6), \
        "score_features(features, logits) differs from score(model, x)"
    xs, ys = to_arrays(dataset)
    with torch.no_grad():
        fit_f, fit_l = model.features_and_logits(xs)
    other = new_detector(obj)
    other.fit_features(model, fit_f, fit_l, ys, **options)
    assert torch.allclose(other.score(model, x).double(), s.double(), rtol=1e-5, atol=1e-6), \
        "fit_features(model, features, logits, labels) fits differently from fit(model, dataset)"


def check_metric(metric_or_name: Any) -> float:
    """A metric declares its task (ood or calibration), returns a finite float, and ignores input order."""
    metric = _component("metric", metric_or_name)
    task = metric_task(metric)
    assert task is not None, "metric must be marked with @jemeval.ood_metric or @jemeval.calibration_metric"
    rng = np.random.default_rng(0)
    if task == "ood":
        a, b = rng.normal(1, 1, 50), rng.normal(0, 1, 40)
        value = metric(a, b)
        again = metric(rng.permutation(a), rng.permutation(b))
    else:
        logits = rng.normal(size=(60, 4))
        probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        labels = rng.integers(0, 4, 60)
        value = metric(probs, labels)
        perm = rng.permutation(60)
        again = metric(probs[perm], labels[perm])
    assert isinstance(value, (float, np.floating)) and np.isfinite(value), \
        f"metric returned {value!r}, not a finite float"
    assert abs(float(value) - float(again)) < 1e-9, "metric depends on the order of the examples"
    return float(value)


def check_attack(factory_or_name: Any, norm: str = "linf", epsilons: Sequence[float] = (0.0, 0.05, 0.2),
                 model: EnergyModel | None = None, **options) -> torch.Tensor:
    """An attack is a :class:`jemeval.Attack` that supports ``norm``; it returns one batch per epsilon,
    each inside its epsilon ball (pixel units, i.e. 2*eps in model space) and inside [-1, 1], and
    leaves the model's mode, parameters and their gradients as they were."""
    assert norm in NORMS, f"norm must be one of {NORMS}"
    factory = _component("attack", factory_or_name)
    attack = as_attack(factory(norm, **options), norm)
    assert isinstance(attack, Attack) and norm in attack.norms, f"attack does not declare norm {norm!r} in its norms"
    assert isinstance(attack.settings, dict), "attack.settings must be a dict (recorded in the results)"
    model = model or tiny_model()
    x = torch.rand(6, *model.input_shape, generator=torch.Generator().manual_seed(2)) * 2 - 1
    y = model.predict(x).detach()
    mode, before = model.training, [p.detach().clone() for p in model.parameters()]
    advs = attack(model, x, y, list(epsilons))
    assert model.training == mode, "attack changed the model's train/eval mode"
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters())), "attack changed the parameters"
    assert torch.is_tensor(advs) and advs.shape == (len(epsilons), *x.shape), (
        f"attack must return Tensor[{len(epsilons)}, {', '.join(map(str, x.shape))}], "
        f"got {getattr(advs, 'shape', type(advs))}")
    assert advs.min() >= -1 - 1e-5 and advs.max() <= 1 + 1e-5, "adversarials leave the [-1, 1] input space"
    for eps, adv in zip(epsilons, advs):
        size = perturbation_norm(x, adv, norm)
        assert (size <= 2 * eps + 1e-4).all(), \
            f"perturbation of size {float(size.max()) / 2:.4f} (pixel units) exceeds epsilon {eps}"
    return advs
