"""The torchattacks attacks (APGD, FAB, Square, C&W, AutoAttack) against torchattacks run directly."""
from __future__ import annotations

import json
import sys

import pytest
import torch
from click.testing import CliRunner

import jemeval
from jemeval.builtins import torchattacks_attacks as ta_attacks
from jemeval.cli import cli
from jemeval.data import subsample
from jemeval.errors import JemevalError, UsageError
from jemeval.evaluation.robust.evaluate import robust
from jemeval.evaluation.robust.threat import perturbation_norm


class ZeroOne(torch.nn.Module):
    """The test's own [0, 1] front of a [-1, 1] model (what torchattacks expects)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x01):
        return self.model(x01 * 2 - 1)


def _digits(n, seed):
    ds = subsample(jemeval.load_dataset("digits", "test"), n, seed=seed)
    return ds.x, ds.y


def _robust_after(model, x, y, adv):
    with torch.no_grad():
        clean = model(x).argmax(1) == y
        return float(((model(adv).argmax(1) == y) & clean).double().mean())


def test_apgd_ce_k0_equals_torchattacks_apgd_run_directly(digits_baseline_ckpt):
    """The acceptance check: the command line's apgd-ce at K = 0 gives exactly the robust accuracies
    of torchattacks.APGD on the same model, subset, seed (0: one batch) and settings."""
    import torchattacks

    res = CliRunner().invoke(cli, [
        "robust", "--model", str(digits_baseline_ckpt), "--attack", "apgd-ce", "--norm", "linf",
        "--epsilons", "0,0.05,0.1", "--refine-steps", "0", "--n", "100", "--seed", "0", "--steps", "10",
        "--json", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    recs = sorted(json.loads(res.stdout)["records"], key=lambda r: r["epsilon"])
    model = jemeval.load_model(digits_baseline_ckpt).eval()
    x, y = _digits(100, seed=0)
    want = []
    for eps in (0.0, 0.05, 0.1):
        adv = x
        if eps:
            atk = torchattacks.APGD(ZeroOne(model), norm="Linf", eps=eps, steps=10, n_restarts=1, seed=0, loss="ce",
                                    eot_iter=1, rho=0.75)
            adv = atk((x + 1) / 2, y) * 2 - 1
        want.append(_robust_after(model, x, y, adv))
    assert [r["robust_accuracy"] for r in recs] == want
    assert want[0] > 0.9 and want[2] < want[0]  # clean accuracy is high and the attack does something
    assert recs[0]["grad_mode"] == "full" and recs[0]["eot_samples"] == 1 and recs[0]["draws"] == 1
    assert all(r["ci_low"] <= r["robust_accuracy"] <= r["ci_high"] for r in recs)


def test_autoattack_standard_is_not_weaker_than_pgd(digits_baseline_ckpt):
    kwargs = {"norm": "linf", "epsilons": [0.0, 0.05, 0.1], "n": 40, "seed": 1, "steps": 10, "device": "cpu",
              "progress": False}
    aa = robust(digits_baseline_ckpt, attacks="autoattack:queries=100", aa_version="standard", **kwargs)
    pgd = robust(digits_baseline_ckpt, attacks="pgd", **kwargs)
    got = [r["robust_accuracy"] for r in aa.records]
    assert all(a <= p for a, p in zip(got, [r["robust_accuracy"] for r in pgd.records])), (got, pgd.records)
    assert got[0] == aa.records[0]["clean_accuracy"] and got[-1] < got[0]
    settings = aa.provenance["settings"]["attacks"]["autoattack"]
    assert settings["version"] == "standard" and settings["steps"] == 10 and settings["queries"] == 100


def test_every_attack_stays_in_the_ball_and_leaves_epsilon_zero_alone(digits_baseline_ckpt):
    model = jemeval.load_model(digits_baseline_ckpt).eval()
    x, y = _digits(12, seed=4)
    cases = [("linf", ta_attacks.apgd_ce("linf", steps=3)), ("l2", ta_attacks.apgd_dlr("l2", steps=3)),
             ("linf", ta_attacks.apgd_t("linf", steps=2)), ("l2", ta_attacks.fab("l2", steps=3)),
             ("linf", ta_attacks.square("linf", queries=20)), ("l2", ta_attacks.cw("l2", steps=5)),
             ("linf", ta_attacks.autoattack("linf", version="rand", steps=2))]
    for norm, attack in cases:
        eps = [0.0, 0.05, 0.3]
        torch.manual_seed(0)
        adv = attack(model, x, y, eps)
        assert adv.shape == (3, *x.shape) and adv.min() >= -1 and adv.max() <= 1
        assert torch.equal(adv[0], x), attack.name
        for e, a in zip(eps, adv):
            assert (perturbation_norm(x, a, norm) <= 2 * e + 1e-5).all(), (attack.name, e)


def test_unit_interval_round_trip_keeps_untouched_pixels_exactly():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, 3, 5, 5, generator=g) * 2 - 1  # values (x + 1) / 2 * 2 - 1 does not give back exactly
    x01 = ta_attacks.to_unit(x)
    adv01 = x01.clone()
    adv01[:, 0, 0, 0] = 0.25
    back = ta_attacks.from_unit(x, x01, adv01)
    assert torch.equal(back[:, 1:], x[:, 1:]) and torch.allclose(back[:, 0, 0, 0], torch.full((4,), -0.5))


def test_apgd_eot_comes_from_eot_samples_and_averages_over_fresh_noise(digits_baseline_ckpt):
    """In an EOT gradient mode APGD runs eot_iter = eot_samples on a single-draw classifier; the
    gradient of each of its iterations is then the mean over that many fresh noise draws."""
    seen = []

    class Recording(ta_attacks.APGDAttack):
        def build(self, ta, model01, eps, *, num_classes, seed, eot_samples):
            atk = super().build(ta, model01, eps, num_classes=num_classes, seed=seed, eot_samples=eot_samples)
            seen.append((atk.eot_iter, model01.model.grad_mode, model01.model.eot_samples))
            return atk

    attack = Recording("linf", name="apgd-ce", loss="ce", steps=2)
    result = robust(digits_baseline_ckpt, norm="linf", attacks=[attack], refine_steps=1, grad_mode=["full", "bpda+eot"],
                    eot_samples=3, chains=2, epsilons=[0.0, 0.05], n=4, device="cpu", progress=False)
    assert seen == [(1, "full", 1), (3, "bpda+eot", 1)]  # epsilon 0 never runs the attack
    assert {r["grad_mode"]: r["eot_samples"] for r in result.records} == {"full": 1, "bpda+eot": 3}


def test_missing_torchattacks_is_one_line_naming_the_extra(monkeypatch, digits_baseline_ckpt):
    monkeypatch.setitem(sys.modules, "torchattacks", None)  # import torchattacks -> ImportError
    with pytest.raises(JemevalError, match=r"pip install 'jemeval\[attacks\]'"):
        ta_attacks.apgd_ce("linf")
    res = CliRunner().invoke(cli, ["robust", "--model", str(digits_baseline_ckpt), "--norm", "linf", "--attack",
                                   "apgd-ce", "--n", "5", "--device", "cpu"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    lines = [line for line in res.output.splitlines() if "Error" in line]
    assert len(lines) == 1 and "jemeval[attacks]" in lines[0], res.output


@pytest.mark.parametrize("make, words", [
    (lambda: ta_attacks.cw("linf"), "does not support norm 'linf'"),
    (lambda: ta_attacks.apgd_ce("linf", steps=0), "needs steps >= 1"),
    (lambda: ta_attacks.autoattack("linf", version="rnd"), r"unknown AutoAttack version 'rnd' \(did you mean 'rand'"),
    (lambda: ta_attacks.square("l2", loss="hinge"), "loss must be margin or ce"),
])
def test_bad_attack_options_are_usage_errors(make, words):
    with pytest.raises(UsageError, match=words):
        make()


def test_registered_with_the_other_attacks():
    assert {"apgd-ce", "apgd-dlr", "apgd-t", "fab", "square", "cw", "autoattack"} <= set(jemeval.names("attack"))
    assert ta_attacks.square("linf").gradient_free and ta_attacks.cw("l2").minimization
    assert ta_attacks.autoattack("linf", version="rand").supports_eot
    assert not ta_attacks.autoattack("linf").supports_eot
