"""Built-in attacks: jemeval's adapters against plain foolbox run on the same model and inputs."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import jemeval
from jemeval.builtins import foolbox_attacks as attacks
from jemeval.data import subsample
from jemeval.errors import JemevalError, UsageError
from jemeval.evaluation.robust.evaluate import robust
from jemeval.evaluation.robust.threat import perturbation_norm, project_to_ball


@pytest.fixture(scope="module")
def clf(digits_classifier_ckpt):
    return jemeval.load_model(digits_classifier_ckpt).eval()


@pytest.fixture(scope="module")
def subset():
    ds = subsample(jemeval.load_dataset("digits", "test"), 40, seed=3)
    return ds.x, ds.y


def _plain_foolbox(model, x, y, fb_attack, eps_pixel, seed):
    fb = attacks.import_foolbox()  # foolbox itself, imported with jemeval's git/scipy workarounds

    torch.manual_seed(seed)
    np.random.seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fmodel = fb.PyTorchModel(model, bounds=(-1, 1), device="cpu")
        criterion = fb.criteria.Misclassification(y)
        _, clipped, success = fb_attack(fmodel, x, criterion, epsilons=[2 * e for e in eps_pixel])
    return torch.stack(clipped), success


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_k0_pgd_equals_plain_foolbox(digits_classifier_ckpt, clf, subset, norm):
    fb = attacks.import_foolbox()

    x, y = subset
    eps = [0.0, 0.1, 0.3, 0.6] if norm == "l2" else [0.0, 0.02, 0.05, 0.1]
    cls = fb.attacks.L2PGD if norm == "l2" else fb.attacks.LinfPGD
    _, success = _plain_foolbox(clf, x, y, cls(steps=5, rel_stepsize=0.5, random_start=True).repeat(2), eps, seed=3)
    want = (1 - success.double().mean(1)).tolist()

    result = robust(digits_classifier_ckpt, norm=norm, refine_steps=0, attacks="pgd", epsilons=eps, n=40, seed=3,
                    steps=5, restarts=2, progress=False, device="cpu")
    got = [r["robust_accuracy"] for r in sorted(result.records, key=lambda r: r["epsilon"])]
    assert got == pytest.approx(want, abs=1e-12)
    assert got[0] == result.records[0]["clean_accuracy"] > 0.9
    assert got[-1] < got[0]  # the attack does something at the largest epsilon
    assert result.records[0]["restarts"] == 2 and result.records[0]["steps"] == 5


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_pgd_adversarials_stay_in_the_ball_and_the_bounds(clf, subset, norm):
    x, y = subset
    eps = [0.0, 0.05, 0.2]
    adv = attacks.pgd(norm, steps=3)(clf, x, y, eps)
    assert adv.shape == (3, *x.shape)
    assert adv.min() >= -1 and adv.max() <= 1
    for e, a in zip(eps, adv):
        size = perturbation_norm(x, a, norm)
        assert (size <= 2 * e + 1e-5).all()
    assert torch.equal(adv[0], x)


def test_top2_starting_points_are_correct_inputs_of_the_runner_up_class(clf, subset):
    x, y = subset
    starts, valid = attacks.top2_starting_points(clf, x, y)
    with torch.no_grad():
        logits = clf(x)
        start_pred = clf(starts).argmax(1)
    second = logits.argsort(1, descending=True)[:, 1]
    assert valid.all()
    assert (start_pred != y).all()  # every start is adversarial
    correct = logits.argmax(1) == y
    pool_ok = {int(c) for c, p in zip(y, logits.argmax(1)) if c == p}  # classes with a correct pool example
    for i in range(len(x)):  # a small setup check, not a hot loop
        if not correct[i]:
            assert torch.equal(starts[i], x[i])
            continue
        match = (x == starts[i]).flatten(1).all(1).nonzero()
        j = int(match[0])
        assert int(y[j]) == int(start_pred[i])  # a correctly classified pool input...
        if int(second[i]) in pool_ok:
            assert int(y[j]) == int(second[i])  # ...of the model's top-2 class when one exists


def test_pointwise_k0_equals_plain_foolbox_from_the_same_starts(clf, subset):
    fb = attacks.import_foolbox()

    x, y = subset[0][:16], subset[1][:16]
    starts, valid = attacks.top2_starting_points(clf, x, y)
    assert valid.all()
    torch.manual_seed(5)
    np.random.seed(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = fb.attacks.PointwiseAttack().run(fb.PyTorchModel(clf, bounds=(-1, 1), device="cpu"), x,
                                                fb.criteria.Misclassification(y), starting_points=starts)
    torch.manual_seed(5)
    np.random.seed(5)
    got = attacks.pointwise("l2").minimize(clf, x, y)
    torch.testing.assert_close(got, want)
    # __call__ projects the minimal adversarials onto each ball, like foolbox's clip_perturbation
    eps = [0.0, 0.5, 8.0]
    torch.manual_seed(5)
    np.random.seed(5)
    per_eps = attacks.pointwise("l2")(clf, x, y, eps)
    torch.testing.assert_close(per_eps[-1], want)
    assert torch.equal(per_eps[0], x)
    sizes = perturbation_norm(x, per_eps[1], "l2")
    assert (sizes <= 1.0 + 1e-5).all()


def test_boundary_finds_adversarials_not_larger_than_its_start(clf, subset):
    x, y = subset[0][:12], subset[1][:12]
    starts, _ = attacks.top2_starting_points(clf, x, y)
    torch.manual_seed(0)
    adv = attacks.boundary("l2", steps=50).minimize(clf, x, y)
    with torch.no_grad():
        assert (clf(adv).argmax(1) != y).all()
    assert (perturbation_norm(x, adv, "l2") <= perturbation_norm(x, starts, "l2") + 1e-5).all()


def test_common_random_numbers_make_a_stochastic_model_repeatable(clf, subset):
    from jemeval.sampling.refinement import RefinedClassifier

    x = subset[0][:5]
    noisy = RefinedClassifier(clf, 1, chains=2, sigma=0.1)
    crn = attacks.CommonRandomNumbers(noisy, seed=7)
    with torch.no_grad():
        assert torch.equal(crn(x), crn(x))
        assert not torch.equal(noisy(x), noisy(x))


def test_project_to_ball_matches_foolbox_clip_perturbation(subset):
    fb = attacks.import_foolbox()

    x = subset[0][:6]
    far = (x + torch.randn(x.shape, generator=torch.Generator().manual_seed(0))).clamp(-1, 1)
    for norm, dist in (("l2", fb.distances.l2), ("linf", fb.distances.linf)):
        torch.testing.assert_close(project_to_ball(x, far, 0.3, norm), dist.clip_perturbation(x, far, 0.3))


def test_a_third_party_attack_with_only_the_base_interface_works(digits_classifier_ckpt):
    seen = {}

    def shift(model, x, y, epsilons):
        """Moves every pixel by +epsilon (model space 2 epsilon), clipped to the bounds."""
        seen["model"] = type(model).__name__
        return torch.stack([(x + 2 * e).clamp(-1, 1) for e in epsilons])

    result = robust(digits_classifier_ckpt, norm="linf", attacks=[shift], epsilons=[0, 0.5, 1.0], n=30, progress=False,
                    device="cpu")
    model = jemeval.load_model(digits_classifier_ckpt)
    ds = subsample(jemeval.load_dataset("digits", "test"), 30, seed=0)
    with torch.no_grad():
        clean_ok = model(ds.x).argmax(1) == ds.y
        want = [float(((model((ds.x + 2 * e).clamp(-1, 1)).argmax(1) == ds.y) & clean_ok).double().mean())
                for e in (0, 0.5, 1.0)]
    assert [r["robust_accuracy"] for r in result.records] == pytest.approx(want)
    assert [r["attack"] for r in result.records] == ["shift"] * 3
    assert seen["model"] == "RefinedClassifier"


def test_an_attack_leaving_the_ball_is_refused(digits_classifier_ckpt):
    def cheat(model, x, y, epsilons):
        return torch.stack([torch.zeros_like(x) for _ in epsilons])

    with pytest.raises(JemevalError, match="larger than epsilon"):
        robust(digits_classifier_ckpt, norm="l2", attacks=[cheat], epsilons=[0.1], n=10, progress=False, device="cpu")

    def wrong_shape(model, x, y, epsilons):
        return x

    with pytest.raises(JemevalError, match="expected a tensor of shape"):
        robust(digits_classifier_ckpt, norm="l2", attacks=[wrong_shape], epsilons=[0.1], n=10, progress=False,
               device="cpu")


def test_unknown_norms_and_bad_steps_are_usage_errors():
    with pytest.raises(UsageError, match=r"unknown norm 'l1' \(did you mean"):
        attacks.pgd("l1")
    with pytest.raises(UsageError, match="steps >= 1"):
        attacks.pgd("l2", steps=0)
    assert sorted(attacks.BUILTIN_ATTACKS) == ["boundary", "pgd", "pointwise"]
    assert {"pgd", "boundary", "pointwise"} <= set(jemeval.names("attack"))
    assert math.isclose(attacks.pgd("l2", steps=10).settings["rel_stepsize"], 0.25)


# -- foolbox's import-time breakages ------------------------------------------------------------------
NO_FILTERS = textwrap.dedent("""
    import importlib.abc, sys
    import scipy.ndimage

    class NoFilters(importlib.abc.MetaPathFinder):  # SciPy 2.0 removes scipy.ndimage.filters
        def find_spec(self, name, path, target=None):
            if name == "scipy.ndimage.filters":
                raise ModuleNotFoundError("No module named 'scipy.ndimage.filters'")

    del sys.modules["scipy.ndimage.filters"], scipy.ndimage.filters
    sys.meta_path.insert(0, NoFilters())
    import jemeval.builtins.foolbox_attacks as attacks
    import jemeval.builtins.torchattacks_attacks

    fb = attacks.import_foolbox()
    import foolbox.attacks.blur as blur

    assert blur.gaussian_filter is scipy.ndimage.gaussian_filter
    print("imported", fb.__version__)
