"""Checkpoints and headers from elsewhere (issue 23 items 4, 7 and part of 11), written as the attacks.

A ``.pt`` or ``.safetensors`` file may be a download: whatever it records is checked before it is
used. Its training set may not choose which local files a command reads (``folder:/`` crawled the
disk); every header field is checked against the architecture (a tensor stored as int32, a std of
0, one class name for ten outputs); and an architecture whose size has nothing to do with the
file's weights (``width: 10**12``) is refused before anything is allocated. Each refusal is one line;
no file changes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import safetensors.torch as st
import torch
from test_bad_inputs import assert_one_line_refusal, runner, snapshot
from torch.nn.modules.module import register_module_parameter_registration_hook

import jemeval
from jemeval.cli import cli
from jemeval.errors import CheckpointError, UsageError
from jemeval.formats.safetensors import HEADER_KEY, save_safetensors

REPO = Path(jemeval.__file__).resolve().parent.parent


def _small_model(channels: int = 1) -> jemeval.EnergyModel:
    torch.manual_seed(0)
    return jemeval.create_model("cnn:width=4", 10, (channels, 8, 8))


def _tampered_pt(src: Path, dst: Path, *, state: dict | None = None, **changes) -> Path:
    raw = torch.load(src, weights_only=True)
    raw.update(changes)
    if state is not None:
        raw["state_dict"] = state
    torch.save(raw, dst)
    return dst


def _tampered_safetensors(src: Path, dst: Path, *, state: dict | None = None, **changes) -> Path:
    """``src`` (a real export) with its "jemeval" header edited as an attacker would (the JSON is plain text)."""
    with st.safe_open(str(src), framework="pt") as fh:
        header = json.loads(fh.metadata()[HEADER_KEY])
    header.update(changes)
    tensors = state if state is not None else st.load_file(str(src))
    st.save_file(tensors, str(dst), metadata={HEADER_KEY: json.dumps(header)})
    return dst


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A folder with a real checkpoint (base.pt, recording digits) and its real export (base.safetensors)."""
    model = _small_model()
    jemeval.save_checkpoint(tmp_path / "base.pt", model, dataset="digits")
    save_safetensors(tmp_path / "base.safetensors", model)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JEMEVAL_DEBUG", raising=False)
    return tmp_path


# -- item 4: a checkpoint may not choose which local files a command reads -------------------------
LOCAL_SPECS = ["folder:/", "folder:/proc/self", "npz:/etc/passwd"]
#: (command line, the flag the error names); each would read the checkpoint's dataset by default
DEFAULTING_COMMANDS = [
    ("eval --n 20", "--data"),
    ("calibrate --n 20", "--data"),
    ("ood --ood uniform --n 20 --score maxprob", "--id"),
    ("robust --norm l2 --n 2 --steps 1 --epsilons 0,0.1", "--data"),
    ("sample --init data --n 2 --steps 1", "--data"),
]


@pytest.mark.slow
@pytest.mark.parametrize("spec", LOCAL_SPECS, ids=["root", "proc-self", "etc-passwd"])
@pytest.mark.parametrize("args, flag", DEFAULTING_COMMANDS, ids=[c.split()[0] for c, _ in DEFAULTING_COMMANDS])
def test_a_checkpoint_recording_a_local_path_is_refused_in_one_line(files, spec, args, flag):
    """A real process (a hang shows as the timeout: ``folder:/`` used to crawl for minutes)."""
    _tampered_pt(files / "base.pt", files / "ck.pt", dataset=spec)
    before = snapshot(files)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "jemeval", *args.split(), "--model", "ck.pt", "--device", "cpu"],
                          capture_output=True, text=True, cwd=files, env=environ, timeout=60, check=False)
    result = SimpleNamespace(exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)
    assert_one_line_refusal(result, f"the checkpoint records its training set as {spec!r}")
    assert proc.returncode == 2 and f"give {flag} {spec} (or another dataset)" in proc.stderr
    assert snapshot(files) == before


