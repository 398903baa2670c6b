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


def quick_digits_cnn(path, seed: int):
    """A digits cnn (width 4) after 4 quick epochs of cross-entropy, saved at ``path``: accuracy well
    above chance, so report and robust numbers are not all 0, in a second or two."""
    import torch

    import jemeval
    from jemeval.formats.native import save_checkpoint

    torch.manual_seed(seed)
    ds = jemeval.load_dataset("digits", "train")
    model = jemeval.create_model("cnn", 10, (1, 8, 8), width=4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(4):
        for i in range(0, len(ds), 64):
            loss = torch.nn.functional.cross_entropy(model(ds.x[i:i + 64]), ds.y[i:i + 64])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return save_checkpoint(path, model.eval(), dataset="digits")
