"""Several nodes: two torchrun node agents (``--nnodes 2``, c10d rendezvous over loopback, gloo) on
this machine, each in a working folder of its own (nodes share no cwd), give the records of one
process; the node whose worker is rank 0 writes every output, the other writes nothing; a node that
fails before its worker joins the process group stops both with one line each, at once.

The agents are ``python -m jemeval.runtime.launch`` (``torch.distributed.run`` with its flags, as
``--nproc`` uses it: plain ``torchrun`` would take the commands' ``--n`` for its own ``--nnodes``).
With the c10d rendezvous ``--node-rank`` is ignored: which agent's worker is rank 0 is the
rendezvous's choice, so the tests find the node that wrote. The one-process references run through
tests/test_shards.py's ``jemeval`` helper (``--nproc 1``: no launch, no process group).
"""
from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from helpers import free_port
from test_bad_inputs import assert_one_line_refusal, snapshot
from test_ddp_training import API, CLASSIFIER, TINY, rows
from test_shards import _env, _without_seconds, comparable, jemeval

from jemeval.errors import JemevalError, UsageError
from jemeval.formats.native import read_checkpoint
from jemeval.runtime import arrival as A
from jemeval.training import resolve_config, train

TIMEOUT_S = 150  # a hang is a failure, not a stuck CI job


def two_nodes(*args: str, root: Path, timeout: float = TIMEOUT_S,
              extra: tuple[list[str], list[str]] = ([], [])) -> list[subprocess.CompletedProcess]:
    """``jemeval ARGS`` launched by two node agents, in ``root/node0`` and ``root/node1`` (created);
    ``extra``: arguments given to one node's command only."""
    port, run_id = free_port(), uuid.uuid4().hex[:8]
    agents = []
    for node in (0, 1):
        folder = root / f"node{node}"
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "jemeval.runtime.launch", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", run_id, "--max-restarts", "0", "-m", "jemeval", *args, *extra[node]]
        agents.append(subprocess.Popen(cmd, cwd=folder, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True))
    deadline, done = time.monotonic() + timeout, []
    try:
        for agent in agents:
            out, err = agent.communicate(timeout=max(1.0, deadline - time.monotonic()))
            done.append(subprocess.CompletedProcess(agent.args, agent.returncode, out, err))
    finally:
        for agent in agents:  # only after a timeout: a hang
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    return done


def writer(root: Path) -> Path:
    """The one node folder that holds outputs; the other must hold nothing (rank 0 alone writes)."""
    folders = [root / "node0", root / "node1"]
    written = [f for f in folders if any(f.iterdir())]
    assert len(written) == 1, {str(f): sorted(p.name for p in f.rglob("*")) for f in folders}
    return written[0]


def succeeded(agents: list[subprocess.CompletedProcess]) -> None:
    for agent in agents:
        assert agent.returncode == 0, agent.stderr[-3000:]
        assert "Traceback" not in agent.stderr and "Error" not in agent.stderr, agent.stderr[-3000:]


def one_and_two_nodes(command: list[str], tmp_path: Path, transform=lambda r: r) -> tuple[dict, dict]:
    """``command --out result.json`` in one process and on two nodes: both results, checked equal."""
    single = tmp_path / "one"
    single.mkdir()
    res = jemeval(*command, "--out", "result.json", "--nproc", "1", cwd=single)
    assert res.returncode == 0, res.stderr[-2000:]
    agents = two_nodes(*command, "--out", "result.json", root=tmp_path / "two")
    succeeded(agents)
    folder = writer(tmp_path / "two")
    one, two = (transform(comparable(f / "result.json")) for f in (single, folder))
    assert two["records"] == one["records"]
    assert two == one
    return one, two


@pytest.mark.slow
def test_ood_on_two_nodes_gives_the_records_of_one_process(tmp_path, digits_classifier_ckpt):
    # input noise on every batch, a gradient score and a fitted detector, 4 batches dealt to 2 ranks
    command = ["ood", "--model", str(digits_classifier_ckpt), "--ood", "uniform", "--n", "16", "--batch-size", "5",
               "--input-sigma", "0.03", "--score", "logpx,gradnorm,knn", "--fit-n", "60", "--no-cache",
               "--device", "cpu", "--seed", "5"]
    one, _ = one_and_two_nodes(command, tmp_path)
    assert {r["score"] for r in one["records"]} == {"logpx", "gradnorm", "knn"}


@pytest.mark.slow
def test_robust_on_two_nodes_gives_the_records_of_one_process(tmp_path, digits_jem_ckpt):
    # 5 inputs in batches of 2 (the last one short); K=1 refinement draws chain noise on every batch
    command = ["robust", "--model", str(digits_jem_ckpt), "--norm", "l2", "--epsilons", "0.5", "--n", "5",
               "--batch-size", "2", "--steps", "2", "--refine-steps", "0,1", "--chains", "2", "--draws", "1",
               "--device", "cpu", "--seed", "3"]
    one, _ = one_and_two_nodes(command, tmp_path, transform=_without_seconds)
    assert [r["refine_steps"] for r in one["records"]] == [0, 1] and one["records"][0]["n"] == 5


