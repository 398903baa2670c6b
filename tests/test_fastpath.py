"""The fast path: switch defaults, bf16 autocast with fp32 SGLD arithmetic, channels_last, the
compiled/eager split, the shared data+samples forward, and SGLD's default behaviour unchanged."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from jemeval.energy.factory import create_model
from jemeval.energy.model import EnergyModel
from jemeval.runtime.fastpath import FastPath, has_batchnorm, joint_logits, to_fp32, unwrap
from jemeval.sampling.buffer import ReplayBuffer
from jemeval.sampling.sgld import SGLD, frozen, model_log_p
from jemeval.testing import tiny_model


def _cnn():
    torch.manual_seed(0)
    return create_model("cnn:width=8", 10, (1, 8, 8)).eval()


def test_for_device_defaults_and_overrides():
    cpu = FastPath.for_device("cpu")
    assert cpu.channels_last and not (cpu.bf16 or cpu.compile or cpu.pin_memory)
    cuda = FastPath.for_device("cuda")
    assert cuda.channels_last and cuda.pin_memory and not cuda.compile  # compile: no measured gain, slow start
    assert cuda.bf16 == (torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    fp = FastPath.for_device("cuda:0", compile=True, bf16=None)  # None keeps the device default
    assert fp.compile and fp.bf16 == cuda.bf16
    assert FastPath.for_device("cpu", bf16=True).autocast_dtype is torch.bfloat16
    assert FastPath().autocast_dtype is None
    with pytest.raises(TypeError, match="unknown fast-path switch"):
        FastPath.for_device("cpu", tf33=True)


def test_sgld_default_is_the_plain_fp32_update():
    """Without a fast path a step is exactly x + step_size * grad + noise * randn (JEM's update)."""
    m = tiny_model(num_classes=3)
    x0 = torch.rand(16, 1, 4, 4) * 2 - 1
    sgld = SGLD(steps=4, step_size=0.5, noise=0.05, clamp=(-1.2, 1.2))
    out = sgld.sample(m, x0, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    x = x0.clone()
    for _ in range(4):
        xr = x.clone().requires_grad_(True)
        with frozen(m):
            (grad,) = torch.autograd.grad(m.log_px(xr).sum(), xr)
        x = (x + 0.5 * grad + 0.05 * torch.randn(x.shape, generator=g)).clamp(-1.2, 1.2)
    torch.testing.assert_close(out, x, rtol=0, atol=1e-6)
    assert torch.equal(x0, x0.clone()) and out.dtype == torch.float32


def test_bf16_sampling_keeps_fp32_chains_and_stays_close_to_fp32():
    m = tiny_model(num_classes=3)
    x0 = torch.rand(256, 1, 4, 4) * 2 - 1
    sgld = SGLD(steps=10, step_size=1.0, noise=0.01)
    fp = FastPath(bf16=True)
    ref, tr_ref = sgld.sample(m, x0, generator=torch.Generator().manual_seed(0), return_trace=True)
    out, trace = sgld.sample(m, x0, generator=torch.Generator().manual_seed(0), return_trace=True, fastpath=fp)
    assert out.dtype == torch.float32 and trace.dtype == torch.float32
    assert not torch.is_autocast_enabled("cpu")
    # bf16 rounding of the network moves the chains by ~1% of their displacement, well under the
    # Langevin noise accumulated over the steps (0.01 * sqrt(10) per coordinate)
    assert (out - ref).norm() < 0.03 * (ref - x0).norm()
    assert (out - ref).abs().mean() < 0.01
    assert trace[-1] > trace[0] + 0.1  # still ascends log p~(x)
    torch.testing.assert_close(trace, tr_ref, rtol=0, atol=0.02)
    buf = ReplayBuffer(8, (1, 4, 4))
    buf.push(torch.arange(4), out[:4])
    assert buf.data.dtype == torch.float32 and torch.equal(buf.data[:4], out[:4])
    y = torch.arange(256) % 3
    xy = sgld.sample(m, x0, y, fastpath=fp)
    with torch.no_grad():
        assert (m.log_pxy(xy, y) - m.log_pxy(x0, y)).mean() > 0.1


def test_bf16_input_gradients_point_the_same_way_on_a_conv_net():
    m = _cnn()
    x = torch.rand(32, 1, 8, 8) * 2 - 1
    from jemeval.sampling.sgld import _input_grad

    with frozen(m):
        v32, g32 = _input_grad(m, x, None, False, None)
        v16, g16 = _input_grad(m, x, None, False, torch.bfloat16)
    assert v16.dtype == g16.dtype == torch.float32
    cos = torch.nn.functional.cosine_similarity(g32.flatten(1), g16.flatten(1))
    assert cos.min() > 0.95
    torch.testing.assert_close(v16, v32, rtol=0, atol=0.02)


def test_channels_last_gives_the_same_chains():
    m = _cnn()
    x0 = torch.rand(8, 1, 8, 8) * 2 - 1
    sgld = SGLD(steps=3, step_size=50.0, noise=0.01)
    ref = sgld.sample(m, x0, generator=torch.Generator().manual_seed(1))
    prepared = FastPath(channels_last=True).prepare(m)
    assert prepared.run is m and not prepared.compiled
    conv = m.net.features[0]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    out = sgld.sample(m, x0, generator=torch.Generator().manual_seed(1), fastpath=FastPath(channels_last=True))
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert (ref - x0).abs().max() > 0.01  # the gradient moved the chains (not only the noise)


def test_compiled_wrapper_is_separate_from_the_eager_module():
    m = _cnn()
    prepared = FastPath(compile=True).prepare(m)  # building the wrapper compiles nothing yet
    assert prepared.compiled and prepared.eager is m and unwrap(prepared.run) is m
    assert not any(k.startswith("_orig_mod.") for k in prepared.eager.state_dict())
    assert all(k.startswith("_orig_mod.") for k in prepared.run.state_dict())
    with frozen(prepared.run):  # freezing the wrapper freezes the shared parameters
        assert not any(p.requires_grad for p in m.parameters())
    assert all(p.requires_grad for p in m.parameters())
    wrapper = nn.Sequential(m)  # stands in for DistributedDataParallel
    both = FastPath(compile=True).prepare(m, wrap=lambda module: wrapper)
    assert both.run._orig_mod is wrapper and both.sample._orig_mod is m and both.eager is m
    plain = FastPath().prepare(m, wrap=lambda module: wrapper)
    assert plain.run is wrapper and plain.sample is m and not plain.compiled


def test_joint_logits_share_one_forward_without_batchnorm():
    m = _cnn()
    calls = []
    m.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[0]))
    x, xq = torch.rand(6, 1, 8, 8), torch.rand(4, 1, 8, 8)
    a, b = joint_logits(m, x, xq)
    assert calls == [10] and a.shape == (6, 10) and b.shape == (4, 10)
    torch.testing.assert_close(a, m(x))
    torch.testing.assert_close(b, m(xq))
    calls.clear()
    a16, _ = joint_logits(m, x, xq, fastpath=FastPath(bf16=True, channels_last=True))
    assert a16.dtype == torch.float32 and calls == [10]
    torch.testing.assert_close(a16, a, rtol=0, atol=0.05)

    bn = EnergyModel(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.LazyLinear(3)),
                     num_classes=3, input_shape=(1, 8, 8))
    bn(x)  # materialise the lazy layer
    seen = []
    bn.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[0]))
    assert has_batchnorm(bn) and not has_batchnorm(m)
    joint_logits(bn.train(), x, xq)
    assert seen == [6, 4]  # separate passes: train-mode BatchNorm must not mix data and samples


def test_to_fp32_and_log_p_unchanged():
    assert to_fp32(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    d = torch.ones(2, dtype=torch.float64)
    assert to_fp32(d) is d
    m = tiny_model()
    x = torch.rand(3, 1, 4, 4)
    assert torch.equal(model_log_p(m, x), m.log_px(x))
