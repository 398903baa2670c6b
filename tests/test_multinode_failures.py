"""Several-node launches that go wrong end on every node with one line, promptly, never a silent
wait or a silent success: two launch agents (``python -m jemeval.runtime.launch --nnodes 2``) over
loopback, as in tests/test_multinode.py, each in a working folder of its own.

* a node whose ``--model`` does not exist, and a checkpoint every node fails to load (the error
  shared by every rank after the join): one line on each node, not a node that waits at its
  agent's exit barrier (300 s, deaf to SIGTERM);
* the rendezvous port held by another program, listening or only bound: one line on each node in
  seconds (torch's store client would wait for that program's answer forever);
* nodes given different options (``--n 200`` / ``--n 100``) or different files at the same path:
  one line naming what differs, not each node running its own command with exit status 0;
* an agent whose processes finished waits for the other node: a SIGTERM ends it at once, and the
  other node's failure ends it with one line.

The timings are bounded well below what a hang costs (torch's 300 s exit barrier, its store
client's endless wait): a test fails by its timeout where the launch would hang.
"""
from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from helpers import free_port
from test_bad_inputs import assert_one_line_refusal
from test_shards import _env

from jemeval.errors import UsageError

TIMEOUT_S = 90  # a hang is a failure, not a stuck CI job; the prompt endings are checked below it
PROMPT_S = 60  # two agents' start-up (torch imports) on a loaded 2-core machine, and the one line


def launch(commands: tuple[list[str], list[str]], root: Path, port: int | None = None) -> list[subprocess.Popen]:
    """Two node agents, the first running ``commands[0]`` in ``root/node0``, the second
    ``commands[1]`` in ``root/node1`` (what follows the launcher's own flags: ``-m jemeval ...``
    or ``--no-python PROGRAM ...``), meeting at 127.0.0.1:``port`` (a free one by default)."""
    port, run_id = port or free_port(), uuid.uuid4().hex[:8]
    agents = []
    for node, command in enumerate(commands):
        folder = root / f"node{node}"
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "jemeval.runtime.launch", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", run_id, "--max-restarts", "0", *command]
        agents.append(subprocess.Popen(cmd, cwd=folder, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True))
    return agents


def finish(agents: list[subprocess.Popen], timeout: float = TIMEOUT_S) -> list[SimpleNamespace]:
    """Every agent's exit status and output, each with the seconds from now until it ended; agents
    still running at ``timeout`` are killed and the test fails (a hang)."""
    started, deadline, done = time.monotonic(), time.monotonic() + timeout, []
    try:
        for agent in agents:
            out, err = agent.communicate(timeout=max(1.0, deadline - time.monotonic()))
            done.append(SimpleNamespace(exit_code=agent.returncode, stdout=out, stderr=err,
                                        seconds=time.monotonic() - started))
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    return done


def ood(model: str, *more: str) -> list[str]:
    return ["-m", "jemeval", "ood", "--model", model, "--ood", "uniform", "--score", "maxprob", "--no-cache",
            "--device", "cpu", "--out", "result.json", *more]


def assert_every_node_says(ended: list[SimpleNamespace], expected: str, root: Path) -> None:
    for node in ended:
        assert node.seconds < PROMPT_S, node
        assert_one_line_refusal(node, expected)
    assert not (root / "node0" / "result.json").exists() and not (root / "node1" / "result.json").exists()


@pytest.mark.slow
def test_a_node_whose_model_does_not_exist_ends_every_node_with_one_line(tmp_path, digits_classifier_ckpt):
    # the same command line; m.pt is in node0's folder only (no shared filesystem)
    (tmp_path / "node0").mkdir()
    shutil.copy(digits_classifier_ckpt, tmp_path / "node0" / "m.pt")
    ended = finish(launch((ood("m.pt", "--n", "8"), ood("m.pt", "--n", "8")), tmp_path))
    there, missing = f"sha256 {_short_sha(tmp_path / 'node0' / 'm.pt')}", "missing"
    first, second = (there, missing) if f"{there} on process 0" in ended[0].stderr else (missing, there)
    assert_every_node_says(ended, f"the input checkpoint 'm.pt' (--model) is {first} on process 0 but {second} on "
                           "process 1", tmp_path)
    assert {node.exit_code for node in ended} == {2}


@pytest.mark.slow
def test_an_error_every_rank_shares_after_the_join_ends_every_node_with_one_line(tmp_path):
    # the same file on both nodes, so they agree; loading it fails on every rank, after the join:
    # the rank that is not 0 ends with the error's status too, not with 0 at its agent's exit barrier
    for node in (0, 1):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "m.pt").write_bytes(b"not a checkpoint" * 64)
    ended = finish(launch((ood("m.pt", "--n", "8"), ood("m.pt", "--n", "8")), tmp_path))
    assert_every_node_says(ended, "'m.pt' is not a PyTorch checkpoint", tmp_path)
    assert {node.exit_code for node in ended} == {1}


