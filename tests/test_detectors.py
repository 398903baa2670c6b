"""Fitted OOD detectors (issue 14): parity with pytorch-ood's own detectors and metrics, one forward per
batch, the fit cache, the detector contract for plugins (written from docs/plugins.md only), and the
penultimate features every architecture gives."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from pytorch_ood import detector as pod
from pytorch_ood.metrics import OODMetrics
from torch.utils.data import DataLoader

import jemeval
from jemeval import testing
from jemeval.builtins import detectors, scores
from jemeval.caches.detectors import cache_dir
from jemeval.errors import UsageError
from jemeval.evaluation.batching import resolve_scores, run_batches
from jemeval.evaluation.ood.evaluate import evaluate_ood


@pytest.fixture(scope="module")
def fit_loader():
    """The images jemeval fits on for the classifier fixture (its checkpoint records no held-out split):
    the whole digits train split, in the batches pytorch-ood's fit reads them."""
    return DataLoader(jemeval.load_dataset("digits", "train"), batch_size=256)


@pytest.fixture(scope="module")
def jem_scores(clf):
    """jemeval's per-example scores on digits test (ID) and uniform noise, every built-in detector."""
    result = evaluate_ood(clf, "uniform", scores=["mahalanobis", "knn", "vim", "react", "dice", "odin", "energy",
                                                  "energy:T=2", "entropy", "gradnorm-huang", "ash:variant=ash-p"],
                          n=120, seed=0, progress=False)
    return result


def _inputs(result):
    """The ID and OOD images the scores of ``result`` were computed on (same subsets, same order)."""
    ds_id = jemeval.data.subsample(jemeval.load_dataset("digits", "test"), 120, 0)
    ds_ood = jemeval.data.subsample(jemeval.load_dataset("uniform", "test", input_shape=(1, 8, 8), n=120), 120, 0)
    return ds_id.x, ds_ood.x


def _theirs(detector, x):
    return -detector.predict(x).detach().double().numpy()  # pytorch-ood gives outlier scores


