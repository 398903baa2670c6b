"""Generation (`jemeval sample`, `jemeval.sample`): SGLD chains, chain starts, filters, outputs."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import jemeval
from jemeval.artifacts import Samples, SamplesResult, load_samples
from jemeval.cli import cli
from jemeval.errors import UsageError
from jemeval.evaluation.generation import sample, top_confident_mask
from jemeval.formats.native import save_checkpoint
from jemeval.plots.grids import grid_rows, save_samples_grid


@pytest.fixture(scope="session")
def gen_ckpt(request):
    """A digits JEM when the trainer's fixture exists, else the plain digits classifier."""
    try:
        return request.getfixturevalue("digits_jem_ckpt")
    except pytest.FixtureLookupError:
        return request.getfixturevalue("digits_classifier_ckpt")


@pytest.fixture(scope="session")
def conditional(gen_ckpt):
    return sample(gen_ckpt, classes="all", n=3, steps=12, seed=1, progress=False)


@pytest.fixture(scope="session")
def buffer_ckpt(tmp_path_factory):
    """A tiny model whose replay buffer holds a distinct constant image per class block."""
    torch.manual_seed(0)
    model = jemeval.create_model("cnn", 4, (1, 8, 8), width=4)
    block_values = torch.tensor([-0.75, -0.25, 0.25, 0.75])
    buffer = block_values.repeat_interleave(5).view(20, 1, 1, 1).expand(20, 1, 8, 8).clone()
    path = tmp_path_factory.mktemp("buf") / "buffer.pt"
    save_checkpoint(path, model, dataset="digits", replay_buffer=buffer,
                    config={"sgld": {"steps": 7, "step_size": 0.5, "noise": 0.02, "clamp": None, "bn_mode": "eval"}})
    return path, block_values


def test_conditional_samples_are_classified_as_their_target(conditional, gen_ckpt):
    model = jemeval.load_model(gen_ckpt)
    with torch.no_grad():
        logits = model(conditional.samples.x)
    pred = logits.argmax(1)
    # the records agree with an independent recomputation from the returned images
    assert torch.equal(pred, conditional.samples.predicted)
    s = conditional.samples
    torch.testing.assert_close(logits.gather(1, s.target.view(-1, 1)).squeeze(1), s.log_p)
    torch.testing.assert_close(logits.logsumexp(1), conditional.samples.log_px)
    rows = {r["class"]: r for r in conditional.records}
    for c in range(10):
        hit = (pred[conditional.samples.target == c] == c).double().mean().item()
        assert rows[c]["target_rate"] == pytest.approx(hit)
        assert rows[c]["n"] == 3
    assert rows["all"]["target_rate"] == pytest.approx((pred == conditional.samples.target).double().mean().item())
    assert rows["all"]["target_rate"] >= 0.9


def test_chains_raise_log_p_on_average(gen_ckpt):
    for classes in (None, "all"):
        s = sample(gen_ckpt, classes=classes, n=8, steps=10, seed=0, progress=False)
        trace = s.samples.log_p_trace.numpy()
        assert len(trace) == 11  # before each step and after the last, across progress chunks
        assert trace[-1] > trace[0]
        assert (np.diff(trace) > 0).mean() >= 0.8
        assert s.extra["log_p_trace"]["first"] == pytest.approx(float(trace[0]))
        # the last trace value is the mean log p~ of the returned samples
        assert float(trace[-1]) == pytest.approx(float(s.samples.log_p.double().mean()), rel=1e-4, abs=1e-4)


def test_settings_and_provenance_record_every_choice(conditional, gen_ckpt):
    s = conditional.samples.settings
    assert s["mode"] == "class-conditional" and s["init"] == "noise" and s["seed"] == 1
    trained = jemeval.load_model(gen_ckpt).metadata["config"].get("sgld")  # a JEM fixture records its SGLD
    expected = {"step_size": 1.0, "noise": 0.01, "clamp": None, "bn_mode": "eval"}
    expected.update({k: v for k, v in (trained or {}).items() if k in expected})
    assert s["sgld"] == {"steps": 12, **expected}
    assert s["sgld_defaults_from"] == ("checkpoint config" if trained else "JEM release defaults")
    assert s["top_confident"] is None and s["n_generated"] == s["n_kept"] == 30
    prov = conditional.provenance
    assert prov["command"] == "sample" and prov["seed"] == 1 and prov["settings"]["sgld"]["steps"] == 12
    assert prov["checkpoint"]["path"] == str(gen_ckpt)


