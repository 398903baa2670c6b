"""Evaluation on several processes (``--nproc N``): whole batches dealt out, results gathered, the
records of one process; rank 0 alone prints and writes; an error anywhere is one line.

The 2-process checks run real gloo process groups on CPU: :func:`map_batches` through
``torch.multiprocessing`` (fast), the commands end to end through ``--nproc 2`` (torchrun; slow).
The reference is always the same command with ``--nproc 1`` (one process, no process group).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from click.testing import CliRunner
from helpers import free_port

from jemeval.cli import cli
from jemeval.cli.options import without_nproc
from jemeval.errors import JemevalError, UsageError
from jemeval.runtime import distributed as D
from jemeval.runtime import shards
from jemeval.runtime.launch import launched_by_torchrun


# -- one process ------------------------------------------------------------------------------------
def test_batch_streams_depend_on_seed_and_batch_only():
    assert shards.batch_seed(5, 0) == 5  # a run that fits in one batch keeps its numbers
    seeds = {shards.batch_seed(s, b) for s in range(4) for b in range(4)}
    assert len(seeds) == 16  # seed 1's batch 0 is not seed 0's batch 1, and so on
    a = torch.rand(3, generator=shards.batch_generator(2, 3))
    assert torch.equal(a, torch.rand(3, generator=shards.batch_generator(2, 3)))
    assert torch.equal(torch.rand(3, generator=shards.batch_generator(7, 0)),
                       torch.rand(3, generator=torch.Generator().manual_seed(7)))


def test_map_batches_in_one_process_is_the_plain_loop():
    assert shards.rank_and_world() == (0, 1)
    assert list(shards.my_batches(3)) == [0, 1, 2]
    assert shards.map_batches(lambda b: b * b, 4) == [0, 1, 4, 9]
    assert shards.map_batches(lambda b: b, 0) == []
    assert shards.map_items(lambda b, item: (b, item), "xyz") == [(0, "x"), (1, "y"), (2, "z")]
    with pytest.raises(UsageError, match="batch_size=3 is too small") as exc:
        shards.map_batches(_fails_on_rank1, 5)
    assert exc.value.param == "batch_size"


def test_interleave_restores_batch_order():
    assert shards.interleave([[0, 3, 6], [1, 4], [2, 5]], 7) == list(range(7))


def test_without_nproc_and_the_torchrun_check(monkeypatch):
    assert without_nproc(["sample", "--nproc", "2", "--n", "3", "--nproc=4", "--seed", "1"]) == \
        ["sample", "--n", "3", "--seed", "1"]
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not launched_by_torchrun(2) and not launched_by_torchrun(None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert launched_by_torchrun(None) and launched_by_torchrun(2)
    with pytest.raises(UsageError, match="nproc=3 disagrees with the launcher's WORLD_SIZE=2"):
        launched_by_torchrun(3)


# -- two gloo processes -----------------------------------------------------------------------------
def _batch(b: int) -> dict:
    """A batch's 'result': random numbers from its own stream, as an evaluation batch draws them."""
    return {"b": b, "x": torch.rand(2, generator=shards.batch_generator(11, b))}


def _fails_on_rank1(b: int) -> int:
    if b == 3:  # batch 3 runs on rank 1 of 2
        raise UsageError("batch_size=3 is too small", param="batch_size")
    return b


def _worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    D.init_from_env(backend="gloo", env=env, timeout_s=60)
    try:
        unsharded = shards.map_batches(lambda b: (b, rank), 3)  # outside sharded(): every batch, here
        with shards.sharded():
            sharded_report(rank, out, unsharded)
    finally:
        D.destroy()


