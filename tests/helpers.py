"""Small helpers several test files share (importable because pytest puts tests/ on sys.path)."""
from __future__ import annotations

import socket
from typing import Any

#: wall-clock values: the only things two identical runs may differ in
VOLATILE = ("created", "seconds", "examples_per_s")


def without_timings(obj: Any) -> Any:
    """``obj`` (nested dicts and lists) without timestamps and timings; everything else compares exactly."""
    if isinstance(obj, dict):
        return {k: without_timings(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [without_timings(v) for v in obj]
    return obj


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (for a test's own process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
