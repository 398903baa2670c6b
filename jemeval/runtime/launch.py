"""``--nproc N``: the same command line again, in N processes on this machine, through
``torch.distributed.run`` (gloo on CPU, nccl on CUDA with one GPU per process).

Shared by ``jemeval train`` (DistributedDataParallel, :func:`jemeval.training.rundir.check_launch` adds its
checks) and the evaluation commands (sharded by whole batches, :mod:`jemeval.runtime.shards`).
Everything a worker would refuse about the processes themselves is checked first
(:func:`check_nproc`), so a mistake is one line before any process starts; inside a worker the
launch is not repeated (:func:`launched_by_torchrun`).

Run as ``python -m jemeval.runtime.launch ARGS`` this module is ``torch.distributed.run`` itself,
except that a worker's failure ends with that worker's own one-line error (the launcher adds no
traceback of its own): what :func:`relaunch` starts, and the launcher of one agent per node for several
nodes (docs/performance.md, "Several nodes"): unlike ``torchrun`` it does not take a command's ``--n``
for its own ``--nnodes`` (``allow_abbrev`` off).
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

if __name__ == "__main__":  # the launcher itself: torch's C++ store warnings (a stopping peer's store) stay quiet
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # read once, when torch loads: set it first

import torch  # noqa: E402

from jemeval.errors import UsageError
from jemeval.runtime.distributed import available_cpus

#: exit statuses of a worker that already said why in one line (click's: 1 error, 2 usage error),
#: or that was interrupted (130: Ctrl-C, said once by the process the user started)
EXPLAINED_EXITS = (1, 2, 130)
#: set in the workers :func:`relaunch` starts: their stderr is the user's terminal, so only rank 0
#: reports a Ctrl-C (:func:`quiet_worker`); the launcher and the user's own process say nothing
RELAUNCHED_ENV = "JEMEVAL_RELAUNCHED"


def quiet_worker() -> bool:
    """True in a worker that :func:`relaunch` started, other than rank 0: it says nothing of a
    Ctrl-C (rank 0 says it once for all of them)."""
    return os.environ.get(RELAUNCHED_ENV) == "1" and os.environ.get("RANK", "0") != "0"


def reports_errors() -> bool:
    """Whether this process says an error every rank of a launch raised alike: outside a launch, or
    as the first process of its node (LOCAL_RANK 0). Every node's terminal or log gets the one line
    once; the node's other processes end with the same exit status, silently. A process that ends
    with status 0 instead would leave its node's agent waiting for the others at its exit barrier."""
    return os.environ.get("LOCAL_RANK", "0") in ("", "0")


def launched_by_torchrun(nproc: int | None) -> bool:
    """True inside a torchrun worker (then ``nproc``, when given, must agree with its WORLD_SIZE)."""
    world = os.environ.get("WORLD_SIZE")
    if world is None:
        return False
    if nproc is not None and int(world) != nproc:
        raise UsageError(f"nproc={nproc} disagrees with the launcher's WORLD_SIZE={world}: drop nproc under "
                         "torchrun", param="nproc")
    return True


def check_nproc(nproc: int, device: torch.device) -> None:
    """Refuse more local processes than there are devices for them, before any starts (one line):
    one GPU each with nccl, one CPU core each with gloo (more only thrash and can exhaust memory)."""
    if nproc < 1:
        raise UsageError(f"nproc must be >= 1, got {nproc}", param="nproc")
    if device.type == "cuda":
        have = torch.cuda.device_count()
        if nproc > have:
            raise UsageError(f"nproc={nproc} needs one GPU per process but {have} GPU(s) are visible: use "
                             f"nproc={have} or fewer, or device='cpu' for {nproc} gloo processes on CPU", param="nproc")
        return
    cores = available_cpus()
    if nproc > cores:
        raise UsageError(f"nproc={nproc} is more than the {cores} CPU core(s) available to gloo processes on CPU: "
                         f"use nproc={cores} or fewer", param="nproc")


