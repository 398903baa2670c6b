"""Checkpoint interop: JEM++ / SADA-JEM (and BatchNorm JEM-release) WRN layouts load and give the
logits of an independently written reference forward; `jemeval convert` writes them as jemeval
checkpoints with their source, BatchNorm sampling mode and provenance; bad input gives one line."""
from __future__ import annotations

import hashlib
import json
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

import jemeval
from jemeval import testing
from jemeval.cli import cli
from jemeval.errors import CheckpointError, UsageError
from jemeval.formats.convert import convert
from jemeval.formats.foreign import CheckpointLayout, FoundCheckpoint
from jemeval.formats.native import read_checkpoint
from jemeval.plugins import get_plugin_manager
from jemeval.sampling.recorded import recorded_sgld

DEPTH, WIDEN, CLASSES = 10, 2, 10  # one block per stage: 16 / 32 / 64 / 128 channels


def follow_up_state_dict(*, f_linear: bool, yopo: bool = False, seed: int = 0) -> dict[str, torch.Tensor]:
    """A WRN state dict in the key layout of the JEM release's wideresnet.py (see docs/interop.md) with
    BatchNorm (JEM++ / SADA-JEM: no ``f.linear``), random values everywhere, running statistics included."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}

    def rand(*shape, scale=1.0, offset=0.0):
        return offset + scale * torch.randn(*shape, generator=g)

    def add_conv(name, c_out, c_in, k):
        sd[name + ".weight"] = rand(c_out, c_in, k, k, scale=(2.0 / (c_in * k * k)) ** 0.5)
        sd[name + ".bias"] = rand(c_out, scale=0.05)

    def add_bn(name, c):
        sd[name + ".weight"] = rand(c, scale=0.2, offset=1.0)
        sd[name + ".bias"] = rand(c, scale=0.2)
        sd[name + ".running_mean"] = rand(c, scale=0.3)
        sd[name + ".running_var"] = 0.5 + torch.rand(c, generator=g)
        sd[name + ".num_batches_tracked"] = torch.tensor(1234)

    widths = [16, 16 * WIDEN, 32 * WIDEN, 64 * WIDEN]
    add_conv("f.conv1", 16, 3, 3)
    for stage in (1, 2, 3):
        c_in, c_out = widths[stage - 1], widths[stage]
        p = f"f.layer{stage}.0"
        add_bn(p + ".bn1", c_in)
        add_conv(p + ".conv1", c_out, c_in, 3)
        add_bn(p + ".bn2", c_out)
        add_conv(p + ".conv2", c_out, c_out, 3)
        add_conv(p + ".shortcut.0", c_out, c_in, 1)  # every stage changes width or stride here
    add_bn("f.bn1", widths[3])
    if f_linear:
        sd["f.linear.weight"], sd["f.linear.bias"] = rand(CLASSES, widths[3]), rand(CLASSES)
    sd["energy_output.weight"], sd["energy_output.bias"] = rand(1, widths[3]), rand(1)
    sd["class_output.weight"], sd["class_output.bias"] = rand(CLASSES, widths[3], scale=0.1), rand(CLASSES)
    if yopo:  # JEM++ --model yopo registers conv1 and the stages twice
        aliases = {"f.layer_one.": "f.conv1.", "f.other_layers.0.": "f.layer1.", "f.other_layers.1.": "f.layer2.",
                   "f.other_layers.2.": "f.layer3.", "f.other_layers.3.": "f.bn1."}
        for alias, canonical in aliases.items():
            sd.update({alias + k[len(canonical):]: v.clone() for k, v in list(sd.items()) if k.startswith(canonical)})
    return sd


def reference_logits(sd: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Pre-activation WRN forward from the layout description, BatchNorm in eval mode (running stats)."""
    def norm_act(t, name):
        mean, var = sd[name + ".running_mean"][None, :, None, None], sd[name + ".running_var"][None, :, None, None]
        t = (t - mean) / torch.sqrt(var + 1e-5)
        t = t * sd[name + ".weight"][None, :, None, None] + sd[name + ".bias"][None, :, None, None]
        return torch.where(t > 0, t, 0.2 * t)

    def conv(t, name, stride=1, padding=1):
        return F.conv2d(t, sd[name + ".weight"], sd[name + ".bias"], stride=stride, padding=padding)

    out = conv(x, "f.conv1")
    for stage, stride in ((1, 1), (2, 2), (3, 2)):
        p = f"f.layer{stage}.0"
        h = conv(norm_act(out, p + ".bn1"), p + ".conv1")
        h = conv(norm_act(h, p + ".bn2"), p + ".conv2", stride=stride)
        out = h + conv(out, p + ".shortcut.0", stride=stride, padding=0)
    feats = norm_act(out, "f.bn1").mean(dim=(2, 3))  # avg_pool2d(8) on the 8 x 8 map
    return feats @ sd["class_output.weight"].t() + sd["class_output.bias"]


