"""JEM++'s proximal SGLD: it ascends log p~, leaves the model alone, needs fewer full passes, and
falls back to plain SGLD (with a warning) when a model cannot be split at its first layer."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from jemeval.energy.factory import create_model
from jemeval.energy.model import EnergyModel
from jemeval.runtime.fastpath import FastPath
from jemeval.sampling.proximal import _SPLITS, ProximalSGLD, first_layer
from jemeval.sampling.sgld import SGLD
from jemeval.testing import tiny_model


def _counting(model: EnergyModel, layer: nn.Module) -> dict[str, int]:
    """Count full forward passes (a hook on the tiny net's last layer: log p~(x, y) does not go
    through the model's own forward) and first-layer evaluations."""
    counts = {"full": 0, "first": 0}
    model.net.body[-1].register_forward_hook(lambda *a: counts.__setitem__("full", counts["full"] + 1))
    layer.register_forward_hook(lambda *a: counts.__setitem__("first", counts["first"] + 1))
    return counts


def test_raises_log_px_and_leaves_the_model_untouched():
    m = tiny_model(num_classes=3, input_shape=(1, 4, 4))
    m.train()
    m.net.body[3].bias.requires_grad_(False)
    flags = [p.requires_grad for p in m.parameters()]
    before_params = [p.detach().clone() for p in m.parameters()]
    x0 = torch.rand(256, 1, 4, 4) * 2 - 1
    x, trace = ProximalSGLD(steps=3, inner_steps=3, noise=0.001).sample(m, x0, return_trace=True)
    with torch.no_grad():
        assert m.log_px(x).mean() > m.log_px(x0).mean() + 0.1
    assert trace.shape == (4,) and trace[-1] > trace[0]
    assert x.abs().max() <= 1.0 + 0.01  # projected onto the data box before the small noise
    assert m.training and [p.requires_grad for p in m.parameters()] == flags
    assert all(p.grad is None for p in m.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before_params, m.parameters()))
    assert not x.requires_grad and x.grad_fn is None


def test_fewer_full_forward_passes_for_the_same_number_of_updates():
    m = tiny_model(num_classes=3)
    layer = first_layer(m)
    assert layer is m.net.body[1]
    counts = _counting(m, layer)
    x0 = torch.rand(32, 1, 4, 4) * 2 - 1
    ProximalSGLD(steps=2, inner_steps=5).sample(m, x0)  # 2 + 2 * 5 = 12 updates
    # 2 full passes; first layer: 2 full + 10 inner + 1 for the one-time split check
    assert counts == {"full": 2, "first": 13}
    counts.update(full=0, first=0)
    ProximalSGLD(steps=2, inner_steps=5).sample(m, x0)  # the split check is cached per model
    assert counts == {"full": 2, "first": 12}
    counts.update(full=0, first=0)
    SGLD(steps=12).sample(m, x0)
    assert counts == {"full": 12, "first": 12}
    counts.update(full=0, first=0)
    ProximalSGLD(steps=2, inner_steps=5, recompute_first_layer=False).sample(m, x0)
    assert counts == {"full": 2, "first": 2}


