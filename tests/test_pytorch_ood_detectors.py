"""Every pytorch-ood detector that applies to a trained classifier, through one adapter (issue 27 item 1).

Parity: each new score, fitted by jemeval (``fit`` -> one pass -> ``fit_features``) and scored in jemeval's
batch loop, gives per-example scores and an AUROC equal to pytorch-ood's class called directly (fitted by
its own ``fit(DataLoader)`` on the same images, the defaults written out here). Attacks: bad options, an
unlabelled fit set, a cached state naming a class to rebuild, the command line with a wrong percentile.
"""
from __future__ import annotations

import io
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pytorch_ood import detector as pod
from pytorch_ood.metrics import OODMetrics
from test_bad_inputs import assert_one_line_refusal, runner, snapshot
from torch.utils.data import DataLoader

import jemeval
from jemeval import testing
from jemeval.builtins import pytorch_ood_detectors as P
from jemeval.components.adapters import new_detector
from jemeval.data import ArrayDataset
from jemeval.errors import UsageError
from jemeval.evaluation.batching import resolve_scores, run_batches
from jemeval.evaluation.metrics import auroc
from jemeval.plugins import get_registry

K, SHAPE = 4, (1, 6, 6)
NAMES = [s.name for s in P.SPECS]
#: the spec whose scores equal pytorch-ood's class: VRA's default is OpenOOD's one global pair of thresholds
#: (tests/test_silent_detectors.py), pytorch-ood's per-feature thresholds are its option per_feature=True
AS_PYTORCH_OOD = {"vra": "vra:per_feature=True"}


def _blobs(means: torch.Tensor, n: int, seed: int) -> ArrayDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % K
    x = (means[y] + 0.35 * torch.randn((n, *SHAPE), generator=g)).clamp(-1, 1)
    return ArrayDataset(x, y, num_classes=K, name="blobs")


@pytest.fixture(scope="module")
def setup():
    """A tiny classifier trained (full batch, 150 Adam steps) on 4 Gaussian blobs; its fit, ID test and
    uniform-noise OOD images."""
    means = torch.rand((K, *SHAPE), generator=torch.Generator().manual_seed(0)) * 1.2 - 0.6
    fit, test = _blobs(means, 400, 1), _blobs(means, 120, 2)
    model = testing.tiny_model(K, SHAPE, seed=0).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        F.cross_entropy(model.logits(fit.x), fit.y).backward()
        opt.step()
    model.eval().requires_grad_(False)
    ood = ArrayDataset(torch.rand((120, *SHAPE), generator=torch.Generator().manual_seed(3)) * 2 - 1,
                       torch.full((120,), -1), num_classes=K, name="noise")
    return model, fit, test, ood


def _references(model, fit: ArrayDataset) -> dict:
    """pytorch-ood's classes on the model itself, with the defaults jemeval documents, fitted by pytorch-ood."""
    loader = DataLoader(fit, batch_size=100)
    head, features = model.classifier(), model.features

    def maps(x):
        return model.features(x)[:, :, None, None]

    def flat(h):
        return head(h.flatten(1))

    return {
        "gen": pod.GEN(model, gamma=0.1, M=100),
        "weighted-ebo": pod.WeightedEBO(model, torch.ones(K)),
        "lts": pod.LTS(features, head, p=0.05),
        "scale": pod.SCALE(maps, flat, percentile=0.85),
        "klmatching": pod.KLMatching(model).fit(loader),
        "tscaling": pod.TemperatureScaling(model).fit(loader),
        "openmax": pod.OpenMax(model, tailsize=25, alpha=10, euclid_weight=1.0).fit(loader),
        "rmd": pod.RMD(features).fit(loader),
        "gmm": pod.GMM(features, reg=1e-6).fit(loader),
        "she": pod.SHE(features, head).fit(loader),
        "nnguide": pod.NNGuide(features, head, k=100).fit(loader),
        "fdbd": pod.fDBD(features, head).fit(loader),
        "nci": pod.NCI(features, head, alpha=1e-4).fit(loader),
        "pnml": pod.PNML(features, head, eps=1e-12).fit(loader),
        "vra": pod.VRA(maps, flat, lower_percentile=0.1, upper_percentile=0.9).fit(loader),
    }


def _theirs(name: str, reference, x: torch.Tensor) -> np.ndarray:
    """pytorch-ood's outlier scores, sign flipped; OpenMax one example at a time (its batch result depends on
    which classes the rest of the batch predicts: jemeval scores each example alone)."""
    with torch.no_grad():
        if name == "openmax":
            out = torch.cat([reference.predict(x[i:i + 1]) for i in range(len(x))])
        else:
            out = reference.predict(x)
    return -out.double().numpy()


@pytest.fixture(scope="module")
def parity(setup):
    model, fit, test, ood = setup
    scored = resolve_scores([AS_PYTORCH_OOD.get(name, name) for name in NAMES])
    for s in scored:
        if s.detector:
            s.fn.fit(model, fit, **s.options)
    ours = [{name: out[AS_PYTORCH_OOD.get(name, name)] for name in NAMES}
            for out in (run_batches(model, ds, scores=scored, batch_size=50, progress=False, device="cpu").scores
                        for ds in (test, ood))]
    references = _references(model, fit)
    theirs = {name: (_theirs(name, ref, test.x), _theirs(name, ref, ood.x)) for name, ref in references.items()}
    return ours, theirs


def test_at_least_25_scores_without_the_example_plugin():
    names = [c.name for c in get_registry().components("score") if c.plugin.startswith("jemeval.builtins.")]
    assert len(names) >= 25 and set(NAMES) <= set(names), sorted(names)
    assert len(NAMES) == len(set(NAMES)) == 15


