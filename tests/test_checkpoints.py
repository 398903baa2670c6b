"""Checkpoints: our format round-trips; the JEM release layout loads and gives the logits of an
independently written reference forward pass; every bad file gives one clear error."""
import os
import re

import pytest
import torch
import torch.nn.functional as F

import jemeval
from jemeval.builtins.layouts import infer_wrn_config
from jemeval.errors import CheckpointError
from jemeval.formats.native import read_checkpoint


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
            t = F.batch_norm(t, sd[prefix + "running_mean"], sd[prefix + "running_var"], sd[prefix + "weight"],
                             sd[prefix + "bias"], False, 0.0, 1e-5)
        return F.leaky_relu(t, 0.2)

    out = F.conv2d(x, sd["f.conv1.weight"], sd["f.conv1.bias"], padding=1)
    n = (depth - 4) // 6
    for layer, stride in ((1, 1), (2, 2), (3, 2)):
        for i in range(n):
            p = f"f.layer{layer}.{i}."
            s = stride if i == 0 else 1
            h = F.conv2d(act(out, p + "bn1."), sd[p + "conv1.weight"], sd[p + "conv1.bias"], padding=1)
            h = F.conv2d(act(h, p + "bn2."), sd[p + "conv2.weight"], sd[p + "conv2.bias"], stride=s, padding=1)
            short = out
            if p + "shortcut.0.weight" in sd:
                short = F.conv2d(out, sd[p + "shortcut.0.weight"], sd[p + "shortcut.0.bias"], stride=s)
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


