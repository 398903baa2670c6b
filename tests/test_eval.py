"""`jemeval eval`: accuracy and NLL against plain torch, input noise, SGLD refinement, CLI errors."""
from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

import jemeval
from jemeval.cli import cli
from jemeval.evaluation.accuracy import evaluate


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_accuracy_and_nll_match_torch(clf):
    ds = jemeval.load_dataset("digits", "test")
    with torch.no_grad():
        logits = clf.net(ds.x).double()
    (record,) = evaluate(clf, progress=False).records
    assert record["accuracy"] == pytest.approx((logits.argmax(1) == ds.y).double().mean().item())
    assert record["nll"] == pytest.approx(torch.nn.functional.cross_entropy(logits, ds.y).item(), abs=1e-6)
    assert record["n"] == 450 and record["refine_steps"] == 0 and record["data"] == "digits"
    assert record["accuracy"] > 0.9


def test_sigma_noise_is_explicit_seeded_and_recorded(clf):
    ds = jemeval.load_dataset("digits", "test")
    a = evaluate(clf, input_sigma=0.5, seed=7, progress=False)
    with pytest.warns(DeprecationWarning, match="'sigma' is now 'input_sigma'"):
        b = evaluate(clf, sigma=0.5, seed=7, progress=False)  # the old name, for one release
    assert a.records[0]["nll"] == b.records[0]["nll"]
    noisy = ds.x + 0.5 * torch.randn(ds.x.shape, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(clf.net(noisy).double(), ds.y).item()
    assert a.records[0]["nll"] == pytest.approx(expected, abs=1e-5)
    assert a.records[0]["sigma"] == 0.5
    assert a.provenance["settings"]["sigma"] == 0.5 and a.provenance["settings"]["noise_seed"] == 7


def test_refinement_rows_and_identity_refinement(clf):
    # zero step size and zero noise: SGLD leaves inputs unchanged, so K = 2 must equal K = 0
    result = evaluate(clf, refine_steps=[0, 2], chains=2, sgld_step_size=0.0, sgld_noise=0.0, n=64, progress=False)
    with pytest.warns(DeprecationWarning) as caught:
        old = evaluate(clf, refine_steps=[0, 2], chains=2, step_size=0.0, noise=0.0, n=64, progress=False)
    assert {str(w.message).split(" (")[0] for w in caught} == {
        "evaluate(): the keyword 'step_size' is now 'sgld_step_size'",
        "evaluate(): the keyword 'noise' is now 'sgld_noise'"}
    assert old.records == result.records
    plain, refined = result.records
    assert (plain["refine_steps"], refined["refine_steps"]) == (0, 2)
    assert refined["accuracy"] == plain["accuracy"]
    assert refined["nll"] == pytest.approx(plain["nll"], abs=1e-6)
    settings = result.provenance["settings"]["refinement"]["2"]
    assert settings["chains"] == 2 and settings["sgld"]["step_size"] == 0.0 and settings["sgld"]["noise"] == 0.0


def test_refinement_moves_inputs_and_is_seeded(clf):
    a = evaluate(clf, refine_steps=1, chains=2, chain_sigma=0.1, n=64, seed=3, progress=False)
    b = evaluate(clf, refine_steps=1, chains=2, chain_sigma=0.1, n=64, seed=3, progress=False)
    plain = evaluate(clf, n=64, seed=3, progress=False)
    assert a.records[0]["nll"] == b.records[0]["nll"]
    assert a.records[0]["nll"] != plain.records[0]["nll"]
    assert a.provenance["settings"]["refinement"]["1"]["sgld"]["step_size"] == 1.0  # JEM's default


def test_cli_json_and_errors(digits_classifier_ckpt):
    r = run("eval", "--model", digits_classifier_ckpt, "--n", 50, "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["records"][0]["n"] == 50
    for args, message in [
        (["--refine-steps", "a"], "--refine-steps must be comma-separated integers"),
        (["--refine-steps", "-1"], "--refine-steps must be integers >= 0"),
        (["--data", "uniform"], "unlabelled"),
        (["--chains", "0"], "--chains must be >= 1"),
    ]:
        r = run("eval", "--model", digits_classifier_ckpt, *args, "--device", "cpu")
        assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, (args, r.output)
    r = run("eval", "--model", "/nonexistent/best.pt", "--device", "cpu")
    assert r.exit_code == 1 and "does not exist" in r.output
