"""Attacks that show they converged (issue 27 item 3): `robust(eot_samples=[...], steps=[...])` and
`jemeval robust --eot-samples 1,5,10,20 --steps 10,50,100` run every count on the same inputs and
seeds; a curve is converged only when the last two counts' paired outcomes show no significant drop
(exact McNemar) and the drop's upper 95% limit (Newcombe) is below the tolerance (issue 33 item 3).

The acceptance model needs many EOT samples by construction (:class:`Wiggly`): a nearest-class-mean
linear classifier on digits plus ``B sin(omega z) @ r``, a term whose expectation under the chains'
noise is ``exp(-omega^2 sigma^2 / 2) B sin(omega z) @ r`` (e^-112 at omega 50, sigma 0.3: nothing),
but whose gradient in one noise draw carries ``B omega cos(.)`` = +-2.5 per pixel against the
linear term's ~1. The defence the attacker faces is the linear one; a single draw's gradient points
mostly at noise, and averaging N draws shrinks that noise only as 1/sqrt(N), so robust accuracy
keeps falling with the EOT count long after EOT = 1 has claimed robustness.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import binomtest
from test_bad_inputs import assert_one_line_refusal, runner, snapshot
from torch import nn

import jemeval
from jemeval.cli import cli
from jemeval.energy.model import EnergyModel
from jemeval.evaluation.robust.checks import sanity_checks
from jemeval.evaluation.robust.convergence import convergence, mark_converged, paired_difference_interval
from jemeval.evaluation.robust.evaluate import robust
from jemeval.evaluation.robust.intervals import wilson_interval

#: keys that differ between two runs of the same attack (wall time) or only exist after a sweep
UNPAIRED = ("seconds", "converged", "flags")


class Wiggly(nn.Module):
    """Nearest class mean on digits (logits w_c . z - |w_c|^2 / 2) plus ``B sin(omega z) @ r.T``, r in
    {-1, 1}^(10 x 64) fixed: see the module docstring. B = 0 is the plain linear classifier."""

    def __init__(self, b: float, omega: float = 50.0):
        super().__init__()
        train = jemeval.load_dataset("digits", "train")
        z, y = train.x.flatten(1), train.y
        means = torch.stack([z[y == c].mean(0) for c in range(10)])
        self.linear = nn.Linear(64, 10)
        with torch.no_grad():
            self.linear.weight.copy_(means)
            self.linear.bias.copy_(-0.5 * (means ** 2).sum(1))
        signs = torch.randint(0, 2, (10, 64), generator=torch.Generator().manual_seed(0)).float() * 2 - 1
        self.register_buffer("r", signs)
        self.b, self.omega = b, omega

    def forward(self, x):
        z = x.flatten(1)
        return self.linear(z) + self.b * torch.sin(self.omega * z) @ self.r.T


def wiggly(b: float) -> EnergyModel:
    return EnergyModel(Wiggly(b), num_classes=10, input_shape=(1, 8, 8), arch="wiggly").eval()


#: K = 1 SGLD step (small, noiseless) after chain noise 0.3: refinement with large chain noise
NOISY = dict(norm="linf", refine_steps=1, sgld_step_size=0.01, sgld_noise=0.0, attacks="pgd", epsilons=[0, 0.2],
             data="digits", n=200, steps=10, grad_mode="eot", chains=2, chain_sigma=0.3, device="cpu", progress=False)


def at(result, eps, **counts):
    (rec,) = [r for r in result.records if r["epsilon"] == eps and all(r[k] == v for k, v in counts.items())]
    return rec


def paired(rec):
    return {k: v for k, v in rec.items() if k not in UNPAIRED}


def test_eot_sweep_flags_a_defence_whose_attack_needs_many_eot_samples(tmp_path):
    model = wiggly(0.05)
    res = robust(model, eot_samples=[16, 1, 4], **NOISY)  # any order: the counts are sorted
    accs = [at(res, 0.2, eot_samples=c)["robust_accuracy"] for c in (1, 4, 16)]
    assert accs[0] > accs[2] + 0.15  # EOT = 1 overestimates robustness
    before, last = accs[1], accs[2]
    (verdict,) = [v for v in res.extra["convergence"] if v["epsilon"] == 0.2]
    b, c = verdict["broken"], verdict["gained"]
    assert b - c == round((before - last) * 200)  # the paired counts explain the drop of the two accuracies
    assert verdict["p_value"] == pytest.approx(binomtest(b, b + c).pvalue) and verdict["p_value"] < 0.05  # scipy
    assert all(r["converged"] is False for r in res.records if r["epsilon"] == 0.2)
    assert all(r["converged"] is True for r in res.records if r["epsilon"] == 0)  # nothing attacked: flat
    message = f"pgd K=1 eot eps=0.2: {before:.3f} -> {last:.3f} from 4 to 16 EOT samples, {b} inputs broken and {c}"
    (check,) = [c for c in res.extra["checks"] if c["check"] == "attack_converged"]
    assert not check["passed"] and check["message"].startswith("WARNING: " + message)
    assert "not converged (the drop is significant)" in check["message"]
    assert check["message"] in res.notes and check["axis"] == "eot_samples"
    assert verdict["counts"] == [1, 4, 16] and verdict["robust_accuracy"] == accs and verdict["converged"] is False
    assert res.provenance["settings"]["sweep"]["converge_tolerance"] == 0.01
    assert res.provenance["settings"]["eot_samples"] == [1, 4, 16]
    assert res.provenance["settings"]["sweep"]["eot_samples"] == [1, 4, 16]
    # the other checks judge the sweep's last count only (one curve, not three)
    assert len([c for c in res.extra["checks"] if c["check"] == "non_increasing"]) == 1

    # paired: a count of the sweep is exactly the run of that single count (inputs, attack seeds, re-check noise)
    single = robust(model, eot_samples=16, **NOISY)
    assert [paired(r) for r in single.records] == [paired(at(res, e, eot_samples=16)) for e in (0, 0.2)]
    assert all(r["converged"] is None for r in single.records) and "convergence" not in single.extra
    assert "attack_converged" not in {c["check"] for c in single.extra["checks"]}
    assert single.provenance["settings"]["eot_samples"] == 16 and "sweep" not in single.provenance["settings"]

    # carried on from 64 to 128 draws, the same defence's curve flattens (measured: 5 inputs broken, 2
    # regained): no significant drop, and converged at a tolerance its 200 inputs can resolve
    longer = robust(model, eot_samples=[64, 128], converge_tolerance=0.05, **NOISY)
    (flat,) = [v for v in longer.extra["convergence"] if v["epsilon"] == 0.2]
    assert flat["p_value"] >= 0.05 and flat["drop_ci_high"] < 0.05 and flat["converged"] is True
    assert at(longer, 0.2, eot_samples=128)["converged"] is True
    assert [c["passed"] for c in longer.extra["checks"] if c["check"] == "attack_converged"] == [True]

    # the figure: beside accuracy vs epsilon (at the last count), accuracy vs EOT samples, the curve flagged
    from jemeval.plots.robustness import draw_robust_sweep, plot_robust_result

    fig = draw_robust_sweep(res.records, res.extra["convergence"], title="t")
    eps_panel, sweep_panel = fig.axes
    (line,) = [ln for ln in sweep_panel.get_lines() if "NOT converged" in ln.get_label()]
    assert list(line.get_xdata()) == [1, 4, 16] and list(line.get_ydata()) == accs
    assert {ln.get_label() for ln in eps_panel.get_lines() if not ln.get_label().startswith("_")} == {"K=1 pgd (eot)"}
    assert plot_robust_result(res, tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_deterministic_defence_is_converged():
    """K = 0 without noise: every EOT count is the same attack (run once, converged by construction),
    and PGD on a linear classifier has converged by 10 steps (measured: flat from 10 to 20)."""
    model = wiggly(0.0)
    common = dict(norm="linf", refine_steps=0, attacks="pgd", epsilons=[0, 0.1, 0.2], data="digits", n=100,
                  grad_mode="eot", chains=2, device="cpu", progress=False)
    res = robust(model, eot_samples=[1, 4, 16], steps=[10, 20], converge_tolerance=0.05, **common)
    assert sorted((r["grad_mode"], r["eot_samples"], r["steps"]) for r in res.records) == sorted(
        [("full", 1, 10)] * 3 + [("full", 1, 20)] * 3)  # deterministic: the EOT mode collapses to full
    for eps in (0.1, 0.2):
        a, b = at(res, eps, steps=10)["robust_accuracy"], at(res, eps, steps=20)["robust_accuracy"]
        low, high = wilson_interval(round(b * 100), 100)
        assert a - b <= (high - low) / 2
    assert 0.1 < at(res, 0.1, steps=20)["robust_accuracy"] < 0.9  # a point where the attack has work to do
    assert all(r["converged"] is True for r in res.records)
    by_axis = {v["axis"]: v for v in res.extra["convergence"] if v["epsilon"] == 0.2}
    assert by_axis["eot_samples"]["converged"] is True and by_axis["eot_samples"].get("drop") is None
    assert "deterministic at K=0" in by_axis["eot_samples"]["message"]
    assert by_axis["steps"]["counts"] == [10, 20] and by_axis["steps"]["converged"] is True
    assert (by_axis["steps"]["broken"], by_axis["steps"]["gained"]) == (0, 0)
    # no input changed, but 100 inputs cannot rule out a drop of one point: not converged at the default
    strict = robust(model, eot_samples=1, steps=[10, 20], **common)
    (v,) = [v for v in strict.extra["convergence"] if v["epsilon"] == 0.2]
    assert v["drop_ci_high"] > 0.01 and v["converged"] is False and "more inputs" in v["message"]
    checks = [c for c in res.extra["checks"] if c["check"] == "attack_converged"]
    assert {c["axis"] for c in checks} == {"eot_samples", "steps"} and all(c["passed"] for c in checks)
    # a single steps count and EOT count keep meaning what they did: the sweep's steps=20 run, exactly
    single = robust(model, eot_samples=16, steps=20, converge_tolerance=0.05, **common)
    assert [paired(r) for r in single.records] == [paired(at(res, e, steps=20)) for e in (0, 0.1, 0.2)]


def test_a_sweep_that_changes_no_run_says_so():
    """Single-draw gradients at a noisy K never read the EOT count: no verdict, and a note instead of
    a silent sweep that measured nothing."""
    res = robust(wiggly(0.05), norm="linf", refine_steps=0, attacks="pgd", epsilons=[0.2], data="digits", n=20,
                 steps=2, grad_mode="full", chains=2, chain_sigma=0.3, eot_samples=[1, 4], device="cpu", progress=False)
    assert [(r["eot_samples"], r["converged"]) for r in res.records] == [(1, None)]  # run once
    assert "the eot_samples sweep [1, 4] changed no run: EOT samples matter only in the eot and bpda+eot" in (
        " ".join(res.notes))
    assert "attack_converged" not in {c["check"] for c in res.extra["checks"]}


def _curve(eps, before, after, *, n=300, counts=(5, 10), axis="eot_samples"):
    """Records and per-input outcomes of one curve at two counts: ``before``/``after`` the robust inputs."""
    recs, outs = [], []
    for count, robust_set in zip(counts, (before, after)):
        correct = [i in robust_set for i in range(n)]
        low, high = wilson_interval(len(robust_set), n)
        recs.append({"attack": "pgd", "refine_steps": 2, "grad_mode": "eot", "epsilon": eps, "norm": "linf",
                     "robust_accuracy": len(robust_set) / n, "clean_accuracy": 0.9, "n": n, "ci_low": low,
                     "ci_high": high, "eot_samples": count if axis == "eot_samples" else 10,
                     "steps": count if axis == "steps" else 10})
        outs.append({"correct": correct})
    return recs, outs


def test_a_drop_of_six_inputs_and_no_gain_is_not_converged_whatever_the_wilson_half_width():
    """The issue's case: 10 steps break 6 inputs the 1-step attack left robust and regain none: exact McNemar
    p = 2 / 2^6 = 0.031, so not converged, although the drop (0.02) is within the last count's Wilson
    half-width (0.054), the rule 0.3 applied."""
    before = set(range(200))
    recs, outs = _curve(0.1, before, before - set(range(6)), counts=(1, 10), axis="steps")
    low, high = wilson_interval(194, 300)
    assert 0.02 < (high - low) / 2  # the old unpaired rule would have called it converged
    (v,) = convergence(recs, outs, swept=["steps"])
    assert (v["broken"], v["gained"]) == (6, 0) and v["p_value"] == pytest.approx(0.03125)
    assert binomtest(6, 6).pvalue == pytest.approx(0.03125)
    assert v["converged"] is False and "not converged (the drop is significant)" in v["message"]
    mark_converged(recs, [v])
    assert [r["converged"] for r in recs] == [False, False]
    (check,) = [c for c in sanity_checks(recs, verdicts=[v]) if c["check"] == "attack_converged"]
    assert not check["passed"] and "6 inputs broken and 0 regained" in check["message"]


def test_converged_needs_no_significant_drop_and_an_upper_limit_below_the_tolerance():
    same = set(range(195))
    (v,) = convergence(*_curve(0.1, same, same), swept=["eot_samples"])  # nothing changed on 300 inputs
    assert v["drop"] == 0 and v["drop_ci_high"] < 0.01 and v["converged"] is True
    swapped = (same - {0, 1, 2}) | {296, 297, 298}  # 3 broken, 3 regained: no drop, but 300 inputs cannot
    recs, outs = _curve(0.1, same, swapped)         # rule out a drop of one point
    (v,) = convergence(recs, outs, swept=["eot_samples"])
    assert v["p_value"] == 1.0 and v["drop_ci_high"] > 0.01 and v["converged"] is False
    assert "not converged (the limit is not below 0.01: more inputs" in v["message"]
    (v,) = convergence(recs, outs, swept=["eot_samples"], tolerance=0.05)
    assert v["converged"] is True and v["tolerance"] == 0.05
    # a rise is judged as a drop is: a significant gain means the numbers still move
    (v,) = convergence(*_curve(0.1, same - set(range(8)), same), swept=["eot_samples"])
    assert v["drop"] < 0 and v["p_value"] < 0.05 and v["converged"] is False


def test_the_verdict_is_taken_at_the_other_axis_largest_count():
    recs, outs = _curve(0.1, set(range(150)), set(range(150)), counts=(5, 10))
    r2, o2 = _curve(0.1, set(range(150)), set(range(100)), counts=(5, 10))
    for r in r2:
        r["steps"] = 50  # the same EOT counts at more attack steps: the verdict reads these
    (v,) = [v for v in convergence(recs + r2, outs + o2, swept=["eot_samples"])]
    assert v["counts"] == [5, 10] and v["robust_accuracy"] == [0.5, 100 / 300] and v["converged"] is False
    both = convergence(recs, outs, swept=["eot_samples", "steps"])
    assert [v["converged"] for v in both if v["axis"] == "steps"] == [None]  # one steps count: no sweep
    with pytest.raises(ValueError, match="one outcome per record"):
        convergence(recs, outs[:1], swept=["eot_samples"])


def test_newcombe_interval_equals_statsmodels_where_the_pairs_are_uncorrelated():
    """With ad = bc (phi = 0) Newcombe's paired method 10 is his unpaired method 10 on the two margins,
    which statsmodels implements (confint_proportions_2indep, method "newcomb")."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    for a, b, c, d in ((4, 2, 6, 3), (20, 10, 40, 20), (90, 5, 90, 5), (1, 1, 1, 1)):
        assert a * d == b * c
        n = a + b + c + d
        expected = confint_proportions_2indep(a + b, n, a + c, n, method="newcomb", compare="diff")
        assert paired_difference_interval(a, b, c, d) == pytest.approx(tuple(expected), abs=1e-12)


