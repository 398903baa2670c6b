"""What ``python -m jemeval.runtime.launch`` (one agent per node) adds to torch's node agent, so that
no mistake in a several-node launch is a silent wait:

* **The rendezvous endpoint is checked before torch uses it** (:func:`check_endpoint`). torch's
  store client waits forever for the answer of a program that is not a torch store, and an agent
  that cannot host the store on a port another program holds becomes such a client: both agents
  would say nothing, for good. Here a port that answers but is no torch store, or that this
  machine cannot bind, is one line on every node, in seconds.
* **The agents' exit barrier hears what torch's does not** (:func:`install_exit_barrier`). An agent
  whose processes finished waits there for the other nodes' agents, in one blocking store call of
  up to 300 s: deaf to SIGTERM, and blind to a node whose processes failed (that agent never
  arrives). Waited for in short slices instead, a SIGTERM ends the agent at once, and a node that
  left without arriving (its agent closed the rendezvous, or its store is gone) ends this node
  with one line (:class:`NodeLeft`).
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import socket
import threading
import time
from typing import Any

from jemeval.runtime.arrival import quiet_native_stderr

#: how long a port that accepted a connection may take to answer as a torch store does (a store
#: answers in milliseconds; a program that is no store never does)
STORE_ANSWER_S = 5.0
#: how long torch's client tries again after a program hung up on it (it then gives up; one that
#: keeps the connection open and never answers it waits for forever)
_RECONNECT_S = 2.0
#: the exit barrier's slices: how soon a SIGTERM or a node that left is noticed there
BARRIER_SLICE_S = 0.25
#: times a port this machine could not bind is looked at again (another agent of this machine may
#: have bound it a moment before it listens), and the pause between looks
_BIND_RETRIES, _BIND_PAUSE_S = 3, 0.5
_C10D_DEFAULT_PORT = 29400


class EndpointTaken(Exception):
    """The rendezvous endpoint is held by a program other than a torch store (the one line)."""


class NodeLeft(Exception):
    """Another node's agent ended without reaching the exit barrier (the one line)."""


def endpoint_of(args: Any) -> tuple[str, int, str] | None:
    """(host, port, the flag that sets the port) of the store the agents of a launch meet at, from
    torch.distributed.run's parsed ``args``; None where torch picks a free port itself
    (``--standalone``, one node without a port) or the backend is no torch store (etcd)."""
    try:
        from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
        from torch.distributed.run import parse_min_max_nnodes
    except ImportError:  # a torch that moved them: its own rendezvous, unchecked
        return None
    if args.standalone or args.rdzv_backend not in ("c10d", "static"):
        return None
    if args.rdzv_backend == "static" and not args.rdzv_endpoint:
        if args.master_port is None and parse_min_max_nnodes(args.nnodes)[1] == 1:
            return None
        port = 29500 if args.master_port is None else args.master_port
        return args.master_addr, int(port), "--master-port"
    try:
        host, port = parse_rendezvous_endpoint(args.rdzv_endpoint, default_port=_C10D_DEFAULT_PORT)
    except ValueError:
        return None  # torch says what is wrong with the endpoint's spelling
    return (host, port, "--rdzv-endpoint") if port else None


def check_endpoint(host: str, port: int, flag: str) -> None:
    """Raise :class:`EndpointTaken` when ``host:port`` answers but not as a torch store, or when
    nothing answers there and this machine, which would then host the store, cannot bind the port.
    Nothing answering on another machine is normal: its agent has not started yet."""
    where = f"{host}:{port}"
    advice = f"choose a free port ({flag}), the same on every node"
    for attempt in range(_BIND_RETRIES):
        if _accepts(host, port):
            if not _answers_as_store(host, port):
                raise EndpointTaken(f"the launch's rendezvous endpoint {where} answers but is no torch store: another "
                                    f"program holds port {port}; {advice}")
            return
        if not _is_this_machine(host) or _can_bind(port):
            return
        if attempt + 1 < _BIND_RETRIES:
            time.sleep(_BIND_PAUSE_S)
    raise EndpointTaken(f"port {port} of the launch's rendezvous endpoint {where} is taken on this machine by another "
                        f"program (it accepts no connections), so no store can be hosted there; {advice}")


