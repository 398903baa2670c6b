"""Attacks that show they converged (issue 27 item 3): `robust(eot_samples=[...], steps=[...])` and
`jemeval robust --eot-samples 1,5,10,20 --steps 10,50,100` run every count on the same inputs and
seeds and flag a curve whose robust accuracy still drops by more than its Wilson half-width between
the last two counts.

The acceptance model needs many EOT samples by construction (:class:`Wiggly`): a nearest-class-mean
linear classifier on digits plus ``B sin(omega z) @ r``, a term whose expectation under the chains'
noise is ``exp(-omega^2 sigma^2 / 2) B sin(omega z) @ r`` (e^-112 at omega 50, sigma 0.3: nothing),
but whose gradient in one noise draw carries ``B omega cos(.)`` = +-2.5 per pixel against the
linear term's ~1. The defence the attacker faces is the linear one; a single draw's gradient points
mostly at noise, and averaging N draws shrinks that noise only as 1/sqrt(N), so robust accuracy
keeps falling with the EOT count long after EOT = 1 has claimed robustness.
"""
from __future__ import annotations

import pytest
import torch
from test_bad_inputs import assert_one_line_refusal, runner, snapshot
from torch import nn

import jemeval
from jemeval.cli import cli
from jemeval.energy.model import EnergyModel
from jemeval.evaluation.robust.checks import convergence, mark_converged, sanity_checks
from jemeval.evaluation.robust.evaluate import robust
from jemeval.evaluation.robust.intervals import wilson_interval

#: keys that differ between two runs of the same attack (wall time) or only exist after a sweep
UNPAIRED = ("seconds", "converged")


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
    low, high = wilson_interval(round(last * 200), 200)  # independent of the records' own interval
    assert before - last > (high - low) / 2  # the sweep's last step still drops by more than the half-width
    assert all(r["converged"] is False for r in res.records if r["epsilon"] == 0.2)
    assert all(r["converged"] is True for r in res.records if r["epsilon"] == 0)  # nothing attacked: flat
    message = (f"pgd K=1 eot eps=0.2: {before:.3f} -> {last:.3f} from 4 to 16 EOT samples, more than the "
               f"{(high - low) / 2:.3f} half-width: not converged")
    (check,) = [c for c in res.extra["checks"] if c["check"] == "attack_converged"]
    assert not check["passed"] and check["message"].startswith("WARNING: " + message)
    assert check["message"] in res.notes and check["axis"] == "eot_samples"
    (verdict,) = [v for v in res.extra["convergence"] if v["epsilon"] == 0.2]
    assert verdict["counts"] == [1, 4, 16] and verdict["robust_accuracy"] == accs and verdict["converged"] is False
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

    # carried on to 64 draws, the same defence's curve flattens: converged (and the paired 16 is the same run)
    longer = robust(model, eot_samples=[16, 64], **NOISY)
    assert paired(at(longer, 0.2, eot_samples=16)) == paired(at(res, 0.2, eot_samples=16))
    drop = at(longer, 0.2, eot_samples=16)["robust_accuracy"] - at(longer, 0.2, eot_samples=64)["robust_accuracy"]
    rec64 = at(longer, 0.2, eot_samples=64)
    assert drop <= (rec64["ci_high"] - rec64["ci_low"]) / 2 and rec64["converged"] is True
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
    res = robust(model, eot_samples=[1, 4, 16], steps=[10, 20], **common)
    assert sorted((r["grad_mode"], r["eot_samples"], r["steps"]) for r in res.records) == sorted(
        [("full", 1, 10)] * 3 + [("full", 1, 20)] * 3)  # deterministic: the EOT mode collapses to full
    for eps in (0.1, 0.2):
        a, b = at(res, eps, steps=10)["robust_accuracy"], at(res, eps, steps=20)["robust_accuracy"]
        low, high = wilson_interval(round(b * 100), 100)
        assert a - b <= (high - low) / 2
    assert 0.1 < at(res, 0.1, steps=20)["robust_accuracy"] < 0.9  # a point where the attack has work to do
    assert all(r["converged"] is True for r in res.records)
    by_axis = {v["axis"]: v for v in res.extra["convergence"] if v["epsilon"] == 0.2}
    assert by_axis["eot_samples"]["converged"] is True and by_axis["eot_samples"]["half_width"] is None
    assert "deterministic at K=0" in by_axis["eot_samples"]["message"]
    assert by_axis["steps"]["counts"] == [10, 20] and by_axis["steps"]["converged"] is True
    checks = [c for c in res.extra["checks"] if c["check"] == "attack_converged"]
    assert {c["axis"] for c in checks} == {"eot_samples", "steps"} and all(c["passed"] for c in checks)
    # a single steps count and EOT count keep meaning what they did: the sweep's steps=20 run, exactly
    single = robust(model, eot_samples=16, steps=20, **common)
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


def _rec(eps, acc, n=100, **counts):
    low, high = wilson_interval(round(acc * n), n)
    return {"attack": "pgd", "refine_steps": 2, "grad_mode": "eot", "epsilon": eps, "robust_accuracy": acc,
            "clean_accuracy": 0.9, "n": n, "ci_low": low, "ci_high": high, "norm": "linf", **counts}


def test_the_verdict_compares_the_last_two_counts_with_the_last_half_width():
    half = (lambda lo_hi: (lo_hi[1] - lo_hi[0]) / 2)(wilson_interval(40, 100))  # 0.40 on n = 100: 0.095
    recs = [_rec(0.1, 0.90, eot_samples=1, steps=10), _rec(0.1, 0.50, eot_samples=5, steps=10),
            _rec(0.1, 0.40, eot_samples=10, steps=10),                       # 0.50 -> 0.40: 0.10 > 0.095
            _rec(0.2, 0.60, eot_samples=1, steps=10), _rec(0.2, 0.49, eot_samples=5, steps=10),
            _rec(0.2, 0.40, eot_samples=10, steps=10)]                       # 0.49 -> 0.40: 0.09 <= 0.095
    verdicts = convergence(recs, swept=["eot_samples"])
    assert [(v["epsilon"], v["converged"]) for v in verdicts] == [(0.1, False), (0.2, True)]
    assert verdicts[0]["half_width"] == pytest.approx(half) and verdicts[0]["counts"] == [1, 5, 10]
    mark_converged(recs, verdicts)
    assert [r["converged"] for r in recs] == [False] * 3 + [True] * 3
    checks = sanity_checks(recs, verdicts=verdicts)
    (check,) = [c for c in checks if c["check"] == "attack_converged"]
    assert not check["passed"] and "eps=0.1: 0.500 -> 0.400 from 5 to 10 EOT samples" in check["message"]
    assert "eps=0.2" not in check["message"]
    # a rise is no drop; one axis failing fails the record, an axis that does not apply (None) does not count
    recs[2]["robust_accuracy"] = 0.55
    assert convergence(recs, swept=["eot_samples"])[0]["converged"] is True
    both = convergence(recs, swept=["eot_samples", "steps"])
    assert [v["converged"] for v in both if v["axis"] == "steps"] == [None, None]  # one steps count: no sweep
    # the verdict is taken at the other axis's largest count
    recs += [_rec(0.1, 0.55, eot_samples=5, steps=50), _rec(0.1, 0.30, eot_samples=10, steps=50)]
    (v,) = [v for v in convergence(recs, swept=["eot_samples"]) if v["epsilon"] == 0.1]
    assert v["counts"] == [5, 10] and v["robust_accuracy"] == [0.55, 0.30] and v["converged"] is False


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
