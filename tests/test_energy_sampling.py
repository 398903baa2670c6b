import pytest
import torch

import jemeval
from jemeval.sampling.buffer import ReplayBuffer
from jemeval.sampling.sgld import SGLD, frozen
from jemeval.testing import tiny_model


def test_energy_model_definitions():
    m = tiny_model(num_classes=4)
    x = torch.rand(5, 1, 4, 4) * 2 - 1
    logits = m.net(x)
    assert torch.allclose(m(x), logits)
    assert torch.allclose(m.log_px(x), torch.logsumexp(logits, 1))
    assert torch.allclose(m.energy(x), -torch.logsumexp(logits, 1))
    y = torch.tensor([0, 1, 2, 3, 0])
    assert torch.allclose(m.log_pxy(x, y), logits[torch.arange(5), y])
    assert torch.allclose(m.probs(x), torch.softmax(logits, 1))


def test_normalization_is_applied_inside_the_model():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 2 * 2, 2))
    normalization = {"mean": [0.1, 0.2, 0.3], "std": [0.5, 0.5, 0.25]}
    m = jemeval.EnergyModel(net, num_classes=2, input_shape=(3, 2, 2), normalization=normalization)
    x = torch.rand(4, 3, 2, 2)
    mean = torch.tensor([0.1, 0.2, 0.3]).view(1, 3, 1, 1)
    std = torch.tensor([0.5, 0.5, 0.25]).view(1, 3, 1, 1)
    assert torch.allclose(m(x), net((x - mean) / std))


def test_sgld_ascends_log_px_without_touching_parameters():
    m = tiny_model(num_classes=3, input_shape=(1, 4, 4))
    m.train()  # the sampler must restore this
    m.net.body[1].weight.requires_grad_(False)  # a frozen layer stays frozen afterwards
    flags = [p.requires_grad for p in m.parameters()]
    x0 = torch.rand(256, 1, 4, 4) * 2 - 1
    before = m.log_px(x0).mean()
    x, trace = SGLD(steps=10, step_size=1.0, noise=0.001).sample(m, x0, return_trace=True)
    with torch.no_grad():
        after = m.log_px(x).mean()
    assert after > before + 0.1
    assert trace.shape == (11,) and torch.allclose(trace[0], before.detach(), atol=1e-5)
    assert all(p.grad is None for p in m.parameters()), "sampling created parameter gradients"
    assert [p.requires_grad for p in m.parameters()] == flags
    assert m.training
    assert not x.requires_grad and x.grad_fn is None


def test_class_conditional_sampling_raises_log_pxy():
    m = tiny_model(num_classes=3)
    y = torch.arange(90) % 3
    x0 = torch.rand(90, 1, 4, 4) * 2 - 1
    x = SGLD(steps=10, step_size=1.0, noise=0.0).sample(m, x0, y)
    with torch.no_grad():
        assert (m.log_pxy(x, y) - m.log_pxy(x0, y)).mean() > 0.1


def test_sgld_eval_mode_during_sampling_and_train_mode_setting():
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(self.training)
            return x

    m = tiny_model()
    m.net.body.insert(0, Probe())
    m.train()
    SGLD(steps=2, noise=0.0).sample(m, torch.zeros(2, 1, 4, 4))
    SGLD(steps=2, noise=0.0, bn_mode="train").sample(m, torch.zeros(2, 1, 4, 4))
    assert seen == [False, False, True, True] and m.training


def test_sgld_create_graph_differentiates_through_steps_wrt_input_only():
    m = tiny_model()
    x0 = (torch.rand(4, 1, 4, 4) * 2 - 1).requires_grad_(True)
    x = SGLD(steps=3, step_size=0.1, noise=0.0).sample(m, x0, create_graph=True)
    (g,) = torch.autograd.grad(m.log_px(x).sum(), x0)
    assert g.shape == x0.shape and torch.isfinite(g).all()
    assert all(p.grad is None for p in m.parameters())


