"""The report scales with models (issue 28 item 3): each set loaded once per report, the bootstrap
side of a model computed once per row, and the cache keyed on the checkpoint's bytes.

Three tiny digits classifiers (trained here in a second, really different weights) are reported
twice: as built, and with the sharing switched off (every set loaded per (model, section), every
run's bootstrap replicates drawn again for every pair it is in). The loads are counted by a spy on
the dataset factories; report.json's numbers must be identical.
"""
from __future__ import annotations

import contextlib
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_bad_inputs import runner
from test_report_groups import tiny

import jemeval.data
import jemeval.provenance
from jemeval.cli import cli
from jemeval.errors import UsageError
from jemeval.evaluation import mrmc
from jemeval.evaluation.figures_of_merit import ECE, Accuracy, Outcomes, bootstrap_counts
from jemeval.reports import build, compare
from jemeval.reports.cache import CACHE
from jemeval.results import Result

ARGS = ["--sections", "accuracy,calibration,ood,robust", "--n", "40", "--refine-steps", "0", "--epsilons", "0,0.5",
        "--ood", "uniform,interp", "--score", "logpx,maxprob", "--set", "robust.n=16", "--set", "robust.steps=2",
        "--device", "cpu"]
#: what report.json holds that a run computes (its provenance aside: times, paths)
NUMBERS = ("records", "comparisons", "groups", "summary", "errors")