def test_the_python_api_refuses_a_recorded_path_even_to_a_valid_dataset(files):
    """The recorded npz is a real, loadable digits-shaped set: only the refusal keeps it unread."""
    rng = np.random.default_rng(0)
    np.savez(files / "d.npz", x=rng.integers(0, 256, (20, 1, 8, 8), dtype=np.uint8), y=np.arange(20) % 10)
    spec = f"npz:{files / 'd.npz'}"
    model = jemeval.load_model(_tampered_pt(files / "base.pt", files / "ck.pt", dataset=spec))
    calls = [
        ("data", lambda: jemeval.evaluate(model, device="cpu", progress=False)),
        ("data", lambda: jemeval.calibrate(model, device="cpu", progress=False)),
        ("id", lambda: jemeval.evaluate_ood(model, "uniform", scores="maxprob", device="cpu", progress=False)),
        ("data", lambda: jemeval.robust(model, norm="l2", n=2, steps=1, device="cpu", progress=False)),
        ("data", lambda: jemeval.sample(model, n=2, steps=1, init="data", device="cpu", progress=False)),
        ("reference", lambda: jemeval.fidelity(jemeval.sample(model, n=2, steps=1, device="cpu", progress=False),
                                               features=[model], metrics="fd")),
    ]
    for param, call in calls:
        with pytest.raises(UsageError) as info:
            call()
        assert info.value.param == param and "\n" not in str(info.value)
        assert f"give {param}={spec} (or another dataset)" in str(info.value)
    # the user can still choose that file on purpose
    assert jemeval.evaluate(model, data=spec, device="cpu", progress=False).records[0]["n"] == 20


