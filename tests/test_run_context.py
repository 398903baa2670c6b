"""Issue 24 items 2, 3 and 5 (findings 2, 4, 7): evaluation grouped by capability, one run context, the
caches under its policy; written as the attacks.

- a plugin written against 0.2 imports the old module paths: every moved name still resolves, to the
  very object at its new home, with one DeprecationWarning naming that home; what only the old module
  imported (``resolve_device``) is not passed off as a public name;
- the keyword API and the context are one call: the same numbers either way, a keyword beside
  ``context=`` replaces that field, a bad batch size is refused in one line before a model is read;
- a poisoned detector-cache entry (valid key and checksum, changed values: the cache cannot tell) is
  never read when the policy says so (``cache=False``, ``--no-cache``, a report run with it), and
  nothing is written; a policy's folder receives the states instead of ``$JEMEVAL_CACHE_DIR``;
- fidelity's reference-features file is left alone when the policy neither reads nor writes, and the
  verified Inception weights are not kept in the process when the policy says ``memory=False``, even
  when the call fails.

The models are untrained digits networks saved here (no training fixture): every number is compared
with the same computation made the other way.
"""
from __future__ import annotations

import importlib
import inspect
import json
import warnings

import click
import pytest
import torch
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

import jemeval
import jemeval.caches.detectors as detector_cache
from jemeval.cli import cli
from jemeval.context import FIELDS, CachePolicy, RunContext
from jemeval.errors import UsageError
from jemeval.evaluation.fidelity import inception
from jemeval.evaluation.fidelity.evaluate import fidelity
from jemeval.evaluation.ood.evaluate import evaluate_ood

# -- item 1: 0.2's module paths ------------------------------------------------------------------------
#: (old module, a name it had, the module that now defines it)
MOVED = [
    ("jemeval.evaluation.ood", "evaluate_ood", "jemeval.evaluation.ood.evaluate"),
    ("jemeval.evaluation.ood", "compute_ood_scores", "jemeval.evaluation.ood.evaluate"),
    ("jemeval.evaluation.ood", "OODScores", "jemeval.evaluation.ood.evaluate"),
    ("jemeval.evaluation.ood", "DEFAULT_SCORES", "jemeval.evaluation.ood.evaluate"),
    ("jemeval.evaluation.ood_sets", "expand_groups", "jemeval.evaluation.ood.sets"),
    ("jemeval.evaluation.ood_fit", "fit_sets", "jemeval.evaluation.ood.fit"),
    ("jemeval.evaluation.ood_tune", "tune_scores", "jemeval.evaluation.ood.tune"),
    ("jemeval.evaluation.robustness", "robust", "jemeval.evaluation.robust.evaluate"),
    ("jemeval.evaluation.robustness", "DEFAULT_EPSILONS", "jemeval.evaluation.robust.evaluate"),
    ("jemeval.evaluation.robustness", "sanity_checks", "jemeval.evaluation.robust.evaluate"),
    ("jemeval.evaluation.attack_loop", "run_attacks", "jemeval.evaluation.robust.attack_loop"),
    ("jemeval.evaluation.robust_checks", "reaches_everything", "jemeval.evaluation.robust.checks"),
    ("jemeval.evaluation.threat", "perturbation_norm", "jemeval.evaluation.robust.threat"),
    ("jemeval.evaluation.intervals", "wilson_interval", "jemeval.evaluation.robust.intervals"),
    ("jemeval.evaluation.fidelity", "fidelity", "jemeval.evaluation.fidelity.evaluate"),
    ("jemeval.evaluation.fidelity", "frechet_distance", "jemeval.evaluation.fidelity.evaluate"),
    ("jemeval.evaluation.fidelity", "check_inception_weights", "jemeval.evaluation.fidelity.evaluate"),
    ("jemeval.evaluation.inception", "check_extractor_weights", "jemeval.evaluation.fidelity.inception"),
    ("jemeval.evaluation.extractors", "library_metrics", "jemeval.evaluation.fidelity.extractors"),
    ("jemeval.evaluation.calibration", "held_out_indices", "jemeval.data"),
    ("jemeval.evaluation.batching", "prepare_model", "jemeval.evaluation.inputs"),
    ("jemeval.evaluation.batching", "training_dataset", "jemeval.evaluation.inputs"),
    ("jemeval.evaluation.batching", "recorded_dataset", "jemeval.evaluation.inputs"),
    ("jemeval.evaluation.batching", "check_input_shape", "jemeval.evaluation.inputs"),
    ("jemeval.evaluation.batching", "check_refine_steps", "jemeval.evaluation.inputs"),
    ("jemeval.evaluation.batching", "check_min", "jemeval.evaluation.inputs"),
]


