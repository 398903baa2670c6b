"""safetensors export (`jemeval export`) and loading (`jemeval.load_model("x.safetensors")`)."""
from __future__ import annotations

import json

import pytest
import safetensors.torch as st
import torch
from click.testing import CliRunner

import jemeval
from jemeval.cli import cli
from jemeval.errors import CheckpointError
from jemeval.formats.export import export
from jemeval.formats.safetensors import FORMAT, HEADER_KEY, is_safetensors, read_header


def _one_line(result) -> str:
    text = result.output.strip()
    assert text.count("\n") == 0, text
    return text


def test_jem_checkpoint_round_trips_to_identical_logits(digits_jem_ckpt, tmp_path):
    out = tmp_path / "jem.safetensors"
    result = export(digits_jem_ckpt, out, classes=[str(c) for c in range(10)])
    record = result.records[0]
    assert record["output"] == str(out) and record["bytes"] == out.stat().st_size
    source, back = jemeval.load_model(digits_jem_ckpt), jemeval.load_model(out)
    x = jemeval.load_dataset("digits", "test").x[:64]
    with torch.no_grad():
        assert torch.equal(source(x), back(x))
    assert (back.arch, back.arch_options, back.num_classes, tuple(back.input_shape)) == (
        source.arch, source.arch_options, source.num_classes, tuple(source.input_shape))
    assert back.metadata["dataset"] == "digits" and back.metadata["classes"] == [str(c) for c in range(10)]
    # the recorded SGLD settings travel, so refinement and sampling default to the training ones
    assert back.metadata["config"]["sgld"] == source.metadata["config"]["sgld"]
    header = read_header(out)
    assert header["format"] == FORMAT and header["provenance"]["checkpoint"]["path"] == str(digits_jem_ckpt)
    assert header["provenance"]["source"]["command"] == "train"
    # any tool reads the tensors: the names are the network's state_dict names
    assert set(st.load_file(out)) == set(source.net.state_dict())