def test_sgld_noise_follows_generator_and_clamp():
    m = tiny_model()
    x0 = torch.zeros(3, 1, 4, 4)
    s = SGLD(steps=3, step_size=0.0, noise=1.0, clamp=(-0.5, 0.5))
    a = s.sample(m, x0, generator=torch.Generator().manual_seed(5))
    b = s.sample(m, x0, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and a.abs().max() <= 0.5 and a.abs().max() > 0


def test_replay_buffer_reinit_and_class_blocks():
    g = torch.Generator().manual_seed(0)
    buf = ReplayBuffer(1000, (1, 2, 2), num_classes=10, reinit_freq=0.0, generator=g)
    buf.data.fill_(0.25)
    x0, idx = buf.sample(500, generator=g)
    assert torch.all(x0 == 0.25)
    y = torch.arange(500) % 10
    _, idx = buf.sample(500, y, generator=g)
    assert torch.equal(idx // 100, y)  # contiguous class blocks of size 1000 / 10
    buf.reinit_freq = 0.3
    x0, _ = buf.sample(4000, generator=g)
    fresh = (x0 != 0.25).flatten(1).any(1).float().mean()
    assert 0.25 < fresh < 0.35
    buf.push(torch.tensor([0, 1]), torch.ones(2, 1, 2, 2))
    assert torch.all(buf.data[:2] == 1)
    assert ReplayBuffer.from_tensor(buf.state_dict()["data"]).data.shape == (1000, 1, 2, 2)


def test_frozen_restores_flags_after_exception():
    m = tiny_model()
    try:
        with frozen(m, train=True):
            assert not any(p.requires_grad for p in m.parameters()) and m.training
            raise RuntimeError
    except RuntimeError:
        pass
    assert all(p.requires_grad for p in m.parameters()) and not m.training


def test_push_with_duplicate_indices_is_deterministic_last_wins():
    buf = ReplayBuffer(5, (1,), reinit_freq=0.0)
    idx = torch.tensor([3, 1, 3, 3, 0])
    x = torch.arange(5, dtype=torch.float32).view(5, 1)
    buf.push(idx, x)
    assert buf.data[3].item() == 3.0 and buf.data[1].item() == 1.0 and buf.data[0].item() == 4.0


def test_train_mode_sampling_leaves_batchnorm_running_stats_untouched():
    m = jemeval.create_model("wrn:depth=10,widen=1,norm=batch", 3, (3, 8, 8)).eval()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    SGLD(steps=2, bn_mode="train").sample(m, torch.rand(4, 3, 8, 8) * 2 - 1)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert not m.training


def test_recorded_sgld_reads_checkpoint_settings_aliases_and_overrides():
    from jemeval.errors import UsageError
    from jemeval.sampling.recorded import recorded_sgld

    m = tiny_model()
    sgld, source = recorded_sgld(m, 7)
    assert (sgld.steps, sgld.step_size, sgld.noise, sgld.bn_mode) == (7, 1.0, 0.01, "eval")
    assert source == "JEM release defaults"
    m.metadata["config"] = {"sgld": {"lr": 0.5, "std": 0.02, "bn_mode": "train", "sampler": "proximal-sgld",
                                     "inner_steps": 5, "clamp": [-1, 1]}}
    sgld, source = recorded_sgld(m, 3, noise=0.0)
    assert (sgld.step_size, sgld.noise, sgld.bn_mode, sgld.clamp) == (0.5, 0.0, "train", (-1.0, 1.0))
    assert source.startswith("checkpoint config (trained with proximal-sgld")
    with pytest.raises(UsageError, match="BatchNorm mode while sampling must be one of eval, train"):
        recorded_sgld(m, 3, bn_mode="trian")
    with pytest.raises(UsageError, match="clamp must be two numbers"):
        SGLD(clamp=(0.0,))


@pytest.mark.parametrize("field, value", [
    ("step_size", float("nan")), ("noise", float("inf")), ("step_size", "fast"), ("clamp", (-1.0, float("nan"))),
    ("steps", 2.5), ("steps", float("nan")),
])
def test_sampler_fields_must_be_finite(field, value):
    """Issue 11 item 10: `--sgld-lr nan` turned every chain into NaN and printed accuracy 0, exit 0."""
    from jemeval.errors import UsageError
    from jemeval.sampling.proximal import ProximalSGLD

    for cls in (SGLD, ProximalSGLD):
        with pytest.raises(UsageError, match=rf"^{cls.__name__} {field.split('_')[0]}"):
            cls(**{field: value})
    for name in ("inner_step_size", "grad_clip"):
        with pytest.raises(UsageError, match=rf"ProximalSGLD {name} must be a finite number, got nan"):
            ProximalSGLD(**{name: float("nan")})


def test_cli_refuses_a_nan_step_size_in_one_line(digits_classifier_ckpt):
    from click.testing import CliRunner

    from jemeval.cli import cli

    commands = (["eval", "--refine-steps", "1", "--sgld-lr", "nan"], ["sample", "--steps", "1", "--sgld-std", "inf"])
    for command in commands:
        r = CliRunner().invoke(cli, [*command, "--model", str(digits_classifier_ckpt), "--device", "cpu"])
        assert r.exit_code == 2, r.output
        assert r.output.strip().splitlines()[-1].startswith("Error: SGLD ") and "finite number" in r.output
