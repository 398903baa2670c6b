"""Device names as users write them: one parser for the command line and the Python API.

``load_model(path, device="gpu")`` and ``--device gpu`` must fail the same way, with one line that
lists what is valid, instead of torch's "Expected one of cpu, cuda, ... device type" from deep
inside ``Module.to``. The command line's ``--device`` goes through :func:`resolve_device` too.
"""
from __future__ import annotations

import platform
from typing import Any

import torch

from jemeval.errors import UsageError, did_you_mean

#: what users may write (besides a torch.device): "auto" = cuda when available, else cpu
DEVICE_CHOICES = ("cpu", "cuda", "cuda:N", "auto")


def resolve_device(device: str | torch.device | None, *, name: str = "device") -> torch.device:
    """A usable :class:`torch.device` for ``device`` (None and "auto": cuda when available, else cpu).

    Refused with one line naming ``name`` (the parameter, or the command line's flag): a string
    torch does not parse (``"gpu"``), CUDA when it is not available, ``cuda:N`` beyond the visible
    GPUs, and device types other than cpu, cuda and an available mps (``meta`` would give garbage,
    not an error).
    """
    if device is None or (isinstance(device, str) and device.strip().lower() in ("", "auto")):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    param = name if name.isidentifier() else None  # the command line passes its flag, e.g. "--device"
    if isinstance(device, torch.device):
        dev = device
    else:
        text = str(device).strip()
        try:
            dev = torch.device(text.lower())
        except (RuntimeError, ValueError, TypeError):
            hint = " (did you mean 'cuda'?)" if "gpu" in text.lower() else did_you_mean(text, ("cpu", "cuda", "auto"))
            raise UsageError(f"unknown {name} {text!r}{hint}: use {', '.join(DEVICE_CHOICES)}", param=param) from None
    if dev.type == "mps" and torch.backends.mps.is_available():
        return dev
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"{name} {str(device)!r} is not one jemeval runs on: use {', '.join(DEVICE_CHOICES)}",
                         param=param)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"{name} {str(device)!r} requested but CUDA is not available here; use cpu", param=param)
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise UsageError(f"{name} {str(device)!r} does not exist: this machine has {count} GPU(s), "
                             f"cuda:0..cuda:{count - 1}", param=param)
    return dev


def device_description(device: str | torch.device | None) -> dict[str, Any]:
    device = torch.device(device or "cpu")
    info: dict[str, Any] = {"device": str(device)}
    if device.type == "cuda" and torch.cuda.is_available():
        idx = device.index if device.index is not None else torch.cuda.current_device()
        info["device_name"] = torch.cuda.get_device_name(idx)
        info["cuda_version"] = torch.version.cuda
    else:
        info["device_name"] = platform.processor() or platform.machine()
        info["cpu_threads"] = torch.get_num_threads()
    return info