def _reference_detectors(clf, fit_loader):
    head = clf.classifier()
    w, b = head.weight.detach(), head.bias.detach()
    return {
        "mahalanobis": pod.Mahalanobis(clf.features).fit(fit_loader),
        "knn": pod.KNN(clf.features, k=50).fit(fit_loader),
        "vim": pod.ViM(clf.features, d=w.shape[1] // 2, w=w, b=b).fit(fit_loader),
        "react": pod.ReAct(clf.features, head, percentile=0.9).fit(fit_loader),
        "dice": pod.DICE(clf.features, w, b, p=0.9).fit(fit_loader),
        # eps in pixel units: our inputs are pixels scaled by 2 (std 0.5), which norm_std tells pytorch-ood
        "odin": pod.ODIN(clf, eps=0.0014, temperature=1000.0, norm_std=[0.5]),
        "energy": pod.EnergyBased(clf),
        "energy:T=2": pod.EnergyBased(clf, t=2.0),
        "entropy": pod.Entropy(clf),
        "gradnorm-huang": pod.GradNorm(clf, param_filter=lambda name: name == "net.head.weight"),
        "ash:variant=ash-p": pod.ASH(lambda x: clf.features(x)[:, :, None, None], lambda h: head(h.flatten(1)),
                                     variant="ash-p", percentile=0.90),
    }


def test_per_example_scores_equal_pytorch_oods_own_detectors(clf, fit_loader, jem_scores):
    """Mahalanobis, KNN, ViM, ReAct, DICE fitted by pytorch-ood on the same train images through its own
    DataLoader path, and ODIN, energy, entropy, Huang's GradNorm, ASH run by pytorch-ood on the same model:
    jemeval's scores are theirs with the sign flipped."""
    x_id, x_ood = _inputs(jem_scores)
    scored = jem_scores.extra["scores"]
    with torch.no_grad():
        references = _reference_detectors(clf, fit_loader)
    for label, reference in references.items():
        with torch.no_grad() if label not in ("odin", "gradnorm-huang") else torch.enable_grad():
            theirs_id, theirs_ood = _theirs(reference, x_id), _theirs(reference, x_ood)
        np.testing.assert_allclose(scored.id_scores[label], theirs_id, rtol=2e-4, atol=1e-5, err_msg=label)
        np.testing.assert_allclose(scored.ood_scores["uniform"][label], theirs_ood, rtol=2e-4, atol=1e-5,
                                   err_msg=label)


def test_metrics_equal_pytorch_oods_ood_metrics(jem_scores):
    """AUROC and AUPR-In/Out equal OODMetrics given outlier scores (-score) with OOD positive; FPR95
    (the fraction of OOD accepted at 95% of ID kept) is its FPR95TPR with ID as the 'positive' class."""
    scored = jem_scores.extra["scores"]
    for record in jem_scores.records:
        a, o = scored.id_scores[record["score"]], scored.ood_scores["uniform"][record["score"]]
        s = torch.from_numpy(np.r_[a, o])
        ood_positive = OODMetrics()
        ood_positive.update(-s, torch.from_numpy(np.r_[np.zeros(len(a)), -np.ones(len(o))]).long())
        theirs = ood_positive.compute()
        id_positive = OODMetrics()
        id_positive.update(s, torch.from_numpy(np.r_[-np.ones(len(a)), np.zeros(len(o))]).long())
        assert record["auroc"] == pytest.approx(theirs["AUROC"], abs=1e-12), record
        assert record["aupr_in"] == pytest.approx(theirs["AUPR-IN"], abs=1e-12), record
        assert record["aupr_out"] == pytest.approx(theirs["AUPR-OUT"], abs=1e-12), record
        assert record["fpr95"] == pytest.approx(id_positive.compute()["FPR95TPR"], abs=1e-12), record


def test_every_option_a_score_ran_with_is_recorded_defaults_included(jem_scores):
    """Issue 27: the defaults (OpenOOD's ASH 0.90 for CIFAR, pytorch-ood's k) are in the result, not
    only what the user typed, so a record says what was computed."""
    recorded = jem_scores.provenance["settings"]["score_options"]
    assert recorded["ash:variant=ash-p"] == {"variant": "ash-p", "percentile": 0.90}
    assert recorded["knn"] == {"k": 50} and recorded["energy:T=2"] == {"T": 2.0} and recorded["energy"] == {"T": 1.0}
    assert json.loads(json.dumps(recorded)) == recorded  # written with the result as it is


def test_grids_are_pytorch_oods_hyperparameter_spaces():
    assert detectors.KNN.grid == pod.KNN.hyperparameter_space
    assert detectors.ViM.grid == pod.ViM.hyperparameter_space
    assert detectors.ReAct.grid == pod.ReAct.hyperparameter_space
    assert detectors.DICE.grid == pod.DICE.hyperparameter_space
    assert scores.ash.grid == pod.ASH.hyperparameter_space
    assert scores.odin.grid == {"T": pod.ODIN.hyperparameter_space["temperature"],
                                "eps": pod.ODIN.hyperparameter_space["eps"]}


def test_one_forward_per_batch_for_every_logits_and_features_score(clf):
    """Features and logits come from one pass: the first layer runs once per batch for logpx, maxprob,
    energy, entropy and four fitted detectors together."""
    train = jemeval.load_dataset("digits", "train")
    fitted = resolve_scores(["logpx", "maxprob", "energy", "entropy", "mahalanobis", "knn", "vim", "react"])
    for s in fitted:
        if s.detector:
            s.fn.fit(clf, train)
    calls = []
    handle = clf.net.features[0].register_forward_hook(lambda *a: calls.append(1))
    try:
        out = run_batches(clf, jemeval.load_dataset("digits", "test"), scores=fitted, batch_size=100, progress=False)
    finally:
        handle.remove()
    assert len(calls) == 5  # 450 images, 5 batches
    assert set(out.scores) == {s.label for s in fitted}


def test_fitted_state_is_cached_and_reused(clf, monkeypatch, tmp_path):
    monkeypatch.setenv("JEMEVAL_CACHE_DIR", str(tmp_path))
    first = evaluate_ood(clf, "uniform", scores=["knn:k=7", "vim", "logpx"], n=60, progress=False)
    second = evaluate_ood(clf, "uniform", scores=["knn:k=7", "vim", "logpx"], n=60, progress=False)
    fit1, fit2 = (r.provenance["settings"]["detectors"] for r in (first, second))
    assert {k: v["fit"] for k, v in fit1.items()} == {"knn:k=7": "fitted", "vim": "fitted"}
    assert {k: v["fit"] for k, v in fit2.items()} == {"knn:k=7": "cached", "vim": "cached"}
    assert first.records == second.records
    files = sorted(cache_dir().glob("*.pt"))
    assert [f.name.split("-")[0] for f in files] == ["knn", "vim"] and str(tmp_path) in str(files[0])
    saved = torch.load(files[0], weights_only=True)  # tensors and plain values only
    assert saved["state"]["k"] == 7 and saved["state"]["features"].shape == (1347, 64)
    # other options, other weights or other fit data are other entries
    other = evaluate_ood(clf, "uniform", scores=["knn:k=8"], n=60, fit_n=500, progress=False)
    assert other.provenance["settings"]["detectors"]["knn:k=8"]["fit"] == "fitted"
    changed = jemeval.load_model(clf.metadata["checkpoint"]["path"])
    with torch.no_grad():
        changed.net.head.bias.add_(0.01)
    again = evaluate_ood(changed, "uniform", scores=["knn:k=7"], n=60, progress=False)
    assert again.provenance["settings"]["detectors"]["knn:k=7"]["fit"] == "fitted"


def test_a_broken_cache_file_is_refitted_with_a_warning(clf, monkeypatch, tmp_path):
    monkeypatch.setenv("JEMEVAL_CACHE_DIR", str(tmp_path))
    evaluate_ood(clf, "uniform", scores=["react"], n=40, progress=False)
    (path,) = cache_dir().glob("react-*.pt")
    path.write_bytes(b"not a torch file")
    with pytest.warns(UserWarning, match="could not be read"):
        result = evaluate_ood(clf, "uniform", scores=["react"], n=40, progress=False)
    assert result.provenance["settings"]["detectors"]["react"]["fit"] == "fitted"
    torch.load(path, weights_only=True)  # rewritten whole
    evaluate_ood(clf, "uniform", scores=["react"], n=40, progress=False, cache=False)
    assert len(list(cache_dir().glob("*.pt"))) == 1


def test_detector_contract_checks_pass_for_the_builtins():
    for name in ("mahalanobis", "knn", "vim", "react", "dice"):
        testing.check_detector(name)
    for name in ("entropy", "odin", "gradnorm-huang", "ash"):
        testing.check_score(name)


def test_each_use_of_a_detector_has_its_own_instance(clf):
    result = evaluate_ood(clf, "uniform", scores=["knn:k=1", "knn:k=40"], n=50, progress=False)
    scored = result.extra["scores"]
    assert not np.allclose(scored.id_scores["knn:k=1"], scored.id_scores["knn:k=40"])
    assert (scored.id_scores["knn:k=1"] >= scored.id_scores["knn:k=40"]).all()  # nearer neighbour, smaller distance


@pytest.mark.parametrize("spec, message", [
    ("knn:k=0", "k must be a whole number >= 1 (e.g. knn:k=50), got 0"),
    ("knn:k=2000", "needs at least 2000 fit images (the distance to the k-th nearest fit image), got 1347"),
    ("knn:kk=3", "has no option 'kk' (did you mean 'k'?)"),
    ("vim:d=64", "d must be a whole number in 1..63"),
    ("react:percentile=90", "use 0.9 for 90%"),
    ("odin:eps=-1", "eps must be a finite number >= 0"),
    ("ash:variant=ash-x", "unknown variant 'ash-x'"),
])
@pytest.mark.any_device
def test_bad_detector_options_are_one_line(digits_classifier_ckpt, spec, message):
    from click.testing import CliRunner

    from jemeval.cli import cli

    r = CliRunner().invoke(cli, ["ood", "--model", str(digits_classifier_ckpt), "--ood", "uniform", "--score", spec,
                                 "--n", "20"])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output


def test_mahalanobis_needs_labelled_fit_data(clf):
    with pytest.raises(UsageError, match="needs labelled fit data") as info:
        evaluate_ood(clf, "gaussian", scores=["mahalanobis"], fit_on="uniform", n=20, progress=False)
    assert info.value.param == "fit_on"


# -- a third-party detector, written from docs/plugins.md alone --------------------------------------
class CentroidDetector:
    """Distance of the features to their training mean, as docs/plugins.md's detector example."""

    def __init__(self):
        self.center = None

    def fit(self, model, dataset, *, shrink: float = 0.0):
        features = []
        with torch.no_grad():
            for x, _ in DataLoader(dataset, batch_size=128):
                features.append(model.features(x))
        self.center = torch.cat(features).mean(0) * (1 - shrink)

    def score(self, model, x):
        with torch.no_grad():
            return -(model.features(x) - self.center).norm(dim=1)

    def state_dict(self):
        return {"center": self.center}

    def load_state_dict(self, state):
        self.center = state["center"]


class NoCacheDetector(CentroidDetector):
    """The minimal detector: fit and score only (no state_dict), fitted every run."""

    state_dict = None
    load_state_dict = None


class ThirdParty:
    @jemeval.hookimpl
    def register_scores(self, register):
        register("centroid", CentroidDetector)
        register("centroid-nocache", NoCacheDetector())


def test_a_third_party_detector_plugin_fits_scores_and_is_cached(clf, monkeypatch, tmp_path):
    monkeypatch.setenv("JEMEVAL_CACHE_DIR", str(tmp_path))
    with testing.registered_plugin(ThirdParty(), name="third-party-detectors"):
        testing.check_detector("centroid")
        testing.check_detector("centroid-nocache")
        first = evaluate_ood(clf, "uniform", scores=["centroid:shrink=0.5", "centroid-nocache"], n=50,
                             progress=False)
        second = evaluate_ood(clf, "uniform", scores=["centroid:shrink=0.5", "centroid-nocache"], n=50,
                              progress=False)
        with pytest.raises(UsageError, match="has no option 'shrnk'"):
            evaluate_ood(clf, "uniform", scores=["centroid:shrnk=1"], progress=False)
    fits = [{k: v["fit"] for k, v in r.provenance["settings"]["detectors"].items()} for r in (first, second)]
    assert fits == [{"centroid:shrink=0.5": "fitted", "centroid-nocache": "fitted"},
                    {"centroid:shrink=0.5": "cached", "centroid-nocache": "fitted"}]
    assert first.records == second.records
    # the score is what the plugin computes: minus the distance to the train features' mean, halved
    train = jemeval.load_dataset("digits", "train")
    test = jemeval.data.subsample(jemeval.load_dataset("digits", "test"), 50, 0)
    with torch.no_grad():
        center = clf.features(train.x).mean(0) * 0.5
        expected = -(clf.features(test.x) - center).norm(dim=1).numpy()
    np.testing.assert_allclose(first.extra["scores"].id_scores["centroid:shrink=0.5"], expected, rtol=1e-5)


def test_the_docs_detector_example_runs_as_written(clf, monkeypatch, tmp_path):
    """docs/plugins.md's detector example, executed verbatim: it registers, fits, caches and scores."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()
    block = next(b.split("```", 1)[0] for b in text.split("```python\n") if "class Centroid" in b)
    namespace: dict = {}
    exec(compile(block, "docs/plugins.md", "exec"), namespace)  # noqa: S102 (our own docs)
    plugin = type("DocsPlugin", (), {"register_scores": staticmethod(namespace["register_scores"])})
    monkeypatch.setenv("JEMEVAL_CACHE_DIR", str(tmp_path))
    with testing.registered_plugin(plugin, name="docs-detector"):
        testing.check_detector("centroid")
        runs = [evaluate_ood(clf, "uniform", scores=["centroid"], n=40, progress=False) for _ in range(2)]
    assert [r.provenance["settings"]["detectors"]["centroid"]["fit"] for r in runs] == ["fitted", "cached"]
    train = jemeval.load_dataset("digits", "train")
    test = jemeval.data.subsample(jemeval.load_dataset("digits", "test"), 40, 0)
    with torch.no_grad():
        center = clf.features(train.x).mean(0)
        expected = torch.nn.functional.cosine_similarity(clf.features(test.x), center[None], dim=1).numpy()
    np.testing.assert_allclose(runs[0].extra["scores"].id_scores["centroid"], expected, rtol=1e-5, atol=1e-6)


def test_a_state_dict_that_is_not_plain_data_is_not_cached(clf, monkeypatch, tmp_path):
    class Pickly(CentroidDetector):
        def state_dict(self):
            return {"center": self.center, "fn": np.ones(3)}  # numpy: weights_only cannot read it

    class Plugin:
        @jemeval.hookimpl
        def register_scores(self, register):
            register("pickly", Pickly)

    monkeypatch.setenv("JEMEVAL_CACHE_DIR", str(tmp_path))
    with testing.registered_plugin(Plugin(), name="pickly-plugin"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = evaluate_ood(clf, "uniform", scores=["pickly"], n=30, progress=False)
    assert any("not tensors and plain values" in str(w.message) for w in caught)
    info = dict(result.provenance["settings"]["detectors"]["pickly"])
    assert isinstance(info.pop("state_bytes"), int)
    assert info == {"options": {}, "fit": "fitted", "cache": None}
    assert not list(cache_dir().glob("*.pt"))


# -- features -------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch, shape, dim", [("cnn:width=8", (1, 8, 8), 32), ("wrn:depth=10,widen=1", (3, 16, 16), 64),
                                              ("timm:resnet18", (3, 32, 32), 512)])
def test_features_and_the_linear_head_give_the_logits(arch, shape, dim):
    model = jemeval.create_model(arch, 10, shape).eval()
    x = torch.rand(3, *shape) * 2 - 1
    with torch.no_grad():
        features, logits = model.features_and_logits(x)
        assert features.shape == (3, dim)
        torch.testing.assert_close(logits, model.logits(x))
        torch.testing.assert_close(model.classifier()(features), logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.features(x), features)


def test_igebm_features_are_each_class_pooled_head_input():
    igebm = pytest.importorskip("jemeval_igebm.model")
    if not hasattr(igebm.IGEBM, "forward_features"):  # the shared venv's non-editable copy predates this tree
        pytest.skip("the installed jemeval-igebm predates features; test with plugins/jemeval-igebm/src on the path")
    model = jemeval.create_model("igebm:width=8", 10, (1, 8, 8)).eval()
    x = torch.rand(4, 1, 8, 8) * 2 - 1
    with torch.no_grad():
        features, logits = model.features_and_logits(x)
        assert features.shape == (4, 10 * 16)  # K classes x D = 2 * width (the last stage)
        torch.testing.assert_close(logits, model.logits(x))
        torch.testing.assert_close(model.classifier()(features), logits, rtol=1e-5, atol=1e-5)
        # class k's block is the head input of (x, k): its energy is the head applied to it
        e3 = model.net.energy(x, torch.full((4,), 3))
        torch.testing.assert_close(-model.net.energy_head(features.view(4, 10, -1)[:, 3]).squeeze(1), -e3)


def test_a_network_without_features_names_its_architecture():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    model = jemeval.EnergyModel(net, num_classes=10, input_shape=(1, 8, 8), arch="example-mlp")
    with pytest.raises(UsageError, match="architecture 'example-mlp' gives no penultimate features") as info:
        model.features(torch.zeros(1, 1, 8, 8))
    assert "forward_features" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(UsageError, match="example-mlp"):
        evaluate_ood(model, "uniform", id="digits", scores=["knn"], n=10, progress=False)