def test_newcombe_interval_covers_the_paired_difference():
    """Coverage of the true p10 - p01 over 2000 tables from each of several paired designs (robust
    outcomes at two attack counts: mostly concordant, a few inputs change): at least 0.93."""
    rng = np.random.default_rng(0)
    for n, probs in ((300, (0.6, 0.02, 0.01, 0.37)), (200, (0.3, 0.005, 0.0, 0.695)), (100, (0.5, 0.1, 0.1, 0.3)),
                     (300, (0.05, 0.01, 0.0, 0.94))):
        truth = probs[1] - probs[2]
        tables = rng.multinomial(n, probs, size=2000)
        covered = [lo <= truth <= hi for lo, hi in (paired_difference_interval(*t) for t in tables)]
        assert np.mean(covered) >= 0.93, (n, probs, np.mean(covered))


def _untrained_digits_cnn(tmp_path):
    from jemeval.energy.factory import create_model
    from jemeval.formats.native import save_checkpoint

    torch.manual_seed(0)
    model = create_model("cnn", 10, (1, 8, 8), width=4, metadata={"dataset": "digits"})
    return save_checkpoint(tmp_path / "m.pt", model, dataset="digits")


def test_cli_sweep_prints_counts_verdicts_and_draws_the_curve(tmp_path):
    import json

    ckpt, plot = _untrained_digits_cnn(tmp_path), tmp_path / "sweep.png"
    args = ["robust", "--model", str(ckpt), "--norm", "linf", "--epsilons", "0,0.1", "--n", "10", "--chains", "2",
            "--chain-sigma", "0.3", "--grad-mode", "eot", "--device", "cpu"]
    res = runner().invoke(cli, [*args, "--eot-samples", "1,2", "--steps", "2,3", "--plot", str(plot), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert sorted({(r["eot_samples"], r["steps"]) for r in out["records"]}) == [(1, 2), (1, 3), (2, 2), (2, 3)]
    assert all(r["converged"] in (True, False) for r in out["records"])
    assert {v["axis"] for v in out["convergence"]} == {"eot_samples", "steps"}
    assert "attack_converged" in {c["check"] for c in out["checks"]}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = runner().invoke(cli, [*args, "--eot-samples", "1,2"])
    assert table.exit_code == 0 and "converged" in table.stdout.splitlines()[0]
    # one count is no sweep: what --eot-samples N always meant
    single = runner().invoke(cli, [*args, "--eot-samples", "2", "--steps", "3", "--json"])
    out = json.loads(single.stdout)
    assert {(r["eot_samples"], r["steps"], r["converged"]) for r in out["records"]} == {(2, 3, None)}
    assert "convergence" not in out and out["provenance"]["settings"]["eot_samples"] == 2


@pytest.mark.parametrize("option, value, words", [
    ("--eot-samples", "0,5", "--eot-samples must be whole numbers >= 1"),
    ("--eot-samples", "5,x", "--eot-samples must be comma-separated integers"),
    ("--steps", "10,-1", "--steps must be whole numbers >= 1"),
    ("--steps", "ten", "--steps must be comma-separated integers"),
])
def test_a_bad_count_in_a_sweep_is_one_line_and_touches_nothing(tmp_path, option, value, words):
    ckpt = _untrained_digits_cnn(tmp_path)
    before = snapshot(tmp_path)
    res = runner().invoke(cli, ["robust", "--model", str(ckpt), "--norm", "linf", "--n", "4", "--device", "cpu",
                                option, value, "--plot", str(tmp_path / "p.png"), "--csv", str(tmp_path / "r.csv")])
    assert_one_line_refusal(res, words)
    assert snapshot(tmp_path) == before
