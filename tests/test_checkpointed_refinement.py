"""Checkpointed refinement (issue 27 item 4): the gradient through K SGLD steps recomputed step by step
in the backward equals the stored one, in memory that does not grow with K."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn
from torch.nn.functional import cross_entropy

import jemeval
from jemeval.sampling.refinement import RefinedClassifier
from jemeval.sampling.sgld import SGLD

#: a large step: a random network's curvature is small, and the steps' Hessian term must show in the gradient
SGLD_SETTINGS = SGLD(step_size=50.0, noise=0.01)


@pytest.fixture(scope="module")
def model64():
    torch.manual_seed(0)
    return jemeval.create_model("cnn", 10, (1, 8, 8), width=4).double().eval()


@pytest.fixture(scope="module")
def batch64():
    g = torch.Generator().manual_seed(1)
    return (torch.rand(3, 1, 8, 8, generator=g, dtype=torch.float64) * 2 - 1), torch.tensor([0, 3, 7])


def _graph(t: torch.Tensor) -> list:
    """Every autograd node behind ``t``."""
    seen, todo = [], [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or any(node is s for s in seen):
            continue
        seen.append(node)
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return seen


def _graph_nodes(t: torch.Tensor) -> set[str]:
    """Names of every autograd node behind ``t``."""
    return {type(node).__name__ for node in _graph(t)}


def _logits_and_grad(model, x, y, *, steps=5, seed=3, **kw):
    """Refined logits and d(cross-entropy)/dx with the chains' noise from a fresh seeded generator."""
    refined = RefinedClassifier(model, steps, chains=2, sigma=0.03, sgld=SGLD_SETTINGS,
                                generator=torch.Generator().manual_seed(seed), **kw)
    z = x.clone().requires_grad_(True)
    logits = refined(z)
    nodes = _graph_nodes(logits)
    (grad,) = torch.autograd.grad(cross_entropy(logits, y, reduction="sum"), z)
    return logits.detach(), grad, nodes


@pytest.mark.parametrize("mode, eot", [("full", 1), ("eot", 3)])
def test_checkpointed_gradient_through_five_steps_equals_the_stored_one(model64, batch64, mode, eot):
    x, y = batch64
    plain_logits, plain_grad, plain_nodes = _logits_and_grad(model64, x, y, grad_mode=mode, eot_samples=eot,
                                                             checkpoint=False)
    ckpt_logits, ckpt_grad, ckpt_nodes = _logits_and_grad(model64, x, y, grad_mode=mode, eot_samples=eot,
                                                          checkpoint=True)
    assert "CheckpointedStepBackward" in ckpt_nodes and "CheckpointedStepBackward" not in plain_nodes
    assert torch.equal(ckpt_logits, plain_logits)  # the forward is the same computation, bit for bit
    torch.testing.assert_close(ckpt_grad, plain_grad, rtol=1e-10, atol=1e-13)
    # the steps' Hessian term is in both: the identity backward (BPDA) is measurably different
    _, bpda_grad, _ = _logits_and_grad(model64, x, y, grad_mode="bpda+eot" if eot > 1 else "bpda", eot_samples=eot)
    assert (bpda_grad - plain_grad).abs().max() > 1e-4 * plain_grad.abs().max()
    assert all(p.grad is None and p.requires_grad for p in model64.parameters())


def test_checkpointed_gradient_matches_finite_differences(model64, batch64):
    """An independent reference: central differences of the loss with the same noise in every call."""
    x, y = batch64[0][:2], batch64[1][:2]
    refined = RefinedClassifier(model64, 5, chains=2, sigma=0.03, sgld=SGLD(step_size=2.0, noise=0.01),
                                checkpoint=True)

    def loss(z):
        refined.generator = torch.Generator().manual_seed(11)
        return cross_entropy(refined(z), y, reduction="sum")

    z = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(z), z)
    h = 1e-6
    for idx in [(0, 0, 3, 4), (1, 0, 6, 1), (0, 0, 0, 0), (1, 0, 7, 7)]:
        e = torch.zeros_like(x)
        e[idx] = h
        with torch.no_grad():
            fd = (loss(x + e) - loss(x - e)) / (2 * h)
        assert abs(fd.item() - grad[idx].item()) < 1e-7 + 1e-5 * abs(fd.item())


