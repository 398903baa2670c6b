"""Chain starts from per-class Gaussians of the training images (jemeval.sampling.gaussian_starts,
``gaussian_starts`` in a run): the fit against NumPy's per-class mean and covariance, the draws against
the fit, the mixing fraction, a replay buffer's starts and restarts, and runs with them (the labelled
images only; a resume is exact)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_bad_inputs import assert_one_line_refusal, runner

import jemeval
from jemeval.cli import cli
from jemeval.formats.native import read_checkpoint
from jemeval.sampling import gaussian_starts as gs
from jemeval.sampling.buffer import ReplayBuffer, uniform_like_shape
from jemeval.sampling.gaussian_starts import RIDGE, GaussianStarts
from jemeval.training import resolve_config, train
from jemeval.training.parts import fit_gaussian_starts
from jemeval.training.splits import prepare_data


def labelled_images(n=900, shape=(1, 2, 2), seed=0):
    """Three classes with their own means and correlated values, labels interleaved."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    mix = torch.randn(3, 4, 4, generator=g) * 0.05
    z = torch.randn(n, 4, generator=g)
    x = torch.einsum("nij,nj->ni", mix[y], z) + (y[:, None] - 1) * 0.3
    return x.reshape(n, *shape), y


def numpy_reference(x, y):
    flat = x.reshape(len(x), -1).double().numpy()
    means = np.stack([flat[y.numpy() == c].mean(0) for c in range(3)])
    covs = np.stack([np.cov(flat[y.numpy() == c], rowvar=False) + RIDGE * np.eye(flat.shape[1]) for c in range(3)])
    return means, covs


def test_the_fit_is_numpys_per_class_mean_and_covariance_read_in_batches(monkeypatch):
    monkeypatch.setattr(gs, "FIT_BATCH", 128)  # 900 images: 8 batches, each holding every class
    x, y = labelled_images()
    fit = GaussianStarts.fit(x, y, (1, 2, 2))
    means, covs = numpy_reference(x, y)
    assert not fit.diagonal and fit.classes.tolist() == [0, 1, 2]
    np.testing.assert_allclose(fit.means.numpy(), means, atol=1e-6)
    factors = fit.factors.double()
    np.testing.assert_allclose((factors @ factors.transpose(1, 2)).numpy(), covs, atol=1e-6)


def test_above_the_full_covariance_budget_the_fit_is_per_value(monkeypatch):
    monkeypatch.setattr(gs, "FULL_COVARIANCE_MAX", 3 * 4 * 4 - 1)
    x, y = labelled_images()
    fit = GaussianStarts.fit(x, y, (1, 2, 2))
    means, covs = numpy_reference(x, y)
    assert fit.diagonal
    np.testing.assert_allclose(fit.factors.double().numpy() ** 2, np.diagonal(covs, axis1=1, axis2=2), atol=1e-6)


def test_draws_of_a_class_have_its_mean_and_covariance():
    x, y = labelled_images()
    fit = GaussianStarts.fit(x, y, (1, 2, 2))
    means, covs = numpy_reference(x, y)
    g = torch.Generator().manual_seed(1)
    draws = fit.starts(40000, 1.0, torch.full((40000,), 2), generator=g).reshape(40000, 4).double().numpy()
    assert np.abs(draws).max() <= 1  # clamped to the images' range (rarely reached here)
    np.testing.assert_allclose(draws.mean(0), means[2], atol=3e-3)  # standard error ~5e-4
    np.testing.assert_allclose(np.cov(draws, rowvar=False), covs[2], atol=2e-3)


def test_fraction_zero_is_jems_uniform_start_and_a_half_mixes_the_two():
    x, y = labelled_images()
    fit = GaussianStarts.fit(x, y, (1, 2, 2))
    uniform = uniform_like_shape(4000, (1, 2, 2), generator=torch.Generator().manual_seed(5))
    none = fit.starts(4000, 0.0, generator=torch.Generator().manual_seed(5))
    assert torch.equal(none, uniform)  # the same stream: U(-1, 1) is drawn first
    half = fit.starts(4000, 0.5, generator=torch.Generator().manual_seed(5))
    replaced = (half != uniform).flatten(1).any(1).float().mean().item()
    assert 0.46 < replaced < 0.54  # binomial(4000, 0.5): sd 0.008


def test_a_label_without_training_images_keeps_its_uniform_start():
    x, y = labelled_images()
    keep = y != 1
    fit = GaussianStarts.fit(x[keep], y[keep], (1, 2, 2))  # classes 0 and 2 only
    labels = torch.tensor([0, 1, 2, 7] * 50)
    uniform = fit.starts(200, 0.0, labels, generator=torch.Generator().manual_seed(3))
    drawn = fit.starts(200, 1.0, labels, generator=torch.Generator().manual_seed(3))
    same = (drawn == uniform).flatten(1).all(1)
    assert same[labels == 1].all() and same[labels == 7].all() and not same[labels == 0].any()


