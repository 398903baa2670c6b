"""The ranks of a launch meeting in its store before they join the process group (the store
torchrun's agents share, or rank 0's), so that nothing that goes wrong there is a silent wait:

* a rank that stops before joining (a bad option, a file missing on its node) leaves its one line
  there (:func:`tell_peers`), and the ranks waiting for it (:func:`arrive`) stop with it at once;
* every rank compares what it was given with rank 0's (:mod:`jemeval.runtime.agreement`) once all
  arrived: a difference is one line on every rank;
* a rank that never comes is one line at the timeout.

:func:`jemeval.runtime.distributed.init_from_env` calls :func:`arrive` and then joins.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from jemeval.errors import JemevalError, UsageError
from jemeval.runtime import agreement


def env_int(env: Mapping[str, str], key: str) -> int | None:
    """``env[key]`` as an integer (None when unset or empty); one line when it is no integer."""
    value = env.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise JemevalError(f"environment variable {key}={value!r} is not an integer") from None


#: set once this process began joining its process group: a later error is exchanged through the
#: group (:func:`jemeval.runtime.distributed.raise_any`), not announced in the store (:func:`tell_peers`)
_JOINING = False
#: set once this process stopped on a peer's error (or on the launch's store closing): nothing to tell
_HEARD = False
ARRIVAL_POLL_S = 0.1


def launch_store(env: Mapping[str, str], rank: int, world: int, timeout: datetime.timedelta) -> Any:
    """The store at MASTER_ADDR:MASTER_PORT as ``init_process_group`` would open it: torchrun's agent
    store (every rank a client) or, launched otherwise, hosted by rank 0."""
    from torch.distributed.rendezvous import _create_c10d_store

    port = env_int(env, "MASTER_PORT")
    return _create_c10d_store(env["MASTER_ADDR"], port, rank, world, timeout)


def store_prefix(env: Mapping[str, str]) -> str:
    """jemeval's keys in the launch's store, per launch attempt (torchrun restarts reuse its store)."""
    return f"jemeval/{env.get('TORCHELASTIC_RUN_ID', '')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


def arrive(store: Any, rank: int, world: int, env: Mapping[str, str], timeout_s: float,
           agreed: Mapping[str, Any] | None = None) -> None:
    """Wait until all ``world`` ranks arrived, or raise the one line of a rank that stopped before it
    joined (:func:`tell_peers`: a bad option, a missing file on its node) instead of waiting for it
    until the timeout; then check that every rank was given what rank 0 was (``agreed``, this rank's
    declaration: :func:`jemeval.runtime.agreement.expect_agreement`).
    Ranks on other nodes start this together: torchrun's rendezvous gathered the nodes. Every error
    raised here is raised by every waiting rank alike (marked ``shared``)."""
    global _HEARD
    prefix = store_prefix(env)
    deadline = time.monotonic() + timeout_s
    with quiet_native_stderr():  # a store the launch already closed is one line below, not torch's C++ frames
        try:
            if rank == 0 and agreed:  # left before arriving: whoever sees every rank arrived can read it
                store.set(prefix + "agreed", json.dumps(agreed))
            _all_reached(store, prefix + "arrived", world, prefix, deadline, timeout_s)
            if store.check([prefix + "agreed"]):  # the same answer on every rank: all of them compare
                agreement.compare_with_rank0(store, prefix, rank, agreed or {})
                _all_reached(store, prefix + "compared", world, prefix, deadline, timeout_s)
                if store.check([prefix + "disagree"]):
                    raise UsageError(store.get(prefix + "disagree").decode(errors="replace"))
        except (UsageError, JemevalError) as exc:
            _HEARD = True  # every waiting rank raises it: nothing to tell the others
            exc.shared = True  # type: ignore[attr-defined]
            raise
        except Exception:  # noqa: BLE001 - torch's DistNetworkError: the launch closed its store
            _HEARD = True
            error = JemevalError("the launch stopped while this process waited for the others to start: another "
                                 "process or node failed (see its own line)")
            error.shared = True  # type: ignore[attr-defined]
            raise error from None


def _all_reached(store: Any, key: str, world: int, prefix: str, deadline: float, timeout_s: float) -> None:
    """Count this rank at ``key`` and wait for all ``world`` ranks there, raising a stopped rank's
    line (:func:`tell_peers`) at once and the missing ones at the deadline."""
    global _HEARD
    store.add(key, 1)
    while store.add(key, 0) < world:
        if store.check([prefix + "failed"]):
            _HEARD = True  # a peer's error: not told back to the peers
            raise UsageError(store.get(prefix + "failed").decode(errors="replace"))
        if time.monotonic() > deadline:
            count = store.add(key, 0)
            raise JemevalError(f"only {count} of the launch's {world} processes started within "
                               f"{timeout_s:g} s: a node that never started or was killed (see its own output)")
        time.sleep(ARRIVAL_POLL_S)


@contextlib.contextmanager
def quiet_native_stderr():
    """Send what C++ code writes to file descriptor 2 (torch's store warnings with their stack frames)
    to /dev/null for the block; Python's own ``sys.stderr`` is flushed first and restored after."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def tell_peers(message: str, env: Mapping[str, str] | None = None) -> bool:
    """In a torchrun worker that stops before joining its process group: leave ``message`` (its one
    line) in the launch's store, where the other ranks, waiting for it to arrive (:func:`arrive`),
    read it and stop with it instead of waiting until the timeout. Returns whether the message was
    left; nothing is done in a single process or after the join (then
    :func:`jemeval.runtime.distributed.raise_any` tells)."""
    env = os.environ if env is None else env
    try:
        rank, world = env_int(env, "RANK"), env_int(env, "WORLD_SIZE")
    except JemevalError:
        return False
    if _JOINING or _HEARD or not world or world < 2 or rank is None or "MASTER_ADDR" not in env \
            or "MASTER_PORT" not in env:
        return False  # after the join raise_any tells; a peer's own error is not told back
    if rank == 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return False  # rank 0 would host the store itself: nobody could read it
    try:
        with quiet_native_stderr():
            store = launch_store(env, rank, world, datetime.timedelta(seconds=30))
            store.compare_set(store_prefix(env) + "failed", "", f"process {rank} of {world} stopped: {message}")
    except Exception:  # noqa: BLE001 - no store to tell (rank 0's own store, or the launch is gone)
        return False
    return True


def joining() -> None:
    """Mark that this process began joining its process group: from now on an error is exchanged
    through the group (:func:`jemeval.runtime.distributed.raise_any`), not left in the store."""
    global _JOINING
    _JOINING = True
