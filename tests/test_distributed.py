"""Data-parallel utilities: environment checks, sharding, RNG streams, and a real 2-process gloo run.

The 2-process test trains a BatchNorm-free model on a JEM loss (cross-entropy plus the contrast of
log p~ on data and on noise-free SGLD samples) with batch B/2 per rank, and checks that it ends
with the same parameters as one process with batch B.
"""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from helpers import free_port
from torch import nn

from jemeval.energy.model import EnergyModel
from jemeval.errors import JemevalError
from jemeval.runtime import distributed as D
from jemeval.runtime.fastpath import FastPath, joint_logits
from jemeval.sampling.sgld import SGLD

N, GLOBAL_BATCH, STEPS, SEED = 24, 8, 3, 7  # 3 steps = one epoch


def _model() -> EnergyModel:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(4 * 16, 3))
    return EnergyModel(net, num_classes=3, input_shape=(1, 4, 4))


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.rand((N, 1, 4, 4), generator=g) * 2 - 1
    return x, torch.arange(N) % 3, torch.rand((N, 1, 4, 4), generator=g) * 2 - 1  # data, labels, chain starts


def _train(ctx: D.DistContext) -> torch.Tensor:
    """A few JEM steps on this rank's shard; returns the flattened parameters."""
    model = _model()
    prepared = FastPath().prepare(model, wrap=ctx.wrap)  # DDP for training, the bare module for SGLD
    ddp = prepared.run
    assert prepared.sample is model and (ddp is model) == (not ctx.distributed)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    x, y, starts = _data()
    shard = D.shard_indices(N, ctx.rank, ctx.world_size, SEED, epoch=0)
    b = GLOBAL_BATCH // ctx.world_size
    sampler = SGLD(steps=3, step_size=1.0, noise=0.0)
    for step in range(STEPS):
        idx = shard[step * b:(step + 1) * b]
        assert len(idx) == b
        x_q = sampler.sample(prepared.sample, starts[idx])
        logits_d, logits_q = joint_logits(ddp, x[idx], x_q)
        loss = F.cross_entropy(logits_d, y[idx]) - (logits_d.logsumexp(1).mean() - logits_q.logsumexp(1).mean())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    ctx = D.init_from_env(backend="gloo", env=env, timeout_s=60)
    try:
        params = _train(ctx)
        mean = D.all_reduce_mean(torch.tensor([float(rank + 1)]))
        gathered = D.all_gather_cat(torch.full((2,), float(rank)))
        noise = torch.randn(4, generator=D.rank_generator(SEED, ctx.rank))
        streams = D.all_gather_cat(noise)
        D.barrier()
        if ctx.is_main:
            torch.save({"params": params, "mean": mean, "gathered": gathered, "streams": streams,
                        "ctx": (ctx.rank, ctx.world_size, ctx.backend, ctx.distributed)}, out)
    finally:
        D.destroy()




@pytest.mark.slow
def test_two_gloo_processes_match_one_process_with_the_full_batch(tmp_path):
    out = str(tmp_path / "rank0.pt")
    mp.spawn(_worker, args=(2, free_port(), out), nprocs=2, join=True)
    result = torch.load(out)
    single = _train(D.init_from_env(env={}))
    assert result["ctx"] == (0, 2, "gloo", True)
    initial = torch.cat([p.detach().flatten() for p in _model().parameters()])
    assert not torch.equal(single, initial), "no training happened"
    torch.testing.assert_close(result["params"], single, rtol=1e-4, atol=1e-5)
    assert result["mean"].item() == pytest.approx(1.5)
    assert result["gathered"].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert not torch.equal(result["streams"][:4], result["streams"][4:]), "ranks share an SGLD noise stream"


def test_shards_are_deterministic_disjoint_and_cover_the_data():
    shards = [D.shard_indices(10, r, 3, seed=1, epoch=2) for r in range(3)]
    assert all(len(s) == 4 for s in shards)  # 10 padded to 12, dealt to 3 ranks
    assert set(torch.cat(shards).tolist()) == set(range(10))
    assert torch.equal(shards[1], D.shard_indices(10, 1, 3, seed=1, epoch=2))
    assert not torch.equal(D.shard_indices(10, 0, 1, seed=1, epoch=2), D.shard_indices(10, 0, 1, seed=1, epoch=3))
    dropped = [D.shard_indices(10, r, 3, seed=1, epoch=2, drop_last=True) for r in range(3)]
    assert all(len(s) == 3 for s in dropped) and len(set(torch.cat(dropped).tolist())) == 9
    assert torch.equal(D.shard_indices(5, 0, 1, seed=0, epoch=0, shuffle=False), torch.arange(5))


def test_rank_generators_are_reproducible_and_distinct():
    a = torch.rand(3, generator=D.rank_generator(0, 0))
    assert torch.equal(a, torch.rand(3, generator=D.rank_generator(0, 0)))
    assert not torch.equal(a, torch.rand(3, generator=D.rank_generator(0, 1)))
    assert not torch.equal(a, torch.rand(3, generator=D.rank_generator(1, 0)))


def test_single_process_context_and_helpers_are_no_ops():
    ctx = D.init_from_env(env={})
    assert (ctx.rank, ctx.world_size, ctx.distributed, ctx.is_main) == (0, 1, False, True)
    model = _model()
    assert ctx.wrap(model) is model and not D.active()
    t = torch.tensor([2.0])
    assert D.all_reduce_mean(t) is t and t.item() == 2.0
    assert D.all_gather_cat(t).tolist() == [2.0]
    D.barrier()


@pytest.mark.parametrize("env, message", [
    ({"RANK": "0"}, "set both RANK and WORLD_SIZE"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 must be in [0, WORLD_SIZE=2)"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "MASTER_ADDR is not set"),
    ({"RANK": "0", "WORLD_SIZE": "1"}, None),
])
def test_inconsistent_launch_environments_fail_with_one_line(env, message):
    if message is None:
        assert D.init_from_env(env=env, backend="gloo").world_size == 1
        return
    with pytest.raises(JemevalError) as err:
        D.init_from_env(env=env, backend="gloo")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_unknown_backend_is_one_line():
    with pytest.raises(JemevalError, match="unknown distributed backend 'mpi': choose gloo"):
        D.init_from_env(env={"RANK": "0", "WORLD_SIZE": "1"}, backend="mpi")


def _leaving_worker(rank: int, port: int, synchronize: bool, out: str) -> None:
    import time

    env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    D.init_from_env(backend="gloo", env=env, timeout_s=60)
    D.gather_objects(rank)  # a last collective, as every command ends with raise_any's exchange
    if rank == 1:
        time.sleep(1.5)  # the slow rank: still busy when rank 0 leaves
    start = time.monotonic()
    D.destroy(synchronize=synchronize)
    if rank == 0:
        torch.save({"waited": time.monotonic() - start, "left": not D.dist.is_initialized()}, out)


@pytest.mark.slow
def test_leaving_together_waits_for_the_slowest_rank(tmp_path):
    # a rank that finished first must not tear the group down under a peer's feet (CI saw a gloo
    # worker abort, exit -6, after it had written its results; without the barrier, leaving at
    # different times here once hung rank 0 for the group's whole timeout)
    out = str(tmp_path / "rank0.pt")
    mp.spawn(_leaving_worker, args=(free_port(), True, out), nprocs=2, join=True)
    result = torch.load(out)
    assert result["left"]
    assert result["waited"] >= 1.0
