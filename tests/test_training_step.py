"""One training iteration (jemeval.training.step, objectives, the trainer's schedule): the loss terms
against a hand computation, the learning-rate schedule, deterministic buffer writes, and the benchmark
that times exactly this iteration."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

from jemeval.sampling.buffer import last_writer
from jemeval.training.config import resolve_config
from jemeval.training.objectives import Logits, Weights, jem_loss
from jemeval.training.trainer import learning_rate, run_rate


def test_buffer_writes_with_repeated_slots_are_deterministic():
    idx = torch.tensor([3, 1, 3, 0, 1, 3])
    x = torch.arange(6.0)
    data = torch.full((5,), -1.0)
    data[idx] = x[last_writer(idx, 5)]
    expected = torch.full((5,), -1.0)
    for i, slot in enumerate(idx.tolist()):  # sequential reference: the last write wins
        expected[slot] = x[i]
    assert torch.equal(data, expected)


def test_learning_rate_warmup_and_step_decay():
    kw = {"warmup_iters": 10, "decay_epochs": (3, 5), "decay_rate": 0.3}
    assert learning_rate(1e-3, 0, 0, **kw) == pytest.approx(1e-4)
    assert learning_rate(1e-3, 9, 0, **kw) == pytest.approx(1e-3)
    assert learning_rate(1e-3, 50, 2, **kw) == pytest.approx(1e-3)
    assert learning_rate(1e-3, 50, 3, **kw) == pytest.approx(3e-4)
    assert learning_rate(1e-3, 50, 7, **kw, scale=0.5) == pytest.approx(1e-3 * 0.09 * 0.5)
    config = resolve_config("digits", lr=1e-3, **kw)
    assert run_rate(config, 50, 7, 0.5) == learning_rate(1e-3, 50, 7, **kw, scale=0.5)


def test_jem_loss_terms_match_hand_computation():
    torch.manual_seed(0)
    lab, data, q, qy = (torch.randn(5, 4) for _ in range(4))
    y = torch.tensor([0, 1, 2, 3, 1])
    out = Logits(lab=lab, y_lab=y, data=data, sample=q, sample_y=qy, y_sample=y)
    t = jem_loss(out, Weights(pyx=1.0, px=0.5, pxy=2.0, l2=0.1))
    lse = lambda z: np.log(np.exp(z.numpy()).sum(1))
    ce = np.mean([-(lab[i, y[i]].item() - lse(lab)[i]) for i in range(5)])
    px = -(lse(data).mean() - lse(q).mean())
    fy = lambda z: np.array([z[i, y[i]].item() for i in range(5)])
    pxy = -(fy(lab).mean() - fy(qy).mean())
    l2 = (lse(data) ** 2).mean() + (lse(q) ** 2).mean() + (fy(lab) ** 2).mean() + (fy(qy) ** 2).mean()
    assert t["pyx"].item() == pytest.approx(ce, rel=1e-5)
    assert t["px"].item() == pytest.approx(px, rel=1e-5)
    assert t["pxy"].item() == pytest.approx(pxy, rel=1e-5)
    assert t["l2"].item() == pytest.approx(l2, rel=1e-5)
    assert t["loss"].item() == pytest.approx(ce + 0.5 * px + 2.0 * pxy + 0.1 * l2, rel=1e-5)
    assert t["e_data"].item() == pytest.approx(-lse(data).mean(), rel=1e-5)
    assert t["e_sample"].item() == pytest.approx(-np.concatenate([lse(q), lse(qy)]).mean(), rel=1e-5)


def test_benchmark_prints_ratios():
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "train_step.py")
    spec = importlib.util.spec_from_file_location("train_step", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    r = bench.main(["--arch", "cnn:width=8", "--batch", "16", "--steps", "2", "--repeats", "1", "--json",
                    "--device", "cpu"])
    assert r["sgld_step_over_forward_backward"] > 0 and r["jem_iteration_over_plain_iteration"] > 1
    assert r["jem_images_per_s"] > 0


def _batchnorm_step(model, px: float):
    from jemeval.sampling.sgld import SGLD
    from jemeval.training.augment import Augment
    from jemeval.training.step import StepOptions, TrainStep
    return TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), sgld=SGLD(steps=2, step_size=1.0),
                     buffer=None, weights=Weights(px=px), num_classes=3, input_shape=(3, 8, 8), augment=Augment(),
                     generator=torch.Generator().manual_seed(0), options=StepOptions(short_run=True))


def test_batchnorm_running_statistics_are_the_datas_alone():
    """A BatchNorm network's training step forwards SGLD samples in train mode too (separate passes);
    its running statistics, what the eval-mode network normalises with, must be those a train-mode
    forward over the labelled batch alone gives (plain torch on a copy of the network)."""
    import copy

    import jemeval
    torch.manual_seed(0)
    model = jemeval.create_model("wrn:depth=10,widen=1,norm=batch", 3, (3, 8, 8))
    reference = copy.deepcopy(model).train()
    x, y = torch.rand(16, 3, 8, 8) * 2 - 1, torch.randint(0, 3, (16,))
    with torch.no_grad():
        reference(x)
    stats = _batchnorm_step(model, px=1.0)(x, y)
    assert torch.isfinite(stats["e_sample"])  # the samples did go through the network
    layers = [(m, r) for m, r in zip(model.modules(), reference.modules()) if isinstance(m, torch.nn.BatchNorm2d)]
    assert layers
    for m, r in layers:
        torch.testing.assert_close(m.running_mean, r.running_mean, rtol=0, atol=0)
        torch.testing.assert_close(m.running_var, r.running_var, rtol=0, atol=0)
        assert int(m.num_batches_tracked) == int(r.num_batches_tracked) == 1
        assert m.momentum == r.momentum  # restored after the samples' pass