# -- issue 11: nothing executed from a file, no silent garbage ---------------------------------
class _MkdirPayload:
    """A pickle that runs code when fully unpickled: it creates the folder ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _tensor_only(tmp_path, name, **changes):
    """A valid tensor-only jemeval checkpoint (cnn, digits shape) with top-level fields changed."""
    jemeval.save_checkpoint(tmp_path / "base.pt", jemeval.create_model("cnn:width=4", 10, (1, 8, 8)))
    raw = torch.load(tmp_path / "base.pt", weights_only=True)
    raw.update(changes)
    torch.save(raw, tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize("option", ["checkpoint_path", "pretrained_cfg_overlay", "pretrained", "cache_dir",
                                    "init_file"])
def test_checkpoint_cannot_make_timm_open_a_file(tmp_path, option):
    """Issue 11 item 8, as an attack: a tensor-only checkpoint whose arch_options name a pickle
    payload for timm to load. The option is refused before any factory runs; the payload never runs."""
    payload, marker = tmp_path / "payload.pt", tmp_path / "payload-ran"
    torch.save({"state_dict": _MkdirPayload(marker)}, payload)
    value = {"file": str(payload)} if option.endswith("overlay") else True if option == "pretrained" else str(payload)
    ckpt = _tensor_only(tmp_path, "timm.pt", arch="timm", arch_options={"variant": "resnet18", option: value})
    with pytest.raises(CheckpointError, match=rf"architecture option '{option}', which is refused") as exc:
        jemeval.load_model(ckpt)
    assert "\n" not in str(exc.value) and not marker.exists()


def test_checkpoint_options_are_allow_listed_by_the_architecture(tmp_path):
    """wrn/cnn take only their own options from a checkpoint; timm keeps ordinary options."""
    bad = _tensor_only(tmp_path, "cnn.pt", arch_options={"width": 4, "checkpoint_path": "x.pt"})
    with pytest.raises(CheckpointError, match=r"'checkpoint_path', which is refused: it is not an option of 'cnn' "
                                              r"\(its options: width, stride\)"):
        jemeval.load_model(bad)
    # a timm checkpoint with plain options still loads
    m = jemeval.create_model("timm:resnet18", 3, (3, 16, 16), drop_rate=0.1)
    jemeval.save_checkpoint(tmp_path / "timm.pt", m)
    assert jemeval.load_model(tmp_path / "timm.pt").arch_options == {"variant": "resnet18", "drop_rate": 0.1}
    # and the timm factory itself never forwards a loader option, from a spec either
    with pytest.raises(jemeval.errors.UsageError, match="timm option 'checkpoint_path' is refused"):
        jemeval.create_model("timm:resnet18,checkpoint_path=x.pt", 3, (3, 16, 16))


def test_non_finite_weights_are_refused_at_load(tmp_path):
    """Issue 11 item 9: NaN weights used to give ECE 0 and chance accuracy with exit code 0."""
    m = jemeval.create_model("cnn:width=4", 10, (1, 8, 8))
    state = {k: v.clone() for k, v in m.net.state_dict().items()}
    key = max(state)
    state[key].view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    ckpt = _tensor_only(tmp_path, "nan.pt", state_dict=state)
    with pytest.raises(CheckpointError, match=rf"non-finite values in weight tensor '{re.escape(key)}' \(3 of "):
        jemeval.load_model(ckpt)
    from click.testing import CliRunner

    from jemeval.cli import cli

    r = CliRunner().invoke(cli, ["calibrate", "--model", str(ckpt), "--device", "cpu"])
    assert r.exit_code == 1 and r.output.strip().splitlines() == [r.output.strip()] and "non-finite" in r.output
    # foreign layouts go through the same check
    sd = release_state_dict(10, 1, 10)
    sd["class_output.bias"][0] = float("nan")
    torch.save({"model_state_dict": sd}, tmp_path / "release.pt")
    with pytest.raises(CheckpointError, match="non-finite values in weight tensor 'class_output.bias'"):
        jemeval.load_model(tmp_path / "release.pt")


def test_non_finite_replay_buffer_is_refused_when_used(tmp_path):
    m = jemeval.create_model("cnn:width=4", 10, (1, 8, 8))
    buf = torch.rand(20, 1, 8, 8) * 2 - 1
    buf[3, 0, 0, 0] = float("nan")
    jemeval.save_checkpoint(tmp_path / "buf.pt", m, dataset="digits", replay_buffer=buf)
    model = jemeval.load_model(tmp_path / "buf.pt")  # the weights are fine: evaluation is not refused
    with pytest.raises(CheckpointError, match="non-finite values in its replay buffer"):
        jemeval.sample(model, n=2, steps=1, init="buffer", progress=False)


@pytest.mark.parametrize("changes, message", [
    ({"state_dict": None}, "damaged jemeval checkpoint ('state_dict' is a NoneType)"),
    ({"arch_options": [1]}, "'arch_options' is not a dict"),
    ({"format_version": "1"}, "'format_version' is not a number"),
    ({"state_dict": {"features.0.weight": "text"}}, "its state_dict is not a dict of named tensors"),
])
def test_damaged_jemeval_checkpoints_are_one_line(tmp_path, changes, message):
    with pytest.raises(CheckpointError, match=re.escape(message)):
        jemeval.load_model(_tensor_only(tmp_path, "bad.pt", **changes))


def test_checkpoint_without_state_dict_is_one_clear_line(tmp_path):
    ckpt = _tensor_only(tmp_path, "nostate.pt")
    raw = torch.load(ckpt, weights_only=True)
    del raw["state_dict"]
    torch.save(raw, ckpt)
    from click.testing import CliRunner

    from jemeval.cli import cli

    r = CliRunner().invoke(cli, ["eval", "--model", str(ckpt), "--device", "cpu"])
    assert r.exit_code == 1 and "a bug in jemeval" not in r.output
    assert r.output.strip() == f"Error: {str(ckpt)!r} is a damaged jemeval checkpoint (no 'state_dict'); re-save it " \
                               "with `jemeval train` or jemeval.save_checkpoint"


def test_pickle_refusal_says_how_to_get_a_loadable_file(tmp_path):
    """Issue 11 item 14: it used to suggest `jemeval convert`, which refuses the same file."""
    from jemeval.formats.convert import convert

    torch.save({"model": torch.nn.Linear(2, 2)}, tmp_path / "pickled.pt")
    for call in (lambda: jemeval.load_model(tmp_path / "pickled.pt"),
                 lambda: convert(tmp_path / "pickled.pt", tmp_path / "out.pt")):
        with pytest.raises(CheckpointError) as exc:
            call()
        text = str(exc.value)
        assert "torch.save(model.state_dict()" in text and "torch.nn.modules.linear.Linear" in text
        assert "convert it with" not in text and "\n" not in text


@pytest.mark.any_device
def test_load_model_device_names_are_checked_in_one_place(tmp_path, digits_classifier_ckpt):
    from jemeval.cli.options import resolve_device as cli_device
    from jemeval.errors import UsageError
    from jemeval.runtime.devices import resolve_device

    with pytest.raises(UsageError, match=r"unknown device 'gpu' \(did you mean 'cuda'\?\): use cpu, cuda, cuda:N, "
                                         r"auto"):
        jemeval.load_model(digits_classifier_ckpt, device="gpu")
    with pytest.raises(UsageError, match="unknown --device 'gpu'"):
        cli_device("gpu")
    with pytest.raises(UsageError, match="'meta' is not one jemeval runs on"):
        resolve_device("meta")
    assert resolve_device("CPU") == torch.device("cpu") and resolve_device(torch.device("cpu")).type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA is not available here"):
            jemeval.load_model(digits_classifier_ckpt, device="cuda:0")
    else:
        with pytest.raises(UsageError, match="does not exist: this machine has"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")
