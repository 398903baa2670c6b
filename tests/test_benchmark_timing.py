"""benchmarks/timing.py's FLOP counter (the benchmarks' achieved FLOP/s): equal to torch's own
FlopCounterMode wherever that one runs, and it also counts an SGLD step, where FlopCounterMode
raises (its module tracker cannot follow ``autograd.grad`` taken with respect to a module's input)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from jemeval.energy.factory import create_model
from jemeval.runtime.fastpath import FastPath
from jemeval.sampling.sgld import SGLD

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def timing(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import timing

    return timing


@pytest.fixture
def wrn():
    torch.manual_seed(0)
    return create_model("wrn:depth=10,widen=1", 10, (3, 16, 16)).to("cpu")


def library_count(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_a_training_pass_counts_what_flopcountermode_counts(timing, wrn):
    x, y = torch.rand(4, 3, 16, 16) * 2 - 1, torch.tensor([0, 1, 2, 3])

    def train_pass():
        F.cross_entropy(wrn(x), y).backward()

    expected = library_count(train_pass)
    assert expected > 0
    assert timing.flops_of(train_pass) == expected


def test_an_sgld_step_counts_a_forward_and_the_input_gradient(timing, wrn):
    x = torch.rand(4, 3, 16, 16) * 2 - 1

    def sgld_step():
        SGLD(steps=1).sample(wrn, x, generator=torch.Generator().manual_seed(0))

    with pytest.raises(RuntimeError):  # why timing has its own counter
        library_count(sgld_step)

    def same_math_through_backward():  # d/dx of logsumexp, parameters frozen: what a step computes
        for p in wrn.parameters():
            p.requires_grad_(False)
        wrn(x.clone().requires_grad_(True)).logsumexp(1).sum().backward()
        for p in wrn.parameters():
            p.requires_grad_(True)

    expected = library_count(same_math_through_backward)
    with torch.no_grad():
        forward = library_count(lambda: wrn(x))
    assert expected == 2 * forward  # every layer's backward-data costs its forward (the input needs it too)
    assert timing.flops_of(sgld_step) == expected
    fast = FastPath(channels_last=True, bf16=True)  # the count is the math's, not the layout's or precision's
    prepared = fast.prepare(wrn).run
    assert timing.flops_of(lambda: SGLD(steps=1).sample(prepared, x, fastpath=fast)) == expected


def test_the_header_names_the_processor(timing):
    name = timing.processor_name()
    assert name and name in timing.header("t", torch.device("cpu"))


def test_the_matmul_ceiling_is_2n3_flops_over_the_median_time(timing, monkeypatch):
    clock = iter([0.0, 1.0, 10.0, 12.0, 20.0, 23.0])  # three timed matmuls: 1 s, 2 s, 3 s
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    n = 64
    assert timing.gemm_ceiling(torch.device("cpu"), torch.float32, n=n, repeats=3) == 2 * n ** 3 / 2.0