def test_a_semi_supervised_run_fits_its_labelled_images_only(tmp_path):
    config = resolve_config("digits", out=str(tmp_path / "r"), labels_per_class=5, gaussian_starts=0.5,
                            device="cpu")
    data = prepare_data(config, torch.device("cpu"))
    fit = fit_gaussian_starts(config, data)
    x, y = data.x[data.labelled], data.y[data.labelled]
    assert len(y) == 50
    torch.testing.assert_close(fit.means, GaussianStarts.fit(x, y, data.input_shape).means)
    assert fit_gaussian_starts(config.replace(gaussian_starts=0.0), data) is None


@pytest.mark.parametrize("value", [1.5, -0.1, float("nan")])
def test_a_fraction_outside_zero_to_one_is_refused(value, tmp_path):
    with pytest.raises(jemeval.errors.UsageError, match=r"gaussian_starts must lie in \[0, 1\]"):
        resolve_config("digits", out=str(tmp_path / "r"), gaussian_starts=value)


def test_gaussian_starts_without_sampling_are_refused_not_ignored(tmp_path):
    with pytest.raises(jemeval.errors.UsageError, match=r"gaussian_starts \(where SGLD chains start\) needs sampling"):
        resolve_config("digits", out=str(tmp_path / "r"), gaussian_starts=0.5, px_weight=0.0)


def test_the_cli_refuses_a_fraction_above_one_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner().invoke(cli, ["train", "digits", "--gaussian-starts", "2", "--out", "run"])
    assert_one_line_refusal(result, "--gaussian-starts must lie in [0, 1], got 2.0")
    assert not (tmp_path / "run").exists()


def test_a_replay_buffer_starts_and_restarts_its_chains_from_the_mixture():
    x, y = labelled_images()
    fit = GaussianStarts.fit(x, y, (1, 2, 2))
    buffer = ReplayBuffer(300, (1, 2, 2), num_classes=3, reinit_freq=1.0, generator=torch.Generator().manual_seed(0),
                          starts=fit.mixture(1.0))
    assert (buffer.data.flatten(1).std(1) < 0.3).all()  # every chain a Gaussian draw (uniform rows: std ~0.6)
    starts, _ = buffer.sample(3000, torch.full((3000,), 0), generator=torch.Generator().manual_seed(1))
    means, _ = numpy_reference(x, y)
    np.testing.assert_allclose(starts.flatten(1).mean(0).numpy(), means[0], atol=0.01)  # restarted as class 0
    plain = ReplayBuffer(300, (1, 2, 2), generator=torch.Generator().manual_seed(0))
    assert torch.equal(plain.data, uniform_like_shape(300, (1, 2, 2), generator=torch.Generator().manual_seed(0)))


TINY = {"arch": "cnn:width=8", "batch_size": 32, "lr": 2e-3, "warmup_iters": 2, "decay_epochs": (), "sgld_steps": 2,
        "buffer_size": 60, "val_size": 30, "progress": False, "test_eval": False, "check_every": 2, "device": "cpu",
        "gaussian_starts": 0.5, "grid_every": 0}


@pytest.mark.parametrize("chains", [{"short_run": True}, {"short_run": False}], ids=["short-run", "persistent"])
def test_a_run_with_gaussian_starts_resumes_exactly_and_differs_from_uniform_starts(chains, tmp_path):
    def run(name, epochs, **more):
        settings = {**TINY, **chains, "epochs": epochs, "out": str(tmp_path / name), **more}
        train(resolve_config("digits[0-2]", **settings))
        return read_checkpoint(tmp_path / name / "last.pt")

    full, uniform = run("full", 2), run("uniform", 2, gaussian_starts=0.0)
    run("half", 1)
    half = run("half", 2, resume=True)
    assert all(torch.equal(full["state_dict"][k], half["state_dict"][k]) for k in full["state_dict"])
    assert not all(torch.equal(full["state_dict"][k], uniform["state_dict"][k]) for k in full["state_dict"])
    assert full["config"]["gaussian_starts"] == 0.5
    if not chains["short_run"]:
        assert torch.equal(full["replay_buffer"], half["replay_buffer"])


def test_the_gpu_way_of_drawing_correlated_noise_is_the_cpu_way():
    """On a GPU every class's product is computed and one kept; on the CPU one product per class."""
    g = torch.Generator().manual_seed(0)
    factors, z, k = torch.randn(4, 6, 6, generator=g), torch.randn(50, 6, generator=g), torch.arange(50) % 3
    expected = torch.stack([factors[k[i]] @ z[i] for i in range(50)])
    for every_class in (True, False):
        torch.testing.assert_close(gs._correlated(factors, k, z, every_class=every_class), expected)