""")


def _without_git(tmp_path: Path) -> dict[str, str]:
    """The environment with an empty PATH (no git binary) and none of GitPython's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_PYTHON")}
    env["PATH"] = str(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    assert shutil.which("git", path=env["PATH"]) is None
    return env


@pytest.mark.slow
def test_foolbox_attacks_and_robust_work_without_git_and_without_scipy_filters(digits_classifier_ckpt, tmp_path):
    env = _without_git(tmp_path)
    plain = subprocess.run([sys.executable, "-c", "import foolbox"], env=env, capture_output=True, text=True)
    assert plain.returncode != 0 and "git" in plain.stderr.lower()  # the breakage is real here
    ours = subprocess.run([sys.executable, "-c", NO_FILTERS], env=env, capture_output=True, text=True)
    assert ours.returncode == 0 and ours.stdout.startswith("imported 3."), ours.stderr
    cmd = [sys.executable, "-m", "jemeval", "robust", "--model", str(digits_classifier_ckpt), "--norm", "linf",
           "--attack", "pgd", "--epsilons", "0,0.1", "--n", "5", "--steps", "2", "--device", "cpu", "--json"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert [r["attack"] for r in json.loads(res.stdout)["records"]] == ["pgd", "pgd"]


def test_a_foolbox_that_cannot_be_imported_is_one_true_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "foolbox", None)
    with pytest.raises(JemevalError, match=r"^foolbox \(pgd, boundary, pointwise\) could not be imported: "
                                           r"ModuleNotFoundError: .*torchattacks attacks .* do not need it$"):
        attacks.import_foolbox()


def test_foolbox_model_uses_the_models_device(clf):
    fmodel = attacks.foolbox_model(clf)
    assert str(fmodel.device) == "cpu"  # not CUDA, even where CUDA is visible
