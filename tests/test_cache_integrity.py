"""Issue 23, the detector and reference-feature caches, written as the attacks: a detector state with the
right key but flipped values or wrong shapes, a fit image folder changed in place, a fit set of the
wrong shape, a read-only cache folder, `fidelity --features M --ref-cache FILE` (honoured), and
reference features changed in the file.

The models are untrained networks saved here; every number under attack is compared with the same
computation without any cache.
"""
from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image
from test_bad_inputs import assert_one_line_refusal, runner

import jemeval
import jemeval.caches.detectors as detector_cache
from jemeval.cli import cli
from jemeval.evaluation.fidelity import evaluate as fidelity_module
from jemeval.evaluation.fidelity.evaluate import fidelity
from jemeval.evaluation.ood.evaluate import evaluate_ood
from jemeval.formats.native import save_checkpoint


def knn(**kw):
    return evaluate_ood("m.pt", "uniform", scores=["knn"], n=60, device="cpu", progress=False, **kw)


def auroc(result) -> float:
    (record,) = result.records
    return record["auroc"]


def fit_info(result) -> dict:
    """The knn entry of the provenance, less its state size (a positive byte count, checked here)."""
    info = dict(result.provenance["settings"]["detectors"]["knn"])
    assert info.pop("state_bytes") > 0
    return info


def state_file(home):
    (path,) = (home / "jc" / "detectors").glob("knn-*.pt")
    return path


# -- item 10: a detector state changed after jemeval wrote it is refitted, never used ---------------------
def test_flipped_detector_values_are_refitted_with_a_note(home, monkeypatch):
    truth = auroc(knn(cache=False))
    assert fit_info(knn())["fit"] == "fitted"
    path = state_file(home)
    saved = torch.load(path, weights_only=True)
    saved["state"]["features"] = -saved["state"]["features"]  # the right key, the values flipped
    torch.save(saved, path)

    with pytest.warns(UserWarning, match="did not match its checksum; refitted"):
        result = knn()
    assert auroc(result) == truth
    assert fit_info(result)["fit"] == "fitted" and "did not match its checksum" in fit_info(result)["note"]
    assert fit_info(knn())["fit"] == "cached"  # replaced by the refit state

    torch.save(saved, path)  # the attack is real: trusted as written, the flipped state gives another number
    monkeypatch.setattr(detector_cache, "state_sha256", lambda state: saved["state_sha256"])
    assert fit_info(knn())["fit"] == "cached" and abs(auroc(knn()) - truth) > 0.05


# -- item 11: the right key and checksum but the wrong shapes: refitted, not a sklearn error -------------------
def test_a_wrong_shape_detector_state_is_refitted(home):
    truth = auroc(knn(cache=False))
    knn()
    path = state_file(home)
    saved = torch.load(path, weights_only=True)
    saved["state"]["features"] = saved["state"]["features"][:, :5].contiguous()
    saved["state_sha256"] = detector_cache.state_sha256(saved["state"])
    torch.save(saved, path)
    with pytest.warns(UserWarning, match="does not fit the model"):
        result = knn()
    assert auroc(result) == truth and "refitted" in fit_info(result)["note"]


def test_a_fit_set_of_the_wrong_shape_is_one_line_naming_fit_on(home):
    rng = np.random.default_rng(0)
    np.savez(home / "rgb.npz", x=rng.integers(0, 256, (20, 3, 8, 8), dtype=np.uint8), y=np.arange(20) % 10)
    result = runner().invoke(cli, ["ood", "--model", "m.pt", "--ood", "uniform", "--score", "knn", "--fit-on",
                                   "npz:rgb.npz", "--n", "20", "--device", "cpu"])
    assert_one_line_refusal(result, "--fit-on: dataset 'npz:rgb.npz' has images of shape (3, 8, 8) but the model "
                                    "takes (1, 8, 8)")
    assert not (home / "jc").exists()


