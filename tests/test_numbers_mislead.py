"""Issue 23 items 14-17: numbers that mislead.

14. DICE, ReAct and ASH assume non-negative (ReLU) penultimate features; on LeakyReLU features DICE
    gave the digits JEM AUROC 0.051 with no warning. A note must say so (and `jemeval list scores`).
15. ``maxprob`` was float32: confident examples tied at 1.0 and the AUROC moved.
16. AutoAttack's rand version ran without EOT (eot_samples 1) in the full and bpda gradient modes.
17. The report's quick preset had no epsilon at which the large-epsilon sanity check runs for K > 0.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import softmax
from sklearn.metrics import roc_auc_score
from test_bad_inputs import runner
from test_nonfinite_outputs import save_digits_cnn
from torch import nn

from jemeval.builtins import torchattacks_attacks as ta_attacks
from jemeval.cli import cli
from jemeval.data import ArrayDataset, load_dataset, subsample
from jemeval.energy.model import EnergyModel
from jemeval.evaluation.batching import resolve_scores, run_batches
from jemeval.evaluation.metrics import auroc
from jemeval.evaluation.ood.evaluate import evaluate_ood
from jemeval.evaluation.ood.fit import fit_sets
from jemeval.evaluation.robust.checks import reaches_everything
from jemeval.evaluation.robust.evaluate import check_epsilons, robust
from jemeval.reports.sections import run_section
from jemeval.reports.settings import PRESETS, resolve_options
from jemeval.testing import TinyNet, tiny_model


# -- item 14: scores that assume ReLU features --------------------------------------------------------
def relu_model(seed: int = 0) -> EnergyModel:
    """The tiny test network with ReLU instead of LeakyReLU: its features are never negative."""
    torch.manual_seed(seed)
    net = TinyNet(10, (1, 8, 8))
    net.body[2] = nn.ReLU()
    return EnergyModel(net, num_classes=10, input_shape=(1, 8, 8), arch="tiny-relu").eval()


def negative_fraction_of(model, ds) -> float:
    """The fraction of feature values < 0, computed here from the model's own features."""
    with torch.no_grad():
        features = model.features(ds.x if hasattr(ds, "x") else torch.stack([ds[i][0] for i in range(len(ds))]))
    return float((features < 0).double().mean())


def _ood(model):
    return evaluate_ood(model, "uniform", id="digits", scores=["dice", "react", "ash"], n=40, fit_n=200, cache=False,
                        device="cpu", progress=False)


def test_leaky_relu_features_get_a_note_for_dice_react_and_ash():
    """The attack: a model whose penultimate features are partly negative (LeakyReLU). Each of the three
    scores gets a note; the fractions equal the ones computed here from the fit and the ID features."""
    model = tiny_model(10, (1, 8, 8))
    result = _ood(model)
    signs = result.provenance["settings"]["feature_signs"]
    fit = negative_fraction_of(model, fit_sets(model, "digits", fit_n=200, seed=0).fit)
    scored = negative_fraction_of(model, subsample(load_dataset("digits", "test"), 40, seed=0))
    assert 0.05 < fit < 0.95 and 0.05 < scored < 0.95  # the model really has negative features
    assert signs["dice"] == {"negative_fraction": pytest.approx(fit), "measured_on": "fit features"}
    assert signs["react"] == {"negative_fraction": pytest.approx(fit), "measured_on": "fit features"}
    assert signs["ash"] == {"negative_fraction": pytest.approx(scored),
                            "measured_on": "in-distribution features scored"}
    for label in ("dice", "react", "ash"):
        notes = [n for n in result.notes if n.startswith(f"score {label!r} assumes non-negative (ReLU)")]
        assert len(notes) == 1 and f"{signs[label]['negative_fraction']:.1%}" in notes[0], result.notes


def test_relu_features_get_no_note():
    result = _ood(relu_model())
    assert all(c["negative_fraction"] == 0 for c in result.provenance["settings"]["feature_signs"].values())
    assert not [n for n in result.notes if "non-negative (ReLU)" in n], result.notes