def save_follow_up(path, sd, buffer=True):
    obj = {"model_state_dict": sd}
    if buffer:
        obj["replay_buffer"] = torch.rand(12, 3, 32, 32, generator=torch.Generator().manual_seed(5)) * 2 - 1
    torch.save(obj, path)
    return obj


@pytest.mark.parametrize("f_linear,yopo,layout,bn_mode", [
    (False, False, "jem++/sada-jem", "train"),
    (False, True, "jem++/sada-jem", "train"),
    (True, False, "jem-release-batchnorm", "eval"),
])
def test_batchnorm_layouts_give_the_reference_logits(tmp_path, f_linear, yopo, layout, bn_mode):
    sd = follow_up_state_dict(f_linear=f_linear, yopo=yopo)
    path = tmp_path / "ckpt.pt"
    save_follow_up(path, sd)
    model = jemeval.load_model(path)
    assert model.metadata["source_format"] == layout
    assert model.arch_options == {"depth": DEPTH, "widen": WIDEN, "norm": "batch", "dropout": 0.0}
    assert recorded_sgld(model, 3)[0].bn_mode == bn_mode  # what sampling and refinement will use
    x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        assert torch.allclose(model(x), reference_logits(sd, x), atol=1e-4, rtol=1e-4)


def test_convert_writes_a_jemeval_checkpoint_with_source_and_provenance(tmp_path):
    sd = follow_up_state_dict(f_linear=False, yopo=True, seed=3)
    src, dst = tmp_path / "CIFAR10_jempp.pt", tmp_path / "out" / "jempp.pt"
    dst.parent.mkdir()  # output folders are never created implicitly
    obj = save_follow_up(src, sd)
    result = convert(src, dst, dataset="digits")
    raw = torch.load(dst, weights_only=True)  # tensor-only: loads without code execution
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    assert raw["format"] == "jemeval-checkpoint" and raw["arch"] == "wrn" and raw["dataset"] == "digits"
    assert raw["config"]["source_layout"] == "jem++/sada-jem" and raw["config"]["source_sha256"] == sha
    assert raw["config"]["sgld"] == {"bn_mode": "train"}
    assert raw["provenance"]["checkpoint"]["sha256"] == sha and raw["provenance"]["command"] == "convert"
    assert torch.equal(raw["replay_buffer"], obj["replay_buffer"])
    assert not any(k.startswith(("f.layer_one", "f.other_layers")) for k in raw["state_dict"])
    record = result.records[0]
    assert record["layout"] == "jem++/sada-jem" and record["bn_mode"] == "train"
    assert record["replay_buffer"] == [12, 3, 32, 32]
    model = jemeval.load_model(dst)
    assert recorded_sgld(model, 1)[0].bn_mode == "train" and model.metadata["dataset"] == "digits"
    x = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(2)) * 2 - 1
    with torch.no_grad():
        assert torch.allclose(model(x), reference_logits(sd, x), atol=1e-4, rtol=1e-4)


def test_convert_command_json_and_one_line_errors(tmp_path):
    runner = CliRunner()
    src = tmp_path / "sada.pt"
    save_follow_up(src, follow_up_state_dict(f_linear=False), buffer=False)
    ok = runner.invoke(cli, ["convert", str(src), str(tmp_path / "sada_jemeval.pt"), "--json"])
    assert ok.exit_code == 0, ok.output
    payload = json.loads(ok.stdout)
    assert payload["records"][0]["layout"] == "jem++/sada-jem" and payload["records"][0]["replay_buffer"] is None
    assert payload["provenance"]["checkpoint"]["path"] == str(src)

    def error(*args, code):
        res = runner.invoke(cli, ["convert", *map(str, args)])
        assert res.exit_code == code, res.output
        lines = [line for line in res.output.splitlines() if line.startswith("Error")]
        assert len(lines) == 1 and "Traceback" not in res.output, res.output
        return lines[0]

    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    msg = error(tmp_path / "other.pt", tmp_path / "o.pt", code=1)
    assert "nor a known layout" in msg
    assert all(n in msg for n in ("jem-release", "jem-release-batchnorm", "jem++/sada-jem"))
    assert "already a jemeval checkpoint" in error(tmp_path / "sada_jemeval.pt", tmp_path / "o.pt", code=2)
    assert "must be a .pt file" in error(src, tmp_path / "o.pth", code=2)
    assert "unknown dataset 'digit'" in error(src, tmp_path / "o.pt", "--dataset", "digit", code=2)
    assert "does not exist" in error(tmp_path / "missing.pt", tmp_path / "o.pt", code=1)
    assert not (tmp_path / "o.pt").exists()