class _Saved:
    """What autograd stores for a saved tensor (through the hooks below), so its lifetime can be watched."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def _saved_bytes(model, x, y, steps: int, checkpoint: bool) -> int:
    """Bytes of the tensors autograd still keeps for the backward once the forward has returned
    (the graph's memory; what a step's own input gradient saved and freed in between is not counted)."""
    alive: weakref.WeakSet = weakref.WeakSet()

    def pack(t):
        holder = _Saved(t)
        alive.add(holder)
        return holder

    refined = RefinedClassifier(model, steps, chains=2, sigma=0.03, sgld=SGLD_SETTINGS, checkpoint=checkpoint,
                                generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda holder: holder.t):
        z = x.clone().requires_grad_(True)
        loss = cross_entropy(refined(z), y)
        gc.collect()
        total = sum(h.t.numel() * h.t.element_size() for h in alive)
        # a checkpointed step keeps its input and noise on its node (views of one store), not through the hooks
        stores = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                  for node in _graph(loss) if type(node).__name__ == "CheckpointedStepBackward" for t in node.saved}
        torch.autograd.grad(loss, z)
    return total + sum(stores.values())


def test_checkpointed_graph_keeps_two_images_per_step_not_the_network(model64, batch64):
    """K = 1 vs K = 10: the checkpointed graph grows by the step's input and noise (2 x chains x image
    per step) and nothing else; the stored one grows by the network's activations and their double
    backward, many times that."""
    x, y = batch64
    per_step = 2 * x.shape[0] * 2 * x[0].numel() * x.element_size()  # (input + noise) x chains=2
    ckpt = {k: _saved_bytes(model64, x, y, k, True) for k in (1, 10)}
    plain = {k: _saved_bytes(model64, x, y, k, False) for k in (1, 10)}
    assert ckpt[10] - ckpt[1] == 9 * per_step
    assert plain[10] - plain[1] > 5 * (ckpt[10] - ckpt[1])


def test_checkpointing_is_on_by_default_from_two_steps_and_recorded(model64, batch64):
    x, y = batch64
    for steps, want in [(0, False), (1, False), (2, True), (5, True), (20, True)]:
        refined = RefinedClassifier(model64, steps)
        assert refined.checkpoint is want and refined.settings()["checkpoint"] is want
    off = RefinedClassifier(model64, 5, checkpoint=False)
    assert off.checkpoint is False and off.settings()["checkpoint"] is False
    assert RefinedClassifier(model64, 1, checkpoint=True).settings()["checkpoint"] is True
    # the default run really is the checkpointed one; the switch really turns it off
    _, _, default_nodes = _logits_and_grad(model64, x, y)
    _, _, off_nodes = _logits_and_grad(model64, x, y, checkpoint=False)
    assert "CheckpointedStepBackward" in default_nodes and "CheckpointedStepBackward" not in off_nodes


class _DropoutNet(nn.Module):
    """A model that draws from the global RNG in every forward while SGLD samples in train mode."""

    num_classes, input_shape = 10, (1, 8, 8)

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Dropout(0.3), nn.LeakyReLU(0.2), nn.Flatten(),
                                  nn.Linear(4 * 64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_recomputation_redraws_the_same_randomness_and_leaves_the_callers_stream(batch64):
    """Global-RNG chain noise and dropout during train-mode sampling: the recomputed steps must see the
    forward's dropout masks, and the caller's generator must be where the unchecked run leaves it."""
    torch.manual_seed(0)
    model = _DropoutNet().double().eval()
    x, y = batch64
    out = {}
    for ckpt in (False, True):
        refined = RefinedClassifier(model, 5, chains=2, sigma=0.03, checkpoint=ckpt,
                                    sgld=SGLD(step_size=0.5, noise=0.01, bn_mode="train"))
        torch.manual_seed(123)
        z = x.clone().requires_grad_(True)
        logits = refined(z)
        (grad,) = torch.autograd.grad(cross_entropy(logits, y), z)
        out[ckpt] = logits.detach(), grad, torch.rand(4)
    assert torch.equal(out[True][0], out[False][0])
    torch.testing.assert_close(out[True][1], out[False][1], rtol=1e-10, atol=1e-13)
    assert torch.equal(out[True][2], out[False][2])
    assert not model.training


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_checkpointed_gradient_equals_the_stored_one_on_cuda(model64, batch64):
    model = jemeval.create_model("cnn", 10, (1, 8, 8), width=4).double().eval().cuda()
    x, y = batch64[0].cuda(), batch64[1].cuda()
    grads = []
    for ckpt in (False, True):
        refined = RefinedClassifier(model, 5, chains=2, sigma=0.03, sgld=SGLD_SETTINGS, checkpoint=ckpt,
                                    generator=torch.Generator("cuda").manual_seed(3))
        z = x.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(cross_entropy(refined(z), y), z)
        grads.append(g)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-9, atol=1e-12)


def test_robust_records_where_checkpointing_was_on():
    """The provenance says at which refinement steps the attack gradient was checkpointed (the
    default turns it on from 2 steps; ``None`` alone would not say)."""
    from jemeval.testing import tiny_model

    model = tiny_model(10, (1, 8, 8))
    kwargs = dict(data="digits", norm="l2", refine_steps=[0, 1, 3], n=4, epsilons=[0.0, 0.5], device="cpu",
                  progress=False)
    settings = jemeval.robust(model, **kwargs).provenance["settings"]
    assert settings["gradient_checkpointing"] is None and settings["gradient_checkpointing_steps"] == [3]
    off = jemeval.robust(model, **kwargs, checkpoint=False).provenance["settings"]
    assert off["gradient_checkpointing"] is False and off["gradient_checkpointing_steps"] == []