def test_same_seed_same_samples(gen_ckpt):
    a = sample(gen_ckpt, n=4, steps=3, seed=5, progress=False)
    b = sample(gen_ckpt, n=4, steps=3, seed=5, progress=False)
    c = sample(gen_ckpt, n=4, steps=3, seed=6, progress=False)
    torch.testing.assert_close(a.samples.x, b.samples.x)
    assert not torch.allclose(a.samples.x, c.samples.x)


def test_sgld_defaults_come_from_the_checkpoint_and_arguments_win(buffer_ckpt):
    path, _ = buffer_ckpt
    s = sample(path, n=2, steps=1, progress=False)
    assert s.samples.settings["sgld"]["step_size"] == 0.5 and s.samples.settings["sgld"]["noise"] == 0.02
    assert s.samples.settings["sgld_defaults_from"] == "checkpoint config"
    s = sample(path, n=2, steps=1, sgld_step_size=0.1, sgld_noise=0.0, progress=False)
    assert s.samples.settings["sgld"]["step_size"] == 0.1 and s.samples.settings["sgld"]["noise"] == 0.0


def test_buffer_init_uses_the_class_blocks(buffer_ckpt):
    path, values = buffer_ckpt
    s = sample(path, classes=[1, 3], n=4, steps=0, init="buffer", progress=False)
    for c in (1, 3):
        torch.testing.assert_close(s.samples.x[s.samples.target == c], torch.full((4, 1, 8, 8), values[c].item()))
    assert s.samples.settings["init_details"]["buffer_size"] == 20
    u = sample(path, n=12, steps=0, init="buffer", progress=False)
    # every unconditional start is a buffer image (reinitialisation is off when generating)
    assert all(any(torch.equal(img, torch.full((1, 8, 8), v.item())) for v in values) for img in u.samples.x)


@pytest.mark.any_device
def test_buffer_init_without_a_buffer_is_one_clear_error(digits_classifier_ckpt):
    with pytest.raises(UsageError, match="stores no replay buffer.*set init to 'noise'"):
        sample(digits_classifier_ckpt, n=2, steps=1, init="buffer", progress=False)
    res = CliRunner().invoke(cli, ["sample", "--model", str(digits_classifier_ckpt), "--init", "buffer"])
    assert res.exit_code == 2
    assert "stores no replay buffer" in res.output and "Traceback" not in res.output


def test_data_init_starts_from_dataset_images(digits_classifier_ckpt):
    s = sample(digits_classifier_ckpt, n=5, steps=0, init="data", progress=False)
    train = jemeval.load_dataset("digits", "train").x
    assert all((train == img).flatten(1).all(1).any() for img in s.samples.x)
    assert s.samples.settings["init_details"]["dataset"] == "digits"


@pytest.mark.parametrize("kwargs, message", [
    ({"init": "bufer"}, "did you mean 'buffer'"),
    ({"top_confident": 0}, "percentage"),
    ({"n": 0}, "^n must be >= 1, got 0$"),
    ({"classes": "11"}, "not a class"),
    ({"classes": "two"}, "'all' or class indices"),
    ({"steps": -1}, "steps must be >= 0"),
])
def test_bad_arguments_are_usage_errors(digits_classifier_ckpt, kwargs, message):
    with pytest.raises(UsageError, match=message):
        sample(digits_classifier_ckpt, **{"n": 2, "steps": 1, "progress": False, **kwargs})


def _top_confident_reference(pred, conf, percent):
    keep = np.zeros(len(pred), dtype=bool)
    for c in np.unique(pred):
        idx = np.flatnonzero(pred == c)
        k = int(np.ceil(len(idx) * percent / 100 - 1e-9))
        keep[idx[np.argsort(-conf[idx], kind="stable")[:k]]] = True
    return keep


@pytest.mark.parametrize("percent", [10, 33.3, 50, 100])
def test_top_confident_mask_matches_a_per_class_loop(percent):
    rng = np.random.default_rng(0)
    pred = rng.integers(0, 7, size=200)
    pred[pred == 3] = 4  # an empty class
    conf = rng.random(200)
    expected = _top_confident_reference(pred, conf, percent)
    np.testing.assert_array_equal(top_confident_mask(pred, conf, percent), expected)