def sharded_report(rank: int, out: str, unsharded: list) -> None:
    """What rank ``rank`` sees inside sharded(), saved for the test to read."""
    report = {"unsharded": unsharded, "mine": list(shards.my_batches(5)), "results": shards.map_batches(_batch, 5)}
    try:
        shards.map_batches(_fails_on_rank1, 5)
    except JemevalError as exc:
        report["error"] = (type(exc).__name__, str(exc), exc.param, exc.shared)
    report["after"] = shards.map_batches(lambda b: -b, 3)  # the ranks are still in step
    report["items"] = shards.map_items(lambda b, item: (b, item, rank), iter("abcde"))
    torch.save(report, f"{out}.{rank}")




@pytest.mark.slow
def test_two_gloo_processes_give_the_batches_of_one(tmp_path):
    out = str(tmp_path / "rank")
    mp.spawn(_worker, args=(2, free_port(), out), nprocs=2, join=True)
    single = [_batch(b) for b in range(5)]
    for rank in (0, 1):
        report = torch.load(f"{out}.{rank}")
        assert report["mine"] == [rank, rank + 2, rank + 4][: 3 - rank]
        assert [r["b"] for r in report["results"]] == list(range(5))
        assert all(torch.equal(r["x"], s["x"]) for r, s in zip(report["results"], single))
        # the error of rank 1's batch is raised on both ranks, naming the same parameter
        assert report["error"] == ("UsageError", "batch_size=3 is too small", "batch_size", True)
        assert report["after"] == [0, -1, -2]
        assert report["unsharded"] == [(0, rank), (1, rank), (2, rank)]
        assert report["items"] == [(b, "abcde"[b], b % 2) for b in range(5)]  # every item, by its own rank


# -- the commands, end to end -----------------------------------------------------------------------
def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", PYTHONWARNINGS="ignore")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    return env