def test_scores_without_the_assumption_record_nothing():
    result = evaluate_ood(tiny_model(10, (1, 8, 8)), "uniform", id="digits", scores=["energy", "knn"], n=40,
                          fit_n=100, cache=False, device="cpu", progress=False)
    assert "feature_signs" not in result.provenance["settings"]
    assert not [n for n in result.notes if "ReLU" in n]


def test_list_scores_says_which_scores_assume_relu_features():
    result = runner().invoke(cli, ["list", "scores"])
    assert result.exit_code == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:] if line.strip()}
    for name in ("dice", "react", "ash"):
        assert "assumes non-negative (ReLU) features" in lines[name], lines[name]
    assert "ReLU" not in lines["knn"] and "ReLU" not in lines["energy"]


# -- item 15: maxprob in float64 --------------------------------------------------------------------
class FixedLogits(nn.Module):
    """A 'model' whose logits are its inputs: the test chooses the logits exactly."""

    def forward(self, x):
        return x.flatten(1)


def _logits(margins: np.ndarray) -> torch.Tensor:
    z = np.zeros((len(margins), 3), dtype=np.float32)
    z[:, 0] = margins
    return torch.from_numpy(z)


def test_maxprob_is_float64_and_its_auroc_is_sklearns():
    """Logits whose float32 softmax ties at 1.0 (margins 17..31) but whose float64 softmax does not."""
    rng = np.random.default_rng(0)
    id_logits, ood_logits = _logits(rng.uniform(19, 31, 60)), _logits(rng.uniform(17, 29, 60))
    assert (id_logits.softmax(1).amax(1) == 1.0).float().mean() > 0.5  # the precondition: float32 ties

    def scores(logits):
        ds = ArrayDataset(logits.view(-1, 1, 1, 3), torch.zeros(len(logits)), validate=False)
        return run_batches(FixedLogits(), ds, scores=resolve_scores(["maxprob"]), keep_logits=False,
                           batch_size=16, device="cpu").scores["maxprob"]

    got_id, got_ood = scores(id_logits), scores(ood_logits)
    want_id = softmax(id_logits.double().numpy(), axis=1).max(1)
    want_ood = softmax(ood_logits.double().numpy(), axis=1).max(1)
    np.testing.assert_allclose(got_id, want_id, rtol=1e-14, atol=0)
    np.testing.assert_allclose(got_ood, want_ood, rtol=1e-14, atol=0)
    assert len(np.unique(got_id)) == len(got_id)  # no ties
    labels = np.r_[np.ones(60), np.zeros(60)]
    reference = roc_auc_score(labels, np.r_[want_id, want_ood])
    assert auroc(got_id, got_ood) == pytest.approx(reference, abs=1e-12)
    float32 = auroc(id_logits.softmax(1).amax(1).double().numpy(), ood_logits.softmax(1).amax(1).double().numpy())
    assert abs(float32 - reference) > 1e-3  # float32 would have given another AUROC


def test_maxprob_model_form_equals_the_logits_form():
    model = tiny_model(10, (1, 8, 8))
    x = torch.rand(8, 1, 8, 8) * 2 - 1
    (score,) = resolve_scores(["maxprob"])
    with torch.no_grad():
        logits = model.logits(x)
    assert score.fn(model, x).dtype == torch.float64
    torch.testing.assert_close(score.fn(model, x), score.from_logits(logits), rtol=0, atol=0)


# -- item 16: AutoAttack rand applies its EOT in every gradient mode --------------------------------------
@pytest.fixture
def inner_eot(monkeypatch):
    """The eot_iter every inner APGD of AutoAttack was built with."""
    seen: list[list[int]] = []
    real = ta_attacks.AutoAttackEnsemble.build

    def build(self, ta, model01, eps, **kwargs):
        aa = real(self, ta, model01, eps, **kwargs)
        seen.append([inner.eot_iter for inner in aa._autoattack.attacks if hasattr(inner, "eot_iter")])
        return aa

    monkeypatch.setattr(ta_attacks.AutoAttackEnsemble, "build", build)
    return seen