def _accepts(host: str, port: int) -> bool:
    """Whether something listens at ``host:port`` (a connection is accepted within a second)."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _answers_as_store(host: str, port: int) -> bool:
    """Whether ``host:port`` answers torch's store handshake within :data:`STORE_ANSWER_S`. torch's
    client waits forever on a program that accepts and never answers: it tries in a thread of its
    own (the wait releases the GIL), left behind when it does not come back in time (it never
    writes again: a program that hangs up ends it within :data:`_RECONNECT_S`)."""
    from torch.distributed import TCPStore

    answered = []

    def connect() -> None:
        with contextlib.suppress(Exception):  # closed or reset by the program: no store either
            TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=_RECONNECT_S))
            answered.append(True)

    probe = threading.Thread(target=connect, name="jemeval-endpoint-probe", daemon=True)
    with quiet_native_stderr():  # torch's client logs each failed try with its C++ stack frames
        probe.start()
        probe.join(STORE_ANSWER_S + 1.0)
    return bool(answered)


def _is_this_machine(host: str) -> bool:
    """Whether ``host`` names this machine (as torch's c10d rendezvous decides who hosts the store)."""
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

    try:
        return _matches_machine_hostname(host)
    except Exception:  # noqa: BLE001 - an unresolvable name: another machine's, torch will say so
        return False


def _can_bind(port: int) -> bool:
    """Whether a store could listen on ``port`` of this machine: bound (not listening, so no agent
    can connect to it by mistake) with the address reuse a store uses, then let go."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as exc:
            return exc.errno != errno.EADDRINUSE
    return True


def install_exit_barrier() -> bool:
    """Put :func:`exit_barrier` in place of torch's agent exit barrier (in this process, the
    launcher); False, torch's own kept, where this torch has not the pieces it is built from."""
    try:
        from torch.distributed.elastic.agent.server import api
        from torch.distributed.elastic.utils.store import _barrier_nonblocking  # noqa: F401
    except ImportError:
        return False
    if not hasattr(api, "_TERMINAL_STATE_SYNC_ID") or not hasattr(api.SimpleElasticAgent, "_exit_barrier"):
        return False
    api.SimpleElasticAgent._exit_barrier = exit_barrier
    return True


def exit_barrier(agent: Any) -> None:
    """The agent's exit barrier (torch's keys and timeout), waited for in slices of
    :data:`BARRIER_SLICE_S`: between them Python runs torch's SIGTERM handler, and looks whether
    another node's agent closed the rendezvous without arriving (its processes failed)."""
    import torch.distributed as dist
    from torch.distributed.elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.elastic.utils.store import _barrier_nonblocking

    store, nodes = agent._store, agent._worker_group.group_world_size
    handler = agent._worker_group.spec.rdzv_handler
    timeout_s = agent._exit_barrier_timeout
    deadline = time.monotonic() + timeout_s
    try:
        key = _barrier_nonblocking(store=store, world_size=nodes, key_prefix=_TERMINAL_STATE_SYNC_ID)
        while True:
            try:
                store.wait([key], datetime.timedelta(seconds=BARRIER_SLICE_S))
                return
            except dist.DistStoreError:  # the slice ended before every node arrived: still waiting
                pass
            if handler.is_closed() and not store.check([key]):
                raise NodeLeft(_LEFT)
            if time.monotonic() > deadline:
                raise NodeLeft(f"not every node's processes finished within {timeout_s:g} s of this node's: a node "
                               "was stopped or killed (see its own output)")
    except (dist.DistNetworkError, RendezvousError):  # the store's host, another node's agent, is gone
        raise NodeLeft(_LEFT) from None


_LEFT = "another node's launch ended before its processes finished, or after they failed: see that node's own line"