def test_normalisation_batchnorm_buffers_and_sniffing(tmp_path):
    torch.manual_seed(0)
    norm = {"mean": [0.49, 0.48, 0.45], "std": [0.25, 0.24, 0.26]}
    model = jemeval.create_model("wrn:depth=10,widen=1,norm=batch", 10, (3, 16, 16), normalization=norm)
    model.train()
    with torch.no_grad():
        model(torch.rand(8, 3, 16, 16) * 2 - 1)  # running statistics move away from their initial values
    model.eval()
    jemeval.save_checkpoint(tmp_path / "wrn.pt", model)
    export(tmp_path / "wrn.pt", tmp_path / "wrn.safetensors")
    renamed = tmp_path / "wrn.bin"  # recognised by its first bytes, whatever its name
    renamed.write_bytes((tmp_path / "wrn.safetensors").read_bytes())
    assert is_safetensors(renamed) and not is_safetensors(tmp_path / "wrn.pt")
    back = jemeval.load_model(renamed)
    x = torch.rand(5, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        assert torch.equal(model(x), back(x))
    assert back.normalization == model.normalization and back.metadata["dataset"] is None
    assert st.load_file(renamed)["f.layer1.0.bn1.num_batches_tracked"].dtype == torch.int64


def _write(path, header, tensors=None):
    tensors = tensors if tensors is not None else jemeval.create_model("cnn:width=4", 10, (1, 8, 8)).net.state_dict()
    metadata = None if header is None else {HEADER_KEY: header if isinstance(header, str) else json.dumps(header)}
    st.save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    return path


def _header(**changes):
    base = {"format": FORMAT, "format_version": 1, "arch": "cnn", "arch_options": {"width": 4}, "num_classes": 10,
            "input_shape": [1, 8, 8], "normalization": None, "dataset": "digits"}
    return {**base, **changes}


def test_unknown_architecture_is_one_clear_line(tmp_path):
    path = _write(tmp_path / "x.safetensors", _header(arch="mystery_net"))
    with pytest.raises(CheckpointError, match="needs model architecture 'mystery_net', which no installed plugin "
                                              "provides") as info:
        jemeval.load_model(path)
    assert "\n" not in str(info.value)
    r = CliRunner().invoke(cli, ["ood", "--model", str(path), "--ood", "uniform", "--device", "cpu"])
    assert r.exit_code == 1 and "mystery_net" in _one_line(r)


@pytest.mark.parametrize("header, message", [
    (None, "holds weights without jemeval's header"),
    ("{not json", "damaged jemeval header \\(not JSON"),
    (_header(format="other"), "header of another kind"),
    (_header(format_version=99), "newer jemeval"),
    ({k: v for k, v in _header().items() if k != "num_classes"}, "no 'num_classes'"),
    (_header(num_classes="10"), "'num_classes' is a str"),
    (_header(input_shape=[1, 0, 8]), "input_shape \\[1, 0, 8\\] is not a list of positive integers"),
    (_header(arch_options={"width": 4, "checkpoint_path": "/tmp/payload.pt"}),
     "architecture option 'checkpoint_path', which is refused"),  # the allow-list of load_model
    (_header(arch_options={"width": 8}), "size mismatch"),  # header and tensors disagree
])
def test_header_is_validated(tmp_path, header, message):
    path = _write(tmp_path / "bad.safetensors", header)
    with pytest.raises(CheckpointError, match=message) as info:
        jemeval.load_model(path)
    assert "\n" not in str(info.value)


def test_non_finite_and_unreadable_files_are_refused(tmp_path):
    state = {k: v.clone() for k, v in jemeval.create_model("cnn:width=4", 10, (1, 8, 8)).net.state_dict().items()}
    key = next(k for k, v in state.items() if v.is_floating_point())
    state[key].view(-1)[0] = float("nan")
    with pytest.raises(CheckpointError, match=f"non-finite values in weight tensor '{key}'"):
        jemeval.load_model(_write(tmp_path / "nan.safetensors", _header(), state))
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(CheckpointError, match="is not a readable safetensors file"):
        jemeval.load_model(tmp_path / "junk.safetensors")
    with pytest.raises(CheckpointError, match="does not exist"):
        jemeval.load_model(tmp_path / "missing.safetensors")


def test_export_command(digits_classifier_ckpt, tmp_path):
    out, record = tmp_path / "clf.safetensors", tmp_path / "export.json"
    r = CliRunner().invoke(cli, ["export", str(digits_classifier_ckpt), "--format", "safetensors", "--out", str(out),
                                 "--result", str(record), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["records"][0]["format"] == "safetensors" and data["provenance"]["command"] == "export"
    assert json.loads(record.read_text())["records"][0]["output"] == str(out)
    r = CliRunner().invoke(cli, ["export", str(digits_classifier_ckpt), "--out", str(tmp_path / "clf.pt")])
    assert r.exit_code == 2 and "--out must be a .safetensors file" in _one_line(r)
    r = CliRunner().invoke(cli, ["export", str(digits_classifier_ckpt), "--out", str(tmp_path / "c.safetensors"),
                                 "--classes", "a,b"])
    assert r.exit_code == 2 and "--classes gives 2 names, one per class is needed: the model has 10" in _one_line(r)
    r = CliRunner().invoke(cli, ["export", str(digits_classifier_ckpt), "--format", "onnx", "--out", str(out)])
    assert r.exit_code == 2 and "'onnx' is not 'safetensors'" in _one_line(r)


def test_commands_protect_the_dataset_a_safetensors_header_names(tmp_path):
    """A header's dataset naming a file is never read by default (issue 23 item 4), so never overwritten."""
    import numpy as np

    data = tmp_path / "data.npz"
    np.savez(data, x=np.zeros((4, 1, 8, 8), np.float32), y=np.zeros(4, np.int64))
    before = data.read_bytes()
    path = _write(tmp_path / "m.safetensors", _header(dataset=f"npz:{data}"))
    r = CliRunner().invoke(cli, ["ood", "--model", str(path), "--ood", "uniform", "--save-scores", str(data),
                                 "--device", "cpu"])
    assert r.exit_code == 2 and f"records its training set as 'npz:{data}'" in _one_line(r)
    assert data.read_bytes() == before