@pytest.mark.parametrize("old, name, new", MOVED, ids=[f"{o}.{n}" for o, n, _ in MOVED])
def test_a_0_2_import_still_works_and_names_the_new_path(old, name, new):
    with pytest.warns(DeprecationWarning) as caught:
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)
    assert len(caught) == 1 and new in str(caught[0].message) and "next release" in str(caught[0].message)


@pytest.mark.parametrize("module, name", [
    ("jemeval.evaluation.accuracy", "evaluate"), ("jemeval.evaluation.calibration", "calibrate"),
    ("jemeval.evaluation.generation", "sample"), ("jemeval.evaluation.distal", "distal"),
    ("jemeval.evaluation.batching", "run_batches"), ("jemeval.evaluation.batching", "check_finite_outputs"),
    ("jemeval.evaluation.metrics", "auroc"), ("jemeval.data", "held_out_indices")])
def test_names_that_stayed_do_not_warn(module, name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert callable(getattr(importlib.import_module(module), name))


@pytest.mark.parametrize("old, name", [("jemeval.evaluation.fidelity", "resolve_device"),
                                       ("jemeval.evaluation.robustness", "torch"),
                                       ("jemeval.evaluation.ood", "no_such_name"),
                                       ("jemeval.evaluation.batching", "no_such_name")])
def test_what_the_old_module_only_imported_is_not_a_moved_name(old, name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            getattr(importlib.import_module(old), name)


def test_the_public_api_reads_the_new_homes_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("evaluate_ood", "calibrate", "evaluate", "robust", "sample", "fidelity", "report",
                     "RunContext", "CachePolicy"):
            assert getattr(jemeval, name) is not None


# -- item 2: one run context ---------------------------------------------------------------------------
ENTRY_POINTS = ["evaluate_ood", "calibrate", "evaluate", "robust", "sample", "fidelity", "report"]


@pytest.mark.parametrize("name", [*ENTRY_POINTS, "distal"])
def test_every_entry_point_takes_the_context_and_its_fields(name):
    fn = getattr(jemeval, name) if name != "distal" else importlib.import_module("jemeval.evaluation.distal").distal
    params = inspect.signature(fn).parameters
    assert {*FIELDS, "context"} <= set(params), sorted(params)
    assert all(params[f].kind is inspect.Parameter.KEYWORD_ONLY for f in (*FIELDS, "context"))


def _numbers(result):
    return [{k: v for k, v in r.items()} for r in result.records], {
        k: v for k, v in result.provenance["settings"].items() if k not in ("detectors",)}


def test_keywords_and_the_context_are_the_same_call(home):
    by_keywords = evaluate_ood("m.pt", "uniform,interp", n=50, input_sigma=0.1, seed=3, device="cpu",
                               progress=False, batch_size=16)
    context = RunContext(seed=3, device="cpu", progress=False, batch_size=16)
    by_context = evaluate_ood("m.pt", "uniform,interp", n=50, input_sigma=0.1, context=context)
    assert _numbers(by_keywords) == _numbers(by_context)
    assert by_context.provenance["seed"] == 3 and by_context.provenance["settings"]["batch_size"] == 16
    # a keyword beside context= replaces that field of it (the context itself is left as it was)
    other = RunContext(seed=99, device="cpu", progress=False, batch_size=16)
    assert _numbers(evaluate_ood("m.pt", "uniform,interp", n=50, input_sigma=0.1, context=other, seed=3)) == \
        _numbers(by_keywords)
    assert other.seed == 99
    # and the seed really reaches the computation: another seed, other noise, other numbers
    assert _numbers(evaluate_ood("m.pt", "uniform,interp", n=50, input_sigma=0.1, context=other))[0] != \
        _numbers(by_keywords)[0]


def test_the_default_batch_size_is_each_functions_own(home):
    calibrated = jemeval.calibrate("m.pt", n=20, device="cpu", progress=False)
    assert calibrated.provenance["settings"]["batch_size"] == 256
    attacked = jemeval.robust("m.pt", norm="l2", n=4, steps=1, epsilons=[0.0, 0.5], device="cpu", progress=False)
    assert attacked.provenance["settings"]["batch_size"] == 100


@pytest.mark.parametrize("call", [
    lambda: RunContext(batch_size=0),
    lambda: evaluate_ood("no-such-model.pt", "uniform", batch_size=0, device="cpu"),
    lambda: jemeval.robust("no-such-model.pt", norm="l2", batch_size=-3, device="cpu"),
    lambda: jemeval.sample("no-such-model.pt", context=RunContext(device="cpu"), batch_size=float("nan")),
], ids=["RunContext", "evaluate_ood", "robust", "sample"])
def test_a_bad_batch_size_is_one_line_before_any_model_is_read(call):
    with pytest.raises(UsageError, match="batch_size must be >= 1") as info:
        call()
    assert info.value.param == "batch_size" and "\n" not in str(info.value)


def test_a_context_that_is_no_run_context_is_one_line():
    with pytest.raises(UsageError, match="context must be a jemeval.RunContext, got dict"):
        evaluate_ood("no-such-model.pt", "uniform", context={"seed": 1})


def test_the_command_line_refuses_a_bad_batch_size_in_one_line_and_touches_nothing(home):
    before = snapshot(home)
    result = runner().invoke(cli, ["ood", "--model", "m.pt", "--ood", "uniform", "--batch-size", "0",
                                   "--device", "cpu", "--out", "r.json"])
    assert_one_line_refusal(result, "--batch-size must be >= 1")
    assert snapshot(home) == before


COMMANDS = ["ood", "calibrate", "eval", "robust", "distal", "sample", "fidelity", "report"]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_evaluation_command_builds_one_context_from_one_bundle(name):
    command = cli.get_command(click.Context(cli), name)
    flags = {o for p in command.params for o in p.opts}
    assert {"--seed", "--device"} <= flags
    if name not in ("distal",):
        assert "--data-root" in flags
    own = inspect.signature(inspect.unwrap(command.callback)).parameters
    assert "context" in own and not {"seed", "device", "batch_size", "data_root", "download"} & set(own), list(own)


# -- item 3: the caches under the context's policy ------------------------------------------------------
def _knn(**kw):
    return evaluate_ood("m.pt", "uniform", scores=["knn"], n=60, device="cpu", progress=False, **kw)


def _poison(state_file):
    """The attack: an entry with the right key and a checksum that matches its changed values (what an
    attacker with write access to the cache folder can make; the cache cannot tell it apart)."""
    saved = torch.load(state_file, weights_only=True)
    saved["state"] = {k: (v + 5.0 * torch.randn_like(v) if torch.is_tensor(v) and v.is_floating_point() else v)
                      for k, v in saved["state"].items()}
    saved["state_sha256"] = detector_cache.state_sha256(saved["state"])
    torch.save(saved, state_file)


def test_a_poisoned_cache_entry_is_never_read_when_the_policy_says_so(home):
    clean = _knn()
    (state_file,) = (home / "jc" / "detectors").glob("knn-*.pt")
    _poison(state_file)
    poisoned = _knn()
    assert poisoned.provenance["settings"]["detectors"]["knn"]["fit"] == "cached"  # the default policy reads it
    assert poisoned.records[0]["auroc"] != clean.records[0]["auroc"]
    before = snapshot(home / "jc")
    for result in (_knn(cache=False), _knn(context=RunContext(cache=CachePolicy(read=False, write=False)))):
        info = dict(result.provenance["settings"]["detectors"]["knn"])
        assert info.pop("state_bytes") > 0
        assert info == {"options": {}, "fit": "fitted", "cache": None}
        assert result.records[0]["auroc"] == clean.records[0]["auroc"]
    assert snapshot(home / "jc") == before  # not read, not replaced


def test_no_cache_on_the_command_line_and_in_a_report(home):
    _knn()
    (state_file,) = (home / "jc" / "detectors").glob("knn-*.pt")
    _poison(state_file)
    before = snapshot(home / "jc")
    result = runner().invoke(cli, ["ood", "--model", "m.pt", "--ood", "uniform", "--score", "knn", "--n", "60",
                                   "--device", "cpu", "--no-cache", "--json"])
    assert result.exit_code == 0, result.output + result.stderr
    assert json.loads(result.stdout)["provenance"]["settings"]["detectors"]["knn"]["fit"] == "fitted"
    report = jemeval.report("m.pt", out=home / "rep", sections="ood", options={"ood": {"scores": ["knn"], "n": 60}},
                            device="cpu", progress=False, cache=False)
    (ood_result,) = report.results["m"]["ood"]
    assert ood_result.provenance["settings"]["detectors"]["knn"]["fit"] == "fitted"
    assert snapshot(home / "jc") == before


def test_the_policy_folder_holds_the_states_instead_of_the_default(home, tmp_path_factory):
    mine = tmp_path_factory.mktemp("policy-cache")
    policy = CachePolicy(dir=mine)
    first = _knn(cache=policy)
    second = _knn(context=RunContext(cache=policy))
    assert first.provenance["settings"]["detectors"]["knn"]["fit"] == "fitted"
    assert second.provenance["settings"]["detectors"]["knn"]["fit"] == "cached"
    assert second.provenance["settings"]["detectors"]["knn"]["cache"].startswith(str(mine / "detectors"))
    assert len(list((mine / "detectors").glob("knn-*.pt"))) == 1 and not (home / "jc").exists()
    assert first.records == second.records


def test_a_read_only_policy_writes_nothing(home):
    result = _knn(cache=CachePolicy(write=False))
    assert result.provenance["settings"]["detectors"]["knn"]["cache"] is None and not (home / "jc").exists()


def test_a_reference_features_file_is_left_alone_when_the_policy_says_so(samples, home):
    plain = fidelity("s.npz", "digits", features="m.pt", metrics="fd", device="cpu")
    off = fidelity("s.npz", "digits", features="m.pt", metrics="fd", device="cpu", ref_cache="rc.npz", cache=False)
    assert not (home / "rc.npz").exists() and "ref_cache" not in off.provenance["settings"]
    assert any("ref_cache 'rc.npz' left alone" in n for n in off.notes)
    assert [r["value"] for r in off.records] == [r["value"] for r in plain.records]
    on = fidelity("s.npz", "digits", features="m.pt", metrics="fd",
                  context=RunContext(device="cpu", cache=CachePolicy(reference_features=home / "rc.npz")))
    assert (home / "rc.npz").is_file() and on.provenance["settings"]["ref_cache"]["written"]


def _verified(tmp_path) -> None:
    """Inception weights of the right shapes, verified: what a fidelity run keeps in the process."""
    path = tmp_path / "inception.pth"
    torch.save({"Conv2d_1a_3x3.conv.weight": torch.randn(32, 3, 3, 3), "fc.weight": torch.randn(1008, 2048)}, path)
    inception.check_extractor_weights(path)
    assert inception._VERIFIED


def test_verified_weights_stay_in_the_process_only_when_the_policy_keeps_them(samples, home):
    _verified(home)
    fidelity("s.npz", "digits", features="m.pt", metrics="fd", device="cpu")
    assert inception._VERIFIED  # the default policy keeps them for the next call
    fidelity("s.npz", "digits", features="m.pt", metrics="fd", device="cpu", cache=CachePolicy(memory=False))
    assert not inception._VERIFIED
    _verified(home)
    with pytest.raises(UsageError, match="unknown metric"):  # a failing call drops them too
        fidelity("s.npz", "digits", metrics="fid,bogus", device="cpu", cache=CachePolicy(memory=False))
    assert not inception._VERIFIED