def test_top_confident_filter_in_sample(gen_ckpt):
    full = sample(gen_ckpt, n=20, steps=4, seed=3, progress=False)
    top = sample(gen_ckpt, n=20, steps=4, seed=3, top_confident=25, progress=False)
    keep = _top_confident_reference(full.samples.predicted.numpy(), full.samples.confidence.numpy(), 25)
    torch.testing.assert_close(top.samples.x, full.samples.x[torch.from_numpy(keep)])
    assert top.samples.settings["n_generated"] == 20 and top.samples.settings["n_kept"] == int(keep.sum())
    assert top.samples.settings["top_confident"] == 25


def test_npz_round_trip(conditional, tmp_path):
    path = conditional.samples.save_npz(tmp_path / "s.npz")
    with np.load(path, allow_pickle=False) as f:
        assert set(f.files) >= {"x", "y", "log_p", "log_px", "predicted", "confidence", "provenance"}
        np.testing.assert_array_equal(f["y"], conditional.samples.target.numpy())
        np.testing.assert_allclose(f["confidence"], conditional.samples.confidence.numpy())
        prov = json.loads(str(f["provenance"]))
    assert prov["settings"]["sgld"]["steps"] == 12 and prov["seed"] == 1
    x, prov2 = load_samples(path)
    torch.testing.assert_close(x, conditional.samples.x)
    assert prov2 == prov


def test_grid_has_one_row_per_class(conditional, tmp_path):
    x, labels, captions = grid_rows(conditional.samples, per_row=5)
    assert labels == [f"y={c}" for c in range(10)]
    assert x.shape == (10 * 3, 1, 8, 8) and len(captions) == 30  # rows trimmed to the 3 samples per class
    unc = sample(conditional.provenance["checkpoint"]["path"], n=10, steps=2, progress=False)
    x, labels, captions = grid_rows(unc.samples, per_row=4)
    groups = sorted(set(unc.samples.predicted.tolist()))
    assert labels == [f"pred {c}" for c in groups]
    assert len(x) == 4 * len(groups) and len(captions) == len(x)
    shown = sum(min(4, int((unc.samples.predicted == c).sum())) for c in groups)
    assert int(torch.isnan(x.flatten(1)).all(1).sum()) == 4 * len(groups) - shown
    from matplotlib.image import imread

    img = imread(save_samples_grid(conditional.samples, tmp_path / "grid.png"))
    assert img.ndim == 3 and img.shape[0] > 300 and img.std() > 0.05
    with pytest.warns(DeprecationWarning, match="save_samples_grid"):  # the old method, kept one release
        old = conditional.samples.save_grid(tmp_path / "old.png")
    assert (imread(old) == img).all()


def test_cli_sample_writes_grid_npz_and_json(gen_ckpt, tmp_path):
    args = ["sample", "--model", str(gen_ckpt), "--class", "0,7", "--n", "2", "--steps", "3", "--device", "cpu",
            "--out", str(tmp_path / "g.png"), "--save", str(tmp_path / "s.npz"), "--json", "--seed", "4"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [r["class"] for r in data["records"]] == [0, 7, "all"]
    assert data["settings"]["classes"] == [0, 7] and data["provenance"]["seed"] == 4
    assert (tmp_path / "g.png").stat().st_size > 0 and (tmp_path / "s.npz").stat().st_size > 0
    res = CliRunner().invoke(cli, ["sample", "--model", str(gen_ckpt), "--out", str(tmp_path / "g.jpg")])
    assert res.exit_code == 2 and "must be a .png file" in res.output


def test_public_api_name():
    assert jemeval.sample is sample


def test_sample_returns_a_result_holding_the_samples(conditional):
    assert isinstance(conditional, SamplesResult) and isinstance(conditional.extra["samples"], Samples)
    assert conditional.samples is conditional.extra["samples"]
    data = conditional.to_dict()  # the JSON result is what it was: records, settings, trace, provenance
    assert list(data) == ["records", "settings", "log_p_trace", "provenance"]


def test_the_old_samples_attributes_still_work_with_a_warning(conditional, tmp_path):
    with pytest.warns(DeprecationWarning, match=r"use result.extra\['samples'\].x"):
        x = conditional.x
    assert x is conditional.samples.x
    with pytest.warns(DeprecationWarning, match="sample returns the Result itself"):
        assert conditional.result is conditional
    with pytest.warns(DeprecationWarning):
        assert len(conditional) == 30
    with pytest.warns(DeprecationWarning):
        conditional.save_npz(tmp_path / "s.npz")
    assert load_samples(tmp_path / "s.npz")[0].shape == (30, 1, 8, 8)
    with pytest.raises(AttributeError):
        conditional.no_such_attribute  # noqa: B018
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert conditional  # truth is not len(): no warning
