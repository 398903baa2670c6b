"""Issue 23, the report folder and its cache, written as the attacks: a user's own folder given as
--out, symlinks inside it, a data file swapped at the same path, cache entries edited after jemeval
wrote them (values, types, artifact files), a read-only location.

The models are untrained digits-shaped networks saved here (no training): every number compared is
computed twice, by the rerun under attack and by a fresh folder or an untouched run.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

import jemeval
from jemeval.cli import cli
from jemeval.formats.native import save_checkpoint
from jemeval.reports.cache import MANIFEST, checksum


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A working folder with an untrained model m.pt (digits-shaped) and d.npz, 60 images labelled with
    the model's own predictions (accuracy 1.0), and d_shifted.npz, the same images with every label
    moved by one class (accuracy 0.0)."""
    torch.manual_seed(0)
    model = jemeval.create_model("cnn", 10, (1, 8, 8), width=4)
    save_checkpoint(tmp_path / "m.pt", model, dataset="digits")
    x = np.random.default_rng(0).integers(0, 256, (60, 1, 8, 8), dtype=np.uint8)
    with torch.no_grad():
        predicted = model.logits(torch.from_numpy(x).float() / 127.5 - 1).argmax(1).numpy()
    np.savez(tmp_path / "d.npz", x=x, y=predicted)
    np.savez(tmp_path / "d_shifted.npz", x=x, y=(predicted + 1) % 10)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JEMEVAL_DEBUG", raising=False)
    return tmp_path


def report(out, *args, sections="accuracy"):
    return runner().invoke(cli, ["report", "--model", "m.pt", "--out", str(out), "--sections", sections,
                                 "--data", "npz:d.npz", "--refine-steps", "0", "--device", "cpu", "--json",
                                 *map(str, args)])


def ok(result) -> dict:
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def accuracy(rep: dict) -> list[float]:
    return [r["accuracy"] for r in rep["records"] if r["section"] == "accuracy"]


def api(out, sections="accuracy"):
    """The same report as :func:`report`, from Python (the same settings: the same cache entries)."""
    return jemeval.report(["m.pt"], out=out, sections=sections, data="npz:d.npz", refine_steps=[0], device="cpu",
                          progress=False)


def statuses(out: Path) -> list[str]:
    return [s["status"] for s in api(out).status]


# -- item 2: a folder jemeval did not write is refused, nothing in it changed ----------------------------
def test_a_users_own_report_md_and_figures_are_refused_and_untouched(home):
    (home / "paper" / "figures").mkdir(parents=True)
    (home / "paper" / "report.md").write_text("# My paper\n\nmy own words\n")
    (home / "paper" / "figures" / "fig1.png").write_bytes(b"\x89PNG\r\n\x1a\nmine")
    before = snapshot(home)
    assert_one_line_refusal(report("paper"), "holds other files (report.md, figures/fig1.png) and no report")
    assert snapshot(home) == before


def test_a_user_file_in_a_report_folder_is_never_replaced_nor_deleted(home):
    ok(report("r", sections="accuracy,ood"))
    assert (home / "r" / "figures" / "ood-roc.png").is_file()
    (home / "r" / "figures" / "mine.png").write_bytes(b"my figure")
    before = snapshot(home)
    assert_one_line_refusal(report("r"), "figures/mine.png; .jemeval-report.json does not list them")
    assert snapshot(home) == before
    (home / "r" / "figures" / "mine.png").unlink()
    ok(report("r"))  # accuracy only: the ood figures jemeval drew (listed in the manifest) are removed
    assert sorted(p.name for p in (home / "r" / "figures").iterdir()) == []
    listed = json.loads((home / "r" / MANIFEST).read_text())["files"]
    assert "figures/ood-roc.png" not in listed and "report.md" in listed


def test_a_report_folder_of_the_previous_version_is_adopted_and_a_mixed_one_refused(home):
    ok(report("r", sections="accuracy,ood"))
    (home / "r" / MANIFEST).unlink()  # as 0.1/0.2 wrote it: no manifest, entries of format 1
    for entry in (home / "r" / "cache").glob("*.json"):
        data = json.loads(entry.read_text())
        data["format"] = "jemeval-report-cache/1"
        del data["checksum"]
        entry.write_text(json.dumps(data))
    shutil.copytree(home / "r", home / "mixed")
    (home / "mixed" / "notes.txt").write_text("mine")
    before = snapshot(home / "mixed")
    assert_one_line_refusal(report("mixed"), "holds other files (notes.txt) and no report")
    assert snapshot(home / "mixed") == before

    rep = ok(report("r", sections="accuracy,ood"))
    assert accuracy(rep) == [1.0]
    listed = set(json.loads((home / "r" / MANIFEST).read_text())["files"])
    assert {"report.md", "report.html", "report.json", "figures/ood-roc.png"} <= listed
    assert {f"cache/{p.name}" for p in (home / "r" / "cache").iterdir()} <= listed


