"""Pretrained classifiers as models (issue 25, item 5): ``--model timm:NAME``, ``torchvision:NAME``,
``pytorch-ood:KEY`` and ``hf:REPO``.

No network: each test builds the library's real cache on disk (the Hugging Face Hub cache for timm
and hf:, torch hub's checkpoints folder for torchvision and pytorch-ood) holding small random
weights, publishes them where the library looks (torchvision's weights enum URL and pytorch-ood's
registry entry carry the file's hash, as the real ones do), and loads through the library's own API
with HF_HUB_OFFLINE=1. Numbers are checked against the library's network run directly on inputs
normalised by hand. The attacks: a tampered cache entry, a pickle that would run code, a FIFO in the
cache, a missing file without --download, an output over the cached weights.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

import jemeval
from jemeval.cli import cli
from jemeval.errors import CheckpointError, UsageError

REV = "0123456789abcdef0123456789abcdef01234567"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the caches, built as each library lays them out ------------------------------------------------
@pytest.fixture
def offline(tmp_path, monkeypatch):
    """Empty caches for this test only, and the Hub offline."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    return tmp_path


def hub_cache(root: Path, repo: str, files: dict[str, bytes], rev: str = REV) -> Path:
    """``models--ORG--NAME/{blobs/<sha256>, snapshots/<rev>/<file> -> blob, refs/main}``: the Hub cache."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(rev)
    (folder / "snapshots" / rev).mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (folder / "snapshots" / rev / name).symlink_to(os.path.relpath(blob, folder / "snapshots" / rev))
    return folder / "snapshots" / rev


def _safetensors_bytes(state: dict, tmp: Path) -> bytes:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp))
    data = tmp.read_bytes()
    tmp.unlink()
    return data


@pytest.fixture
def timm_resnet18(offline):
    """timm's resnet18 (default tag a1_in1k) with random weights in the Hub cache, as timm fetches it."""
    import timm

    torch.manual_seed(0)
    net = timm.create_model("resnet18", pretrained=False).eval()
    data = _safetensors_bytes(net.state_dict(), offline / "w.safetensors")
    config = json.dumps({"architecture": "resnet18", "num_classes": 1000}).encode()
    snap = hub_cache(offline / "hf", "timm/resnet18.a1_in1k", {"model.safetensors": data, "config.json": config})
    return net, snap / "model.safetensors"


def publish_torch_hub(offline: Path, state: dict, stem: str) -> tuple[Path, str]:
    """Save ``state`` as torch hub names files (``<stem>-<sha256 prefix>.pth``) in $TORCH_HOME/hub/checkpoints."""
    folder = offline / "torch" / "hub" / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "tmp"
    torch.save(state, tmp)
    digest = _sha256(tmp)
    path = folder / f"{stem}-{digest[:8]}.pth"
    tmp.rename(path)
    return path, digest


@pytest.fixture
def torchvision_resnet18(offline, monkeypatch):
    """torchvision's resnet18 with random weights in torch hub's cache, its DEFAULT weights enum naming them."""
    from torchvision import models

    torch.manual_seed(0)
    net = models.resnet18(num_classes=1000).eval()
    path, _ = publish_torch_hub(offline, net.state_dict(), "resnet18")
    weights = models.ResNet18_Weights.IMAGENET1K_V1
    monkeypatch.setattr(weights.value, "url", f"https://download.pytorch.org/models/{path.name}")
    return net, path


OOD_KEY = "wrn-40-2/cifar10/oe"


@pytest.fixture
def pytorch_ood_wrn(offline, monkeypatch):
    """pytorch-ood's wrn-40-2/cifar10/oe with random weights at its cache path, its registry entry
    recording their SHA-256 (as it records the published file's)."""
    from pytorch_ood.model import WideResNet, registry

    torch.manual_seed(0)
    net = WideResNet(num_classes=10, depth=40, widen_factor=2, drop_rate=0.3).eval()
    folder = offline / "torch" / "hub" / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), folder / "tmp")
    entry = dataclasses.replace(registry.get_model_info(OOD_KEY), sha256=_sha256(folder / "tmp"))
    (folder / "tmp").rename(folder / entry.file_name)
    monkeypatch.setitem(registry._index(), OOD_KEY, entry)
    return net, folder / entry.file_name, entry


