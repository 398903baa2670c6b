"""The OOD protocol of issue 14: near/far groups with per-set and mean records, the sets that come as
files, and hyperparameters tuned on an OOD validation set that is never a test set."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

import jemeval
from jemeval.cli import cli
from jemeval.errors import DatasetNotFoundError, UsageError
from jemeval.evaluation.metrics import auroc
from jemeval.evaluation.ood.evaluate import evaluate_ood
from jemeval.evaluation.ood.sets import expand_groups


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_groups_per_in_distribution_set():
    assert expand_groups(["near", "far"], "cifar10") == [
        ("cifar100", "near"), ("tin", "near"), ("mnist", "far"), ("svhn", "far"), ("textures", "far"),
        ("places365", "far")]  # OpenOOD v1.5
    assert [s for s, _ in expand_groups(["near"], "cifar100")] == ["cifar10", "tin"]
    assert expand_groups(["near", "far"], "digits") == [
        ("interp", "near"), ("rotate", "near"), ("uniform", "far"), ("constant", "far"), ("gaussian", "far")]
    # a class subset as ID: its held-out classes are the first near set
    assert expand_groups(["near"], "digits[0-4]", 10)[0] == ("digits[5,6,7,8,9]", "near")
    # a set named on its own and in a group is listed once, with its group
    assert expand_groups(["uniform", "far"], "digits") == [("uniform", "far"), ("constant", "far"),
                                                           ("gaussian", "far")]
    with pytest.raises(UsageError, match="defined for the in-distribution sets cifar10, cifar100, digits"):
        expand_groups(["near"], "svhn")


def test_group_records_and_means(clf):
    result = evaluate_ood(clf, "near,far", scores="logpx,knn", n=60,
                          progress=False)
    rows = [(r["score"], r["ood"], r["group"]) for r in result.records]
    assert rows[:7] == [("logpx", "interp:digits", "near"), ("logpx", "rotate:digits", "near"),
                        ("logpx", "near", "near"), ("logpx", "uniform", "far"), ("logpx", "constant", "far"),
                        ("logpx", "gaussian", "far"), ("logpx", "far", "far")]
    assert len(rows) == 14 and rows[7:] == [("knn", o, g) for _, o, g in rows[:7]]
    for r in result.records:
        assert list(r)[:4] == ["score", "id", "ood", "group"]
    by = {(r["score"], r["ood"]): r for r in result.records}
    for score in ("logpx", "knn"):
        for group, sets in (("near", ["interp:digits", "rotate:digits"]), ("far", ["uniform", "constant", "gaussian"])):
            mean = by[(score, group)]
            for metric in ("auroc", "aupr_in", "aupr_out", "fpr95"):
                assert mean[metric] == pytest.approx(np.mean([by[(score, s)][metric] for s in sets]))
            assert mean["n_ood"] == 60 * len(sets) and mean["n_id"] == 60
    # per-set records are the plain metrics of the saved scores
    scored = result.extra["scores"]
    assert by[("knn", "rotate:digits")]["auroc"] == pytest.approx(
        auroc(scored.id_scores["knn"], scored.ood_scores["rotate:digits"]["knn"]))
    assert result.provenance["settings"]["groups"] == {"interp:digits": "near", "rotate:digits": "near",
                                                       "uniform": "far", "constant": "far", "gaussian": "far"}


def test_groups_mix_with_named_sets_and_bootstrap(clf):
    result = evaluate_ood(clf, ["flip", "far"], id="digits", scores="maxprob", n=40, bootstrap=5, progress=False)
    assert [(r["ood"], r["group"]) for r in result.records] == [
        ("flip:digits", None), ("uniform", "far"), ("constant", "far"), ("gaussian", "far"), ("far", "far")]
    assert result.records[-1]["auroc_lo"] is None and result.records[1]["auroc_lo"] is not None


def test_digits_class_subset_near_group(digits_classifier_ckpt):
    result = evaluate_ood(digits_classifier_ckpt, "near", id="digits[0-4]", scores="maxprob", n=40, progress=False)
    assert [r["ood"] for r in result.records] == ["digits[5,6,7,8,9]", "interp:digits[0-4]",
                                                  "rotate:digits[0-4]", "near"]


def test_rotate_and_flip_are_the_base_images_transformed():
    base = jemeval.load_dataset("digits", "test")
    rot, flip = jemeval.load_dataset("rotate:digits", "test"), jemeval.load_dataset("flip:digits", "test")
    torch.testing.assert_close(rot.x, torch.rot90(base.x, 1, dims=(2, 3)))
    torch.testing.assert_close(flip.x, base.x.flip(3))
    assert (rot.y == base.y).all()
    with pytest.raises(UsageError, match="multiple of 4"):
        jemeval.load_dataset("rotate:digits,k=4")


def test_file_sets_read_image_folders_and_name_what_is_missing(tmp_path):
    with pytest.raises(DatasetNotFoundError) as info:
        jemeval.load_dataset("tin", root=tmp_path, input_shape=(3, 32, 32))
    message = str(info.value)
    assert str(tmp_path / "tin") in message and "does not exist" in message and "\n" not in message
    (tmp_path / "textures" / "banded").mkdir(parents=True)
    (tmp_path / "textures" / "banded" / "notes.txt").write_text("not an image")
    with pytest.raises(DatasetNotFoundError, match="has no image files"):
        jemeval.load_dataset("textures", root=tmp_path, input_shape=(3, 32, 32))
    rng = np.random.default_rng(0)
    for i, size in enumerate([(40, 60), (64, 64), (20, 30)]):
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(tmp_path / "textures" / "banded" /
                                                                               f"{i}.png")
    ds = jemeval.load_dataset("textures", root=tmp_path, input_shape=(3, 32, 32))
    assert len(ds) == 3 and ds.input_shape == (3, 32, 32)
    x, y = ds[0]
    assert x.shape == (3, 32, 32) and y == -1 and -1 <= float(x.min()) and float(x.max()) <= 1
    gray = jemeval.load_dataset("textures", root=tmp_path, input_shape=(1, 8, 8))
    assert gray[2][0].shape == (1, 8, 8)


@pytest.mark.any_device
def test_cli_missing_file_set_is_one_line(digits_classifier_ckpt, tmp_path):
    r = run("ood", "--model", digits_classifier_ckpt, "--ood", "places365", "--data-root", tmp_path, "--n", 10)
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.strip().splitlines() == [r.output.strip()] and "places365" in r.output


# -- tuning -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tuned(clf):
    return evaluate_ood(clf, "near", scores=["knn", "odin:T=1000", "logpx", "vim"], tune_on="flip:digits", n=80,
                        progress=False)


def test_tuning_picks_the_best_candidate_and_records_it(tuned):
    tuning = tuned.provenance["settings"]["tuning"]
    assert tuning["tune_on"] == "flip:digits" and tuning["metric"] == "auroc"
    assert set(tuning["scores"]) == {"knn", "odin:T=1000", "vim"}  # logpx has nothing to tune
    knn = tuning["scores"]["knn"]
    assert [c["options"]["k"] for c in knn["candidates"]] == [50, 100, 200, 500, 1000]
    best = max(knn["candidates"], key=lambda c: c["auroc"])
    assert knn["chosen"] == best["options"]
    # the user's T stays; only eps is searched
    assert [c["options"] for c in tuning["scores"]["odin:T=1000"]["candidates"]] == [
        {"T": 1000, "eps": 0.0014}, {"T": 1000, "eps": 0.0028}]
    # ViM's grid values at or above the 64 feature dimensions are skipped, and say why
    vim = tuning["scores"]["vim"]["candidates"]
    assert [c["options"]["d"] for c in vim if "auroc" in c] == [16, 32]
    assert all("below the feature dimension 64" in c["skipped"] for c in vim if "skipped" in c)
    # the held-out in-distribution images (no split recorded in this checkpoint: 10% of train, seeded)
    assert tuning["n_id"] == 134 and tuning["n_ood"] == 80 and tuning["split"] == "train"
    assert tuned.provenance["settings"]["fit_data"]["n"] == 1347 - 134
    assert any(note.startswith("Hyperparameters tuned on flip:digits") and "knn k=" in note for note in tuned.notes)


def test_tuned_scores_are_the_chosen_detector_fitted_on_the_images_left_after_tuning(clf, tuned):
    """Checked against pytorch-ood's KNN with the chosen k, fitted on the train images less the seeded
    134 the tuning used (data.split_indices, seed 0), on the same test images."""
    from pytorch_ood.detector import KNN

    from jemeval.data import split_indices, subsample

    k = tuned.provenance["settings"]["tuning"]["scores"]["knn"]["chosen"]["k"]
    train = jemeval.load_dataset("digits", "train")
    fit_idx = split_indices(len(train), 134, 0)[0]
    test = subsample(jemeval.load_dataset("digits", "test"), 80, 0)
    with torch.no_grad():
        reference = KNN(None, k=k).fit_features(clf.features(train.x[fit_idx]), train.y[fit_idx])
        expected = -reference.predict_features(clf.features(test.x)).numpy()
    np.testing.assert_allclose(tuned.extra["scores"].id_scores["knn"], expected, rtol=1e-5)
    again = evaluate_ood(clf, "near", scores=["knn"], tune_on="flip:digits", n=80, progress=False)
    assert again.provenance["settings"]["detectors"]["knn"]["fit"] == "cached"
    np.testing.assert_array_equal(again.extra["scores"].id_scores["knn"], tuned.extra["scores"].id_scores["knn"])
    plain = evaluate_ood(clf, "near", scores=[f"knn:k={k}"], n=80, progress=False)
    assert plain.provenance["settings"]["fit_data"]["n"] == 1347  # without tuning: every train image


@pytest.mark.any_device
def test_tuning_on_a_test_set_or_the_id_set_is_refused(clf):
    for tune_on, other in (("rotate:digits", "rotate:digits"), ("uniform:seed=5", "uniform"), ("digits", "digits")):
        with pytest.raises(UsageError, match=f"is the dataset '{other}' that is also evaluated") as info:
            evaluate_ood(clf, "near,far", scores="knn", tune_on=tune_on, progress=False)
        assert info.value.param == "tune_on"
    r = run("ood", "--model", clf.metadata["checkpoint"]["path"], "--ood", "far", "--tune-on", "gaussian")
    assert r.exit_code == 2 and "--tune-on 'gaussian' is the dataset 'gaussian'" in r.output


def test_cli_near_far_json(digits_classifier_ckpt):
    r = run("ood", "--model", digits_classifier_ckpt, "--ood", "near,far", "--score", "maxprob,mahalanobis",
            "--n", 40, "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [x["ood"] for x in data["records"]][:7] == ["interp:digits", "rotate:digits", "near", "uniform",
                                                       "constant", "gaussian", "far"]
    assert data["provenance"]["settings"]["detectors"]["mahalanobis"]["fit"] in ("fitted", "cached")