@pytest.mark.slow
def test_report_on_two_nodes_gives_the_report_of_one_process(tmp_path, digits_jem_ckpt):
    # accuracy with refinement (chains per batch) and OOD with input noise; the report folder on rank 0's node
    command = ["report", "--model", str(digits_jem_ckpt), "--name", "JEM", "--sections", "accuracy,ood",
               "--n", "12", "--refine-steps", "0,1", "--ood", "uniform", "--input-sigma", "0.03",
               "--set", "accuracy.batch_size=5", "--set", "ood.batch_size=5", "--device", "cpu", "--seed", "2"]
    single = tmp_path / "one"
    single.mkdir()
    res = jemeval(*command, "--out", "r", "--nproc", "1", cwd=single)
    assert res.returncode == 0, res.stderr[-2000:]
    succeeded(two_nodes(*command, "--out", "r", root=tmp_path / "two"))
    folder = writer(tmp_path / "two")
    one, two = comparable(single / "r" / "report.json"), comparable(folder / "r" / "report.json")
    assert two["records"] == one["records"] and len(one["records"]) > 4
    assert sorted(p.name for p in (folder / "r").iterdir()) == sorted(p.name for p in (single / "r").iterdir())


@pytest.mark.slow
def test_train_on_two_nodes_matches_one_process_and_a_resume_needs_the_run_on_every_node(tmp_path):
    # the classifier (no sampler noise): two nodes with 16 images each see one process's batches of 32
    agents = two_nodes("train", *TINY, *CLASSIFIER, "--epochs", "1", "--no-progress", "--out", "run",
                       root=tmp_path / "two")
    succeeded(agents)
    node = writer(tmp_path / "two")
    assert sorted(p.name for p in (node / "run").iterdir()) == ["best.pt", "last.pt", "metrics.csv"]
    classifier = {**API, "px_weight": 0.0, "sigma": 0.0, "augment": "none", "epochs": 1}
    one = train(resolve_config("digits[0-2]", **classifier, out=str(tmp_path / "one"))).records[0]
    a, b = rows(tmp_path / "one" / "metrics.csv"), rows(node / "run" / "metrics.csv")
    assert [r["step"] for r in a] == [r["step"] for r in b] and a[0]["train_acc"] == b[0]["train_acc"]
    wa, wb = read_checkpoint(one["last"])["state_dict"], read_checkpoint(node / "run" / "last.pt")["state_dict"]
    assert all(torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-5) for k in wa)
    assert read_checkpoint(node / "run" / "last.pt")["training_state"]["world_size"] == 2
    # the attack: a resume where the other node has no run folder (no shared filesystem): one line
    # on each node (the other node's line relayed to rank 0), at once, and the run left as it was
    before = snapshot(tmp_path / "two")
    started = time.monotonic()
    agents = two_nodes("train", *TINY, *CLASSIFIER, "--epochs", "2", "--no-progress", "--out", "run", "--resume",
                       root=tmp_path / "two", timeout=90)
    assert time.monotonic() - started < 80
    for agent in agents:
        refusal = SimpleNamespace(exit_code=agent.returncode, stdout=agent.stdout, stderr=agent.stderr)
        assert_one_line_refusal(refusal, "--resume: no 'run/last.pt' to continue")
    assert snapshot(tmp_path / "two") == before


@pytest.mark.slow
def test_a_node_with_a_bad_option_stops_both_nodes_with_one_line(tmp_path, digits_classifier_ckpt):
    command = ["ood", "--model", str(digits_classifier_ckpt), "--ood", "uniform", "--n", "8", "--score", "maxprob",
               "--no-cache", "--device", "cpu", "--out", "result.json"]
    started = time.monotonic()
    agents = two_nodes(*command, root=tmp_path, timeout=90, extra=([], ["--bogus"]))  # node 1 alone: a bad option
    assert time.monotonic() - started < 80  # not the process group's 10-minute timeout
    for agent in agents:
        refusal = SimpleNamespace(exit_code=agent.returncode, stdout=agent.stdout, stderr=agent.stderr)
        assert_one_line_refusal(refusal, "No such option '--bogus'")
    assert sum("of 2 stopped: No such option '--bogus'" in agent.stderr for agent in agents) == 1  # relayed
    assert not any(any((tmp_path / f"node{n}").iterdir()) for n in (0, 1))


def test_a_rank_that_stopped_before_joining_is_relayed_not_waited_for():
    """The store protocol behind the relayed line, in one process: rank 1 leaves its line, rank 0
    (waiting for it to arrive) raises it at once; a rank that never comes is one line at the timeout."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)  # the agent's store
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "t"}
    assert not A.tell_peers("x", env={}) and not A.tell_peers("x", env={**env, "WORLD_SIZE": "1"})
    assert not A.tell_peers("x", env={**env, "RANK": "0", "TORCHELASTIC_USE_AGENT_STORE": ""})  # rank 0 hosts it
    assert A.tell_peers("--n must be >= 1", env=env)
    assert A.tell_peers("a later line", env=env)  # the first failure is the one reported
    started = time.monotonic()
    with pytest.raises(UsageError, match=r"^process 1 of 2 stopped: --n must be >= 1$"):
        A.arrive(store, 0, 2, env, timeout_s=30)
    with pytest.raises(JemevalError, match=r"only 1 of the launch's 2 processes started within 0.3 s"):
        A.arrive(store, 0, 2, {**env, "TORCHELASTIC_RESTART_COUNT": "1"}, timeout_s=0.3)  # a restart: new keys
    assert time.monotonic() - started < 10