@pytest.mark.slow
def test_a_rendezvous_port_held_by_another_program_is_one_line_on_every_node(tmp_path):
    # a port that is only bound, not listened on: test_the_endpoint_check_tells_a_store_from_another_program
    port = free_port()
    with socket.socket() as other:  # the other program: accepts connections and never answers
        other.bind(("127.0.0.1", port))
        other.listen()
        ended = finish(launch((["--no-python", "true"], ["--no-python", "true"]), tmp_path, port=port))
    for node in ended:
        assert node.seconds < PROMPT_S, node
        assert_one_line_refusal(node, f"the launch's rendezvous endpoint 127.0.0.1:{port} answers but is no torch "
                                f"store: another program holds port {port}; choose a free port (--rdzv-endpoint), "
                                "the same on every node")


@pytest.mark.slow
def test_nodes_given_different_options_stop_naming_the_option(tmp_path, digits_classifier_ckpt):
    # (a file that differs between the nodes: test_a_node_whose_model_does_not_exist_..., and the
    # comparison itself: test_the_ranks_compare_what_they_were_given_with_rank_0)
    model = str(digits_classifier_ckpt)
    ended = finish(launch((ood(model, "--n", "200"), ood(model, "--n", "100")), tmp_path))
    first, second = ("200", "100") if "--n is 200 on process 0" in ended[0].stderr else ("100", "200")
    assert_every_node_says(ended, f"the launch's nodes were not given the same command line: --n is {first} on "
                           f"process 0 but {second} on process 1", tmp_path)
    assert all(node.stderr.rstrip().endswith("give every node the same command line") for node in ended)


def _short_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]  # what sha256sum shows


@pytest.mark.slow
def test_an_agent_at_its_exit_barrier_ends_on_sigterm_or_on_the_other_nodes_failure(tmp_path):
    """Node 0's process ends at once (``true``) and its agent waits at the exit barrier for node 1."""
    script = tmp_path / "work.sh"
    script.write_text('#!/bin/sh\ntouch "$1"\nsleep "$2"\nexit "$3"\n')
    script.chmod(0o755)
    # node 1 works for a minute: a SIGTERM ends node 0's waiting agent at once, then node 1's
    started = tmp_path / "started"
    agents = launch((["--no-python", "true"], ["--no-python", str(script), str(started), "60", "0"]),
                    tmp_path / "signal")
    try:
        deadline = time.monotonic() + PROMPT_S
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), "node 1's process never started"
        time.sleep(2)  # node 0's `true` has ended: its agent is at the barrier
        for agent in agents:
            sent = time.monotonic()
            agent.terminate()
            agent.wait(timeout=10)  # torch's own barrier: deaf to it until node 1 ends (60 s) or 300 s
            assert time.monotonic() - sent < 10
    finally:
        finish(agents, timeout=1)
    assert agents[0].returncode == 130  # stopped: said by nobody (the user sent it)
    # node 1 fails after a few seconds: node 0's agent ends with one line, not after 300 s
    ended = finish(launch((["--no-python", "true"], ["--no-python", str(script), str(started), "3", "3"]),
                          tmp_path / "fail"))
    assert ended[0].seconds < PROMPT_S and ended[1].seconds < PROMPT_S
    assert_one_line_refusal(ended[0], "another node's launch ended before its processes finished, or after they failed")
    assert_one_line_refusal(ended[1], "process 1 of the launch ended with exit status 3")


# -- the pieces, in one process (jemeval.runtime.rendezvous imported in each: on a tree without it,
# only these fail at once, the launches above fail by what they do) --------------------------------

def test_the_endpoint_check_tells_a_store_from_another_program(monkeypatch):
    from jemeval.runtime import rendezvous as R

    monkeypatch.setattr(R, "STORE_ANSWER_S", 1.0)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    R.check_endpoint("127.0.0.1", store.port, "--rdzv-endpoint")  # a torch store answers
    R.check_endpoint("127.0.0.1", free_port(), "--rdzv-endpoint")  # nothing there: this machine will host it
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(R.EndpointTaken, match=rf"^the launch's rendezvous endpoint 127.0.0.1:{port} answers but "
                                                  rf"is no torch store: another program holds port {port}; choose"):
            R.check_endpoint("127.0.0.1", port, "--rdzv-endpoint")
        assert time.monotonic() - started < 5
    with socket.socket() as other:  # a program that hangs up at once: no store either, said at once
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        hang_up = threading.Thread(target=lambda: [other.accept()[0].close() for _ in range(2)], daemon=True)
        hang_up.start()
        started = time.monotonic()
        with pytest.raises(R.EndpointTaken, match="answers but is no torch store"):
            R.check_endpoint("127.0.0.1", port, "--rdzv-endpoint")
        assert time.monotonic() - started < R._RECONNECT_S + 1.5  # torch's client tries again until then
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        port = other.getsockname()[1]
        with pytest.raises(R.EndpointTaken, match=rf"^port {port} of .* is taken on this machine by another program "
                                                  r"\(it accepts no connections\).*\(--master-port\)"):
            R.check_endpoint("127.0.0.1", port, "--master-port")


