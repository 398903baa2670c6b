"""The plugin authors' test kit checks real contract properties (and catches violations)."""
import numpy as np
import pytest
import torch

import jemeval
from jemeval import testing


@pytest.mark.parametrize("name,kwargs", [
    ("wrn", {"depth": 10, "widen": 1}),
    ("wrn", {"depth": 10, "widen": 1, "norm": "batch"}),
    ("cnn", {}),
])
def test_builtin_models_pass_check_model(name, kwargs):
    testing.check_model(name, num_classes=4, input_shape=(3, 32, 32), **kwargs)


def test_timm_models_build_without_pretrained_weights():
    m = jemeval.create_model("timm:resnet18", 5, (3, 32, 32))
    assert m(torch.zeros(2, 3, 32, 32)).shape == (2, 5)
    with pytest.raises(jemeval.errors.UsageError, match="did you mean 'resnet18'"):
        jemeval.create_model("timm:resnet19", 5, (3, 32, 32))
    with pytest.raises(jemeval.errors.UsageError, match="WRN depth must be 6n \\+ 4"):
        jemeval.create_model("wrn:depth=12", 5, (3, 32, 32))


@pytest.mark.parametrize("score", ["logpx", "maxprob", "maxlogit", "energy", "gradnorm"])
def test_builtin_scores_pass_check_score(score):
    testing.check_score(score)


def test_check_score_catches_batch_dependence_and_mode_changes():
    with pytest.raises(AssertionError, match="depends on the rest of the batch"):
        testing.check_score(lambda model, x: model.log_px(x).detach() - model.log_px(x).detach().mean())
    with pytest.raises(AssertionError, match="left the model in train mode"):
        testing.check_score(lambda model, x: model.train().log_px(x).detach())


def test_check_metric_and_attack_catch_violations():
    with pytest.raises(AssertionError, match="must be marked"):
        testing.check_metric(lambda a, b: 0.5)

    @jemeval.ood_metric
    def order_dependent(a, b):
        return float(a[0])

    with pytest.raises(AssertionError, match="depends on the order"):
        testing.check_metric(order_dependent)

    def too_big(norm):
        return lambda model, x, y, eps: torch.stack([(x + 2 * e + 0.01).clamp(-1, 1) for e in eps])

    with pytest.raises(AssertionError, match="exceeds epsilon"):
        testing.check_attack(too_big, epsilons=(0.01,))


def test_check_dataset_on_builtin():
    ds = testing.check_dataset("digits")
    assert len(ds) == 450
    assert np.isfinite(testing.check_metric("auroc"))