def untimed(value):
    """``value`` without its ``seconds`` entries (wall time, the one thing two runs may differ in)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k != "seconds"}
    return [untimed(v) for v in value] if isinstance(value, list) else value


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return [tiny(root / f"m{i}" / "best.pt", seed, steps) for i, (seed, steps) in enumerate([(1, 40), (2, 8), (3, 20)])]


def spied_report(models, out: Path, monkeypatch, *, share: bool) -> tuple[dict, Counter]:
    """report.json of a report of ``models`` and the count of each (dataset, split) loaded; ``share``
    False: the report as it was before (no shared sets, paired_bootstrap per pair)."""
    loads: Counter = Counter()
    real = jemeval.data.call_with_supported

    def counted(factory, split, *args, **kwargs):
        loads[(factory.__name__, split)] += 1
        return real(factory, split, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(jemeval.data, "call_with_supported", counted)
        if not share:
            m.setattr(build, "shared_datasets", contextlib.nullcontext)
            m.setattr(Outcomes, "replicates", lambda self, n_boot, seed: np.concatenate(
                [self.resampled(c) for c in bootstrap_counts(self.n, self.strata, n_boot, seed)]))
        args = [a for p in models for a in ("--model", str(p))]
        result = runner().invoke(cli, ["report", *args, "--out", str(out), *ARGS, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), loads


@pytest.mark.slow
def test_each_set_is_loaded_once_for_three_models_and_the_numbers_do_not_change(models, tmp_path, monkeypatch):
    shared, loads = spied_report(models, tmp_path / "shared", monkeypatch, share=True)
    before, loads_before = spied_report(models, tmp_path / "before", monkeypatch, share=False)
    _, loads_one = spied_report(models[:1], tmp_path / "one", monkeypatch, share=True)
    # each load once per report, whatever the number of models (the digits test split is asked for at
    # the model's shape and as stored (calibration, interp's base): two distinct loads)
    assert loads == loads_one and max(loads.values()) <= 2, loads
    assert loads[("uniform", "test")] == loads[("interp", "test")] == 1
    # the attack on the old pipeline: every (model, section) loaded its sets again
    assert loads_before[("digits", "test")] >= 3 * 4  # 4 sections x 3 models read the test set
    assert set(loads) == set(loads_before)
    for key in NUMBERS:
        assert untimed(shared[key]) == untimed(before[key]), key
    assert len({(c["model_a"], c["model_b"]) for c in shared["comparisons"]}) == 3
    assert any(c["test"] == "paired-bootstrap" for c in shared["comparisons"])


def test_sharing_holds_a_set_only_inside_the_block():
    from jemeval.context import shared_datasets

    outside = jemeval.data.load_dataset("uniform", "test", input_shape=(1, 8, 8), n=10)
    with shared_datasets() as kept:
        a = jemeval.data.load_dataset("uniform", "test", input_shape=(1, 8, 8), n=10)
        b = jemeval.data.load_dataset("uniform", "test", input_shape=(1, 8, 8), n=10)
        c = jemeval.data.load_dataset("uniform", "test", input_shape=(1, 8, 8), n=10, seed=1)
    assert a is b and a is not c and len(kept) == 2
    assert a is not outside and jemeval.data.load_dataset("uniform", "test", input_shape=(1, 8, 8), n=10) is not a
    assert bool((a.x == outside.x).all()) and not bool((a.x == c.x).all())


# -- the bootstrap of N models: each run's replicates once per row, the same numbers ------------------
def _probs(rng, n, k=3):
    p = rng.random((n, k))
    return p / p.sum(1, keepdims=True)


@pytest.mark.parametrize("seeds", [(1, 1, 1), (2, 3, 1)])
def test_each_runs_replicates_are_drawn_once_and_equal_a_fresh_bootstrap_for_every_pair(seeds, monkeypatch):
    """Reference: mrmc.seed_mean_bootstrap on fresh Outcomes for each pair (nothing shared); the resampled
    ECE is counted to show each run's replicates ran once (N runs, not once per pair)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 60)
    runs = {m: [(_probs(rng, 60), labels) for _ in range(k)] for m, k in zip("ABC", seeds)}
    calls = Counter()
    real = ECE.resampled
    monkeypatch.setattr(ECE, "resampled", lambda self, counts: calls.update(["ece"]) or real(self, counts))
    def result(p, y):
        per_input = [{"calibration": "none", "probs": p.tolist(), "labels": y.tolist()}]
        return [Result([{"calibration": "none"}], {}, {"per_input": per_input})]

    results = {m: [result(p, y) for p, y in rs] for m, rs in runs.items()}
    values = {m: [{"calibration": "none"}] for m in runs}
    got = [c for c in compare.compare("calibration", results, values, seed=7) if c["metric"] == "ece"
           and c["scope"] == "runs"]
    chunks = -(-compare.N_BOOT // 250)
    assert calls["ece"] == sum(seeds) * chunks  # each run's replicates once, not once per pair
    monkeypatch.setattr(ECE, "resampled", real)
    for record in got:
        a, b = record["model_a"], record["model_b"]
        ref = mrmc.seed_mean_bootstrap("ece", runs[a], runs[b], n_boot=compare.N_BOOT, seed=7)
        assert (record["difference"], record["p_value"], record["n_boot"], record["seed"]) == (
            ref["difference"], ref["p_value"], ref["n_boot"], ref["seed"])
        assert [record["ci_low"], record["ci_high"]] == ref["interval"]


def test_a_test_that_cannot_run_is_one_line_in_its_record():
    """The attack: a figure of merit that is not finite on some resamples: the pair's record states the
    one-line reason (seed_mean_bootstrap's own), the report goes on."""
    class Fussy(Accuracy):
        def resampled(self, counts):
            return np.where(counts[:, 0] > 1, np.nan, super().resampled(counts))

    a, b = (Fussy(np.random.default_rng(i).random(30) < 0.7) for i in (0, 1))
    with pytest.raises(UsageError) as direct:
        mrmc.seed_mean_bootstrap(Fussy, [a], [b], n_boot=compare.N_BOOT, seed=0)
    (record,) = compare.tests({"section": "accuracy"}, [a], [b], seed=0, design="nested")
    assert "\n" not in str(direct.value) and "not finite" in str(direct.value)
    record_b = compare.tests({"section": "accuracy"}, [a, b], [b, a], seed=0, design="nested")[1]
    assert record_b["p_value"] is None and record_b["error"] == str(direct.value)
    assert record["test"] == "mcnemar-exact" and record["p_value"] is not None  # two single runs: exact, no resampling


# -- the cache is keyed on the checkpoint's bytes, not its path --------------------------------------
def _report(model: Path, out: Path, *extra: str) -> dict:
    result = runner().invoke(cli, ["report", "--model", str(model), "--name", "m", "--out", str(out), "--sections",
                                   "accuracy,calibration", "--n", "40", "--refine-steps", "0", "--device", "cpu",
                                   *extra, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_copy_hits_the_cache_and_changed_bytes_at_the_same_path_miss_it(models, tmp_path):
    first = tmp_path / "a" / "best.pt"
    first.parent.mkdir()
    shutil.copyfile(models[0], first)
    out = tmp_path / "rep"
    fresh = _report(first, out)
    copy = tmp_path / "copy" / "best.pt"
    copy.parent.mkdir()
    shutil.copyfile(first, copy)
    entries = sorted((out / CACHE).iterdir())
    stamps = [p.stat().st_mtime_ns for p in entries]
    hit = _report(copy, out)
    assert [p.stat().st_mtime_ns for p in sorted((out / CACHE).iterdir())] == stamps  # nothing recomputed
    assert untimed(hit["records"]) == untimed(fresh["records"])
    assert {r["provenance"]["checkpoint"]["path"] for r in hit["runs"]} == {str(copy)}
    # the attack: other weights written over the same path must not be shown as the old ones
    shutil.copyfile(models[1], first)
    missed = _report(first, out)
    assert untimed(missed["records"]) != untimed(fresh["records"])
    assert {r["provenance"]["checkpoint"]["sha256"] for r in missed["runs"]} == {
        jemeval.provenance.file_sha256(models[1])}


def test_another_models_entry_under_this_models_name_is_recomputed(models, tmp_path):
    """The attack: model 0's cache entry (checksum intact) copied over model 1's entry file."""
    out = tmp_path / "rep"
    _report(models[0], out, "--sections", "accuracy")
    (entry0,) = (out / CACHE).glob("accuracy-*.json")
    b = _report(models[1], out, "--sections", "accuracy")
    (entry1,) = [p for p in (out / CACHE).glob("accuracy-*.json") if p != entry0]
    shutil.copyfile(entry0, entry1)
    again = build.report([str(models[1])], names=["m"], out=out, sections="accuracy", n=40, refine_steps=[0],
                         device="cpu", progress=False)  # the entry's settings hash names model 0's bytes
    assert [s["status"] for s in again.status] == ["computed"]
    assert untimed(again.records) == untimed(b["records"])
    assert json.loads(entry1.read_text())["checkpoint_sha256"] != json.loads(entry0.read_text())["checkpoint_sha256"]


def test_a_checkpoint_replaced_while_the_report_runs_is_not_cached_as_the_old_one(models, tmp_path, monkeypatch):
    """The attack: the file changes between the report hashing it and a section reading it."""
    path = tmp_path / "m" / "best.pt"
    path.parent.mkdir()
    shutil.copyfile(models[0], path)
    real = build.run_section

    def swapped(section, model, options, **kw):
        shutil.copyfile(models[1], path)
        return real(section, model, options, **kw)

    monkeypatch.setattr(build, "run_section", swapped)
    result = build.report([str(path)], names=["m"], out=tmp_path / "rep", sections="accuracy", n=40,
                          refine_steps=[0], device="cpu", progress=False)
    assert "changed while the report ran" in result.errors["m"]["accuracy"]
    assert not list((tmp_path / "rep" / CACHE).glob("accuracy-*.json"))