def test_autoattack_rand_full_and_bpda_average_20_draws(inner_eot):
    """The attack: --attack autoattack --aa-version rand --grad-mode full,bpda. Both runs average
    AutoAttack's 20 draws per gradient (torchattacks' own eot_iter for rand) and the records say 20."""
    result = robust(tiny_model(10, (1, 8, 8)), norm="linf", data="digits", attacks="autoattack:steps=2",
                    aa_version="rand", refine_steps=1, grad_mode=["full", "bpda"], chains=2, epsilons=[0.0, 0.05],
                    n=4, device="cpu", progress=False)
    assert {r["grad_mode"]: r["eot_samples"] for r in result.records} == {"full": 20, "bpda": 20}
    assert inner_eot == [[20, 20], [20, 20]]  # two runs x one non-zero epsilon; APGD-CE and APGD-DLR


def test_autoattack_rand_in_an_eot_mode_uses_eot_samples(inner_eot):
    result = robust(tiny_model(10, (1, 8, 8)), norm="linf", data="digits", attacks="autoattack:steps=2",
                    aa_version="rand", refine_steps=1, grad_mode="eot", eot_samples=3, chains=2,
                    epsilons=[0.0, 0.05], n=4, device="cpu", progress=False)
    assert {r["eot_samples"] for r in result.records} == {3} and inner_eot == [[3, 3]]


def test_autoattack_rand_called_directly_uses_its_20_draws(inner_eot):
    attack = ta_attacks.autoattack("linf", version="rand", steps=2)
    x = torch.rand(2, 1, 8, 8) * 2 - 1
    attack(tiny_model(10, (1, 8, 8)), x, torch.tensor([0, 1]), [0.05])
    assert attack.own_eot_samples == 20 and inner_eot == [[20, 20]]
    assert ta_attacks.autoattack("linf", version="standard").own_eot_samples is None


# -- item 17: every preset has an epsilon where the large-epsilon check runs -----------------------------
@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)])
def test_every_preset_and_norm_has_an_epsilon_the_check_accepts(preset, shape):
    """The preset's epsilons (per norm, as the report resolves them) include one at which the check's
    own predicate says every image is within reach, for images of any size."""
    for norm in ("l2", "linf"):
        options = resolve_options(preset=preset, sections=["robust"], dataset="digits",
                                  overrides={"norm": [norm]})["robust"]
        eps = check_epsilons(options["epsilons"][norm], norm, shape)
        dims = int(np.prod(shape))
        assert any(reaches_everything(norm, e, dims) for e in eps), (preset, norm, eps)


def test_quick_preset_stays_cheap():
    """One extra epsilon per norm (the largest), nothing else."""
    quick = PRESETS["quick"]["robust"]["epsilons"]
    assert quick["l2"] == [0.0, 0.5, 1.0, 2.0, "max"] and quick["linf"] == [0.0, 2 / 255, 8 / 255, 16 / 255, 1.0]


def test_quick_preset_robust_section_runs_the_large_epsilon_check_at_k1(tmp_path):
    """The report's robust section with the quick preset's settings: the K = 1 curve gets the
    large-epsilon check (it used to be skipped, and '5 of 5 sanity checks passed' hid it)."""
    ckpt = save_digits_cnn(tmp_path / "m.pt")
    options = resolve_options(preset="quick", sections=["robust"], dataset="digits", overrides={})["robust"]
    (result,) = run_section("robust", ckpt, options, device=torch.device("cpu"), progress=False)
    assert max(r["epsilon"] for r in result.records) == pytest.approx(8.0)  # sqrt(1 x 8 x 8)
    ran = {(c["refine_steps"], c["check"]) for c in result.extra["checks"]}
    assert (1, "large_epsilon_near_zero") in ran and (0, "large_epsilon_near_zero") in ran, ran


def test_max_epsilon_resolves_per_norm_and_bad_words_are_refused():
    assert check_epsilons([0, "max"], "l2", (3, 32, 32)) == [0.0, pytest.approx(np.sqrt(3072))]
    assert check_epsilons(["max", 0.5], "linf", (1, 8, 8)) == [0.5, 1.0]
    from jemeval.errors import UsageError

    with pytest.raises(UsageError, match=r"epsilon 'huge' is not a number.*'max'"):
        check_epsilons([0, "huge"], "l2", (1, 8, 8))
