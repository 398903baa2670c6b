"""Nothing silent, round 3 (issue 34), the detectors' items, each rebuilt from the case the audit of 1055cef ran.

* 12: options out of range (``gen:gamma=-1``, ``openmax:tailsize=0`` / ``-5``, ``pnml:eps=-1``) ran with
  default-like AUROCs, and ``--fit-n 1`` with ``gmm,rmd,openmax`` printed AUROCs. Every option of every built-in
  score has a declared range checked by the one score parser; each fitted detector states its fewest fit images.
* 16: ``vra`` cited OpenOOD v1.5 but clipped each feature at its own percentiles (pytorch-ood's form); the
  default is now OpenOOD's one global pair of thresholds, checked against OpenOOD's VRAPostprocessor formula
  computed here by hand; ``per_feature=True`` is pytorch-ood's form, checked against its class.
* 21: ``gen:M=0`` and ``nnguide:k=0`` blamed the checkpoint; the option is refused instead.
* 24: ``fidelity --features`` with huge features ended in "unexpected LinAlgError"; one line now, and the
  Frechet distance of huge but finite features is computed (scaled), equal to torch-fidelity's and scipy's.
* 26: ``--score odin:T=1000,eps=0.0014,maxprob`` (docs/evaluation.md's form) was split at every comma.
* 28: ``jemeval.testing.check_score('margin:prob=True')`` said "unknown score" though the CLI accepts it.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch
from pytorch_ood import detector as pod
from test_bad_inputs import assert_one_line_refusal, runner, snapshot
from torch.utils.data import DataLoader

import jemeval
from jemeval import testing
from jemeval.cli import cli
from jemeval.components.adapters import new_detector
from jemeval.data import ArrayDataset
from jemeval.errors import JemevalError, UsageError
from jemeval.evaluation.batching import option_target, resolve_scores, run_batches
from jemeval.evaluation.fidelity.evaluate import frechet_distance_from_features
from jemeval.evaluation.ood.evaluate import evaluate_ood
from jemeval.formats.native import save_checkpoint
from jemeval.plugins import get_registry
from jemeval.registry import option_defaults, split_specs

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _ood(*args: str):
    return runner().invoke(cli, ["ood", "--model", "m.pt", "--ood", "uniform", "--n", "20", "--device", "cpu",
                                 "--no-cache", *args])


# -- item 12: option ranges ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, expected", [
    ("gen:gamma=-1", "score 'gen': gamma must be a finite number > 0 (e.g. gen:gamma=0.1), got -1"),
    ("openmax:tailsize=0", "score 'openmax': tailsize must be a whole number >= 1 (e.g. openmax:tailsize=25), got 0"),
    ("openmax:tailsize=-5", "score 'openmax': tailsize must be a whole number >= 1 (e.g. openmax:tailsize=25), got -5"),
    ("pnml:eps=-1", "score 'pnml': eps must be a finite number in (0, 0.5) (e.g. pnml:eps=1e-12), got -1"),
])
def test_an_option_out_of_range_is_refused_before_any_work(home, spec, expected):
    before = snapshot(home)
    result = _ood("--score", spec, "--fit-n", "200")
    assert_one_line_refusal(result, expected)
    assert "fit digits" not in result.stderr and "ID digits" not in result.stderr  # no pass over any image began
    assert snapshot(home) == before


def _builtin_scores() -> list[str]:
    return [c.name for c in get_registry().components("score") if c.plugin.startswith("jemeval.builtins.")]


def _outside(allowed) -> list:
    """Values just outside a declared range (and a wrong type)."""
    if allowed.kind == "choice":
        return ["no-such-choice"]
    if allowed.kind == "flag":
        return ["yes", 1]
    if allowed.kind == "custom":
        return ["not numbers"]
    bad: list = ["text", float("nan")]
    bad += [allowed.gt] if allowed.gt is not None else [allowed.ge - 1] if allowed.ge is not None else []
    bad += [allowed.lt] if allowed.lt is not None else [allowed.le + 1] if allowed.le is not None else []
    return bad + ([1.5] if allowed.kind == "whole" else [])


def test_every_option_of_every_builtin_score_has_a_range_that_the_parser_checks():
    """Declared once (beside the options), checked in one place (the parser): each option has a range, its
    default and every grid candidate lie inside, and a value just outside is one UsageError naming it."""
    names = _builtin_scores()
    assert len(names) >= 29
    checked = 0
    for name in names:
        (score,) = resolve_scores([name])
        target, skip = option_target(score.fn)
        defaults = option_defaults(target, skip=skip)
        ranges = score.fn.ranges
        assert set(ranges) == set(defaults), f"{name}: options {sorted(defaults)}, ranges {sorted(ranges)}"
        for key, allowed in ranges.items():
            assert allowed.contains(defaults[key]), (name, key, defaults[key])
            assert all(allowed.contains(v) for v in score.fn.grid.get(key, [])), (name, key)
            for value in _outside(allowed):
                text = f"{value:g}" if isinstance(value, float) else str(value)
                with pytest.raises(UsageError, match=rf"^score '{re.escape(name)}': .*{re.escape(key)}"):
                    resolve_scores([f"{name}:{key}={text}"])
                checked += 1
    assert checked >= 60


def test_vra_percentiles_must_be_ordered():
    """Equal percentiles clip every activation to one value: every input would get the same score."""
    with pytest.raises(UsageError, match=r"^score 'vra': lower_percentile \(0.5\) must be below upper_percentile "
                                         r"\(0.5\)$"):
        resolve_scores(["vra:lower_percentile=0.5,upper_percentile=0.5"])
    with pytest.raises(UsageError, match="lower_percentile \\(0.95\\) must be below upper_percentile \\(0.9\\)"):
        resolve_scores(["vra:lower_percentile=0.95"])  # against the default upper percentile


# -- item 12: the fewest fit images ------------------------------------------------------------------------
@pytest.mark.parametrize("score, count, message", [
    ("gmm", "65", "needs at least 65 fit images of each class (a full covariance of 64 features per class has "
                  "full rank only with 64 + 1 images of the class); class"),
    ("rmd", "65", "needs at least 65 labelled fit images (a covariance of 64 features around 1 class mean has full "
                  "rank only with 1 + 64 images), got 1"),
    ("openmax", "25", "needs at least 25 fit images of each class (a Weibull fit on each class's 25 largest "
                      "distances to its centre); class"),
])
def test_fit_n_1_is_refused_for_gmm_rmd_openmax(digits_classifier_ckpt, tmp_path, monkeypatch, score, count,
                                                 message):
    """The audit's case: `--fit-n 1` with gmm,rmd,openmax printed AUROCs (the classifier's features: D = 64)."""
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    result = runner().invoke(cli, ["ood", "--model", str(digits_classifier_ckpt), "--ood", "uniform", "--n", "20",
                                   "--score", score, "--fit-n", "1", "--device", "cpu", "--no-cache"])
    assert_one_line_refusal(result, f"Error: score {score!r} {message}")
    assert count in result.stderr and ("has 1: " in result.stderr or "got 1: " in result.stderr)
    assert "fit on more images (--fit-n, --fit-on)" in result.stderr
    assert "ID digits" not in result.stderr and snapshot(tmp_path) == before  # refused before the evaluation


def test_the_audits_three_scores_together_are_one_line(digits_classifier_ckpt, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner().invoke(cli, ["ood", "--model", str(digits_classifier_ckpt), "--ood", "uniform", "--n", "20",
                                   "--score", "gmm,rmd,openmax", "--fit-n", "1", "--device", "cpu", "--no-cache"])
    assert_one_line_refusal(result, "Error: score 'gmm' needs at least 65 fit images of each class")


#: the tiny model's D = 32 features, K = 3 classes: (score, (fewest images in all, fewest per class))
MINIMUMS = {"mahalanobis": (3 + 32, 0), "rmd": (3 + 32, 0), "gmm": (0, 32 + 1), "openmax": (0, 25), "knn": (50, 0),
            "nnguide": (100, 0), "vim": (32 // 2 + 2, 0), "pnml": (32, 0)}


def _fit_set(per_class: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.cat([torch.full((n,), c) for c, n in enumerate(per_class)])
    x = torch.rand((len(y), 1, 4, 4), generator=torch.Generator().manual_seed(len(y))) * 2 - 1
    return x, y


@pytest.mark.parametrize("name", sorted(MINIMUMS))
def test_each_detector_refuses_one_image_below_its_minimum_and_fits_at_it(name):
    """Fitted from Python (``fit``, as pytorch-ood's API is used), the check is the same as the CLI's."""
    model = testing.tiny_model()
    images, per_class = MINIMUMS[name]
    if per_class:
        short, enough = [per_class, per_class, per_class - 1], [per_class] * 3
        expected = f"needs at least {per_class} fit images of each class (.*); class 2 has {per_class - 1}: "
    else:
        short = [images // 3 + (c < images % 3) for c in range(3)]
        short[2] -= 1
        enough = [images // 3 + (c < images % 3) for c in range(3)]
        expected = f"needs at least {images} (labelled )?fit images (.*), got {images - 1}: "
    detector = new_detector(get_registry().get("score", name))
    with pytest.raises(UsageError, match=rf"^score '{name}' {expected}fit on more images \(fit_n, fit_on\)$"):
        detector.fit(model, ArrayDataset(*_fit_set(short), num_classes=3))
    detector.fit(model, ArrayDataset(*_fit_set(enough), num_classes=3))
    assert torch.isfinite(detector.score(model, _fit_set([4, 4, 4])[0])).all()


def test_she_needs_every_class_of_the_model():
    model = testing.tiny_model()
    detector = new_detector(get_registry().get("score", "she"))
    with pytest.raises(UsageError, match=r"^score 'she' needs at least 1 fit images of each of the model's 3 "
                                         r"classes \(.*\); class 2 has 0"):
        detector.fit(model, ArrayDataset(*_fit_set([5, 5]), num_classes=3))


# -- item 21: the option is refused, the checkpoint is not blamed ------------------------------------------------
@pytest.mark.parametrize("spec, expected", [
    ("gen:M=0", "score 'gen': M must be a whole number >= 1 or None (e.g. gen:M=100), got 0"),
    ("nnguide:k=0", "score 'nnguide': k must be a whole number >= 1 (e.g. nnguide:k=100), got 0"),
])
def test_a_zero_option_is_refused_not_blamed_on_the_checkpoint(home, spec, expected):
    result = _ood("--score", spec, "--fit-n", "200")
    assert_one_line_refusal(result, expected)
    assert "checkpoint" not in result.stderr and "non-finite" not in result.stderr


# -- item 16: VRA as OpenOOD computes it -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vra_case(clf):
    """The classifier, 500 digits training images to fit on, 200 test images to score."""
    train, test = jemeval.load_dataset("digits", "train"), jemeval.load_dataset("digits", "test")
    fit = ArrayDataset(train.x[:500], train.y[:500], num_classes=10, name="fit")
    return clf, fit, test.x[:200]


def _jemeval_scores(model, fit, x, spec):
    (score,) = resolve_scores([spec])
    score.fn.fit(model, fit, **score.options)
    data = ArrayDataset(x, torch.zeros(len(x), dtype=torch.long), num_classes=10, name="x")
    return run_batches(model, data, scores=[score], batch_size=64, progress=False, device="cpu").scores[spec]


def test_vra_default_is_openoods_global_percentiles(vra_case):
    """OpenOOD v1.5's VRAPostprocessor (configs/postprocessors/vra.yml: percentile_high 90, percentile_low 10),
    written out from its formula: the two thresholds are np.percentile of all activations of the fit images
    flattened together; a test feature is clipped to [low, high], then the score is logsumexp of fc(feature)."""
    model, fit, x = vra_case
    with torch.no_grad():
        activations = model.features(fit.x).numpy()
        features = model.features(x).numpy()
    low, high = np.percentile(activations.flatten(), 10), np.percentile(activations.flatten(), 90)
    head = model.classifier()
    logits = np.clip(features, low, high) @ head.weight.detach().numpy().T + head.bias.detach().numpy()
    openood = scipy.special.logsumexp(logits.astype(np.float64), axis=1)
    ours = _jemeval_scores(model, fit, x, "vra")
    np.testing.assert_allclose(ours, openood, rtol=1e-5, atol=1e-5)
    explicit = _jemeval_scores(model, fit, x, "vra:lower_percentile=0.1,upper_percentile=0.9,per_feature=False")
    np.testing.assert_allclose(explicit, ours, rtol=0, atol=0)


def test_vra_per_feature_is_pytorch_oods_and_differs(vra_case):
    model, fit, x = vra_case
    head = model.classifier()
    reference = pod.VRA(lambda v: model.features(v)[:, :, None, None], lambda h: head(h.flatten(1)),
                        lower_percentile=0.1, upper_percentile=0.9).fit(DataLoader(fit, batch_size=100))
    with torch.no_grad():
        theirs = -reference.predict(x).double().numpy()
    per_feature = _jemeval_scores(model, fit, x, "vra:per_feature=True")
    np.testing.assert_allclose(per_feature, theirs, rtol=1e-6, atol=1e-6)
    assert np.abs(per_feature - _jemeval_scores(model, fit, x, "vra")).max() > 0.05  # two different scores


def test_the_result_records_which_vra(clf):
    result = evaluate_ood(clf, "uniform", scores=["vra", "vra:per_feature=True"], n=30, fit_n=300, cache=False,
                          progress=False, device="cpu")
    options = result.provenance["settings"]["score_options"]
    assert options["vra"] == {"lower_percentile": 0.1, "upper_percentile": 0.9, "per_feature": False}
    assert options["vra:per_feature=True"]["per_feature"] is True
    assert {r["score"] for r in result.records} == {"vra", "vra:per_feature=True"}


# -- item 24: the Frechet distance of huge features ----------------------------------------------------------------
def _fid_references(f1: np.ndarray, f2: np.ndarray) -> tuple[float, float]:
    """torch-fidelity's own formula (fid_statistics_to_metric) and the textbook scipy.linalg.sqrtm one."""
    from torch_fidelity.metric_fid import KEY_METRIC_FID, fid_features_to_statistics, fid_statistics_to_metric

    stats = [fid_features_to_statistics(torch.from_numpy(f)) for f in (f1, f2)]
    theirs = fid_statistics_to_metric(*stats, verbose=False)[KEY_METRIC_FID]
    s1, s2 = np.cov(f1, rowvar=False), np.cov(f2, rowvar=False)
    diff = f1.mean(0) - f2.mean(0)
    textbook = diff @ diff + np.trace(s1) + np.trace(s2) - 2 * np.trace(scipy.linalg.sqrtm(s1 @ s2).real)
    return float(theirs), float(textbook)


@pytest.mark.parametrize("scale", [1e100, 1e150, 1e-150])
def test_frechet_distance_scales_and_equals_torch_fidelity(scale):
    """FD(c a, c b) = c^2 FD(a, b): computed for features of 1e150 (whose S1^(1/2) S2 S1^(1/2) overflows
    float64) and of 1e-150 (where it underflows to 0), equal to torch-fidelity's and scipy's numbers on the
    unscaled features."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(300, 12)), rng.normal(0.3, 1.2, size=(250, 12)) @ rng.normal(size=(12, 12)) * 0.5
    theirs, textbook = _fid_references(a, b)
    assert theirs == pytest.approx(textbook, rel=1e-8)
    ours = frechet_distance_from_features(a * scale, b * scale)
    assert math.isfinite(ours) and ours / scale**2 == pytest.approx(theirs, rel=1e-8)


def test_non_finite_features_are_one_line_in_python():
    f = np.random.default_rng(0).normal(size=(20, 4))
    f[3, 1] = np.inf
    with pytest.raises(JemevalError, match=r"^1 of 20 feature vectors hold NaN or inf \(the first: row 3\); a "
                                           "Frechet distance needs finite features"):
        frechet_distance_from_features(f, f[::-1] + 1)


def test_fidelity_with_a_feature_checkpoint_that_overflows_is_one_line(samples, home):
    """The audit's case: `fidelity --features` of a checkpoint whose float32 features overflow (weights x 1e10
    in a three-layer cnn: finite weights, infinite features) ended in 'unexpected LinAlgError'."""
    torch.manual_seed(0)
    model = jemeval.create_model("cnn", 10, (1, 8, 8), width=4).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1e10)
    save_checkpoint(home / "huge.pt", model, dataset="digits")
    before = snapshot(home)
    result = runner().invoke(cli, ["fidelity", "--samples", "s.npz", "--features", "huge.pt", "--ref-n", "20",
                                   "--device", "cpu", "--out", "r.json"])
    assert_one_line_refusal(result, "Error: checkpoint 'huge.pt' gives non-finite penultimate features (NaN or inf) "
                                    "on batch 0 (images 0-2 of the samples)")
    assert "use a checkpoint whose outputs are finite" in result.stderr and "LinAlgError" not in result.stderr
    assert snapshot(home) == before


# -- item 26: a score's options after commas -------------------------------------------------------------------
def _documented_score_specs() -> list[str]:
    """The examples docs/evaluation.md gives for --score options, as written there."""
    text = (DOCS / "evaluation.md").read_text()
    line = re.search(r"Options go after a colon: (.*?`)\.", text.replace("\n  ", " ")).group(1)
    return re.findall(r"`([^`]+)`", line)


def test_the_documented_option_strings_split_as_written():
    documented = _documented_score_specs()
    assert "odin:T=1000,eps=0.0014" in documented and len(documented) >= 3
    assert split_specs(",".join([*documented, "maxprob"]), "scores") == [*documented, "maxprob"]
    assert split_specs("odin:T=1000,eps=0.0014,maxprob", "scores") == ["odin:T=1000,eps=0.0014", "maxprob"]
    assert split_specs("uniform,digits[0,1],interp:digits", "ood") == ["uniform", "digits[0,1]", "interp:digits"]


def test_odin_with_two_options_and_another_score_on_the_command_line(home):
    result = runner().invoke(cli, ["ood", "--model", "m.pt", "--ood", "uniform", "--n", "20", "--device", "cpu",
                                   "--score", "odin:T=1000,eps=0.0014,maxprob", "--json"])
    assert result.exit_code == 0, result.stderr
    import json

    out = json.loads(result.stdout)
    assert [r["score"] for r in out["records"]] == ["odin:T=1000,eps=0.0014", "maxprob"]
    assert out["provenance"]["settings"]["score_options"]["odin:T=1000,eps=0.0014"] == {"T": 1000, "eps": 0.0014}
    model = jemeval.load_model("m.pt")
    same = evaluate_ood(model, "uniform", scores=["odin:T=1000,eps=0.0014", "maxprob"], n=20, device="cpu",
                        progress=False)
    assert [r["auroc"] for r in out["records"]] == [r["auroc"] for r in same.records]


# -- item 28: check_score reads specs as the command line does --------------------------------------------------
class MarginPlugin:
    """The margin score of docs/plugins.md, with an option: the margin of the probabilities (prob=True)."""

    @staticmethod
    def margin_of(logits, prob: bool = False):
        top2 = (logits.softmax(dim=1) if prob else logits).topk(2, dim=1).values
        return top2[:, 0] - top2[:, 1]

    @jemeval.hookimpl
    def register_scores(self, register):
        @jemeval.score(from_logits=MarginPlugin.margin_of)
        def margin(model, x, *, prob: bool = False):
            """Top logit (or probability) minus the runner-up."""
            with torch.no_grad():
                return MarginPlugin.margin_of(model.logits(x), prob)

        register("margin", margin)


def test_check_score_takes_the_spec_the_command_line_takes():
    model = testing.tiny_model()
    x = torch.rand(8, *model.input_shape, generator=torch.Generator().manual_seed(1)) * 2 - 1  # check_score's inputs
    with torch.no_grad():
        top2 = model.logits(x).softmax(dim=1).topk(2, dim=1).values
    with testing.registered_plugin(MarginPlugin(), name="margin-plugin"):
        by_spec = testing.check_score("margin:prob=True", model)
        assert torch.allclose(by_spec, top2[:, 0] - top2[:, 1])
        assert torch.equal(by_spec, testing.check_score("margin", model, prob=True))
        with pytest.raises(UsageError, match=r"score 'margin' has no option 'k'"):
            testing.check_score("margin:prob=True,k=3", model)
    odin = testing.check_score("odin:T=1000,eps=0.0014", model)
    assert torch.equal(odin, testing.check_score("odin", model, T=1000, eps=0.0014))
    with pytest.raises(UsageError, match=r"^score 'energy': the temperature T must be a finite number > 0"):
        testing.check_score("energy:T=0", model)
    testing.check_detector("knn:k=10")  # a detector spec too
