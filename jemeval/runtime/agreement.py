"""What every rank of a launch must be given alike, compared when the ranks meet in the launch's
store (:func:`jemeval.runtime.arrival.arrive`), before they join the process group.

Each node's agent starts the command line it was given; nothing else makes two nodes run the same
command. Given ``--n 200`` on one node and ``--n 100`` on the other, or two different copies of a
checkpoint at the same path, each node would compute with its own and the launch would end as if
all was well. Here every rank compares what it declared (:func:`expect_agreement`: the CLI
declares the parsed options and the content of the files the command reads) with rank 0's, and a
difference is one line naming it, on every rank.
"""
from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from typing import Any

#: what every rank of a launch must be given alike (:func:`expect_agreement`), compared at arrival
_AGREED: dict[str, dict[str, str]] = {}
#: at most this many differences are named in the one line
_DIFFERENCES_SHOWN = 3


def expect_agreement(options: Mapping[str, str], files: Mapping[str, str] | None = None) -> None:
    """Declare what every rank of the launch must hold alike, before joining: a command's ``options``
    as parsed (``{"--n": "200"}``) and the content of the ``files`` it reads (``{"the input checkpoint
    'm.pt' (--model)": "sha256 ..."}``), each value shown as the user would read it. When the ranks
    arrive (:func:`jemeval.runtime.arrival.arrive`) each compares its own with rank 0's: nodes
    started with different command lines (``--n 200`` on one, ``--n 100`` on the other) or different
    copies of a file stop with one line naming what differs, instead of each running with its own.
    Nothing is compared in a single process, nor when rank 0 declared nothing."""
    global _AGREED
    _AGREED = {"options": {str(k): str(v) for k, v in options.items()},
               "files": {str(k): str(v) for k, v in (files or {}).items()}}


def compare_with_rank0(store: Any, prefix: str, rank: int, agreed: Mapping[str, Any]) -> None:
    """Leave this rank's difference from rank 0's declared values as the launch's one line (the
    first rank that finds one writes it; the others keep it)."""
    if rank == 0 or not agreed:
        return
    found = _differences(json.loads(store.get(prefix + "agreed")), agreed)
    if found is None:
        return
    advice, lines = found
    group = os.environ.get("GROUP_RANK")
    where = f"process {rank}" + (f" (node {group}, host {socket.gethostname()})" if group else "")
    shown = "; ".join(f"{key} is {theirs} on process 0 but {ours} on {where}" for key, theirs, ours in
                      lines[:_DIFFERENCES_SHOWN])
    more = f" (and {len(lines) - _DIFFERENCES_SHOWN} more)" if len(lines) > _DIFFERENCES_SHOWN else ""
    store.compare_set(prefix + "disagree", "", f"the launch's nodes were not given {advice}: {shown}{more}; "
                      f"give every node {advice}")


def _differences(reference: Mapping[str, Any], own: Mapping[str, Any]) -> tuple[str, list[tuple[str, str, str]]] | None:
    """(what to give every node, [(key, rank 0's value, this rank's)]): the options that differ,
    else the files (a file named by an option that differs differs too: it would say nothing more)."""
    for kind, advice, absent in (("options", "the same command line", "not given"),
                                 ("files", "the same files", "missing")):
        theirs, ours = reference.get(kind, {}), own.get(kind, {})
        lines = [(k, theirs.get(k, absent), ours.get(k, absent))
                 for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k)]
        if lines:
            return advice, lines
    return None


def declared() -> dict[str, dict[str, str]]:
    """What this process declared (:func:`expect_agreement`); empty when nothing was."""
    return _AGREED
