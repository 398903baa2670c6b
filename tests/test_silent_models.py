"""Nothing silent, round 3 (issue 34): model caches, label spaces and model sources.

Each test rebuilds a case the audit of 1055cef ran. The caches are built offline as each library
lays them out (tests/test_pretrained.py's fixtures: small random weights in the Hugging Face Hub
cache and in torch hub's folder):

* item 1: no command writes into a model cache, through a symlink or not, nor through any symlink;
* item 8: a model's classes and a dataset's classes must be the same ones (by number and recorded
  names), be matched by name, or be mapped with ``--class-map FILE``; the map is recorded; the
  temperature note says what was measured;
* item 23: ``--download`` without a network is one line, at once;
* item 25: ``jemeval convert`` reads a ``jemeval export`` safetensors file;
* item 29: the missing-cache message speaks Python in Python and flags on the command line.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import test_pretrained as tp
import torch
from click.testing import CliRunner
from PIL import Image
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

import jemeval
from jemeval.cli import cli
from jemeval.errors import CheckpointError, UsageError

# the caches of tests/test_pretrained.py (pytest finds fixtures by module attribute)
offline = tp.offline
timm_resnet18 = tp.timm_resnet18
torchvision_resnet18 = tp.torchvision_resnet18

#: the source tree of the jemeval this session imported (the subprocess runs the same one)
SOURCE = Path(jemeval.__file__).resolve().parents[1]


def image_folder(root: Path, classes: list[str], size: int, per_class: int = 2, channels: int = 3,
                 seed: int = 0) -> Path:
    """A folder of class folders (torchvision's ImageFolder layout) holding random PNG images."""
    rng = np.random.default_rng(seed)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size, channels) if channels == 3 else (size, size), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def folder_tensors(root: Path, classes: list[str], size: int) -> tuple[torch.Tensor, list[str]]:
    """The folder's images in ImageFolder's order (sorted class folders, sorted files) in [-1, 1], by hand."""
    xs, names = [], []
    for name in sorted(classes):
        for f in sorted((root / name).iterdir()):
            a = np.asarray(Image.open(f).convert("RGB"), dtype=np.float32) / 255.0
            xs.append(torch.from_numpy(a).permute(2, 0, 1) * 2 - 1)
            names.append(name)
    return torch.stack(xs), names


# -- item 1: no output inside a model cache, none through a symlink -------------------------------------
def test_export_refuses_to_write_over_the_cached_hub_weights(timm_resnet18, offline):
    """The audit's case: `export timm:NAME --out <the snapshot file>` replaced the cached weights."""
    _, snap = timm_resnet18
    sha = tp._sha256(snap.resolve())
    before = snapshot(offline)
    for out in (snap, snap.parent / "other.safetensors", offline / "hf" / "x.safetensors"):
        result = runner().invoke(cli, ["export", "timm:resnet18", "--out", str(out)])
        assert_one_line_refusal(result, "is inside the Hugging Face cache")
    assert snapshot(offline) == before and snap.is_symlink()
    assert jemeval.load_model("timm:resnet18").metadata["checkpoint"]["sha256"] == sha


def test_no_command_writes_into_torch_hubs_cache(offline, digits_classifier_ckpt):
    hub = offline / "torch" / "hub"
    (hub / "checkpoints").mkdir(parents=True)
    before = snapshot(offline)
    for args in (["calibrate", "--model", str(digits_classifier_ckpt), "--n", "8", "--device", "cpu",
                  "--out", str(hub / "checkpoints" / "r.json")],
                 ["export", str(digits_classifier_ckpt), "--out", str(hub / "w.safetensors")],
                 ["convert", str(digits_classifier_ckpt), str(hub / "checkpoints" / "c.pt")]):
        assert_one_line_refusal(runner().invoke(cli, args), "is inside torch hub's cache")
    assert snapshot(offline) == before


def test_an_output_path_that_is_a_symlink_is_refused(tmp_path, digits_classifier_ckpt):
    """A link to a file the command does not read (here: someone's notes) was followed or replaced."""
    (tmp_path / "notes.json").write_text('{"mine": 1}')
    (tmp_path / "r.json").symlink_to("notes.json")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere" / "x.json")
    before = snapshot(tmp_path)
    for out in ("r.json", "dangling.json"):
        result = runner().invoke(cli, ["calibrate", "--model", str(digits_classifier_ckpt), "--n", "8", "--device",
                                       "cpu", "--out", str(tmp_path / out)])
        assert_one_line_refusal(result, "is a symbolic link")
    assert snapshot(tmp_path) == before


