"""Checkpoints: our format round-trips; the JEM release layout loads and gives the logits of an
independently written reference forward pass; every bad file gives one clear error."""
import os
import re

import pytest
import torch
import torch.nn.functional as F

import jemeval
from jemeval.checkpoints import infer_wrn_config, read_checkpoint
from jemeval.errors import CheckpointError


def release_state_dict(depth, widen, num_classes, seed=0, batchnorm=False, f_linear=True):
    """Random tensors in the JEM release's key layout (the JEM release's wideresnet.py, see docs/interop.md), built from
    the layout description alone (not from jemeval's modules)."""
    g = torch.Generator().manual_seed(seed)

    def conv(out_c, in_c, k):
        w = torch.randn(out_c, in_c, k, k, generator=g) * (2.0 / (in_c * k * k)) ** 0.5
        return w, torch.randn(out_c, generator=g) * 0.01

    def bn(prefix, c, sd):
        sd[prefix + "weight"] = 1 + 0.1 * torch.randn(c, generator=g)
        sd[prefix + "bias"] = 0.1 * torch.randn(c, generator=g)
        sd[prefix + "running_mean"] = 0.1 * torch.randn(c, generator=g)
        sd[prefix + "running_var"] = 1 + 0.1 * torch.rand(c, generator=g)
        sd[prefix + "num_batches_tracked"] = torch.tensor(100)

    sd = {}
    sd["f.conv1.weight"], sd["f.conv1.bias"] = conv(16, 3, 3)
    n = (depth - 4) // 6
    in_c = 16
    for layer, planes, stride in ((1, 16 * widen, 1), (2, 32 * widen, 2), (3, 64 * widen, 2)):
        for i in range(n):
            p = f"f.layer{layer}.{i}."
            if batchnorm:
                bn(p + "bn1.", in_c, sd)
                bn(p + "bn2.", planes, sd)
            sd[p + "conv1.weight"], sd[p + "conv1.bias"] = conv(planes, in_c, 3)
            sd[p + "conv2.weight"], sd[p + "conv2.bias"] = conv(planes, planes, 3)
            if i == 0 and (stride != 1 or in_c != planes):
                sd[p + "shortcut.0.weight"], sd[p + "shortcut.0.bias"] = conv(planes, in_c, 1)
            in_c = planes
    if batchnorm:
        bn("f.bn1.", in_c, sd)
    if f_linear:
        sd["f.linear.weight"], sd["f.linear.bias"] = torch.randn(10, in_c, generator=g) * 0.01, torch.zeros(10)
    sd["energy_output.weight"], sd["energy_output.bias"] = torch.randn(1, in_c, generator=g) * 0.01, torch.zeros(1)
    sd["class_output.weight"] = torch.randn(num_classes, in_c, generator=g) * in_c ** -0.5
    sd["class_output.bias"] = torch.zeros(num_classes)
    return sd


def reference_forward(sd, x, depth, batchnorm=False):
    def act(t, prefix=None):
        if batchnorm:
            t = F.batch_norm(t, sd[prefix + "running_mean"], sd[prefix + "running_var"], sd[prefix + "weight"], sd[prefix + "bias"], False, 0.0, 1e-5)
        return F.leaky_relu(t, 0.2)

    out = F.conv2d(x, sd["f.conv1.weight"], sd["f.conv1.bias"], padding=1)
    n = (depth - 4) // 6
    for layer, stride in ((1, 1), (2, 2), (3, 2)):
        for i in range(n):
            p = f"f.layer{layer}.{i}."
            s = stride if i == 0 else 1
            h = F.conv2d(act(out, p + "bn1."), sd[p + "conv1.weight"], sd[p + "conv1.bias"], padding=1)
            h = F.conv2d(act(h, p + "bn2."), sd[p + "conv2.weight"], sd[p + "conv2.bias"], stride=s, padding=1)
            short = F.conv2d(out, sd[p + "shortcut.0.weight"], sd[p + "shortcut.0.bias"], stride=s) if p + "shortcut.0.weight" in sd else out
            out = h + short
    out = F.avg_pool2d(act(out, "f.bn1."), 8).flatten(1)
    return F.linear(out, sd["class_output.weight"], sd["class_output.bias"])