def test_affine_first_layer_makes_the_inner_gradient_constant():
    """For a conv/linear first layer the Hamiltonian's gradient is L1^T p = the outer gradient, so
    reusing it gives the same samples as recomputing the first layer."""
    torch.manual_seed(0)
    m = create_model("wrn:depth=10,widen=1", 4, (3, 8, 8)).eval()
    assert first_layer(m) is m.net.f.conv1
    x0 = torch.rand(8, 3, 8, 8) * 2 - 1
    kw = {"steps": 2, "inner_steps": 3, "step_size": 20.0, "inner_step_size": 5.0, "noise": 0.0}
    a = ProximalSGLD(**kw).sample(m, x0)
    b = ProximalSGLD(**kw, recompute_first_layer=False).sample(m, x0)
    assert _SPLITS[m].direct  # conv1 sees x itself: inner steps call conv1 alone
    assert (a - x0).abs().max() > 1e-3
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # an input normalisation inside the model is affine too: the split still holds, through the model
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(4 * 64, 4))
    normed = EnergyModel(net, num_classes=4, input_shape=(3, 8, 8),
                         normalization={"mean": [0.1, 0.0, -0.1], "std": [0.5, 0.25, 0.5]})
    kw.update(step_size=1.0, inner_step_size=0.3)
    a = ProximalSGLD(**kw).sample(normed, x0)
    b = ProximalSGLD(**kw, recompute_first_layer=False).sample(normed, x0)
    assert not _SPLITS[normed].direct  # the inner steps end the model's forward after its first layer
    assert (a - x0).abs().max() > 1e-3
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_class_conditional_bf16_and_step_override():
    m = tiny_model(num_classes=3)
    y = torch.arange(96) % 3
    x0 = torch.rand(96, 1, 4, 4) * 2 - 1
    counts = _counting(m, first_layer(m))
    x = ProximalSGLD(steps=5, inner_steps=2).sample(m, x0, y, steps=3, fastpath=FastPath(bf16=True))
    assert x.dtype == torch.float32 and counts["full"] == 3
    with torch.no_grad():
        assert (m.log_pxy(x, y) - m.log_pxy(x0, y)).mean() > 0.1


def test_noise_follows_the_generator_and_settings_are_recorded():
    m = tiny_model()
    x0 = torch.zeros(4, 1, 4, 4)
    s = ProximalSGLD(steps=2, inner_steps=1, noise=0.5, clamp=None)
    a = s.sample(m, x0, generator=torch.Generator().manual_seed(1))
    b = s.sample(m, x0, generator=torch.Generator().manual_seed(1))
    c = s.sample(m, x0, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    settings = s.settings()
    assert settings["sampler"] == "proximal-sgld" and settings["inner_steps"] == 1 and settings["clamp"] is None
    with pytest.raises(ValueError):
        ProximalSGLD(bn_mode="frozen")


class _InputSkip(nn.Module):
    """The input reaches the output around the first layer: not splittable there."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(16, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        flat = x.flatten(1)
        return self.head(torch.tanh(self.first(flat))) + flat.pow(2).mean(1, keepdim=True)


def test_unsplittable_model_falls_back_to_plain_sgld_with_a_warning():
    torch.manual_seed(0)
    m = EnergyModel(_InputSkip(), num_classes=3, input_shape=(1, 4, 4)).eval()
    x0 = torch.rand(8, 1, 4, 4) * 2 - 1
    s = ProximalSGLD(steps=3, inner_steps=2, noise=0.1)
    with pytest.warns(RuntimeWarning, match="cannot split .* plain SGLD"):
        out = s.sample(m, x0, generator=torch.Generator().manual_seed(0))
    ref = s.fallback().sample(m, x0, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, ref)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the verdict is cached: no second warning
        s.sample(m, x0)
    no_layers = EnergyModel(nn.Flatten(), num_classes=16, input_shape=(1, 4, 4))
    with pytest.warns(RuntimeWarning, match="no conv/linear layer"):
        ProximalSGLD(steps=1).sample(no_layers, x0)


class _HeadFirst(nn.Module):
    """Registers its head before its body: the first layer is found by execution order."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 3)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.LeakyReLU(0.2))

    def forward(self, x):
        return self.head(self.body(x))


def test_first_layer_follows_execution_order():
    m = EnergyModel(_HeadFirst(), num_classes=3, input_shape=(1, 4, 4)).train()
    assert first_layer(m) is m.net.body[1] and m.training
    cnn = create_model("cnn:width=4", 10, (1, 8, 8))
    assert first_layer(cnn) is cnn.net.features[0]
    assert first_layer(nn.Sequential(nn.ReLU())) is None
