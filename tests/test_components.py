"""The component bases (issue 24, item 1): jemeval.Detector, jemeval.Attack and the jemeval.Score
protocol; every built-in an instance; evaluation reads declared attributes; 0.2's duck-typed plugins
adapted at first use with one DeprecationWarning; the old module paths of the attack built-ins.

Each test is written as what a plugin (or a careless user) would do to the contract: score a
detector before fitting it, ask an l2-only attack for linf, hand jemeval an attack that flips the
model into train mode, register a duck-typed plugin, import a module from its old path."""
from __future__ import annotations

import ast
import importlib
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from test_bad_inputs import assert_one_line_refusal, runner, snapshot
from torch import nn

import jemeval
from jemeval import testing
from jemeval.cli import cli
from jemeval.components.adapters import PluginAttack, PluginDetector, as_attack, new_detector
from jemeval.components.detector import NotFittedError
from jemeval.components.score import as_score
from jemeval.errors import JemevalError, UsageError
from jemeval.plugins import get_registry

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def model_ckpt(tmp_path):
    """An untrained small CNN on digits, as a checkpoint file (no training: these tests are about contracts)."""
    from jemeval.formats.native import save_checkpoint

    torch.manual_seed(0)
    model = jemeval.create_model("cnn", 10, (1, 8, 8), width=4).eval()
    return save_checkpoint(tmp_path / "m.pt", model, dataset="digits")


def _plugin(**hooks) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{name: jemeval.hookimpl(fn) for name, fn in hooks.items()})