def relaunch(nproc: int, args: list[str], command: str = "train") -> int:
    """Run the command line ``args`` (``COMMAND ...``, without ``--nproc``) under
    ``torch.distributed.run`` with ``nproc`` local processes; returns its exit status."""
    if command not in args:
        raise UsageError("nproc re-launches the command line and needs it: use torchrun "
                         f"--nproc-per-node {nproc} -m jemeval {command} ... instead", param="nproc")
    cmd = [sys.executable, "-m", "jemeval.runtime.launch", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "jemeval", *args]
    env = {**os.environ, RELAUNCHED_ENV: "1"}
    env.setdefault("OMP_NUM_THREADS", str(max(1, available_cpus() // nproc)))
    proc = subprocess.Popen(cmd, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the whole process group: the launcher and the workers
        try:  # stop by themselves (a training run saves last.pt first; rank 0 says so): wait for them
            return proc.wait()
        except KeyboardInterrupt:  # a second Ctrl-C: the launcher ends its workers
            proc.send_signal(signal.SIGTERM)
            return proc.wait()


def run_workers(argv: list[str]) -> int:
    """``torch.distributed.run`` with ``argv``; the first failed worker's exit status, and one line
    only when that worker could not say why itself (a crash or a signal, not a jemeval error).
    Before it, the rendezvous endpoint is checked and torch's exit barrier replaced
    (:mod:`jemeval.runtime.rendezvous`): a port another program holds, or a node that left, is one
    line on every node, and a SIGTERM ends the agent at once."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import get_args_parser, run

    from jemeval.runtime.rendezvous import EndpointTaken, check_endpoint, endpoint_of, install_exit_barrier

    logging.disable(logging.ERROR)  # its report is a traceback, its Ctrl-C a warning: the workers say why
    parser = get_args_parser()
    parser.allow_abbrev = False  # else the command's own --n would be taken for the launcher's --nnodes
    args = parser.parse_args(argv)
    try:
        endpoint = endpoint_of(args)
        if endpoint is not None:
            check_endpoint(*endpoint)
        install_exit_barrier()
        run(args)
    except SignalException:  # Ctrl-C or SIGTERM: the workers were stopped; the parent says so once
        return 130
    except EndpointTaken as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a failed worker, a node that left, a failed rendezvous; else raised again
        return _failed_launch(exc)
    return 0


def _failed_launch(exc: BaseException) -> int:
    """The exit status of a launch that ended with ``exc``, and its one line where nobody said it:
    a failed worker's status (silent when the worker explained itself), a node that left, or a
    rendezvous that failed before the workers started. Closing the rendezvous after a worker failed
    (another node's agent, the store's host, may be gone) raises again: the worker's failure counts."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    from jemeval.runtime.rendezvous import NodeLeft

    cause = _in_chain(exc, (ChildFailedError, NodeLeft))
    if isinstance(cause, ChildFailedError):
        rank, failure = cause.get_first_failure()
        code = failure.exitcode
        if code not in EXPLAINED_EXITS:
            print(f"Error: process {rank} of the launch ended with exit status {code}", file=sys.stderr)
        return code if 0 < code < 256 else 1
    if isinstance(cause, NodeLeft):
        print(f"Error: {cause}", file=sys.stderr)
        return 1
    if not isinstance(exc, RendezvousError):
        raise exc
    if not _after_the_workers(exc):
        print(f"Error: the launch's rendezvous failed: {str(exc).splitlines()[0]}", file=sys.stderr)
    return 1  # after the workers: another node's launcher closed the store first; the workers said why


def _in_chain(exc: BaseException | None, kinds: tuple[type, ...]) -> BaseException | None:
    """The first error of one of ``kinds`` in ``exc`` and the errors it was raised while handling."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kinds):
            return exc
        seen.add(id(exc))
        exc = exc.__context__
    return None


def _after_the_workers(exc: BaseException) -> bool:
    """Whether a rendezvous error came while the launcher closed the launch (its exit barrier or the
    rendezvous' shutdown), after its workers ended and said why, rather than before they started."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in ("_exit_barrier", "shutdown"):
            return True
        tb = tb.tb_next
    return False


def main(argv: list[str]) -> int:
    """The launcher process's entry: :func:`run_workers`, and 130 without a word for a Ctrl-C that
    came before torch's launcher took its signals over (while it was being imported): the workers stop
    by themselves and the jemeval process that relaunched says "Aborted!" once."""
    # the workers too: torch's C++ warnings (a store a stopping peer already closed: a line and ~30
    # stack frames) would follow a worker's one-line error; errors are still printed
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        return run_workers(argv)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover - exercised through relaunch in the slow tests
    sys.exit(main(sys.argv[1:]))