@pytest.mark.parametrize("args", [
    "eval --data digits --n 20", "calibrate --data digits --n 20",
    "ood --ood uniform --id digits --n 20 --score maxprob",
    "robust --norm l2 --data digits --n 2 --steps 1 --epsilons 0,0.1",
    "sample --init data --data digits --n 2 --steps 1 --json",
], ids=["eval", "calibrate", "ood", "robust", "sample"])
def test_the_same_command_with_an_explicit_dataset_works(files, args):
    _tampered_pt(files / "base.pt", files / "ck.pt", dataset="folder:/")
    r = runner().invoke(cli, [*args.split(), "--model", "ck.pt", "--device", "cpu"])
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize("recorded", ["digits", "digits[0-4]"])
def test_a_registered_name_is_still_the_default(files, recorded):
    _tampered_pt(files / "base.pt", files / "ck.pt", dataset=recorded)
    r = runner().invoke(cli, ["eval", "--model", "ck.pt", "--n", "20", "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["records"][0]["data"] == recorded
    r = runner().invoke(cli, ["sample", "--model", "ck.pt", "--init", "data", "--n", "2", "--steps", "1",
                              "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["settings"]["init_details"]["dataset"] == recorded


# -- item 7 and 11: every header field checked against the architecture ----------------------------
def _int32_state(src: Path) -> dict:
    state = {k: v.clone() for k, v in jemeval.load_model(src).net.state_dict().items()}
    state["features.0.weight"] = (state["features.0.weight"] * 1000).to(torch.int32)
    return state


def _float64_state(src: Path) -> dict:
    state = {k: v.clone() for k, v in jemeval.load_model(src).net.state_dict().items()}
    state["head.bias"] = state["head.bias"].double()
    return state


# (id, changes to the header / checkpoint dict, words the one error line must contain)
FIELD_CASES = [
    ("dtype-int32", {"state": _int32_state}, "stores tensor 'features.0.weight' as int32, but architecture 'cnn' "
                                             "holds float32 there"),
    ("dtype-float64", {"state": _float64_state}, "stores tensor 'head.bias' as float64"),
    ("mean-nan", {"normalization": {"mean": [float("nan")], "std": [0.5]}}, "normalization mean [nan]"),
    ("std-zero", {"normalization": {"mean": [0.5], "std": [0.0]}}, "normalization std [0.0]"),
    ("std-negative", {"normalization": {"mean": [0.5], "std": [-1.0]}}, "must be finite and > 0"),
    ("std-inf", {"normalization": {"mean": [0.5], "std": [float("inf")]}}, "normalization std [inf]"),
    ("norm-per-channel-count", {"normalization": {"mean": [0.5, 0.5], "std": [0.5, 0.5]}},
     "normalization mean [0.5, 0.5]: it must be 1 number"),
    ("norm-missing-std", {"normalization": {"mean": [0.5]}}, "with exactly 'mean' and 'std'"),
    ("norm-text", {"normalization": {"mean": ["0.5"], "std": [0.5]}}, "normalization mean ['0.5']"),
    ("classes-one", {"classes": ["a"]}, "records classes as 1 name for a model with 10 outputs"),
    ("classes-not-text", {"classes": list(range(10))}, "it must be a list of 10 strings"),
    ("classes-eleven", {"classes": [str(i) for i in range(11)]}, "records classes as 11 names"),
    ("classes-zero", {"num_classes": 0}, "records num_classes 0: it must be a whole number from 1"),
    ("classes-negative", {"num_classes": -10}, "records num_classes -10"),
    ("classes-absurd", {"num_classes": 2**40}, f"records num_classes {2**40}"),
    ("classes-million", {"num_classes": 10**6}, "num_classes 1000000 and input_shape [1, 8, 8]: that network would "
                                                "hold more than"),
    ("shape-zero", {"input_shape": [1, 0, 8]}, "input_shape [1, 0, 8] is not a list of positive integers"),
    ("shape-empty", {"input_shape": []}, "input_shape [] is not a list of positive integers"),
    ("shape-huge", {"input_shape": [1, 2**20, 2**20]}, "records input_shape [1, 1048576, 1048576]: "
                                                       "1,099,511,627,776 values per image"),
    ("width-1e12", {"arch_options": {"width": 10**12}}, "cnn width must be a whole number from 1 to 65536, got "
                                                        "1000000000000"),
    ("width-60000", {"arch_options": {"width": 60000}}, "arch_options {'width': 60000}"),
    ("width-zero", {"arch_options": {"width": 0}}, "cnn width must be a whole number from 1 to 65536, got 0"),
]


def _craft(files: Path, kind: str, changes: dict) -> Path:
    changes = dict(changes)
    src = files / f"base.{kind}"
    state = changes.pop("state", None)
    state = state(src) if callable(state) else state
    tamper = _tampered_pt if kind == "pt" else _tampered_safetensors
    return tamper(src, files / f"crafted.{kind}", state=state, **changes)


@pytest.mark.parametrize("kind", ["pt", "safetensors"])
@pytest.mark.parametrize("changes, expected", [c[1:] for c in FIELD_CASES], ids=[c[0] for c in FIELD_CASES])
def test_every_field_is_checked_against_the_architecture(files, kind, changes, expected):
    path = _craft(files, kind, changes)
    before = snapshot(files)
    with pytest.raises(CheckpointError) as info:
        jemeval.load_model(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"'{path}'") and expected in message, message
    r = runner().invoke(cli, ["eval", "--model", str(path), "--device", "cpu"])
    assert_one_line_refusal(r, expected)
    assert snapshot(files) == before


@pytest.mark.parametrize("kind", ["pt", "safetensors"])
def test_an_absurd_architecture_is_refused_before_allocating(files, kind, monkeypatch):
    """width 60000 passes the cnn factory's own bound but would allocate ~1 TB of weights for a file of
    2,258 values: no parameter beyond a few million values may reach the CPU."""
    path = _craft(files, kind, {"arch_options": {"width": 60000}})
    on_cpu = []
    handle = register_module_parameter_registration_hook(
        lambda module, name, p: on_cpu.append(p.numel()) if p is not None and p.device.type != "meta" else None)
    try:
        with pytest.raises(CheckpointError, match="refused before allocating it") as info:
            jemeval.load_model(path)
    finally:
        handle.remove()
    assert "'width': 60000" in str(info.value) and str(path) in str(info.value)
    assert max(on_cpu, default=0) < 5_000_000, on_cpu


def test_an_absurd_option_of_any_factory_is_refused_on_the_meta_device(files):
    """timm forwards any keyword (embed_dim) and has no bound of its own: the size budget still applies."""
    model = jemeval.create_model("timm:vit_tiny_patch16_224,img_size=16,patch_size=8,depth=1", 10, (3, 16, 16))
    jemeval.save_checkpoint(files / "vit.pt", model)
    assert jemeval.load_model(files / "vit.pt").arch_options["depth"] == 1  # the real file loads
    bad = _tampered_pt(files / "vit.pt", files / "vit-bad.pt",
                       arch_options={**model.arch_options, "embed_dim": 3 * 2**20})
    with pytest.raises(CheckpointError, match=r"'embed_dim': 3145728.*that network would hold more than") as info:
        jemeval.load_model(bad)
    assert "\n" not in str(info.value)


def test_honest_files_still_load_with_identical_logits(files):
    """What the checks allow: one normalisation value for all channels or one per channel, ten class
    names for ten outputs, the export of a real checkpoint."""
    x = torch.rand(4, 3, 8, 8) * 2 - 1
    for norm in ({"mean": [0.5], "std": [0.25]}, {"mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3]}):
        model = jemeval.create_model("cnn:width=4", 10, (3, 8, 8), normalization=norm)
        jemeval.save_checkpoint(files / "rgb.pt", model, dataset="cifar10")
        save_safetensors(files / "rgb.safetensors", model, classes=[f"c{i}" for i in range(10)])
        for path in (files / "rgb.pt", files / "rgb.safetensors"):
            back = jemeval.load_model(path)
            with torch.no_grad():
                assert torch.equal(back(x), model(x))
            assert back.normalization == model.normalization
    assert jemeval.load_model(files / "rgb.safetensors").metadata["classes"] == [f"c{i}" for i in range(10)]
