"""Ceilings on the counts an evaluation multiplies its work by, checked before any work starts.

A count (attack iterations, SGLD steps, EOT draws, chains, restarts, bins, bootstrap resamples) is
a loop bound or a batch multiplier: a few zeros too many (``--steps 1000000000``) made a run of
days, or an allocation no machine holds, found out only after the model, the data and the first
sections had run. Two checks refuse such sizes in one line instead, before anything is computed:

* time: every count has a ceiling (:data:`CEILINGS`), far above any use jemeval's presets or the
  JEM paper make of it (the reason is stated beside each), and a robust evaluation's
  forward-and-backward passes per attacked input, restarts x steps x EOT samples x (K x chains + 1),
  have one too (:data:`MAX_PASSES_PER_INPUT`): ceilings fixed in the code, not measured, so the
  same command is refused or run alike on every machine;
* memory: the inputs one forward pass holds at once (batch x chains x EOT samples copies, each
  C x H x W float32 values) are a lower bound of what it needs; above the device's whole memory
  (:func:`device_memory`) it can never fit (:func:`check_memory`). The network's activations come
  on top, so passing this check is no promise that a run fits: only a size that cannot is refused.

Every check names the parameter (the command line shows its flag) and says what would run.
"""
from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from typing import Any

import torch

from jemeval.errors import UsageError

#: count -> (its ceiling, why that far and no further). Each is a loop bound: one more is one more
#: pass (or resample) of every input it applies to.
CEILINGS: dict[str, tuple[int, str]] = {
    "attack_steps": (100_000, "1,000 x the 100 PGD iterations of the JEM paper's evaluation"),
    "restarts": (1_000, "50 x the 20 random starts of the JEM paper's PGD"),
    "eot_samples": (10_000, "1,000 x jemeval's default 10 and 500 x AutoAttack rand's 20 noise draws per gradient"),
    "draws": (10_000, "2,000 x the 5 fresh-noise re-checks recommended for a refined model"),
    "chains": (10_000, "2,000 x the JEM paper's 5 noisy copies of each refined input"),
    "refine_steps": (100_000, "10,000 x the largest K = 10 of the JEM paper's evaluation"),
    "sgld_steps": (100_000, "1,000 x the 100 SGLD iterations jemeval samples with by default"),
    "epochs": (100_000, "over 600 x the JEM paper's 150 passes over CIFAR-10"),
    "buffer_size": (10_000_000, "1,000 x the JEM paper's replay buffer of 10,000 images"),
    "ascent_steps": (100_000, "500 x the 200 gradient-ascent iterations of jemeval distal"),
    "bins": (10_000, "500 x the default 20; even ImageNet's 50,000 validation images leave only 5 per "
                     "interval at 10,000, and the reliability table holds one row per interval in every record"),
    "bootstrap": (100_000, "50 x the 2,000 resamples of the report's paired tests"),
}
#: forward-and-backward passes a robust evaluation may spend on one input at one epsilon: at a
#: microsecond a pass (the smallest model on a fast device) 10^9 are over 15 minutes per input,
#: epsilon and attack; the JEM paper's setting (20 restarts x 100 steps x (10 x 5 + 1)) is 1.02 x 10^5
MAX_PASSES_PER_INPUT = 10**9
#: bytes per input value (float32)
VALUE_BYTES = 4


def ceiling(kind: str) -> int:
    return CEILINGS[kind][0]


def check_count(param: str, value: Any, kind: str | None = None, *, low: int = 1) -> int:
    """``value`` of ``param`` as a whole number in [``low``, the ceiling of ``kind`` (default
    ``param``)]: one line naming the parameter, the ceiling and its reason otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value).is_integer():
        raise UsageError(f"{param} must be a whole number >= {low}, got {value!r}", param=param)
    if value < low:
        raise UsageError(f"{param} must be >= {low}, got {value}", param=param)
    top, reason = CEILINGS[kind or param]
    if int(value) > top:
        raise UsageError(f"{param} {int(value):,} is more than jemeval runs: at most {top:,} ({reason}); a size "
                         "beyond it would run for days or need more memory than a machine has", param=param)
    return int(value)


def check_passes(param: str, passes: int, parts: str) -> None:
    """The forward-and-backward passes per input (``parts`` says how they were counted) within
    :data:`MAX_PASSES_PER_INPUT`, else one line naming ``param``, the product and the ceiling."""
    if passes > MAX_PASSES_PER_INPUT:
        raise UsageError(f"{param}: {parts} = {passes:.3g} forward-and-backward passes per input, more than the "
                         f"{MAX_PASSES_PER_INPUT:.0e} jemeval runs (over 15 minutes per input even at a microsecond "
                         "a pass); lower one of them", param=param)


# -- memory ---------------------------------------------------------------------------------------------
def device_memory(device: str | torch.device) -> int | None:
    """All the memory of ``device`` in bytes: a CUDA device's own, else the machine's physical
    memory (capped by the cgroup limit of a container); None where it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(device.index or 0).total_memory)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX
        return None
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as fh:
            limit = fh.read().strip()
        total = min(total, int(limit)) if limit.isdigit() else total
    except OSError:
        pass
    return int(total)


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_memory(param: str, copies: Sequence[tuple[str, int]], input_shape: Sequence[int],
                 device: str | torch.device) -> None:
    """The images held at once, the product of ``copies`` ((parameter, count): batch, chains, EOT
    samples, ...), each ``input_shape`` float32 values, within the memory of ``device``; above it,
    one line naming ``param`` and the factors (a lower bound of a forward pass: activations come on
    top, so only what can never fit is refused)."""
    images = math.prod(count for _, count in copies)
    need, total = images * math.prod(int(d) for d in input_shape) * VALUE_BYTES, device_memory(device)
    if total is not None and need > total:
        product = " x ".join(f"{name} {count:,}" for name, count in copies)
        product += f" = {images:,} images" if len(copies) > 1 else " images"
        shape = "x".join(str(int(d)) for d in input_shape)
        raise UsageError(f"{product} of {shape} values held at once take {_gib(need)} before any activation, more "
                         f"than the {_gib(total)} of the device ({torch.device(device)}); lower one of them",
                         param=param)