def npz_images(path: Path, n: int, size: int, num_classes: int = 10, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    np.savez(path, x=rng.integers(0, 256, (n, 3, size, size), dtype=np.uint8),
             y=np.arange(n) % num_classes)
    return f"npz:{path}"


def normalised(x, mean, std):
    """jemeval inputs as the library's network takes them, by hand: pixels (x + 1) / 2, then (p - m) / s."""
    return ((x + 1) / 2 - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)


def by_hand(net, x, mean, std):
    with torch.no_grad():
        return net(normalised(x, mean, std))


IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


# -- loading: the numbers, the features, provenance --------------------------------------------------
def test_timm_source_loads_through_timm_from_the_hub_cache(timm_resnet18):
    net, path = timm_resnet18
    model = jemeval.load_model("timm:resnet18")
    assert model.input_shape == (3, 224, 224) and model.num_classes == 1000 and model.arch == "timm"
    x = torch.rand(2, 3, 224, 224) * 2 - 1
    features, logits = model.features_and_logits(x)
    torch.testing.assert_close(logits.detach(), by_hand(net, x, *IMAGENET), rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        pooled = net.forward_head(net.forward_features(normalised(x, *IMAGENET)), pre_logits=True)
    torch.testing.assert_close(features.detach(), pooled, rtol=1e-4, atol=1e-4)
    record = model.metadata["checkpoint"]
    assert record == {"path": str(path), "sha256": _sha256(path.resolve()), "source": "timm:resnet18",
                      "name": "resnet18.a1_in1k", "revision": REV}
    assert model.metadata["classes"][0].startswith("tench") and len(model.metadata["classes"]) == 1000


def test_torchvision_source_gives_everything_before_fc_as_features(torchvision_resnet18):
    net, path = torchvision_resnet18
    model = jemeval.load_model("torchvision:resnet18")
    x = torch.rand(3, 3, 224, 224) * 2 - 1
    features, logits = model.features_and_logits(x)
    torch.testing.assert_close(logits.detach(), by_hand(net, x, *IMAGENET), rtol=1e-4, atol=1e-4)
    body = torch.nn.Sequential(*list(net.children())[:-1])  # conv1 ... avgpool: everything before fc
    with torch.no_grad():
        expected = body(normalised(x, *IMAGENET)).flatten(1)
    torch.testing.assert_close(features.detach(), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.classifier()(features).detach(), logits.detach())
    assert model.metadata["checkpoint"]["revision"] == "ResNet18_Weights.IMAGENET1K_V1"
    assert model.metadata["checkpoint"]["sha256"] == _sha256(path)
    assert model.metadata["classes"][:2] == ["tench", "goldfish"]
    # the same weights named explicitly
    assert jemeval.load_model("torchvision:resnet18:IMAGENET1K_V1").metadata["checkpoint"]["path"] == str(path)


def test_pytorch_ood_source_uses_its_documented_cifar_normalisation(pytorch_ood_wrn):
    net, path, entry = pytorch_ood_wrn
    model = jemeval.load_model(f"pytorch-ood:{OOD_KEY}")
    assert model.input_shape == (3, 32, 32) and model.num_classes == 10 and model.metadata["dataset"] == "cifar10"
    mean, std = entry.preprocessing.mean, entry.preprocessing.std
    assert mean == pytest.approx((125.3 / 255, 123.0 / 255, 113.9 / 255))  # what pytorch-ood documents
    x = torch.rand(4, 3, 32, 32) * 2 - 1
    features, logits = model.features_and_logits(x)
    torch.testing.assert_close(logits.detach(), by_hand(net, x, mean, std), rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        expected = net.features(normalised(x, mean, std))
    torch.testing.assert_close(features.detach(), expected, rtol=1e-4, atol=1e-4)
    assert model.metadata["checkpoint"]["sha256"] == entry.sha256 and model.metadata["checkpoint"]["name"] == OOD_KEY


def test_hf_source_reads_a_jemeval_export_with_its_checks(offline, tmp_path, digits_classifier_ckpt):
    export = tmp_path / "digits.safetensors"
    from jemeval.formats.export import export as export_model

    export_model(digits_classifier_ckpt, export)
    snap = hub_cache(offline / "hf", "me/digits-jem", {"model.safetensors": export.read_bytes()})
    model = jemeval.load_model("hf:me/digits-jem")
    reference = jemeval.load_model(digits_classifier_ckpt)
    x = torch.rand(5, *reference.input_shape) * 2 - 1
    torch.testing.assert_close(model(x), reference(x))
    assert model.metadata["checkpoint"]["source"] == "hf:me/digits-jem"
    assert model.metadata["checkpoint"]["revision"] == REV
    assert model.metadata["checkpoint"]["sha256"] == _sha256(export)
    assert jemeval.load_model(f"hf:me/digits-jem@{REV}:model.safetensors").metadata["checkpoint"]["path"] == str(
        snap / "model.safetensors")


def test_an_export_of_a_pretrained_model_loads_back(torchvision_resnet18, tmp_path):
    """The wrapper is a registered architecture (torchvision:resnet18), so its export names one."""
    out = tmp_path / "tv.safetensors"
    from jemeval.formats.export import export

    export("torchvision:resnet18", out)
    again, first = jemeval.load_model(out), jemeval.load_model("torchvision:resnet18")
    x = torch.rand(2, 3, 224, 224) * 2 - 1
    torch.testing.assert_close(again(x), first(x))
    assert again.normalization == first.normalization and again.arch == "torchvision"


# -- the commands, offline, from the caches -----------------------------------------------------------
def run_commands(source: str, data: str, tmp_path: Path, weights: Path) -> None:
    """ood (knn + logpx), calibrate, robust and eval with one refinement step, and sample, each naming
    the source in provenance."""
    common = ["--model", source, "--device", "cpu", "--json"]
    commands = {
        "ood": ["ood", *common, "--id", data, "--ood", "uniform", "--score", "knn:k=2,logpx", "--n", "8",
                "--fit-n", "8", "--batch-size", "8"],
        "calibrate": ["calibrate", *common, "--data", data, "--n", "8", "--bins", "5"],
        "robust": ["robust", *common, "--data", data, "--norm", "linf", "--refine-steps", "1", "--n", "2",
                   "--steps", "1", "--chains", "1", "--epsilons", "0,8/255", "--batch-size", "2"],
        "eval": ["eval", *common, "--data", data, "--n", "4", "--refine-steps", "0,1", "--chains", "1"],
        "sample": ["sample", "--model", source, "--device", "cpu", "--json", "--n", "2", "--steps", "2"],
    }
    for name, args in commands.items():
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, f"{name}: {result.output}"
        out = json.loads(result.stdout)
        assert out["provenance"]["checkpoint"]["source"] == source, name
        assert out["provenance"]["checkpoint"]["sha256"] == _sha256(weights.resolve()), name
        assert out["records"], name
        if name == "ood":
            assert {r["score"].split(":")[0] for r in out["records"]} >= {"knn", "logpx"}
            assert all(0 <= r["auroc"] <= 1 for r in out["records"])


def test_timm_model_runs_ood_calibrate_robust(timm_resnet18, tmp_path):
    run_commands("timm:resnet18", npz_images(tmp_path / "d.npz", 16, 224), tmp_path, timm_resnet18[1])


def test_torchvision_model_runs_ood_calibrate_robust(torchvision_resnet18, tmp_path):
    run_commands("torchvision:resnet18", npz_images(tmp_path / "d.npz", 16, 224), tmp_path, torchvision_resnet18[1])


def test_pytorch_ood_model_runs_ood_calibrate_robust(pytorch_ood_wrn, tmp_path):
    run_commands(f"pytorch-ood:{OOD_KEY}", npz_images(tmp_path / "d.npz", 16, 32), tmp_path, pytorch_ood_wrn[1])


# -- attacks ---------------------------------------------------------------------------------------------
def test_a_dataset_of_another_shape_is_one_line(pytorch_ood_wrn, tmp_path):
    data = npz_images(tmp_path / "d.npz", 8, 28)
    before = snapshot(tmp_path)
    result = runner().invoke(cli, ["calibrate", "--model", f"pytorch-ood:{OOD_KEY}", "--data", data, "--device", "cpu"])
    assert_one_line_refusal(result, "but the model takes (3, 32, 32)")
    assert snapshot(tmp_path) == before


def test_not_cached_without_download_says_how_to_fetch_and_touches_nothing(offline):
    before = snapshot(offline)
    for source in ("timm:resnet18", "torchvision:resnet18", f"pytorch-ood:{OOD_KEY}", "hf:me/nothing"):
        result = runner().invoke(cli, ["calibrate", "--model", source, "--data", "uniform", "--device", "cpu"])
        assert_one_line_refusal(result, "fetch it once with --download")
    assert snapshot(offline) == before


def test_download_with_hf_hub_offline_set_is_refused_not_attempted(offline):
    with pytest.raises(CheckpointError, match="HF_HUB_OFFLINE is set"):
        jemeval.load_model("timm:resnet18", download=True)


def test_a_tampered_hub_blob_is_refused(timm_resnet18):
    """A cache file whose bytes no longer have the SHA-256 its blob is named by is not the published weights."""
    _, path = timm_resnet18
    blob = path.resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not have the SHA-256 its blob is named by") as info:
        jemeval.load_model("timm:resnet18")
    assert "\n" not in str(info.value)


def test_a_replaced_torch_hub_file_is_refused(torchvision_resnet18, pytorch_ood_wrn):
    for source, path in (("torchvision:resnet18", torchvision_resnet18[1]),
                         (f"pytorch-ood:{OOD_KEY}", pytorch_ood_wrn[1])):
        state = torch.load(path, weights_only=True)
        next(iter(state.values())).add_(1)
        torch.save(state, path)
        before = snapshot(path.parent)
        result = runner().invoke(cli, ["calibrate", "--model", source, "--data", "uniform", "--device", "cpu"])
        assert_one_line_refusal(result, "the cache entry was altered or damaged")
        assert snapshot(path.parent) == before


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['PAYLOAD_MARK']}",))


def test_a_pickle_in_the_cache_never_runs(torchvision_resnet18, offline, monkeypatch):
    """torchvision's loader asks torch.load for full pickle; the cached file here passes the hash check
    (its name carries its own hash) and still cannot run code."""
    from torchvision import models

    mark = offline / "ran"
    monkeypatch.setenv("PAYLOAD_MARK", str(mark))
    path, _ = publish_torch_hub(offline, {"fc.weight": _Payload()}, "evil")
    monkeypatch.setattr(models.ResNet18_Weights.IMAGENET1K_V1.value, "url", f"https://x/{path.name}")
    with pytest.raises(CheckpointError, match="could run code when loaded") as info:
        jemeval.load_model("torchvision:resnet18")
    assert "\n" not in str(info.value) and not mark.exists()
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ  # set only while loading


def test_a_fifo_in_the_cache_is_refused_without_blocking(torchvision_resnet18):
    _, path = torchvision_resnet18
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(CheckpointError, match="is not a regular file"):
        jemeval.load_model("torchvision:resnet18")


def test_no_output_over_the_cached_weights(torchvision_resnet18, offline):
    """The cached file is what the command reads, so --out may not name it (nor a link to it)."""
    _, path = torchvision_resnet18
    (offline / "link.json").symlink_to(path)
    before = snapshot(offline)
    for out in (str(path), str(offline / "link.json")):
        result = runner().invoke(cli, ["calibrate", "--model", "torchvision:resnet18", "--data", "uniform",
                                       "--device", "cpu", "--out", out])
        assert_one_line_refusal(result, "is the input checkpoint")
    assert snapshot(offline) == before


def test_source_like_output_paths_still_behave(torchvision_resnet18, offline, monkeypatch):
    """An output named like a source is a file name: refused as the --model input, written elsewhere."""
    monkeypatch.chdir(offline)
    result = runner().invoke(cli, ["calibrate", "--model", "torchvision:resnet18", "--data", "uniform", "--n", "4",
                                   "--device", "cpu", "--out", "torchvision:resnet18"])
    assert_one_line_refusal(result, "is the input checkpoint")
    assert not (offline / "torchvision:resnet18").exists()


def test_unknown_sources_and_names_are_one_line():
    cases = [("tim:resnet18", CheckpointError, "did you mean 'timm'"),
             ("timm:resnet_18", UsageError, "unknown timm architecture"),
             ("timm:resnet18.nope", UsageError, "timm has no pretrained weights 'resnet18.nope'"),
             ("torchvision:resnet18:V9", UsageError, "has no weights 'V9'; its weights: IMAGENET1K_V1"),
             ("torchvision:fasterrcnn", UsageError, "unknown torchvision classifier"),
             ("pytorch-ood:wrn-40-2/cifar11/oe", UsageError, "pytorch-ood has no model"),
             ("hf:me/model:weights.pt", UsageError, "reads only .safetensors files"),
             ("hf:nothing", UsageError, "expected hf:ORG/NAME")]
    for source, kind, text in cases:
        with pytest.raises(kind, match=text.replace("(", r"\(").replace(".", r"\.")) as info:
            jemeval.load_model(source)
        assert "\n" not in str(info.value), source


def test_a_file_named_like_a_source_is_a_file(tmp_path, monkeypatch, digits_classifier_ckpt):
    monkeypatch.chdir(tmp_path)
    Path("timm:resnet18").write_bytes(Path(digits_classifier_ckpt).read_bytes())
    assert jemeval.load_model("timm:resnet18").arch == jemeval.load_model(digits_classifier_ckpt).arch


def test_download_flag_fetches_through_the_library_and_checks_it(offline, monkeypatch):
    """--download lets torchvision's own loader fetch a missing file (the network is a copy here);
    bytes that do not match the name's hash are refused by torch hub, in one line."""
    import torch.hub
    from torchvision import models

    torch.manual_seed(0)
    state = models.resnet18(num_classes=1000).state_dict()
    published, _ = publish_torch_hub(offline / "server", state, "resnet18")
    monkeypatch.setattr(models.ResNet18_Weights.IMAGENET1K_V1.value, "url", f"https://x/{published.name}")
    fetched = []

    def fake_download(url, dst, hash_prefix=None, progress=True):
        fetched.append(url)
        data = b"junk" + bytes(64) if os.environ.get("SERVE") == "junk" else published.read_bytes()
        Path(dst).write_bytes(data)
        if hash_prefix and not hashlib.sha256(data).hexdigest().startswith(hash_prefix):
            Path(dst).unlink()
            raise RuntimeError(f'invalid hash value (expected "{hash_prefix}")')

    monkeypatch.setattr(torch.hub, "download_url_to_file", fake_download)
    data = npz_images(offline / "d.npz", 2, 224)
    args = ["calibrate", "--model", "torchvision:resnet18", "--data", data, "--n", "2", "--device", "cpu"]
    monkeypatch.setenv("SERVE", "junk")
    result = runner().invoke(cli, [*args, "--download"])
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.exit_code != 0 and "Traceback" not in result.output and len(errors) == 1
    assert "invalid hash value" in errors[0] and "Downloading" in result.stderr  # torch hub's note, on stderr
    assert result.stdout == ""
    assert_one_line_refusal(runner().invoke(cli, args), "fetch it once with --download")
    assert len(fetched) == 1  # never without --download
    monkeypatch.setenv("SERVE", "ok")
    result = runner().invoke(cli, [*args, "--download", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["provenance"]["checkpoint"]["sha256"] == _sha256(published)
    assert (offline / "torch" / "hub" / "checkpoints" / published.name).is_file()


def test_convert_writes_a_source_as_a_checkpoint_that_loads_back(pytorch_ood_wrn, tmp_path):
    """What `jemeval report` needs today (it takes files): the converted file names its source."""
    out = tmp_path / "oe.pt"
    result = runner().invoke(cli, ["convert", f"pytorch-ood:{OOD_KEY}", str(out), "--dataset", "cifar10", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)["records"][0]
    assert record["source_sha256"] == pytorch_ood_wrn[2].sha256 and record["model_source"] == f"pytorch-ood:{OOD_KEY}"
    again, first = jemeval.load_model(out), jemeval.load_model(f"pytorch-ood:{OOD_KEY}")
    x = torch.rand(3, 3, 32, 32) * 2 - 1
    torch.testing.assert_close(again(x), first(x))
    assert again.metadata["dataset"] == "cifar10"
    assert again.metadata["config"]["model_source"] == f"pytorch-ood:{OOD_KEY}"


def test_cached_sources_never_touch_the_network(timm_resnet18, torchvision_resnet18, monkeypatch):
    """Without --download nothing connects anywhere, even with HF_HUB_OFFLINE unset."""
    import socket

    monkeypatch.delenv("HF_HUB_OFFLINE")

    def no_network(*args, **kwargs):
        raise AssertionError("a network connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    for source in ("timm:resnet18", "torchvision:resnet18"):
        assert jemeval.load_model(source).metadata["checkpoint"]["source"] == source


def test_download_fetches_a_hub_file_into_the_cache_and_checks_it(offline, monkeypatch, digits_classifier_ckpt):
    """download=True goes through huggingface_hub.hf_hub_download (here a copy into the cache); a file
    the 'Hub' serves that does not match its blob name is refused."""
    import huggingface_hub

    from jemeval.formats.export import export

    monkeypatch.delenv("HF_HUB_OFFLINE")
    export(digits_classifier_ckpt, offline / "e.safetensors")
    calls = []

    def fake_hf_hub_download(repo, filename, revision=None, cache_dir=None, **kwargs):
        calls.append((repo, filename, revision, cache_dir))
        snap = hub_cache(Path(cache_dir), repo, {filename: (offline / "e.safetensors").read_bytes()})
        if repo == "me/bad":
            (snap / filename).resolve().write_bytes(b"changed in transit")
        return str(snap / filename)

    asked = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hf_hub_download)
    # jemeval asks the Hub once, without retries, before the download (fails fast offline): it answers
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda url, **kwargs: asked.append(url))
    with pytest.raises(CheckpointError, match="fetch it once with download=True"):
        jemeval.load_model("hf:me/good")
    assert calls == []
    model = jemeval.load_model("hf:me/good", download=True)
    assert calls == [("me/good", "model.safetensors", None, str(offline / "hf"))]
    assert len(asked) == 1 and asked[0].endswith("/me/good/resolve/main/model.safetensors")
    assert model.metadata["checkpoint"]["sha256"] == _sha256(offline / "e.safetensors")
    with pytest.raises(CheckpointError, match="does not have the SHA-256 its blob is named by"):
        jemeval.load_model("hf:me/bad", download=True)


def test_report_compares_a_pretrained_source_with_a_checkpoint(pytorch_ood_wrn, tmp_path):
    """`jemeval report` takes sources too: the entry is keyed on the weights file's SHA-256."""
    from jemeval.formats.convert import convert

    data = npz_images(tmp_path / "d.npz", 16, 32)
    convert(f"pytorch-ood:{OOD_KEY}", tmp_path / "wrn.pt", dataset="cifar10")
    args = ["report", "--model", f"pytorch-ood:{OOD_KEY}", "--model", str(tmp_path / "wrn.pt"), "--name", "source",
            "--name", "converted", "--data", data, "--sections", "accuracy,calibration", "--n", "8",
            "--out", str(tmp_path / "r"), "--device", "cpu"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    records = json.loads((tmp_path / "r" / "report.json").read_text())["records"]
    by_model = {m: [r for r in records if r["model"] == m and r["section"] == "accuracy"]
                for m in ("source", "converted")}
    assert by_model["source"] and [r["accuracy"] for r in by_model["source"]] == [
        r["accuracy"] for r in by_model["converted"]]
    models = json.loads((tmp_path / "r" / "report.json").read_text())["provenance"]["settings"]["models"]
    assert models[0]["sha256"] == _sha256(pytorch_ood_wrn[1].resolve())