def _deprecations(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


# -- the bases exist, and every built-in is an instance ------------------------------------------------
def test_the_bases_are_public_and_every_builtin_detector_and_score_is_one():
    assert {"Detector", "Attack", "Score", "score"} <= set(jemeval.__all__)
    registry = get_registry()
    builtin = [c for c in registry.components("score") if c.plugin.startswith("jemeval.builtins.")]
    detectors = [c for c in builtin if isinstance(c.obj, type)]
    own = {c.name for c in detectors if c.plugin == "jemeval.builtins.detectors"}  # pytorch_ood_detectors: its own test
    assert own == {"mahalanobis", "knn", "vim", "react", "dice"}
    for c in detectors:
        assert issubclass(c.obj, jemeval.Detector) and isinstance(new_detector(c.obj), jemeval.Detector), c.name
        assert c.obj.uses_features and c.obj.cacheable, c.name
    plain = [c for c in builtin if c not in detectors]
    assert {c.name for c in plain} >= {"logpx", "maxprob", "energy", "odin", "ash", "gradnorm"}
    for c in plain:
        assert isinstance(c.obj, jemeval.Score), c.name  # capabilities declared, not left to probing
    assert registry.get("score", "energy").grid == {"T": [1, 10, 100, 1000]}
    assert registry.get("score", "ash").assumes_nonnegative_features
    assert registry.get("score", "gradnorm").from_logits is None


def test_every_builtin_attack_is_an_attack_for_every_norm_it_declares():
    registry = get_registry()
    builtin = [c for c in registry.components("attack") if c.plugin.startswith("jemeval.builtins.")]
    assert {c.name for c in builtin} == {"pgd", "boundary", "pointwise", "apgd-ce", "apgd-dlr", "apgd-t", "fab",
                                         "square", "cw", "autoattack"}
    for c in builtin:
        for norm in ("l2", "linf"):
            try:
                attack = c.obj(norm)
            except UsageError as exc:  # cw is L2 only: refused in one line, naming what it supports
                assert c.name == "cw" and norm == "linf" and "it supports l2" in str(exc)
                continue
            assert isinstance(attack, jemeval.Attack) and norm in attack.norms and attack.norm == norm, c.name
            assert attack.settings["attack"] == c.name and f"norm={norm!r}" in repr(attack), repr(attack)
    assert registry.get("attack", "boundary")("l2").minimization
    assert registry.get("attack", "square")("l2").gradient_free


# -- Detector: an unfitted detector refuses in one line ------------------------------------------------
class Centroid(jemeval.Detector):
    """Written as docs/plugins.md says: fit_features and score_features only."""

    def fit_features(self, model, features, logits, labels, *, shrink: float = 0.0):
        self.center = features.mean(0) * (1 - shrink)
        return self

    def score_features(self, features, logits):
        return -(features - self.center.to(features.device)).norm(dim=1)

    def state_dict(self):
        return {"center": self.center}

    def load_state_dict(self, state):
        self.center = state["center"]


class FitScore(jemeval.Detector):
    """The other way to write one: fit(model, dataset) and score(model, x)."""

    name = "fit-score"

    def fit(self, model, dataset):
        self.mean = torch.stack([x for x, _ in dataset]).mean()
        return self

    def score(self, model, x):
        return -(x - self.mean).flatten(1).abs().mean(1)


def test_scoring_an_unfitted_detector_is_one_line_for_builtins_and_plugins():
    model, x = testing.tiny_model(), torch.zeros(2, 1, 4, 4)
    for detector in (new_detector(get_registry().get("score", "knn")), Centroid(), FitScore()):
        with pytest.raises(NotFittedError) as info:
            detector.predict(model, x)
        assert isinstance(info.value, JemevalError) and "\n" not in str(info.value)
        assert "is not fitted: call fit(model, dataset)" in str(info.value)
    with pytest.raises(NotFittedError, match="'Centroid' is not fitted"):
        Centroid().score_features(torch.zeros(2, 3), torch.zeros(2, 3))
    detector = Centroid()
    detector.load_state_dict({"center": torch.zeros(32)})  # a cached state counts as fitted
    assert detector.fitted and detector.predict(model, x).shape == (2,)


def test_declared_capabilities_are_derived_from_what_a_detector_defines_unless_set():
    assert Centroid.uses_features and Centroid.cacheable and not Centroid.needs_labels and Centroid.grid == {}
    assert not FitScore.uses_features and not FitScore.cacheable

    class NoCache(Centroid):
        cacheable = False  # set explicitly: kept

    class NoFit(FitScore):
        needs_fit = False
        mean = 0.0

    assert NoCache.uses_features and not NoCache.cacheable
    assert NoFit().score(testing.tiny_model(), torch.zeros(2, 1, 4, 4)).shape == (2,)  # no check without needs_fit


def test_a_detector_subclass_passes_the_contract_checks_and_a_broken_one_does_not():
    testing.check_detector(Centroid, shrink=0.5)
    testing.check_detector(FitScore)

    class Disagrees(Centroid):  # score_features is not what score gives
        def score(self, model, x):
            return super().score(model, x) + 1

    with pytest.raises(AssertionError, match="score_features"):
        testing.check_detector(Disagrees)

    class NeverRefuses(FitScore):  # needs_fit, yet scores unfitted without a word
        pass

    NeverRefuses.score = lambda self, model, x: torch.zeros(len(x))  # set after the class: the base never saw it
    with pytest.raises(AssertionError, match="before fit"):
        testing.check_detector(NeverRefuses)


def test_a_subclassed_detector_plugin_fits_once_is_cached_and_scores_as_its_features_say(model_ckpt, tmp_path,
                                                                                           monkeypatch):
    monkeypatch.setenv("JEMEVAL_CACHE_DIR", str(tmp_path / "cache"))
    plugin = _plugin(register_scores=lambda register: register("centroid", Centroid))
    with testing.registered_plugin(plugin, name="subclassed"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = [jemeval.evaluate_ood(model_ckpt, "uniform", scores=["centroid:shrink=0.5"], n=30, progress=False)
                for _ in range(2)]
        with pytest.raises(UsageError, match="has no option 'shrnk'"):
            jemeval.evaluate_ood(model_ckpt, "uniform", scores=["centroid:shrnk=1"], progress=False)
    assert _deprecations(caught) == []  # a subclass is no duck
    assert [r.provenance["settings"]["detectors"]["centroid:shrink=0.5"]["fit"] for r in runs] == ["fitted", "cached"]
    model = jemeval.load_model(model_ckpt)
    train = jemeval.load_dataset("digits", "train")
    test = jemeval.data.subsample(jemeval.load_dataset("digits", "test"), 30, 0)
    with torch.no_grad():
        center = model.features(train.x).mean(0) * 0.5
        expected = -(model.features(test.x) - center).norm(dim=1).numpy()
    np.testing.assert_allclose(runs[0].extra["scores"].id_scores["centroid:shrink=0.5"], expected, rtol=1e-5)


# -- duck-typed plugins of 0.2: adapted, working, one warning --------------------------------------------
class DuckCentroid:
    """0.2's detector: no base, fit/score/state_dict, a grid."""

    grid = {"shrink": [0.0, 0.5]}

    def fit(self, model, dataset, *, shrink: float = 0.0):
        with torch.no_grad():
            self.center = torch.cat([model.features(x) for x, _ in torch.utils.data.DataLoader(dataset, 256)]).mean(0)
        self.center = self.center * (1 - shrink)

    def score(self, model, x):
        with torch.no_grad():
            return -(model.features(x) - self.center).norm(dim=1)

    def state_dict(self):
        return {"center": self.center}

    def load_state_dict(self, state):
        self.center = state["center"]


def test_a_duck_typed_detector_still_works_and_warns_once_naming_the_base(model_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("JEMEVAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("jemeval.components.adapters._WARNED", set())
    plugin = _plugin(register_scores=lambda register: register("duck-centroid", DuckCentroid))
    with testing.registered_plugin(plugin, name="duck"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        duck = [jemeval.evaluate_ood(model_ckpt, "uniform", scores=["duck-centroid:shrink=0.5"], n=30, progress=False)
                for _ in range(2)]
        with pytest.raises(UsageError, match="has no option 'shrnk'"):  # options checked against its own fit
            jemeval.evaluate_ood(model_ckpt, "uniform", scores=["duck-centroid:shrnk=1"], progress=False)
    messages = _deprecations(caught)
    assert len(messages) == 1, messages
    assert "DuckCentroid does not subclass jemeval.Detector" in messages[0] and "subclass jemeval.Detector" in \
        messages[0]
    assert [r.provenance["settings"]["detectors"]["duck-centroid:shrink=0.5"]["fit"] for r in duck] == [
        "fitted", "cached"]
    # the same numbers as the subclassed detector (the two compute the same thing)
    plugin = _plugin(register_scores=lambda register: register("centroid", Centroid))
    with testing.registered_plugin(plugin, name="subclassed"):
        sub = jemeval.evaluate_ood(model_ckpt, "uniform", scores=["centroid:shrink=0.5"], n=30, progress=False)
    np.testing.assert_allclose(duck[0].extra["scores"].id_scores["duck-centroid:shrink=0.5"],
                               sub.extra["scores"].id_scores["centroid:shrink=0.5"], rtol=1e-5)
    adapted = new_detector(DuckCentroid)
    assert isinstance(adapted, PluginDetector) and adapted.cacheable and not adapted.uses_features
    assert adapted.grid == {"shrink": [0.0, 0.5]}


class DuckAttack:
    """0.2's attack: a callable with optional attributes, set after a call too (last_without_start)."""

    name = "duck-shift"
    norms = ("linf",)
    gradient_free = True

    def __init__(self):
        self.calls, self.last_without_start = 0, 0

    @property
    def settings(self):
        return {"attack": "duck-shift", "calls": self.calls}

    def __call__(self, model, x, y, epsilons):
        self.calls += 1
        self.last_without_start = 1
        return torch.stack([(x + 2 * e).clamp(-1, 1) for e in epsilons])


def test_a_duck_typed_attack_still_works_and_warns_once_naming_the_base(model_ckpt, monkeypatch):
    monkeypatch.setattr("jemeval.components.adapters._WARNED", set())
    made = []

    def factory(norm):
        made.append(DuckAttack())
        return made[-1]

    plugin = _plugin(register_attacks=lambda register: register("duck-shift", factory))
    with testing.registered_plugin(plugin, name="duck-attacks"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = [jemeval.robust(model_ckpt, norm="linf", attacks=["duck-shift"], epsilons=[0, 0.1], n=40,
                               device="cpu", progress=False) for _ in range(2)]
        with pytest.raises(UsageError, match="does not support norm 'l2'; it supports linf"):
            jemeval.robust(model_ckpt, norm="l2", attacks=["duck-shift"], n=8, device="cpu", progress=False)
    messages = _deprecations(caught)
    assert len(messages) == 1 and "DuckAttack does not subclass jemeval.Attack" in messages[0], messages
    records = runs[0].records
    assert {r["grad_mode"] for r in records} == {"none"} and all(r["gradient_free"] for r in records)
    assert runs[0].provenance["settings"]["attacks"]["duck-shift"] == {"attack": "duck-shift", "calls": 1}
    assert made[0].calls == 1 and any("had no adversarial starting point" in n for n in runs[0].notes)
    # what the duck returned is what was re-classified: every image moved by 0.2 (x 2 in model space)
    model = jemeval.load_model(model_ckpt)
    ds = jemeval.data.subsample(jemeval.load_dataset("digits", "test"), 40, seed=0)
    with torch.no_grad():
        clean = model.logits(ds.x).argmax(1) == ds.y
        shifted = model.logits((ds.x + 0.2).clamp(-1, 1)).argmax(1) == ds.y
    assert [r["robust_accuracy"] for r in records] == [float(clean.double().mean()),
                                                       float((clean & shifted).double().mean())]
    adapted = as_attack(DuckAttack(), "linf")
    assert isinstance(adapted, PluginAttack) and adapted.gradient_free and adapted.norms == ("linf",)
    assert not adapted.minimization and adapted.own_eot_samples is None


# -- Attack: one call in eval mode, every module's mode given back -----------------------------------------
class Recorder(jemeval.Attack):
    """An attack that records the modes it saw, then flips the model into train mode (as a careless
    attack that calls model.train() to run BatchNorm would)."""

    name = "recorder"
    norms = ("l2",)

    def __init__(self, norm, *, fail: bool = False):
        super().__init__(norm)
        self.fail, self.seen = fail, []

    def forward(self, model, x, y, epsilons, eot_samples=None):
        self.seen.append([m.training for m in model.modules()])
        model.train()
        if self.fail:
            raise RuntimeError("attack bug")
        return x.unsqueeze(0).expand(len(epsilons), *x.shape).clone()


def test_an_attack_runs_in_eval_mode_and_gives_every_module_its_mode_back():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    model.train()
    model[1].eval()  # a mixed state: eval() and train() alone would not restore it
    flags = [m.training for m in model.modules()]
    attack = Recorder("l2")
    out = attack(model, torch.zeros(3, 4), torch.zeros(3, dtype=torch.long), [0.0, 0.1])
    assert out.shape == (2, 3, 4) and attack.seen == [[False] * len(flags)]
    assert [m.training for m in model.modules()] == flags
    with pytest.raises(RuntimeError, match="attack bug"):
        Recorder("l2", fail=True)(model, torch.zeros(3, 4), torch.zeros(3, dtype=torch.long), [0.1])
    assert [m.training for m in model.modules()] == flags  # restored after an error too
    assert repr(attack) == "Recorder(norm='l2')"
    with pytest.raises(JemevalError, match="not a minimisation attack"):
        attack.minimize(model, torch.zeros(3, 4), torch.zeros(3, dtype=torch.long))


def test_an_attack_plugin_asked_for_a_norm_it_does_not_declare_is_one_line_and_writes_nothing(model_ckpt, tmp_path,
                                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    plugin = _plugin(register_attacks=lambda register: register("recorder", Recorder))
    before = snapshot(tmp_path)
    with testing.registered_plugin(plugin, name="l2-only"):
        r = runner().invoke(cli, ["robust", "--model", str(model_ckpt), "--attack", "recorder", "--norm", "linf",
                                  "--n", "4", "--device", "cpu", "--json", "--out", "r.json"])
    assert_one_line_refusal(r, "attack 'recorder' does not support norm 'linf'; it supports l2")
    assert snapshot(tmp_path) == before


def test_the_example_plugin_subclasses_the_bases():
    registry = get_registry()
    assert issubclass(registry.get("score", "example-centroid"), jemeval.Detector)
    attack = registry.get("attack", "example-noise")("l2", seed=3)
    assert isinstance(attack, jemeval.Attack) and attack.settings == {"attack": "example-noise", "norm": "l2",
                                                                     "seed": 3}
    with pytest.raises(UsageError, match="unknown norm|does not support norm"):
        registry.get("attack", "example-noise")("l3")


# -- Score: declared forms; plain functions stay registrable ---------------------------------------------
def test_the_score_decorator_declares_and_a_plain_function_gets_the_defaults():
    @jemeval.score(from_logits=lambda logits, *, k=1: logits.topk(k, dim=1).values.sum(1), grid={"k": [1, 2]})
    def topk(model, x, *, k: int = 1):
        """Sum of the top-k logits."""
        return model.logits(x).topk(k, dim=1).values.sum(1)

    assert isinstance(topk, jemeval.Score) and topk.__name__ == "topk" and topk.__doc__.startswith("Sum")
    testing.check_score(topk, k=2)  # also checks that from_logits gives what the score gives

    def plain(model, x):
        return model.logits(x).amax(1)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plain function is a Score: no deprecation
        wrapped = as_score(plain)
    assert (wrapped.from_logits, wrapped.from_features, wrapped.grid, wrapped.assumes_nonnegative_features) == (
        None, None, {}, False)

    @jemeval.score(from_logits=lambda logits: logits.amax(1) + 1)  # a form that lies
    def liar(model, x):
        return model.logits(x).amax(1)

    with pytest.raises(AssertionError, match="from_logits"):
        testing.check_score(liar)


def test_a_plain_score_function_with_0_2_attributes_still_shares_the_forward_pass(model_ckpt):
    calls = []

    def margin(model, x):
        calls.append(len(x))
        top2 = model.logits(x).topk(2, dim=1).values
        return top2[:, 0] - top2[:, 1]

    margin.from_logits = lambda logits: logits.topk(2, dim=1).values[:, 0] - logits.topk(2, dim=1).values[:, 1]
    plugin = _plugin(register_scores=lambda register: register("margin", margin))
    with testing.registered_plugin(plugin, name="margin"):
        result = jemeval.evaluate_ood(model_ckpt, "uniform", scores=["margin"], n=20, progress=False)
    assert calls == [] and np.isfinite(result.extra["scores"].id_scores["margin"]).all()


# -- the moved modules and the probes that are gone ----------------------------------------------------------
@pytest.mark.parametrize("old, new, name", [("jemeval.builtins.attacks", "jemeval.builtins.foolbox_attacks", "pgd"),
                                            ("jemeval.builtins.autoattack", "jemeval.builtins.torchattacks_attacks",
                                             "apgd_ce")])
def test_the_old_attack_module_paths_import_with_a_deprecation_warning(old, new, name, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} is now {new}"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


CAPABILITIES = {"gradient_free", "minimization", "minimize", "supports_eot", "own_eot_samples", "last_without_start",
                "norms", "settings", "fit_features", "score_features", "from_logits", "from_features", "grid",
                "needs_labels", "assumes_nonnegative_features", "state_dict", "load_state_dict", "state"}
PROBE_SITES = ["jemeval/evaluation/robust/evaluate.py", "jemeval/evaluation/robust/attack_loop.py",
               "jemeval/evaluation/ood/fit.py", "jemeval/evaluation/ood/evaluate.py", "jemeval/evaluation/batching.py",
               "jemeval/evaluation/ood/tune.py", "jemeval/caches/detectors.py"]


def test_evaluation_reads_capabilities_and_never_probes_for_them():
    probes = []
    for rel in PROBE_SITES:
        for node in ast.walk(ast.parse((ROOT / rel).read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in CAPABILITIES):
                probes.append(f"{rel}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
    assert probes == []
