"""RefinedClassifier: the SGLD refinement defence, checked against hand-written references."""
from __future__ import annotations

import pytest
import torch

import jemeval
from jemeval.errors import UsageError
from jemeval.sampling.recorded import recorded_sgld
from jemeval.sampling.refinement import RefinedClassifier
from jemeval.sampling.sgld import SGLD


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    model = jemeval.create_model("cnn", 10, (1, 8, 8), width=4).eval()
    return model


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(1)
    return torch.rand(3, 1, 8, 8, generator=g) * 2 - 1, torch.tensor([0, 3, 7])


def _hand_refined_logits(model, x, steps, chains, sigma, step_size, noise, seed):
    """Reference: the same noise stream drawn in the same order, one plain autograd loop."""
    g = torch.Generator().manual_seed(seed)
    xs = x.repeat_interleave(chains, dim=0)
    xs = xs + sigma * torch.randn(xs.shape, generator=g)
    for _ in range(steps):
        z = xs.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(model(z).logsumexp(1).sum(), z)
        xs = z.detach() + step_size * grad + noise * torch.randn(xs.shape, generator=g)
    with torch.no_grad():
        return model(xs).reshape(x.shape[0], chains, -1).mean(1)


def test_zero_steps_is_the_plain_model_exactly(tiny_model, batch):
    x, _ = batch
    refined = RefinedClassifier(tiny_model, 0, chains=5)
    with torch.no_grad():
        assert torch.equal(refined(x), tiny_model(x))
    assert refined.num_classes == 10 and refined.input_shape == (1, 8, 8)


def test_forward_matches_hand_written_refinement(tiny_model, batch):
    x, _ = batch
    sgld = SGLD(step_size=0.7, noise=0.02)
    refined = RefinedClassifier(tiny_model, 3, chains=4, sigma=0.05, sgld=sgld,
                                generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got = refined(x)
    want = _hand_refined_logits(tiny_model, x, 3, 4, 0.05, 0.7, 0.02, seed=5)
    torch.testing.assert_close(got, want)
    refined.generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        torch.testing.assert_close(refined.log_px(x), want.logsumexp(1))


def test_full_gradient_matches_finite_differences(batch):
    torch.manual_seed(0)
    model = jemeval.create_model("cnn", 10, (1, 8, 8), width=4).double().eval()
    x, y = batch[0][:2].double(), batch[1][:2]
    refined = RefinedClassifier(model, 2, chains=2, sigma=0.03, sgld=SGLD(step_size=0.5, noise=0.01), checkpoint=False)

    def loss(z):
        refined.generator = torch.Generator().manual_seed(11)  # same noise every call
        return torch.nn.functional.cross_entropy(refined(z), y, reduction="sum")

    z = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(z), z)
    h = 1e-6
    for idx in [(0, 0, 3, 4), (1, 0, 6, 1), (0, 0, 0, 0)]:
        e = torch.zeros_like(x)
        e[idx] = h
        with torch.no_grad():
            fd = (loss(x + e) - loss(x - e)) / (2 * h)
        assert abs(fd.item() - grad[idx].item()) < 1e-6 + 1e-4 * abs(fd.item())


def test_checkpointed_gradient_equals_stored_gradient(tiny_model, batch):
    x, y = batch
    grads = []
    for ckpt in (False, True):
        refined = RefinedClassifier(tiny_model, 5, chains=2, sigma=0.03, checkpoint=ckpt,
                                    generator=torch.Generator().manual_seed(2))
        z = x.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(torch.nn.functional.cross_entropy(refined(z), y), z)
        grads.append(g)
    torch.testing.assert_close(grads[0], grads[1])
    assert grads[0].abs().sum() > 0
    assert all(p.grad is None and p.requires_grad for p in tiny_model.parameters())


def test_bpda_gradient_is_the_gradient_at_the_refined_point(tiny_model, batch):
    x, y = batch
    kw = {"chains": 3, "sigma": 0.05, "sgld": SGLD(step_size=1.0, noise=0.01)}
    refined = RefinedClassifier(tiny_model, 2, grad_mode="bpda", generator=torch.Generator().manual_seed(4), **kw)
    z = x.clone().requires_grad_(True)
    (got,) = torch.autograd.grad(torch.nn.functional.cross_entropy(refined(z), y), z)

    # reference: refine without autograd, then differentiate the chain-averaged loss at that point
    g = torch.Generator().manual_seed(4)
    xs = x.repeat_interleave(3, 0)
    xs = xs + 0.05 * torch.randn(xs.shape, generator=g)
    xs = SGLD(steps=2, step_size=1.0, noise=0.01).sample(tiny_model, xs, generator=g)
    r = xs.clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(tiny_model(r).reshape(3, 3, -1).mean(1), y)
    (g_r,) = torch.autograd.grad(loss, r)
    want = g_r.reshape(3, 3, *x.shape[1:]).sum(1)  # identity backward, summed over the chains
    torch.testing.assert_close(got, want)