@pytest.mark.parametrize("name", NAMES)
def test_scores_and_auroc_equal_pytorch_ood_called_directly(parity, name):
    (ours_id, ours_ood), theirs = parity
    theirs_id, theirs_ood = theirs[name]
    np.testing.assert_allclose(ours_id[name], theirs_id, rtol=1e-6, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(ours_ood[name], theirs_ood, rtol=1e-6, atol=1e-6, err_msg=name)
    metrics = OODMetrics()  # outlier scores, OOD positive: pytorch-ood's own AUROC
    metrics.update(-torch.from_numpy(np.r_[theirs_id, theirs_ood]),
                   torch.from_numpy(np.r_[np.zeros(len(theirs_id)), -np.ones(len(theirs_ood))]).long())
    assert auroc(ours_id[name], ours_ood[name]) == pytest.approx(metrics.compute()["AUROC"], abs=1e-6), name
    assert np.ptp(np.r_[ours_id[name], ours_ood[name]]) > 0, f"{name} is constant: parity would mean nothing"


def test_defaults_grids_and_kinds_are_pytorch_oods():
    """The grids are pytorch-ood's hyperparameter_space; a class that fits is a cacheable jemeval.Detector
    (labelled fit data where pytorch-ood needs classes), one that does not is a Score with a one-pass form."""
    registry = get_registry()
    for spec in P.SPECS:
        impl = getattr(pod, spec.cls)
        assert spec.grid == {k: list(v) for k, v in impl.hyperparameter_space.items()}, spec.name
        assert set(spec.defaults) - set(spec.own) <= set(impl.__init__.__code__.co_varnames), spec.name
        obj = registry.get("score", spec.name)
        assert spec.fits == bool(impl.requires_fit), spec.name
        if spec.fits:
            assert issubclass(obj, jemeval.Detector) and obj.cacheable and obj.uses_features, spec.name
            assert obj.needs_labels == spec.labels
        else:
            assert isinstance(obj, jemeval.Score) and (obj.from_logits or obj.from_features), spec.name


@pytest.mark.parametrize("name", [s.name for s in P.SPECS if s.fits])
def test_state_round_trips_through_weights_only_load(setup, name):
    """The fitted state is tensors and plain values: torch.load(weights_only=True) reads it, and a fresh
    detector loaded with it scores exactly as the fitted one (what the on-disk cache relies on)."""
    model, fit, test, _ = setup
    detector = new_detector(get_registry().get("score", name))
    detector.fit(model, fit)
    buffer = io.BytesIO()
    torch.save(detector.state_dict(), buffer)
    fresh = new_detector(get_registry().get("score", name))
    fresh.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    assert torch.equal(fresh.score(model, test.x[:20]), detector.score(model, test.x[:20])), name


# -- attacks ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, expected", [
    ("scale:percentile=85", "percentile must be a fraction in [0, 1)"),
    ("nnguide:k=2.5", "k must be a whole number"),
    ("openmax:tailsize=big", "tailsize must be a whole number"),
    ("gen:gama=1", "has no option 'gama'"),
    ("weighted-ebo:weights=1;2", "weights must be 4 finite numbers"),
])
def test_a_bad_option_is_one_usage_error(setup, spec, expected):
    model, fit, test, _ = setup
    with pytest.raises(UsageError, match=re.escape(expected)):
        (score,) = resolve_scores([spec])
        if score.detector:
            score.fn.fit(model, fit, **score.options)
        run_batches(model, test, scores=[score], batch_size=50, progress=False, device="cpu")


def test_unlabelled_fit_data_is_refused_for_the_label_detectors(setup):
    model, fit, _, _ = setup
    unlabelled = ArrayDataset(fit.x, torch.full((len(fit),), -1), num_classes=K, name="unlabelled")
    for spec in (s for s in P.SPECS if s.fits):
        detector = new_detector(get_registry().get("score", spec.name))
        if spec.labels:
            with pytest.raises(UsageError, match="needs labelled fit data"):
                detector.fit(model, unlabelled)
        else:  # the others ignore labels: jemeval's -1 must not make pytorch-ood drop every image
            detector.fit(model, unlabelled)
            assert torch.isfinite(detector.score(model, fit.x[:8])).all(), spec.name


def test_a_stored_state_cannot_name_a_class_to_build():
    """A cached state names OpenMax's two numpy classes by a short name looked up in a fixed table: any other
    name (a module path, a builtin) is refused, never imported; the cache then refits."""
    for name in ("os.system", "builtins.eval", "subprocess.Popen"):
        with pytest.raises(KeyError):
            P.decode({"kind": "object", "class": name, "attrs": {"kind": "dict", "keys": [], "values": []}})
    with pytest.raises(TypeError):
        P.encode(object())  # nothing unknown is stored as an object


def test_command_line_wrong_percentile_is_one_line(tmp_path):
    from jemeval.cli import cli
    from jemeval.formats.native import save_checkpoint

    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "m.pt", jemeval.create_model("cnn", 10, (1, 8, 8), width=4).eval(),
                           dataset="digits")
    before = snapshot(tmp_path)
    args = ["ood", "--model", str(ckpt), "--ood", "uniform", "--score", "vra:upper_percentile=90", "--n", "20",
            "--fit-n", "40", "--device", "cpu", "--no-cache"]
    result = runner().invoke(cli, args)
    assert_one_line_refusal(result, "upper_percentile must be a fraction in [0, 1]")
    assert snapshot(tmp_path) == before