def test_convert_writes_its_record_with_result_and_the_old_out_spelling(tmp_path):
    """OUT is convert's main product; the JSON record is --result (its old spelling --out still works)."""
    src = tmp_path / "sada.pt"
    save_follow_up(src, follow_up_state_dict(f_linear=False), buffer=False)
    new = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "a.pt"), "--result", str(tmp_path / "a.json")])
    old = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "b.pt"), "--out", str(tmp_path / "b.json")])
    assert new.exit_code == 0 and old.exit_code == 0, new.output + old.output
    assert "deprecated" not in new.stderr and "convert's --out is deprecated, use --result" in old.stderr
    for name in ("a", "b"):
        record = json.loads((tmp_path / f"{name}.json").read_text())["records"][0]
        assert record["layout"] == "jem++/sada-jem" and record["output"] == str(tmp_path / f"{name}.pt")


def test_unsupported_follow_up_variants_fail_clearly(tmp_path):
    sd = follow_up_state_dict(f_linear=False, yopo=True)
    sd["f.other_layers.0.0.conv1.weight"] = sd["f.other_layers.0.0.conv1.weight"] + 1  # alias that differs
    torch.save({"model_state_dict": sd}, tmp_path / "bad_alias.pt")
    with pytest.raises(CheckpointError, match="does not equal 'f.layer1.0.conv1.weight'"):
        jemeval.load_model(tmp_path / "bad_alias.pt")
    sd = follow_up_state_dict(f_linear=False)
    sd["f.layer4.0.conv1.weight"] = torch.zeros(256, 128, 3, 3)  # SADA-JEM's 64x64 fourth stage
    torch.save({"model_state_dict": sd}, tmp_path / "img64.pt")
    with pytest.raises(CheckpointError, match="fourth WRN stage"):
        convert(tmp_path / "img64.pt", tmp_path / "o.pt")
    with pytest.raises(UsageError, match="is the input file"):
        convert(tmp_path / "img64.pt", tmp_path / "img64.pt")
    (tmp_path / "taken.pt").write_bytes(b"someone's file")
    with pytest.raises(UsageError, match="'.*taken.pt' already exists; remove it or give another output path"):
        convert(tmp_path / "img64.pt", tmp_path / "taken.pt")
    assert (tmp_path / "taken.pt").read_bytes() == b"someone's file"


# -- layouts from plugins: register_checkpoint_layouts ---------------------------------------------
def _small_cnn(seed=0):
    torch.manual_seed(seed)
    return jemeval.create_model("cnn", 3, (1, 8, 8), width=4).eval()


def _tiny_found(state, **fields):
    """A FoundCheckpoint building a small cnn with ``state``'s weights."""
    def build(path):
        model = _small_cnn()
        model.net.load_state_dict(state)
        return model
    return FoundCheckpoint(build, **fields)


def _layout_plugin(**layouts):
    return types.SimpleNamespace(register_checkpoint_layouts=jemeval.hookimpl(
        lambda register: [register(name, layout) for name, layout in layouts.items()]))