def test_bpda_eot_gradient_is_bpda_over_every_draw_at_once(tiny_model, batch):
    """bpda+eot: eot_samples x chains noisy copies refined without autograd, the loss of the logits
    averaged over all of them, the identity backward summed back onto each input."""
    x, y = batch
    kw = {"chains": 2, "sigma": 0.05, "sgld": SGLD(step_size=1.0, noise=0.01)}
    refined = RefinedClassifier(tiny_model, 2, grad_mode="bpda+eot", eot_samples=3,
                                generator=torch.Generator().manual_seed(4), **kw)
    assert refined.eot_samples == 3 and refined.settings()["grad_mode"] == "bpda+eot"
    z = x.clone().requires_grad_(True)
    (got,) = torch.autograd.grad(torch.nn.functional.cross_entropy(refined(z), y), z)

    copies = 6
    g = torch.Generator().manual_seed(4)
    xs = x.repeat_interleave(copies, 0)
    xs = xs + 0.05 * torch.randn(xs.shape, generator=g)
    xs = SGLD(steps=2, step_size=1.0, noise=0.01).sample(tiny_model, xs, generator=g)
    r = xs.clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(tiny_model(r).reshape(3, copies, -1).mean(1), y)
    (g_r,) = torch.autograd.grad(loss, r)
    torch.testing.assert_close(got, g_r.reshape(3, copies, *x.shape[1:]).sum(1))
    # one draw (bpda) is a different, noisier gradient
    single = RefinedClassifier(tiny_model, 2, grad_mode="bpda", eot_samples=3,
                               generator=torch.Generator().manual_seed(4), **kw)
    z = x.clone().requires_grad_(True)
    (one,) = torch.autograd.grad(torch.nn.functional.cross_entropy(single(z), y), z)
    assert single.eot_samples == 1 and not torch.allclose(one, got)


def test_stochastic_says_when_draws_can_differ(tiny_model):
    quiet = SGLD(step_size=1.0, noise=0.0)
    assert not RefinedClassifier(tiny_model, 0).stochastic
    assert RefinedClassifier(tiny_model, 0, sigma=0.01).stochastic
    assert RefinedClassifier(tiny_model, 2, sgld=SGLD(step_size=1.0, noise=0.01)).stochastic
    assert not RefinedClassifier(tiny_model, 2, sgld=quiet).stochastic  # noiseless SGLD is a fixed map
    x = torch.rand(2, 1, 8, 8) * 2 - 1
    with torch.no_grad():
        det = RefinedClassifier(tiny_model, 2, sgld=quiet)
        assert torch.equal(det(x), det(x))


def test_eot_averages_over_independent_draws(tiny_model, batch):
    x, _ = batch
    eot = RefinedClassifier(tiny_model, 1, chains=2, sigma=0.1, grad_mode="eot", eot_samples=3,
                            sgld=SGLD(step_size=1.0, noise=0.01), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        got = eot(x)
    want = _hand_refined_logits(tiny_model, x, 1, 6, 0.1, 1.0, 0.01, seed=9)
    torch.testing.assert_close(got, want)
    assert eot.settings()["eot_samples"] == 3
    # eot_samples only means something in eot mode
    assert RefinedClassifier(tiny_model, 1, grad_mode="full", eot_samples=3).eot_samples == 1


def test_sgld_defaults_come_from_the_checkpoint_config(tiny_model):
    assert recorded_sgld(tiny_model, 3)[0].step_size == 1.0
    assert recorded_sgld(tiny_model, 3)[0].noise == 0.01
    tiny_model.metadata["config"] = {"sgld": {"step_size": 0.5, "noise": 0.002, "steps": 20}}
    try:
        refined = RefinedClassifier(tiny_model, 4)
        s = refined.settings()
        assert s["sgld"]["step_size"] == 0.5 and s["sgld"]["noise"] == 0.002 and s["sgld"]["steps"] == 4
        assert s["refine_steps"] == 4 and s["chains"] == 5 and s["sigma"] == 0.0 and s["grad_mode"] == "full"
    finally:
        tiny_model.metadata.pop("config")


@pytest.mark.parametrize("kwargs, words", [
    ({"steps": -1}, "steps must be >= 0"),
    ({"steps": 1, "chains": 0}, "chains must be >= 1"),
    ({"steps": 1, "grad_mode": "exact"}, r"grad_mode must be one of full, bpda, eot, bpda\+eot"),
    ({"steps": 1, "sigma": -0.1}, "sigma must be >= 0"),
])
def test_bad_arguments_say_what_is_allowed(tiny_model, kwargs, words):
    with pytest.raises(UsageError, match=words):
        RefinedClassifier(tiny_model, **kwargs)