# -- item 6: the detector key covers the contents of the fit files ---------------------------------------------
def test_a_fit_image_changed_in_place_is_refitted(home):
    torch.manual_seed(0)
    save_checkpoint(home / "rgb.pt", jemeval.create_model("cnn", 2, (3, 8, 8), width=4), dataset="folder:F")
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (home / "F" / label).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(home / "F" / label / f"{i}.png")

    def run(**kw):
        return evaluate_ood("rgb.pt", "uniform", id="folder:F", scores=["knn:k=3"], device="cpu", progress=False, **kw)

    assert run().provenance["settings"]["detectors"]["knn:k=3"]["fit"] == "fitted"
    image, folder_stat = home / "F" / "a" / "0.png", os.stat(home / "F")
    Image.fromarray(np.full((8, 8, 3), 255, np.uint8)).save(image)  # same name, other pixels
    os.utime(home / "F", ns=(folder_stat.st_atime_ns, folder_stat.st_mtime_ns))
    again = run()
    assert again.provenance["settings"]["detectors"]["knn:k=3"]["fit"] == "fitted"
    assert [r["auroc"] for r in again.records] == [r["auroc"] for r in run(cache=False).records]


# -- item 12: a read-only detector cache only warns ----------------------------------------------------------------
def test_a_read_only_detector_cache_only_warns(home, monkeypatch):
    truth = auroc(knn(cache=False))
    real_open, real_mkdir = os.open, os.mkdir
    ro = str(home / "jc")

    def ro_open(path, flags, *args, **kwargs):
        if os.path.abspath(os.fspath(path)).startswith(ro) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    def ro_mkdir(path, *args, **kwargs):
        if os.path.abspath(os.fspath(path)).startswith(ro):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", ro_open)
    monkeypatch.setattr(os, "mkdir", ro_mkdir)
    with pytest.warns(UserWarning, match="could not cache the fitted state"):
        result = knn()
    assert auroc(result) == truth and fit_info(result) == {"options": {}, "fit": "fitted", "cache": None}
    assert not (home / "jc").exists()


# -- item 9: fidelity --features M --ref-cache FILE keeps M's reference features ------------------------------------
def fd(*extra):
    result = runner().invoke(cli, ["fidelity", "--samples", "s.npz", "--ref", "digits", "--features", "m.pt",
                                   "--device", "cpu", "--json", *extra])
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def test_fidelity_features_with_ref_cache_is_honoured(samples, home, monkeypatch):
    plain = fd()
    first = fd("--ref-cache", "rc.npz")
    ref_cache = first["provenance"]["settings"]["ref_cache"]
    assert (home / "rc.npz").is_file() and ref_cache["written"] and ref_cache["used"] == []
    seen = []
    real = fidelity_module.extract_features
    monkeypatch.setattr(fidelity_module, "extract_features", lambda m, x, *a: (seen.append(len(x)), real(m, x, *a))[1])
    again = fidelity("s.npz", "digits", features="m.pt", metrics="fd", ref_cache="rc.npz", device="cpu")
    assert seen == [3]  # the samples only: the 1347 reference images' features came from the file
    assert again.provenance["settings"]["ref_cache"]["used"] == [ref_cache_name(home)]
    assert [r["value"] for r in again.records] == [r["value"] for r in first["records"]] == [
        r["value"] for r in plain["records"]]


def ref_cache_name(home) -> str:
    with np.load(home / "rc.npz", allow_pickle=False) as f:
        (name,) = json.loads(str(f["meta"]))["extractors"]
    return name


# -- item 10: reference features changed in the file are recomputed with a note -----------------------------------
def test_changed_reference_features_are_recomputed(samples, home):
    first = fd("--ref-cache", "rc.npz")
    with np.load(home / "rc.npz", allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    key = next(k for k in arrays if k != "meta")
    arrays[key] = arrays[key] * 3.0
    with open(home / "rc.npz", "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.warns(UserWarning, match="did not match their checksum; recomputed"):
        again = fidelity("s.npz", "digits", features="m.pt", metrics="fd", ref_cache="rc.npz", device="cpu")
    assert [r["value"] for r in again.records] == [r["value"] for r in first["records"]]
    assert any("did not match their checksum" in n for n in again.notes)
    third = fd("--ref-cache", "rc.npz")  # the file was rewritten whole: used as it is from then on
    assert third["provenance"]["settings"]["ref_cache"]["used"] == [ref_cache_name(home)]