def test_a_link_into_the_cache_is_refused_too(timm_resnet18, offline):
    """A path outside the cache whose folder is a link into it lands in the cache: resolved, refused."""
    _, snap = timm_resnet18
    (offline / "elsewhere").symlink_to(snap.parent)
    before = snapshot(offline)
    result = runner().invoke(cli, ["export", "timm:resnet18", "--out", str(offline / "elsewhere" / "x.safetensors")])
    assert_one_line_refusal(result, "is inside the Hugging Face cache")
    assert snapshot(offline) == before


# -- item 8: label spaces --------------------------------------------------------------------------------
@pytest.fixture
def abc_224(tmp_path):
    """A 3-class folder (a, b, c) of 224 x 224 images, the size of the ImageNet models."""
    return image_folder(tmp_path / "abc", ["a", "b", "c"], 224)


def test_an_imagenet_model_on_a_three_class_folder_is_refused_everywhere(timm_resnet18, abc_224, offline):
    """The audit's case: folder classes a, b, c were read as ImageNet classes 0-2 (accuracy 0, exit 0)."""
    data = f"folder:{abc_224}"
    common = ["--model", "timm:resnet18", "--device", "cpu"]
    before = snapshot(offline)
    cases = [["eval", *common, "--data", data], ["calibrate", *common, "--data", data, "--temperature-scaling"],
             ["robust", *common, "--data", data, "--norm", "linf", "--n", "2", "--steps", "1", "--epsilons", "0"],
             ["ood", *common, "--id", data, "--ood", "uniform", "--score", "mahalanobis", "--n", "2", "--no-cache"],
             ["report", "--model", "timm:resnet18", "--data", data, "--sections", "accuracy",
              "--out", str(offline / "rep"), "--device", "cpu"]]
    for args in cases:
        result = runner().invoke(cli, args)
        assert_one_line_refusal(result, "has 3 classes (a, b, c) but the model has 1000 classes (tench")
        assert "--class-map FILE" in result.stderr, result.stderr
    assert snapshot(offline) == before


def test_a_class_map_maps_the_data_to_the_model_and_is_recorded(timm_resnet18, abc_224, offline):
    net, _ = timm_resnet18
    data = f"folder:{abc_224}"
    x, names = folder_tensors(abc_224, ["a", "b", "c"], 224)
    wanted = {"a": 7, "b": 1, "c": 2}  # c by index, b by ImageNet name below (goldfish = 1)
    predicted = tp.by_hand(net, x, *tp.IMAGENET).argmax(1).numpy()
    expected = float(np.mean(predicted == np.array([wanted[n] for n in names])))
    (offline / "map.json").write_text(json.dumps({"a": 7, "b": "goldfish", "2": 2}))
    (offline / "map.csv").write_text("data,model\n# data class -> model class\na,7\nb,Goldfish\nc,2\n")
    for path in (offline / "map.json", offline / "map.csv"):
        result = runner().invoke(cli, ["eval", "--model", "timm:resnet18", "--data", data, "--device", "cpu",
                                       "--class-map", str(path), "--json"])
        assert result.exit_code == 0, result.output + result.stderr
        out = json.loads(result.stdout)
        assert out["records"][0]["accuracy"] == pytest.approx(expected) and out["records"][0]["n"] == 6
        recorded = out["provenance"]["settings"]["class_map"]
        assert recorded["file"] == str(path) and recorded["sha256"] == tp._sha256(path)
        assert {k: v["index"] for k, v in recorded["map"].items()} == wanted
        assert recorded["map"]["b"]["name"].startswith("goldfish")