# -- item 3: links inside the folder are refused; nothing outside is touched ----------------------------
@pytest.mark.parametrize("name", ["figures", "cache", "report.md"])
def test_a_symlink_inside_a_new_folder_is_refused(home, name):
    outside = home / "outside"
    outside.mkdir()
    (outside / "ood-roc.png").write_bytes(b"\x89PNG\r\n\x1a\nsomeone else's")
    (outside / "notes.md").write_text("someone else's")
    (home / "paper").mkdir()
    (home / "paper" / name).symlink_to(outside / "notes.md" if name == "report.md" else outside)
    before = snapshot(home)
    assert_one_line_refusal(report("paper"), f"{name} is a symbolic link; jemeval does not write through links")
    assert snapshot(home) == before


@pytest.mark.parametrize("planted", ["figures", "cache/accuracy", "report.json"])
def test_a_symlink_planted_in_a_report_folder_is_refused(home, planted):
    ok(report("r", sections="accuracy,ood"))
    outside = home / "outside"
    outside.mkdir()
    (outside / "ood-roc.png").write_bytes(b"\x89PNG\r\n\x1a\nsomeone else's")
    (outside / "users.json").write_text('{"mine": true}')
    if planted == "figures":
        shutil.rmtree(home / "r" / "figures")
        (home / "r" / "figures").symlink_to(outside)
        rel = "figures"
    else:
        target = home / "r" / (next((home / "r" / "cache").glob("accuracy-*.json")) if planted == "cache/accuracy"
                               else "report.json")
        target.unlink()
        target.symlink_to(outside / "users.json")
        rel = str(target.relative_to(home / "r"))
    before = snapshot(home)
    assert_one_line_refusal(report("r"), f"{rel} is a symbolic link")
    assert snapshot(home) == before


# -- item 6: a data file replaced at the same path is not served from the cache ---------------------------
def test_a_swapped_npz_gives_the_numbers_of_a_fresh_folder(home):
    assert accuracy(ok(report("r"))) == [1.0]
    os.replace(home / "d_shifted.npz", home / "d.npz")  # the same path, labels shifted by one class
    rerun = ok(report("r"))
    fresh = ok(report("fresh"))
    assert accuracy(rerun) == accuracy(fresh) == [0.0]
    assert statuses("r") == ["cached"]  # and the recomputed entry is reused from then on


# -- item 10: a cache entry changed after jemeval wrote it is recomputed with a note ------------------------
def entry_file(out: Path, section: str) -> Path:
    return next((out / "cache").glob(f"{section}-*.json"))


def test_a_planted_report_value_is_recomputed_with_a_note(home):
    truth = accuracy(ok(report("r")))
    path = entry_file(home / "r", "accuracy")
    data = json.loads(path.read_text())
    data["runs"][0]["records"][0]["accuracy"] = 0.25
    path.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="did not match its checksum; recomputed"):
        result = api("r")
    assert [s["status"] for s in result.status] == ["computed"]
    assert [r["accuracy"] for r in result.records] == truth == [1.0]
    assert any("did not match its checksum; recomputed" in n for n in result.notes)
    assert json.loads(path.read_text())["runs"][0]["records"][0]["accuracy"] == 1.0  # replaced (jemeval's file)


def test_a_changed_artifact_file_is_recomputed(home):
    first = ok(report("r", sections="ood"))
    scores = next((home / "r" / "cache").glob("ood-*-scores.npz"))
    with np.load(scores, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    arrays = {k: (-v if v.dtype.kind == "f" else v) for k, v in arrays.items()}  # every score flipped
    with open(scores, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.warns(UserWarning, match="scores.npz changed"):
        result = api("r", "ood")
    assert [s["status"] for s in result.status] == ["computed"]
    assert [r["auroc"] for r in result.records] == [r["auroc"] for r in first["records"]]


# -- item 11: an entry with values of the wrong types (checksum made to match) is recomputed -----------------
def test_a_wrong_typed_report_entry_is_recomputed(home):
    truth = accuracy(ok(report("r")))
    path = entry_file(home / "r", "accuracy")
    data = json.loads(path.read_text())
    data["seconds"] = "fast"
    data["runs"][0]["records"][0]["accuracy"] = "high"
    data["checksum"] = checksum(data)
    path.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="has values of the wrong types; recomputed"):
        rerun = report("r")
    assert accuracy(ok(rerun)) == truth
    assert "Traceback" not in rerun.stderr


# -- item 12: a read-only location is one line ----------------------------------------------------------------
@pytest.fixture
def read_only(monkeypatch):
    """Make every folder under the returned callable's argument behave as on a read-only mount."""
    roots: list[str] = []
    real_open, real_mkdir = os.open, os.mkdir

    def under(path) -> bool:
        return any(os.path.abspath(os.fspath(path)).startswith(r) for r in roots)

    def ro_open(path, flags, *args, **kwargs):
        if under(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    def ro_mkdir(path, *args, **kwargs):
        if under(path):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", ro_open)
    monkeypatch.setattr(os, "mkdir", ro_mkdir)
    return lambda root: roots.append(os.path.abspath(root) + os.sep)


def test_a_read_only_location_is_one_line(home, read_only):
    ok(report("r"))
    (home / "mnt").mkdir()
    before = snapshot(home)
    read_only(home / "mnt")
    read_only(home / "r")
    assert_one_line_refusal(report("mnt/paper"), "cannot write 'mnt/paper': Read-only file system; choose a writable")
    assert_one_line_refusal(report("r"), "Read-only file system; choose a writable location")
    assert snapshot(home) == before