def test_wrn_28_10_release_layout_has_the_published_size_and_loads_exactly(tmp_path):
    sd = release_state_dict(28, 10, 10)
    assert sum(v.numel() for v in sd.values()) == 36_478_389  # the JEM release's wideresnet.py, see docs/interop.md
    path = tmp_path / "CIFAR10_MODEL.pt"
    torch.save({"model_state_dict": sd, "replay_buffer": torch.rand(20, 3, 32, 32) * 2 - 1}, path)
    model = jemeval.load_model(path)
    assert sum(p.numel() for p in model.parameters()) == 36_471_338
    assert model.arch_options == {"depth": 28, "widen": 10, "norm": None, "dropout": 0.0}
    assert model.num_classes == 10 and model.input_shape == (3, 32, 32)
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        assert torch.allclose(model(x), reference_forward(sd, x, 28), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("depth,widen,classes,bare", [(10, 1, 10, True), (16, 2, 100, False)])
def test_smaller_release_layouts_and_bare_state_dicts(tmp_path, depth, widen, classes, bare):
    sd = release_state_dict(depth, widen, classes, seed=depth)
    path = tmp_path / "m.pt"
    torch.save(sd if bare else {"model_state_dict": sd}, path)
    model = jemeval.load_model(path)
    assert (model.arch_options["depth"], model.arch_options["widen"], model.num_classes) == (depth, widen, classes)
    x = torch.rand(3, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        assert torch.allclose(model(x), reference_forward(sd, x, depth), atol=1e-5, rtol=1e-4)


def test_infer_batchnorm_layout():
    cfg = infer_wrn_config(release_state_dict(10, 2, 10, batchnorm=True, f_linear=False))
    assert cfg == {"depth": 10, "widen": 2, "norm": "batch", "num_classes": 10, "in_channels": 3}


def test_jemeval_checkpoint_roundtrip_is_tensor_only(tmp_path):
    m = jemeval.create_model("wrn:depth=10,widen=1,norm=batch", 7, (3, 16, 16), dropout=0.1)
    path = tmp_path / "ck" / "best.pt"
    path.parent.mkdir()  # output folders are never created implicitly
    jemeval.save_checkpoint(path, m, dataset="npz:x.npz", replay_buffer=torch.zeros(4, 3, 16, 16), config={"a": 1})
    assert sorted(os.listdir(path.parent)) == ["best.pt"]  # no temp files left behind
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == "jemeval-checkpoint" and raw["arch"] == "wrn" and raw["num_classes"] == 7
    m2 = jemeval.load_model(path)
    m.eval()
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    assert torch.equal(m(x), m2(x))
    assert m2.metadata["dataset"] == "npz:x.npz" and m2.metadata["config"] == {"a": 1}
    assert len(m2.metadata["checkpoint"]["sha256"]) == 64


def test_bad_checkpoints_give_one_line_errors(tmp_path):
    def err(path):
        with pytest.raises(CheckpointError) as exc:
            jemeval.load_model(path)
        assert "\n" not in str(exc.value)
        return str(exc.value)

    assert "does not exist" in err(tmp_path / "missing.pt")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "best.pt").write_bytes(b"")
    assert "is a folder (it holds best.pt)" in err(tmp_path / "run")
    (tmp_path / "garbage.pt").write_bytes(b"this is not a checkpoint")
    assert re.search(r"not a readable PyTorch checkpoint \(\w+Error: ", err(tmp_path / "garbage.pt"))
    torch.save(torch.nn.Linear(2, 2), tmp_path / "pickled.pt")  # a pickled module could run code
    assert "could run code" in err(tmp_path / "pickled.pt")
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    assert "not a jemeval checkpoint nor a known layout" in err(tmp_path / "other.pt")
    m = jemeval.create_model("cnn", 10, (1, 8, 8))
    jemeval.save_checkpoint(tmp_path / "cnn.pt", m)
    raw = torch.load(tmp_path / "cnn.pt", weights_only=True)
    raw["arch_options"] = {"width": 8}
    torch.save(raw, tmp_path / "mismatch.pt")
    assert "does not match architecture 'cnn'" in err(tmp_path / "mismatch.pt")
    raw["arch"] = "nope"
    torch.save(raw, tmp_path / "unknown_arch.pt")
    assert "needs model architecture 'nope', which no installed plugin provides" in err(tmp_path / "unknown_arch.pt")


def test_read_checkpoint_never_unpickles_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    torch.save({"x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError):
        read_checkpoint(tmp_path / "evil.pt")
    assert not (tmp_path / "pwned").exists()