def test_the_data_class_names_among_the_models_map_by_name(timm_resnet18, tmp_path):
    """Folders named as the model's classes (an ImageNet synset, a name, a synonym) need no map."""
    net, _ = timm_resnet18
    classes = ["tench", "n01484850", "Carassius auratus"]  # 0 by name, 2 by synset, 1 by synonym
    root = image_folder(tmp_path / "named", classes, 224, per_class=1)
    result = runner().invoke(cli, ["eval", "--model", "timm:resnet18", "--data", f"folder:{root}",
                                   "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output + result.stderr
    out = json.loads(result.stdout)
    by_folder = {"tench": 0, "n01484850": 2, "Carassius auratus": 1}
    x, names = folder_tensors(root, classes, 224)
    predicted = tp.by_hand(net, x, *tp.IMAGENET).argmax(1).numpy()
    assert out["records"][0]["accuracy"] == pytest.approx(np.mean(predicted == [by_folder[n] for n in names]))
    recorded = out["provenance"]["settings"]["class_map"]
    assert recorded["by"] == "names" and {k: v["index"] for k, v in recorded["map"].items()} == by_folder


def test_torchvision_categories_map_by_name_and_a_stranger_is_refused(torchvision_resnet18, tmp_path):
    root = image_folder(tmp_path / "tv", ["goldfish", "tench"], 224, per_class=1)
    result = runner().invoke(cli, ["calibrate", "--model", "torchvision:resnet18", "--data", f"folder:{root}",
                                   "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output + result.stderr
    assert json.loads(result.stdout)["provenance"]["settings"]["class_map"]["map"] == {
        "goldfish": {"index": 1, "name": "goldfish"}, "tench": {"index": 0, "name": "tench"}}
    other = image_folder(tmp_path / "tv2", ["goldfish", "spaceship"], 224, per_class=1)
    result = runner().invoke(cli, ["eval", "--model", "torchvision:resnet18", "--data", f"folder:{other}",
                                   "--device", "cpu"])
    assert_one_line_refusal(result, "class name 'spaceship' is not among them")


@pytest.fixture
def small_folder(tmp_path):
    """A 3-class folder of 8 x 8 colour images with its own class names."""
    return image_folder(tmp_path / "d3", ["cat", "dog", "eel"], 8, per_class=3)


@pytest.fixture
def rgb10(tmp_path):
    """An (untrained) 10-class model of 8 x 8 colour images, trained on cifar10 as far as it records."""
    from jemeval.formats.native import save_checkpoint

    torch.manual_seed(0)
    return save_checkpoint(tmp_path / "rgb10.pt", jemeval.create_model("cnn", 10, (3, 8, 8), width=4),
                           dataset="cifar10")


def test_a_ten_class_model_on_a_folder_of_other_classes_is_refused(rgb10, small_folder, tmp_path):
    data = f"folder:{small_folder}"
    common = ["--model", str(rgb10), "--device", "cpu"]
    before = snapshot(tmp_path)
    for args in (["eval", *common, "--data", data], ["robust", *common, "--data", data, "--norm", "l2", "--n", "2",
                                                     "--steps", "1", "--epsilons", "0"],
                 ["ood", *common, "--id", data, "--ood", "uniform", "--score", "tscaling", "--no-cache"]):
        assert_one_line_refusal(runner().invoke(cli, args), "has 3 classes (cat, dog, eel) but the model has 10")
    assert snapshot(tmp_path) == before


def test_class_map_mistakes_are_one_line(rgb10, small_folder, tmp_path):
    data = f"folder:{small_folder}"
    cases = {"gap.json": ('{"cat": 0, "dog": 1}', "leaves 1 class(es)"),
             "typo.json": ('{"cta": 0, "dog": 1, "eel": 2}', "has no class 'cta' (did you mean 'cat'?)"),
             "big.json": ('{"cat": 0, "dog": 1, "eel": 10}', "the model has 10 classes (0-9), so it has no class 10"),
             "named.json": ('{"cat": 0, "dog": 1, "eel": "eel"}', "the model records no class names"),
             "twice.json": ('{"cat": 0, "0": 1, "dog": 1, "eel": 2}', "maps the data class '0' (label 0) twice"),
             "list.json": ("[0, 1, 2]", "holds a JSON list"),
             "bad.csv": ("cat,0\ndog\n", "row 2 'dog' is not 'data class,model class'")}
    for name, (text, expected) in cases.items():
        (tmp_path / name).write_text(text)
        before = snapshot(tmp_path)
        result = runner().invoke(cli, ["calibrate", "--model", str(rgb10), "--data", data,
                                       "--device", "cpu", "--class-map", str(tmp_path / name)])
        assert_one_line_refusal(result, expected)
        assert snapshot(tmp_path) == before
    result = runner().invoke(cli, ["eval", "--model", str(rgb10), "--data", data, "--device", "cpu",
                                   "--class-map", str(tmp_path / "gap.json"), "--out", str(tmp_path / "gap.json")])
    assert_one_line_refusal(result, "is the class map (--class-map)")


def test_a_mapped_folder_matches_a_hand_computed_accuracy_in_eval_robust_and_ood(rgb10, small_folder, tmp_path):
    """The mapped labels reach every command that compares with labels (robust's clean accuracy, a
    detector fitted on labels)."""
    model = jemeval.load_model(rgb10)
    mapping = {"cat": 3, "dog": 5, "eel": 8}
    (tmp_path / "m.json").write_text(json.dumps(mapping))
    x, names = folder_tensors(small_folder, list(mapping), 8)
    with torch.no_grad():
        predicted = model(x).argmax(1).numpy()
    expected = float(np.mean(predicted == np.array([mapping[n] for n in names])))
    data = f"folder:{small_folder}"
    common = ["--model", str(rgb10), "--device", "cpu", "--json", "--class-map", str(tmp_path / "m.json")]
    out = json.loads(CliRunner().invoke(cli, ["eval", *common, "--data", data]).stdout)
    assert out["records"][0]["accuracy"] == pytest.approx(expected)
    out = json.loads(CliRunner().invoke(cli, ["robust", *common, "--data", data, "--norm", "l2", "--steps", "1",
                                              "--epsilons", "0"]).stdout)
    assert out["records"][0]["clean_accuracy"] == pytest.approx(expected)
    assert out["provenance"]["settings"]["class_map"]["map"]["eel"] == {"index": 8}
    result = CliRunner().invoke(cli, ["ood", *common, "--id", data, "--ood", "uniform", "--score", "tscaling",
                                      "--no-cache"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["provenance"]["settings"]["class_map"]["map"]["cat"] == {"index": 3}


def test_a_model_trained_on_the_data_needs_no_map(digits_classifier_ckpt, small_folder, tmp_path):
    """A jemeval checkpoint records its training set: digits on digits, a 3-class folder model on
    that folder, an npz (no declared classes) as before; an unlabelled OOD folder is unaffected."""
    from jemeval.formats.native import save_checkpoint

    result = runner().invoke(cli, ["eval", "--model", str(digits_classifier_ckpt), "--device", "cpu", "--n", "20"])
    assert result.exit_code == 0, result.stderr
    spec = f"folder:{small_folder}"
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "f3.pt", jemeval.create_model("cnn", 3, (3, 8, 8), width=4), dataset=spec)
    result = runner().invoke(cli, ["calibrate", "--model", str(tmp_path / "f3.pt"), "--data", spec, "--device", "cpu",
                                   "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["provenance"]["settings"]["class_map"] is None
    np.savez(tmp_path / "g.npz", x=np.zeros((12, 1, 8, 8), np.uint8), y=np.arange(12) % 10)
    result = runner().invoke(cli, ["eval", "--model", str(digits_classifier_ckpt), "--device", "cpu",
                                   "--data", f"npz:{tmp_path / 'g.npz'}"])
    assert result.exit_code == 0, result.stderr
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(3):
        Image.fromarray(np.full((8, 8), 40 * i, np.uint8)).save(flat / f"{i}.png")
    result = runner().invoke(cli, ["ood", "--model", str(digits_classifier_ckpt), "--device", "cpu", "--ood",
                                   f"folder:{flat}", "--score", "maxprob,mahalanobis", "--n", "20", "--fit-n", "100",
                                   "--no-cache"])
    assert result.exit_code == 0, result.stderr


def test_the_temperature_note_says_what_was_measured(digits_classifier_ckpt, tmp_path):
    """Labels that are not the model's classes (every digit labelled as the next one) push T to the
    upper bound: the note must say so, and count the validation images classified correctly, not
    claim they are '(nearly) all classified correctly'."""
    ds = jemeval.load_dataset("digits", "test")
    shifted = (ds.y + 1) % 10
    np.savez(tmp_path / "shifted.npz", x=((ds.x.numpy() + 1) * 127.5).round().astype(np.uint8), y=shifted.numpy())
    clf = jemeval.load_model(digits_classifier_ckpt)
    with torch.no_grad():
        accuracy = float((clf(ds.x).argmax(1) == shifted).float().mean())
    assert accuracy < 0.05  # by hand: the shifted labels are (almost) never predicted
    result = jemeval.calibrate(clf, f"npz:{tmp_path / 'shifted.npz'}", temperature_scaling=True, device="cpu")
    note = next(n for n in result.notes if "fitted temperature" in n)
    assert "(nearly) all" not in note and "upper bound" in note, note
    correct, total = (int(v) for v in re.search(r"(\d+) of the (\d+) validation images", note).groups())
    assert total == result.provenance["settings"]["validation"]["n"] and correct / total < 0.1
    assert result.records[1]["temperature"] == pytest.approx(20.0, rel=1e-3)


def test_python_api_takes_a_class_map_and_refuses_without(rgb10, small_folder):
    data = f"folder:{small_folder}"
    with pytest.raises(UsageError, match="class_map=FILE") as info:
        jemeval.evaluate(rgb10, data, device="cpu")
    assert "\n" not in str(info.value)
    result = jemeval.calibrate(rgb10, data, device="cpu", class_map={"cat": 0, "dog": 1, "eel": 2})
    assert result.provenance["settings"]["class_map"]["given"] == "mapping"


# -- item 23: --download without a network ------------------------------------------------------------------
@pytest.mark.slow  # two jemeval processes
def test_download_without_a_network_is_one_line_at_once(tmp_path):
    """The Hub unreachable (a proxy nobody listens on): one line, not 11 retry messages over 35 s.
    Timed against the same command without --download (the same imports, refused at once), so a
    loaded machine's slow start does not count."""
    with socket.socket() as s:  # a port that was free a moment ago: the proxy refuses at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proxy = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and k != "HF_HUB_OFFLINE"}
    env.update(HTTPS_PROXY=proxy, HTTP_PROXY=proxy, ALL_PROXY=proxy, HF_HUB_CACHE=str(tmp_path / "hf"),
               TORCH_HOME=str(tmp_path / "torch"), PYTHONPATH=os.pathsep.join([str(SOURCE), env.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    args = [sys.executable, "-m", "jemeval", "calibrate", "--model", "timm:resnet18", "--data", "uniform", "--device",
            "cpu"]

    def timed(extra: list[str], limit: float) -> tuple[subprocess.CompletedProcess, float]:
        start = time.perf_counter()
        try:
            done = subprocess.run(args + extra, env=env, capture_output=True, text=True, timeout=limit, cwd=tmp_path)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"jemeval {' '.join(extra)} ran past {limit:.0f} s: {(exc.stderr or b'')[-300:]!r}")
        return done, time.perf_counter() - start

    control, start_up = timed([], 120)
    assert "fetch it once with --download" in control.stderr, control.stderr
    done, seconds = timed(["--download"], start_up + 15)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and len(lines) == 1 and lines[0].startswith("Error:"), done.stderr
    assert "the Hugging Face Hub cannot be reached" in lines[0]
    assert seconds - start_up < 10, (seconds, start_up)  # huggingface_hub's retries sleep 23 s
    assert not any((tmp_path / "hf").rglob("*.safetensors"))


# -- item 25: convert reads an export ------------------------------------------------------------------------
def test_convert_writes_an_export_as_a_checkpoint(digits_jem_ckpt, tmp_path):
    from jemeval.formats.export import export

    export(digits_jem_ckpt, tmp_path / "e.safetensors", classes=[f"digit {i}" for i in range(10)])
    result = runner().invoke(cli, ["convert", str(tmp_path / "e.safetensors"), str(tmp_path / "c.pt"), "--json"])
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)["records"][0]
    assert record["layout"] == "jemeval-safetensors"
    assert record["source_sha256"] == tp._sha256(tmp_path / "e.safetensors")
    again, first = jemeval.load_model(tmp_path / "c.pt"), jemeval.load_model(digits_jem_ckpt)
    x = torch.rand(4, 1, 8, 8) * 2 - 1
    assert torch.equal(again(x), first(x))
    assert again.metadata["dataset"] == "digits" and again.metadata["classes"][3] == "digit 3"
    assert again.metadata["config"]["sgld"] == first.metadata["config"]["sgld"]
    assert again.metadata["config"]["source_layout"] == "jemeval-safetensors"


# -- item 29: how to fetch, in each language ----------------------------------------------------------------
def test_the_missing_cache_message_speaks_python_in_python_and_flags_on_the_command_line(offline):
    with pytest.raises(CheckpointError) as info:
        jemeval.load_model("timm:resnet18")
    assert "download=True" in str(info.value) and "--download" not in str(info.value)
    result = runner().invoke(cli, ["calibrate", "--model", "timm:resnet18", "--data", "uniform", "--device", "cpu"])
    assert_one_line_refusal(result, "fetch it once with --download")
    assert "download=True" not in result.stderr and "(..., --download)" not in result.stderr
    result = runner().invoke(cli, ["export", "timm:resnet18", "--out", str(offline / "x.safetensors")])
    assert_one_line_refusal(result, "fetch it once with --download of `jemeval calibrate|eval|ood|")
    assert "(download=True in Python)" in result.stderr