def test_the_endpoint_is_the_one_torch_would_use():
    from torch.distributed.run import get_args_parser

    from jemeval.runtime import rendezvous as R

    def args(*flags):
        return get_args_parser().parse_args([*flags, "prog"])

    assert R.endpoint_of(args("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:123")) == \
        ("h", 123, "--rdzv-endpoint")
    assert R.endpoint_of(args("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h")) == \
        ("h", 29400, "--rdzv-endpoint")
    assert R.endpoint_of(args("--nnodes", "2", "--master-addr", "m", "--master-port", "77")) == \
        ("m", 77, "--master-port")
    assert R.endpoint_of(args("--nnodes", "2", "--master-addr", "m")) == ("m", 29500, "--master-port")
    assert R.endpoint_of(args("--standalone", "--nproc-per-node", "2")) is None  # torch picks a free port
    assert R.endpoint_of(args("--nproc-per-node", "2")) is None  # one node, no port: the same
    assert R.endpoint_of(args("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:0")) is None


def _agent(store, closed: threading.Event, timeout_s: float) -> SimpleNamespace:
    """What the exit barrier reads of a node agent of a 2-node launch."""
    handler = SimpleNamespace(is_closed=closed.is_set)
    group = SimpleNamespace(group_world_size=2, spec=SimpleNamespace(rdzv_handler=handler))
    return SimpleNamespace(_store=store, _exit_barrier_timeout=timeout_s, _worker_group=group)


def test_the_exit_barrier_ends_when_the_other_node_left_or_never_came():
    from jemeval.runtime import rendezvous as R

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    closed = threading.Event()
    threading.Timer(0.5, closed.set).start()  # the other node's agent failed and closed the rendezvous
    started = time.monotonic()
    with pytest.raises(R.NodeLeft, match="another node's launch ended before its processes finished"):
        R.exit_barrier(_agent(store, closed, 60))
    assert 0.4 < time.monotonic() - started < 5
    # the other node arrives after all: its barrier passes, the rendezvous closed or not
    R.exit_barrier(_agent(dist.TCPStore("127.0.0.1", store.port, is_master=False), closed, 60))
    # a barrier nobody else reaches, the rendezvous open: its timeout, in one line
    with pytest.raises(R.NodeLeft, match=r"not every node's processes finished within 0.3 s of this node's"):
        R.exit_barrier(_agent(dist.PrefixStore("again", store), threading.Event(), 0.3))


def test_the_ranks_compare_what_they_were_given_with_rank_0(monkeypatch):
    """Ranks 0 and 1 arrive (two threads), each with its own declaration: a difference in the options
    is the one line both raise; with the same options the files are compared; alike, they go on."""
    from jemeval.runtime import arrival as A

    monkeypatch.setattr(A, "_HEARD", False)  # set by the errors below; left as it was for other tests
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "agree"}
    model = "the input checkpoint 'm.pt' (--model)"

    def arrive(attempt, given):
        errors = {}

        def rank(r):
            try:
                declared = None if given[r] is None else {"options": given[r][0], "files": given[r][1]}
                A.arrive(store, r, 2, {**env, "TORCHELASTIC_RESTART_COUNT": attempt}, 30, declared)
            except Exception as exc:  # noqa: BLE001 - what each rank raised
                errors[r] = exc

        threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
        return errors

    errors = arrive("0", {0: ({"--n": "200", "--seed": "0"}, {model: "sha256 aa"}),
                          1: ({"--n": "100", "--seed": "0"}, {model: "sha256 bb"})})
    assert set(errors) == {0, 1} and all(isinstance(e, UsageError) and e.shared for e in errors.values())
    assert str(errors[0]) == str(errors[1]) == (
        "the launch's nodes were not given the same command line: --n is 200 on process 0 but 100 on process 1; "
        "give every node the same command line")
    # a dataset file only one node has is named on that node alone: missing on the other
    errors = arrive("1", {0: ({"--n": "200"}, {model: "sha256 aa"}), 1: ({"--n": "200"}, {})})
    assert str(errors[0]) == str(errors[1]) == (
        "the launch's nodes were not given the same files: the input checkpoint 'm.pt' (--model) is sha256 aa on "
        "process 0 but missing on process 1; give every node the same files")
    assert arrive("2", {0: ({"--n": "200"}, {model: "sha256 aa"}), 1: ({"--n": "200"}, {model: "sha256 aa"})}) == {}
    assert arrive("3", {0: None, 1: ({"--n": "1"}, {})}) == {}  # rank 0 declared nothing (Python, not the CLI)
