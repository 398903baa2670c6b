"""Stopping a run cleanly: Ctrl-C / SIGTERM, or a request from Python, ends it after the current
iteration with last.pt saved (mid-epoch positions included), so ``resume`` continues exactly.

A second Ctrl-C aborts at once. Under DDP the ranks agree on a stop (a collective with a host sync)
only at the divergence-check iterations, so a stop waits at most ``check_every`` iterations and no
synchronisation is added per step.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from jemeval.runtime.distributed import DistContext
from jemeval.training import ddp


class StopRequest:
    """Why the run should stop (None: it should not)."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason

    def agreed(self, ctx: DistContext, device: torch.device, *, at_check: bool) -> bool:
        """Whether to stop at this iteration (every rank must call it: a collective under DDP)."""
        if ctx.distributed:
            if not at_check:
                return False
            if ddp.any_rank(self.reason is not None, device):
                self.request("stop requested on another process")
        return bool(self.reason)

    @contextmanager
    def on_signals(self, notify: Callable[[str], None]) -> Iterator[None]:
        """SIGINT and SIGTERM request a stop (``notify(name)`` says so) while the block runs."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum, frame) -> None:
            if self.reason:  # a second Ctrl-C aborts at once
                raise KeyboardInterrupt
            name = signal.Signals(signum).name
            self.reason = name
            notify(name)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