def test_hook_register_checkpoint_layouts(tmp_path):
    """A plugin layout recognised from a file's contents (``match``): every --model reads it, and
    `jemeval convert` writes it as a jemeval checkpoint recording the plugin's config and notes."""
    reference = _small_cnn(seed=3)
    torch.save({"tiny_weights": reference.net.state_dict(), "epochs": 7}, tmp_path / "tiny.pt")

    def match(obj):
        if not (isinstance(obj, dict) and "tiny_weights" in obj):
            return None
        return _tiny_found(obj["tiny_weights"], config={"epochs": obj["epochs"]}, sgld={"bn_mode": "train"},
                           notes={"epochs": obj["epochs"]})

    x = torch.rand(4, *reference.input_shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
    plugin = _layout_plugin(tiny=CheckpointLayout("tiny test nets", match=match))
    with testing.registered_plugin(plugin, name="tiny-layouts"):
        loaded = jemeval.load_model(tmp_path / "tiny.pt")
        assert torch.equal(loaded(x), reference(x)) and loaded.metadata["source_format"] == "tiny"
        assert loaded.metadata["config"] == {"source_layout": "tiny", "epochs": 7, "sgld": {"bn_mode": "train"}}
        r = CliRunner().invoke(cli, ["convert", str(tmp_path / "tiny.pt"), str(tmp_path / "out.pt"), "--json"])
        assert r.exit_code == 0, r.output
        record = json.loads(r.stdout)["records"][0]
        assert record["layout"] == "tiny" and record["epochs"] == 7 and record["bn_mode"] == "train"
        listing = json.loads(CliRunner().invoke(cli, ["list", "checkpoint_layouts", "--json"]).stdout)
        assert {"name": "tiny", "plugin": "tiny-layouts", "help": "tiny test nets"} in listing["checkpoint_layout"]
        torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
        with pytest.raises(CheckpointError, match="tiny: tiny test nets"):  # the known layouts include the plugin's
            jemeval.load_model(tmp_path / "other.pt")
    written = read_checkpoint(tmp_path / "out.pt")
    assert written["config"]["source_layout"] == "tiny" and written["config"]["epochs"] == 7
    assert written["config"]["source_sha256"] == hashlib.sha256((tmp_path / "tiny.pt").read_bytes()).hexdigest()
    with pytest.raises(CheckpointError, match="nor a known layout"):  # without the plugin
        jemeval.load_model(tmp_path / "tiny.pt")


def test_path_layouts_convert_what_torch_cannot_read(tmp_path):
    """A layout recognised from the path (``match_path``: a folder here, a TensorFlow prefix for
    jemeval-igebm) joins `jemeval convert`; its source and hashes are what it says."""
    reference = _small_cnn(seed=4)
    folder = tmp_path / "export"
    folder.mkdir()
    torch.save(reference.net.state_dict(), folder / "weights.bin")
    (folder / "FORMAT").write_text("tiny-folder\n")

    def match_path(path):
        marker = Path(path) / "FORMAT"
        if not marker.is_file() or marker.read_text().strip() != "tiny-folder":
            return None
        state = torch.load(Path(path) / "weights.bin", weights_only=True)
        return _tiny_found(state, source=str(Path(path) / "weights.bin"), source_sha256={"weights.bin": "abc"})

    plugin = _layout_plugin(**{"tiny/folder": CheckpointLayout("a folder with FORMAT and weights.bin",
                                                               match_path=match_path)})
    with testing.registered_plugin(plugin, name="folder-layouts"):
        result = convert(folder, tmp_path / "out.pt", dataset="digits")
        record = result.records[0]
        assert record["layout"] == "tiny/folder" and record["source"] == str(folder / "weights.bin")
        assert record["source_sha256"] == {"weights.bin": "abc"} and record["dataset"] == "digits"
        with pytest.raises(CheckpointError, match="is a folder"):  # load_model reads files only
            jemeval.load_model(folder)
    model = jemeval.load_model(tmp_path / "out.pt")
    x = torch.rand(3, *reference.input_shape) * 2 - 1
    assert torch.equal(model(x), reference(x)) and model.metadata["dataset"] == "digits"


def test_a_checkpoint_two_layouts_claim_is_refused(tmp_path):
    src = tmp_path / "sada.pt"
    save_follow_up(src, follow_up_state_dict(f_linear=False), buffer=False)
    greedy = CheckpointLayout("claims everything", match=lambda obj: _tiny_found({}))
    with testing.registered_plugin(_layout_plugin(greedy=greedy), name="greedy-layouts"):
        with pytest.raises(CheckpointError, match=r"matches several layouts: 'greedy' \(plugin 'greedy-layouts'\) and "
                                                  r"'jem\+\+/sada-jem' \(plugin 'jemeval.builtins.layouts'\)"):
            convert(src, tmp_path / "o.pt")
    with testing.registered_plugin(_layout_plugin(bad=object()), name="bad-layouts"):
        info = {i.name: i for i in get_plugin_manager().plugin_infos()}["bad-layouts"]
        assert "not an object with match(obj) or match_path(path)" in info.as_dict()["error"]
