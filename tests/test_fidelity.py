"""Sample quality (`jemeval fidelity`): Frechet distances, model features, IS/FID/KID plumbing."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys

import numpy as np
import pytest
import scipy.linalg
import torch
from click.testing import CliRunner

import jemeval
from jemeval.cli import cli
from jemeval.errors import CheckpointError, JemevalError, UsageError
from jemeval.evaluation.fidelity import evaluate as fid_mod
from jemeval.evaluation.fidelity.evaluate import (
    check_inception_weights,
    extract_features,
    feature_statistics,
    fidelity,
    frechet_distance,
    frechet_distance_from_features,
    to_uint8_rgb,
)
from jemeval.evaluation.generation import sample


def _scipy_fd(f1, f2):
    """The textbook computation (pytorch-fid's): scipy's matrix square root of S1 S2."""
    mu1, mu2 = f1.mean(0), f2.mean(0)
    s1, s2 = np.cov(f1, rowvar=False), np.cov(f2, rowvar=False)
    covmean = scipy.linalg.sqrtm(s1 @ s2).real
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1 + s2 - 2 * covmean))


@pytest.mark.parametrize("n, d", [(400, 6), (200, 20)])
def test_frechet_distance_matches_scipy(n, d):
    rng = np.random.default_rng(d)
    a = rng.normal(size=(n, d)) @ rng.normal(size=(d, d))
    b = rng.normal(loc=0.5, size=(n, d)) @ rng.normal(size=(d, d))
    assert frechet_distance_from_features(a, b) == pytest.approx(_scipy_fd(a, b), rel=1e-6)


def test_frechet_distance_special_cases():
    rng = np.random.default_rng(0)
    f = rng.normal(size=(300, 8))
    assert frechet_distance_from_features(f, f) == pytest.approx(0.0, abs=1e-9)
    shift = rng.normal(size=8)
    # a translation changes only the mean term: exactly ||shift||^2
    assert frechet_distance_from_features(f, f + shift) == pytest.approx(float(shift @ shift), rel=1e-9)
    # two 1-D Gaussians: (m1 - m2)^2 + (s1 - s2)^2
    one_d = frechet_distance(np.array([1.0]), np.array([[4.0]]), np.array([3.0]), np.array([[1.0]]))
    assert one_d == pytest.approx(4 + 1)
    # fewer samples than dimensions (singular covariances) stays finite and non-negative
    g = rng.normal(size=(5, 30))
    assert 0 <= frechet_distance_from_features(g, g[::-1] + 1) < np.inf
    with pytest.raises(ValueError, match="mismatched"):
        frechet_distance(np.zeros(2), np.eye(2), np.zeros(3), np.eye(3))
    with pytest.raises(UsageError, match="at least 2"):
        feature_statistics(np.zeros((1, 4)))


def test_features_are_the_penultimate_layer(digits_classifier_ckpt):
    model = jemeval.load_model(digits_classifier_ckpt)
    x = jemeval.load_dataset("digits", "test").x[:20]
    feats, layer = extract_features(model, x, batch_size=7)
    with torch.no_grad():
        expected = model.net.features(x).double().numpy()  # SmallCNN: features -> head
    np.testing.assert_allclose(feats, expected, rtol=1e-5, atol=1e-6)
    assert "head" in layer and feats.shape == (20, 64)


def test_feature_fd_separates_real_from_noise(digits_classifier_ckpt):
    test = jemeval.load_dataset("digits", "test").x
    noise = torch.rand(200, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    real = fidelity(test, "digits", features=digits_classifier_ckpt, metrics="fd")
    fake = fidelity(noise, "digits", features=digits_classifier_ckpt, metrics="fd")
    same = fidelity(jemeval.load_dataset("digits", "train").x, "digits", features=digits_classifier_ckpt, metrics="fd")
    assert same.records[0]["value"] == pytest.approx(0.0, abs=1e-6)
    assert real.records[0]["value"] < 0.2 * fake.records[0]["value"]
    rec = real.records[0]
    assert rec["metric"] == "fd" and rec["n_samples"] == 450 and rec["n_ref"] == 1347
    assert real.extra["settings"]["features"][0]["dim"] == 64
    assert real.provenance["command"] == "fidelity"


def test_fidelity_records_which_samples_were_scored(digits_classifier_ckpt, tmp_path):
    s = sample(digits_classifier_ckpt, classes="all", n=2, steps=3, top_confident=50, progress=False)
    npz = s.samples.save_npz(tmp_path / "s.npz")
    for given in (s, s.samples, npz):
        res = fidelity(given, features=[digits_classifier_ckpt], ref_n=100)  # reference: the model's dataset
        settings = res.provenance["settings"]
        assert settings["samples"]["generation"]["top_confident"] == 50
        assert settings["samples"]["generation"]["init"] == "noise"
        assert settings["samples"]["generation"]["sgld"]["steps"] == 3
        assert settings["reference"]["dataset"] == "digits" and settings["reference"]["n"] == 100
        assert [r["metric"] for r in res.records] == ["fd"]
        assert any("IS/FID/KID skipped" in n for n in res.notes)
        assert any("judges its own samples" in n for n in res.notes)  # features model = generating model


@pytest.mark.any_device
def test_missing_inception_weights_is_one_clear_line(digits_classifier_ckpt, tmp_path, monkeypatch):
    monkeypatch.delenv(fid_mod.WEIGHTS_ENV, raising=False)
    with pytest.raises(UsageError, match="give it as inception_weights") as info:
        fidelity(torch.zeros(4, 1, 8, 8), "digits")
    assert info.value.param == "inception_weights"
    runner = CliRunner()
    res = runner.invoke(cli, ["fidelity", "--model", str(digits_classifier_ckpt), "--n", "2", "--steps", "1"])
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: IS/FID/KID need")
    assert fid_mod.INCEPTION_FILE in lines[0] and "Traceback" not in res.output
    res = runner.invoke(cli, ["fidelity", "--model", str(digits_classifier_ckpt),
                              "--inception-weights", str(tmp_path / "nope.pth")])
    assert res.exit_code == 2 and "does not exist" in res.output


@pytest.mark.any_device
def test_wrong_inception_weights_files_are_rejected(tmp_path, digits_classifier_ckpt):
    junk = tmp_path / "junk.pth"
    junk.write_text("not weights")
    with pytest.raises(CheckpointError, match="not a tensor-only PyTorch weights file"):
        check_inception_weights(junk)
    with pytest.raises(CheckpointError, match="not torch-fidelity's InceptionV3"):
        check_inception_weights(digits_classifier_ckpt)
    res = CliRunner().invoke(cli, ["fidelity", "--samples", str(junk), "--inception-weights", str(junk)])
    assert res.exit_code != 0 and len(res.output.strip().splitlines()) == 1


def test_without_torch_fidelity_the_message_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_fidelity", None)
    with pytest.raises(JemevalError, match=r"pip install 'jemeval\[fidelity\]'"):
        fid_mod.require_torch_fidelity()


def test_uint8_rgb_conversion():
    x = torch.tensor([-1.0, 0.0, 1.0, 2.0]).view(1, 1, 2, 2)
    u = to_uint8_rgb(x)
    assert u.dtype == torch.uint8 and u.shape == (1, 3, 2, 2)
    assert u[0, 0].flatten().tolist() == [0, 128, 255, 255] and torch.equal(u[0, 0], u[0, 2])


def test_metric_list_errors():
    with pytest.raises(UsageError, match="unknown metric 'fdi'.*'fid'"):
        fidelity(torch.zeros(4, 1, 8, 8), "digits", metrics="fdi")
    with pytest.raises(UsageError, match="needs features"):
        fidelity(torch.zeros(4, 1, 8, 8), "digits", metrics="fd")


# -- with torch-fidelity installed (the `fidelity` extra) --------------------------------------
@pytest.fixture
def no_download(monkeypatch):
    """Any attempt to fetch the Inception weights fails loudly instead of touching the network."""
    tfe = pytest.importorskip("torch_fidelity.feature_extractor_inceptionv3")

    def refuse(*args, **kwargs):
        raise AssertionError("torch-fidelity tried to download weights")

    monkeypatch.setattr(tfe, "load_state_dict_from_url", refuse)
    return tfe


def _stand_in_weights(path):
    """The right first and last tensors: passes jemeval's check, and torch-fidelity then rejects it."""
    state = {"Conv2d_1a_3x3.conv.weight": torch.randn(32, 3, 3, 3), "fc.weight": torch.randn(1008, 2048)}
    torch.save(state, path)
    return state


def test_torch_fidelity_gets_the_verified_tensors(no_download, tmp_path):
    """The library is handed the tensors jemeval verified (not the path); its rejection of the
    stand-in comes back as one line naming the file."""
    stand_in = tmp_path / "stand_in.pth"
    _stand_in_weights(stand_in)
    info = check_inception_weights(stand_in)
    assert info["path"] == str(stand_in) and not info["is_release_file"]
    assert info["sha256"] == hashlib.sha256(stand_in.read_bytes()).hexdigest()
    x = torch.rand(6, 1, 8, 8) * 2 - 1
    with pytest.raises(CheckpointError, match=r"torch-fidelity could not use .*stand_in\.pth.*Missing key"):
        fidelity(x, x, inception_weights=stand_in, metrics="is,fid")


class _MkdirPayload:
    """A pickle that runs code when fully unpickled: it creates the folder ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_weights_swapped_during_sampling_never_run_code(no_download, tmp_path, monkeypatch, digits_classifier_ckpt):
    """Issue 11 item 7, as an attack: the CLI verifies the weights file, then (while samples are
    drawn) the file is replaced by a pickle payload of the same size and mtime. Before the fix the
    check was cached by (path, size, mtime) and torch-fidelity re-opened the path with full pickle,
    running the payload. Now the payload must never run, and torch-fidelity must get the verified tensors."""
    from jemeval.cli.commands import fidelity as cmd

    weights, marker = tmp_path / "weights.pth", tmp_path / "payload-ran"
    verified = _stand_in_weights(weights)
    before = weights.stat()
    payload = pickle.dumps(_MkdirPayload(marker), protocol=2)

    def swap():
        weights.write_bytes(payload + b"\0" * (before.st_size - len(payload)))
        os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = weights.stat()
        assert (after.st_size, after.st_mtime) == (before.st_size, before.st_mtime)

    sample_then_swap = cmd.sample_from_options

    def sampling_and_swap(*args, **kwargs):  # runs after the CLI's check, before torch-fidelity
        samples = sample_then_swap(*args, **kwargs)
        swap()
        return samples

    received = {}
    load = no_download.FeatureExtractorInceptionV3.load_state_dict

    def spy(self, state, *args, **kwargs):
        received.update(state)
        return load(self, state, *args, **kwargs)

    monkeypatch.setattr(cmd, "sample_from_options", sampling_and_swap)
    monkeypatch.setattr(no_download.FeatureExtractorInceptionV3, "load_state_dict", spy)
    res = CliRunner().invoke(cli, ["fidelity", "--model", str(digits_classifier_ckpt),
                                   "--inception-weights", str(weights),
                                   "--metrics", "is", "--n", "2", "--steps", "1", "--device", "cpu"])
    assert not marker.exists(), "the swapped-in pickle ran"
    assert weights.read_bytes().startswith(payload)  # the swap did happen
    # torch-fidelity got exactly the verified tensors; the stand-in lacks the rest, a clean one-line failure
    assert set(received) == set(verified) and all(torch.equal(received[k], v) for k, v in verified.items())
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    last = res.output.strip().splitlines()[-1]  # after the sampling progress bar
    assert last.startswith("Error: torch-fidelity could not use") and "Missing key" in last
    # the payload is live: a full-pickle load of the file as it now is would have run it
    with pytest.raises(RuntimeError, match="magic number"):  # after the payload ran
        torch.load(weights, weights_only=False)
    assert marker.is_dir()


@pytest.fixture(scope="module")
def random_inception_weights(tmp_path_factory):
    """A randomly initialised InceptionV3 in torch-fidelity's layout (the real file cannot be
    downloaded here): enough to run the whole IS/FID/KID pipeline, not to get meaningful values."""
    tfe = pytest.importorskip("torch_fidelity.feature_extractor_inceptionv3")
    cls = tfe.FeatureExtractorInceptionV3
    orig_load, orig_url = cls.load_state_dict, tfe.load_state_dict_from_url
    try:
        cls.load_state_dict = lambda self, *a, **k: None
        tfe.load_state_dict_from_url = lambda *a, **k: {}
        torch.manual_seed(0)
        state = cls("inception-v3-compat", ["2048"]).state_dict()
    finally:
        cls.load_state_dict, tfe.load_state_dict_from_url = orig_load, orig_url
    path = tmp_path_factory.mktemp("inception") / "random-inception.pth"
    torch.save(state, path)
    return path


@pytest.mark.slow
def test_inception_metrics_end_to_end(no_download, random_inception_weights, monkeypatch):
    # 75 x 75 is InceptionV3's smallest input; it keeps this CPU test short (299 in real use)
    monkeypatch.setattr(no_download.FeatureExtractorInceptionV3, "INPUT_IMAGE_SIZE", 75)
    x = torch.rand(12, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    res = fidelity(x, x.clone(), inception_weights=random_inception_weights, seed=3)
    values = {r["metric"]: r for r in res.records}
    assert set(values) == {"is", "fid", "kid"}
    assert values["fid"]["value"] == pytest.approx(0.0, abs=1e-6)  # identical sets
    assert values["kid"]["value"] == pytest.approx(0.0, abs=1e-6)
    assert values["is"]["value"] >= 1.0 - 1e-9
    inc = res.provenance["settings"]["inception"]
    assert inc["weights"]["path"] == str(random_inception_weights)
    assert inc["kid_subset_size"] == 12 and inc["isc_splits"] == 10 and inc["rng_seed"] == 3
    assert any("not torch-fidelity's release file" in n for n in res.notes)
    assert any("say little" in n for n in res.notes)
    out = json.loads(res.to_json())
    assert out["records"][0]["features"] == "inception-v3-compat"


def test_ref_n_errors_name_the_parameter_and_the_flag(digits_classifier_ckpt):
    """Issue 11 item 14: `fidelity --ref-n 0` sampled first, then blamed `--n`."""
    with pytest.raises(UsageError, match=r"^ref_n must be a positive number of examples, got 0$"):
        fidelity(torch.zeros(4, 1, 8, 8), "digits", features=digits_classifier_ckpt, metrics="fd", ref_n=0)
    ckpt = str(digits_classifier_ckpt)
    r = CliRunner().invoke(cli, ["fidelity", "--model", ckpt, "--features", ckpt, "--ref-n", "0", "--n", "2",
                                 "--steps", "1"])
    assert r.exit_code == 2 and "'--ref-n'" in r.output and "'--n'" not in r.output, r.output
    assert "SGLD" not in r.output, r.output


# -- torch-fidelity's other metrics, other extractors, cached reference features (issue 17) ------------
@pytest.fixture
def small_inception(no_download, monkeypatch):
    # 75 x 75 is InceptionV3's smallest input; it keeps these CPU tests short (299 in real use)
    monkeypatch.setattr(no_download.FeatureExtractorInceptionV3, "INPUT_IMAGE_SIZE", 75)
    return no_download


def _images(n, seed):
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@pytest.mark.slow
def test_metrics_equal_torch_fidelitys_own_pipeline(small_inception, random_inception_weights):
    """jemeval runs torch-fidelity's extractor and metric functions itself (to cache reference
    features); the numbers are those of torch_fidelity.calculate_metrics on the same inputs."""
    import torch_fidelity

    from jemeval.evaluation.fidelity.inception import Uint8Images, verified_weights

    x, ref = _images(12, 0), _images(10, 1)
    res = fidelity(x, ref, inception_weights=random_inception_weights, feature_extractor="inception-v3-compat",
                   metrics="is,fid,kid,precision,recall,f_score", seed=3, kid_subset_size=8)
    ours = {r["metric"]: r["value"] for r in res.records}
    info = check_inception_weights(random_inception_weights)
    theirs = torch_fidelity.calculate_metrics(
        input1=Uint8Images(x), input2=Uint8Images(ref), cuda=False, isc=True, fid=True, kid=True, prc=True,
        feature_extractor="inception-v3-compat", feature_extractor_weights_path=verified_weights(info),
        kid_subset_size=8, rng_seed=3, cache=False, verbose=False, save_cpu_ram=True)
    assert ours["is"] == pytest.approx(theirs["inception_score_mean"], rel=1e-9)
    assert ours["fid"] == pytest.approx(theirs["frechet_inception_distance"], rel=1e-9)
    assert ours["kid"] == pytest.approx(theirs["kernel_inception_distance_mean"], rel=1e-9, abs=1e-12)
    assert (ours["precision"], ours["recall"], ours["f_score"]) == pytest.approx(
        (theirs["precision"], theirs["recall"], theirs["f_score"]))
    assert {r["features"] for r in res.records} == {"inception-v3-compat"}
    inc = res.provenance["settings"]["inception"]
    assert inc["layers"] == {"is": "logits_unbiased", "fid": "2048", "kid": "2048", "precision": "2048",
                             "recall": "2048", "f_score": "2048"}


@pytest.mark.slow
def test_reference_features_are_cached_and_checked(small_inception, random_inception_weights, tmp_path,
                                                   monkeypatch):
    from jemeval.evaluation.fidelity import extractors

    x, ref, cache = _images(8, 0), _images(9, 1), tmp_path / "ref.npz"
    first = fidelity(x, ref, inception_weights=random_inception_weights, metrics="fid,kid", ref_cache=cache,
                     kid_subset_size=6)
    assert cache.exists() and first.provenance["settings"]["ref_cache"]["written"]
    seen = []
    real = extractors._features
    monkeypatch.setattr(extractors, "_features", lambda net, images, *a: (seen.append(len(images)),
                                                                          real(net, images, *a))[1])
    again = fidelity(x, ref, inception_weights=random_inception_weights, metrics="fid,kid", ref_cache=cache,
                     kid_subset_size=6)
    assert seen == [8]  # the samples only: the 9 reference images came from the file
    assert [r["value"] for r in again.records] == [r["value"] for r in first.records]
    assert again.provenance["settings"]["ref_cache"]["used"] == ["inception-v3-compat"]
    with np.load(cache, allow_pickle=False) as data:  # plain arrays and a JSON string
        assert set(data.files) == {"meta", "inception-v3-compat/2048"}
    with pytest.raises(UsageError, match="holds the features of other reference images"):
        fidelity(x, _images(9, 2), inception_weights=random_inception_weights, metrics="fid", ref_cache=cache)
    other = tmp_path / "other.pth"
    torch.save({k: v + 0 for k, v in torch.load(random_inception_weights, weights_only=True).items()}, other)
    other.write_bytes(other.read_bytes())  # new bytes, new sha256
    with pytest.raises(UsageError, match="holds inception-v3-compat features of other weights"):
        fidelity(x, ref, inception_weights=other, metrics="fid", ref_cache=cache)
    (tmp_path / "junk.npz").write_bytes(b"junk")
    with pytest.raises(UsageError, match="is not a reference-features file written by jemeval"):
        fidelity(x, ref, inception_weights=random_inception_weights, metrics="fid", ref_cache=tmp_path / "junk.npz")


def test_vgg16_weights_are_verified_and_handed_over_in_memory(no_download, tmp_path, monkeypatch):
    """precision/recall run on VGG16; its weights file goes through the same check as Inception's."""
    monkeypatch.delenv("JEMEVAL_VGG16_WEIGHTS", raising=False)
    x = _images(6, 0)
    with pytest.raises(UsageError, match="precision/recall .*need torch-fidelity's VGG16 weights.*give it as "
                                         "vgg16_weights") as info:
        fidelity(x, x, metrics="precision,recall")
    assert info.value.param == "vgg16_weights"
    stand_in = tmp_path / "vgg.pth"
    torch.save({"features.0.weight": torch.randn(64, 3, 3, 3), "classifier.6.weight": torch.randn(1000, 4096)},
               stand_in)
    with pytest.raises(CheckpointError, match=r"could not use the VGG16 weights .*vgg\.pth.*Missing key"):
        fidelity(x, x, metrics="recall", vgg16_weights=stand_in)
    _stand_in_weights(tmp_path / "inception.pth")  # Inception's tensors are not VGG16's
    with pytest.raises(CheckpointError, match="not torch-fidelity's VGG16"):
        fidelity(x, x, metrics="precision", vgg16_weights=tmp_path / "inception.pth")
    with pytest.raises(UsageError, match="loads its weights as code"):
        fidelity(x, x, metrics="fid", feature_extractor="clip-vit-b-32")
    r = CliRunner().invoke(cli, ["fidelity", "--samples", str(tmp_path / "s.npz"), "--metrics", "precision",
                                 "--ref-cache", str(tmp_path / "c.txt")])
    assert r.exit_code == 2 and "--ref-cache must be a .npz file" in r.output