def jemeval(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``jemeval ARGS`` run in ``cwd``: in this process for ``--nproc 1`` (the reference: no launch,
    no process group), else as a subprocess (``--nproc 2`` re-launches itself through torchrun)."""
    if "--nproc" in args and args[args.index("--nproc") + 1] == "1":
        before = Path.cwd()
        os.chdir(cwd)
        try:
            res = CliRunner().invoke(cli, list(args))
        finally:
            os.chdir(before)
        return subprocess.CompletedProcess(args, res.exit_code, res.stdout, res.stderr)
    return subprocess.run([sys.executable, "-m", "jemeval", *args], check=False, capture_output=True, text=True,
                          env=_env(), timeout=240, cwd=cwd)


def comparable(path: Path) -> dict:
    """A JSON result without what may differ between runs: the provenance's time and process count, and
    the allocator (the --nproc 1 reference runs inside this test process, which tunes glibc's allocator
    only if another test did; `python -m jemeval` always does)."""
    result = json.loads(path.read_text())
    result["provenance"].pop("created", None)
    result["provenance"].pop("allocator", None)
    assert result["provenance"].pop("processes", 2) == 2
    return result


def same_records(command: list[str], tmp_path: Path, out_flag: str = "--out",
                 transform=lambda r: r) -> tuple[dict, dict]:
    """Run ``command`` with --nproc 1 and --nproc 2; both results (JSON, through ``transform``), checked equal."""
    results = {}
    for n in (1, 2):
        folder = tmp_path / f"n{n}"
        folder.mkdir()
        res = jemeval(*command, out_flag, "result.json", "--nproc", str(n), cwd=folder)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "Traceback" not in res.stderr
        results[n] = transform(comparable(folder / "result.json"))
    assert results[2]["records"] == results[1]["records"]
    assert results[2] == results[1]
    return results[1], results[2]


@pytest.mark.slow
def test_sample_nproc_2_gives_the_samples_of_one_process(tmp_path, digits_jem_ckpt):
    # 3 classes x 3 chains in batches of 2: 5 batches, the last one short, dealt to 2 ranks
    command = ["sample", "--model", str(digits_jem_ckpt), "--class", "0,4,7", "--n", "3", "--steps", "3",
               "--batch-size", "2", "--device", "cpu", "--seed", "4", "--save", "samples.npz", "--json"]
    one, _ = same_records(command, tmp_path, out_flag="--result")
    assert [r["n"] for r in one["records"]] == [3, 3, 3, 9]
    a, b = (np.load(tmp_path / f"n{n}" / "samples.npz") for n in (1, 2))
    assert (a["x"] == b["x"]).all() and (a["log_p_trace"] == b["log_p_trace"]).all()
    assert sorted(p.name for p in (tmp_path / "n2").iterdir()) == ["result.json", "samples.npz"]


@pytest.mark.slow
def test_an_error_in_every_rank_is_one_line(tmp_path, digits_classifier_ckpt):
    res = jemeval("sample", "--model", str(digits_classifier_ckpt), "--init", "buffer", "--n", "2", "--steps", "1",
                  "--device", "cpu", "--nproc", "2", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.count("stores no replay buffer") == 1 and res.stderr.count("Error:") == 1
    assert "set --init to 'noise'" in res.stderr



def _without_seconds(result: dict) -> dict:
    """A robust result without its wall-clock fields (each record's ``seconds``)."""
    for record in result["records"]:
        record.pop("seconds", None)
    return result


@pytest.mark.slow
def test_robust_nproc_2_gives_the_records_of_one_process(tmp_path, digits_jem_ckpt):
    # 7 inputs in batches of 3 (the last one short); K=1 refinement draws chain noise on every batch
    command = ["robust", "--model", str(digits_jem_ckpt), "--norm", "l2", "--epsilons", "0.5,1", "--n", "7",
               "--batch-size", "3", "--steps", "2", "--refine-steps", "0,1", "--chains", "2", "--draws", "2",
               "--device", "cpu", "--seed", "3", "--json"]
    one, two = same_records(command, tmp_path, transform=_without_seconds)
    assert [r["refine_steps"] for r in one["records"]] == [0, 0, 1, 1] and one["records"][0]["n"] == 7


@pytest.mark.slow
def test_ood_nproc_2_gives_the_records_of_one_process(tmp_path, digits_classifier_ckpt):
    # input noise (--sigma) on every batch, a gradient score, a fitted detector, bootstrap intervals
    command = ["ood", "--model", str(digits_classifier_ckpt), "--ood", "uniform,gaussian", "--n", "20",
               "--batch-size", "6", "--sigma", "0.03", "--score", "logpx,gradnorm,knn", "--fit-n", "80",
               "--no-cache", "--bootstrap", "20", "--device", "cpu", "--seed", "5", "--save-scores", "scores.npz"]
    one, _ = same_records(command, tmp_path)
    assert {r["score"] for r in one["records"]} == {"logpx", "gradnorm", "knn"}
    a, b = (np.load(tmp_path / f"n{n}" / "scores.npz") for n in (1, 2))
    assert sorted(a.files) == sorted(b.files) and all((a[k] == b[k]).all() for k in a.files if k != "provenance")


@pytest.mark.slow
def test_report_nproc_2_gives_the_report_of_one_process(tmp_path, digits_jem_ckpt):
    # accuracy with refinement (chains per batch), OOD with input noise, samples; rank 0 alone writes
    command = ["report", "--model", str(digits_jem_ckpt), "--name", "JEM", "--sections", "accuracy,ood,samples",
               "--n", "20", "--refine-steps", "0,1", "--ood", "uniform", "--sigma", "0.03", "--set", "samples.n=1",
               "--set", "samples.steps=2", "--set", "samples.classes=all", "--set", "samples.batch_size=3",
               "--set", "accuracy.batch_size=8", "--set", "ood.batch_size=8", "--device", "cpu", "--seed", "2"]
    reports = {}
    for n in (1, 2):
        res = jemeval(*command, "--out", f"r{n}", "--nproc", str(n), cwd=tmp_path)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
        reports[n] = comparable(tmp_path / f"r{n}" / "report.json")
    assert reports[2]["records"] == reports[1]["records"] and len(reports[1]["records"]) > 4
    assert sorted(p.name for p in (tmp_path / "r2").iterdir()) == sorted(p.name for p in (tmp_path / "r1").iterdir())
