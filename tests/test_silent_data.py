"""Issue 34 ("Nothing silent, round 3"), the data items: each case as the audit of 1055cef ran it.

4 a FIFO in a class folder; 6 test or OOD images that are training images; 7 a symlink loop in a
class folder; 9 train splits of two shapes; 13 the checkpoint's own training images; 17 a labelled
folder of mixed sizes; 18 ``folder:D,size=`` values; 19 a truncated PNG read by DataLoader
workers; 20 an absurd label; 22 an npz header whose shape overflows int64; 27 ``train --workers``.

References are computed here without jemeval's loaders: duplicates by hashlib over the files'
bytes and the arrays' rows, image counts from the files written.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import threading
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from test_bad_inputs import assert_one_line_refusal, runner, snapshot
from test_custom_data import CLASSES, _checkpoint, _images, _write_pngs, split_folder

import jemeval
from jemeval.cli import cli
from jemeval.errors import UsageError
from jemeval.formats.native import read_checkpoint


def _run(*args):
    return runner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _json(result) -> dict:
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _warnings(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("warning:")]


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A working folder holding m.pt, an untrained 3-class model for 3 x 8 x 8 images, recorded as
    trained on digits (so no folder here is its training set)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JEMEVAL_DEBUG", raising=False)
    _checkpoint(tmp_path / "m.pt", "digits")
    return tmp_path


# -- item 4: a FIFO named x.png in a class folder ---------------------------------------------------
class Unblocker:
    """Opens a FIFO for writing (and closes it at once) whenever a reader waits on it, so that a
    reader that should never have opened it gets EOF instead of blocking the test for ever."""

    def __init__(self, fifo: Path):
        self.fifo, self.stop, self.opened = fifo, threading.Event(), 0
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(0.05):
            try:
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO while nobody reads
            except OSError:
                continue
            self.opened += 1
            os.close(fd)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def test_a_fifo_in_a_class_folder_is_skipped_and_said(work):
    split_folder(work / "d", {"train": 2, "test": 2})
    os.mkfifo(work / "d" / "test" / "ant" / "x.png")
    with Unblocker(work / "d" / "test" / "ant" / "x.png") as fifo:
        out = _json(_run("eval", "--model", "m.pt", "--data", "folder:d", "--device", "cpu", "--json"))
    assert fifo.opened == 0  # never read
    assert out["records"][0]["n"] == 2 * len(CLASSES)
    assert any("1 not a regular file (a FIFO, socket or device)" in n and "x.png" in n for n in out["notes"])


# -- item 7: a symlink loop in a class folder --------------------------------------------------------
def test_links_in_a_class_folder_are_followed_only_to_its_own_files_and_once(work):
    split_folder(work / "d", {"train": 2, "test": 3})
    ant = work / "d" / "test" / "ant"
    (ant / "loop").symlink_to("..")  # test/ant/loop -> test: every class again, labelled ant
    (ant / "again.png").symlink_to("000.png")  # the same file: read once
    (ant / "out.png").symlink_to(work / "d" / "train" / "bee" / "000.png")  # out of the class folder
    (ant / "sub").mkdir()
    _write_pngs(ant / "sub", _images(1, np.random.default_rng(9)))  # a real sub-folder is read
    out = _json(_run("eval", "--model", "m.pt", "--data", "folder:d", "--device", "cpu", "--json"))
    assert out["records"][0]["n"] == 3 * len(CLASSES) + 1  # 738 on 1055cef
    ds = jemeval.load_dataset("folder:d", "test")
    assert [int(y) for y in ds.targets].count(0) == 4 and all(".." not in str(f) for f in ds.files)
    note = next(n for n in out["notes"] if "not read as images" in n)
    for words in ("1 a link to a folder (not entered)", "1 a link to a file read already", "1 a link out of"):
        assert words in note


# -- item 17: a labelled folder of mixed sizes -------------------------------------------------------
def test_a_labelled_folder_of_mixed_sizes_is_one_line_naming_the_odd_file(work):
    split_folder(work / "d", {"train": 2, "test": 2})
    _write_pngs(work / "d" / "test" / "bee", _images(1, np.random.default_rng(1), size=12))  # bee/000.png
    before = snapshot(work)
    assert_one_line_refusal(_run("eval", "--model", "m.pt", "--data", "folder:d", "--device", "cpu"),
                            "test/bee/000.png' gives an image of shape (3, 12, 12), the folder's first (3, 8, 8)")
    assert snapshot(work) == before


# -- item 18: folder:D,size= ------------------------------------------------------------------------
@pytest.mark.parametrize("size, shown", [("-3", "-3"), ("abc", "'abc'"), ("0", "0"), ("2.5", "2.5")])
def test_a_bad_folder_size_is_one_line_naming_the_allowed_values(work, size, shown):
    split_folder(work / "d", {"train": 1, "test": 1})
    assert_one_line_refusal(_run("eval", "--model", "m.pt", "--data", f"folder:d,size={size}", "--device", "cpu"),
                            "size must be a whole number of pixels >= 1 (size=32 resizes and centre-crops every "
                            f"image to 32 x 32), got size={shown}")


# -- item 19: a truncated PNG read by DataLoader workers ------------------------------------------------
def test_a_truncated_png_is_one_line_with_or_without_workers(work):
    split_folder(work / "d", {"train": 1, "test": 3})
    png = work / "d" / "test" / "bee" / "001.png"
    png.write_bytes(png.read_bytes()[:len(png.read_bytes()) // 2])
    for workers in ("2", "0"):
        assert_one_line_refusal(_run("eval", "--model", "m.pt", "--data", "folder:d", "--device", "cpu",
                                     "--workers", workers),
                                "test/bee/001.png' in the image folder is not a readable image (")


# -- item 20: a label of 2**40 --------------------------------------------------------------------------
def test_an_absurd_label_is_refused_before_a_model_is_made_for_it(work):
    y = np.arange(20) % 3
    y[3] = 2**40
    np.savez(work / "d.npz", x=np.zeros((20, 3, 8, 8), np.uint8), y=y)
    before = snapshot(work)
    assert_one_line_refusal(_run("train", "npz:d.npz", "--out", "run", "--device", "cpu", "--epochs", "1"),
                            "label 1099511627776 (in 'y', index 3) would make 1099511627777 classes; labels are class "
                            "indices 0..K-1 with K at most 1048576")
    assert snapshot(work) == before
    with pytest.raises(UsageError, match="would make 1099511627777 classes"):
        jemeval.load_dataset("npz:d.npz")


# -- item 22: an npz header whose shape overflows int64 ------------------------------------------------
def _forged_npz(path: Path, shape: tuple[int, ...], compression: int) -> None:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": shape})
    labels = io.BytesIO()
    np.lib.format.write_array(labels, np.zeros(4, np.int64))
    with zipfile.ZipFile(path, "w", compression) as z:
        z.writestr("x.npy", header.getvalue() + bytes(64))
        z.writestr("y.npy", labels.getvalue())


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "compressed"])
@pytest.mark.parametrize("shape", [(2**63, 1, 8, 8), (2**64, 1, 8, 8), (3037000500, 3037000500, 1, 1)],
                         ids=["2^63", "2^64", "product"])
def test_an_overflowing_npz_header_is_one_line_and_no_warning(work, shape, compression):
    _forged_npz(work / "d.npz", shape, compression)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _run("eval", "--model", "m.pt", "--data", "npz:d.npz", "--device", "cpu")
    assert_one_line_refusal(result, "array 'x' is truncated or damaged (its .npy header promises shape")
    assert [str(w.message) for w in caught] == []


# -- item 9: train splits of two shapes -----------------------------------------------------------------
def test_train_refuses_a_test_split_of_another_shape_at_the_start(work):
    rng = np.random.default_rng(0)
    np.savez(work / "d.npz", x_train=rng.integers(0, 256, (100, 8, 8), dtype=np.uint8), y_train=np.arange(100) % 10,
             x_test=rng.integers(0, 256, (50, 16, 16), dtype=np.uint8), y_test=np.arange(50) % 10)
    before = snapshot(work)
    assert_one_line_refusal(_run("train", "npz:d.npz", "--out", "run", "--device", "cpu", "--epochs", "1"),
                            "its test split holds images of shape (1, 16, 16) but its train split (1, 8, 8)")
    assert snapshot(work) == before


# -- item 13: the checkpoint's own training images ------------------------------------------------------
@pytest.mark.parametrize("command", ["calibrate", "eval"])
def test_numbers_on_the_checkpoints_own_training_images_say_so(home, command):
    out = _json(_run(command, "--model", "m.pt", "--split", "train", "--device", "cpu", "--json"))
    assert any("the evaluated images are images the model was trained on: digits is the set its checkpoint "
               "records as its training set" in n for n in out["notes"])
    test = _json(_run(command, "--model", "m.pt", "--device", "cpu", "--json"))  # the test split: no such note
    assert not any("trained on" in n for n in test.get("notes", []))


# -- item 6: test or OOD images that are training images ------------------------------------------------
def _file_duplicates(folder: Path) -> set[str]:
    """The files of folder/test byte-identical to a file of folder/train (hashlib, not jemeval)."""
    train = {hashlib.sha256(p.read_bytes()).digest() for p in (folder / "train").rglob("*.png")}
    return {str(p) for p in (folder / "test").rglob("*.png") if hashlib.sha256(p.read_bytes()).digest() in train}


def test_a_folder_whose_test_split_is_its_train_split_is_refused(work):
    split_folder(work / "d", {"train": 3, "test": 1})
    for c in CLASSES:
        for p in (work / "d" / "train" / c).iterdir():
            (work / "d" / "test" / c / p.name).write_bytes(p.read_bytes())
    assert len(_file_duplicates(work / "d")) == 3 * len(CLASSES)
    before = snapshot(work)
    for args in (("eval", "--model", "m.pt", "--data", "folder:d"), ("train", "folder:d", "--out", "run")):
        assert_one_line_refusal(_run(*args, "--device", "cpu"), "all 9 test images of folder:")
    assert snapshot(work) == before


def test_some_test_images_that_are_training_images_are_warned_with_counts(work):
    split_folder(work / "d", {"train": 3, "test": 2})
    src = work / "d" / "train" / "cat" / "002.png"
    (work / "d" / "test" / "ant" / "009.png").write_bytes(src.read_bytes())  # a copy, under another class
    assert _file_duplicates(work / "d") == {str(work / "d" / "test" / "ant" / "009.png")}
    result = _run("eval", "--model", "m.pt", "--data", "folder:d", "--device", "cpu", "--json")
    out = _json(result)
    expected = "1 of the 7 test images of folder:d is also in folder:d's train split, byte for byte"
    assert len(_warnings(result)) == 1 and expected in _warnings(result)[0] and "test/ant/009.png" in result.stderr
    assert any(expected in n for n in out["notes"])
    seen = out["provenance"]["settings"]["seen_images"]
    assert (seen["identical"], seen["of"]) == (1, 7) and seen["first"][0].endswith("test/ant/009.png'")


def _npz_with_repeats(path: Path, repeats: dict[int, int]) -> None:
    """x_train 100 images, x_test 30, x_test[i] = x_train[j] for i, j in ``repeats``."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (100, 8, 8, 3), dtype=np.uint8)
    xt = rng.integers(0, 256, (30, 8, 8, 3), dtype=np.uint8)
    for i, j in repeats.items():
        xt[i] = x[j]
    np.savez(path, x_train=x, y_train=np.arange(100) % 3, x_test=xt, y_test=np.arange(30) % 3)


def _row_duplicates(path: Path) -> list[int]:
    """Rows of x_test that are rows of x_train, by hashlib over each row's bytes."""
    with np.load(path) as f:
        train = {hashlib.sha256(row.tobytes()).digest() for row in f["x_train"]}
        return [i for i, row in enumerate(f["x_test"]) if hashlib.sha256(row.tobytes()).digest() in train]


def test_npz_test_rows_that_are_training_rows_are_counted_exactly_and_hashed_into_the_provenance(work):
    _npz_with_repeats(work / "d.npz", {2: 10, 5: 20, 7: 30})
    assert _row_duplicates(work / "d.npz") == [2, 5, 7]
    result = _run("calibrate", "--model", "m.pt", "--data", "npz:d.npz", "--device", "cpu", "--json")
    out = _json(result)
    assert len(_warnings(result)) == 1 and "3 of the 30 test images of npz:d.npz are also in" in _warnings(result)[0]
    assert "x_test[2] = x_train[10], x_test[5] = x_train[20], x_test[7] = x_train[30]" in _warnings(result)[0]
    seen = out["provenance"]["settings"]["seen_images"]
    assert (seen["identical"], seen["of"], seen["first"]) == (3, 30, ["x_test[2]", "x_test[5]", "x_test[7]"])
    first = out["provenance"]["data_sha256"]["npz:d.npz"]
    _npz_with_repeats(work / "d.npz", {2: 10, 5: 20})  # another file: another hash, one image less seen
    again = _json(_run("calibrate", "--model", "m.pt", "--data", "npz:d.npz", "--device", "cpu", "--json"))
    assert again["provenance"]["data_sha256"]["npz:d.npz"] != first
    assert again["provenance"]["settings"]["seen_images"]["identical"] == 2


def test_ood_sets_made_of_training_images_are_refused_or_warned(work):
    _npz_with_repeats(work / "id.npz", {})
    with np.load(work / "id.npz") as f:
        x = f["x_train"]
    np.savez(work / "all.npz", x=x[:20])
    np.savez(work / "some.npz", x=np.concatenate([x[:4], np.random.default_rng(7).integers(0, 256, (16, 8, 8, 3),
                                                                                           dtype=np.uint8)]))
    refusal = _run("ood", "--model", "m.pt", "--id", "npz:id.npz", "--ood", "npz:all.npz", "--device", "cpu")
    assert_one_line_refusal(refusal, "all 20 images of OOD set 'npz:all.npz' are also in npz:id.npz's train split")
    result = _run("ood", "--model", "m.pt", "--id", "npz:id.npz", "--ood", "npz:some.npz", "--device", "cpu",
                  "--score", "maxprob", "--json")
    out = _json(result)
    assert len(_warnings(result)) == 1 and "4 of the 20 images of OOD set 'npz:some.npz' are also in" in result.stderr
    assert out["provenance"]["settings"]["sets"]["npz:some.npz"]["seen_images"]["identical"] == 4


def test_an_id_npz_without_a_train_split_has_no_training_images_to_compare_an_ood_set_with(work):
    rng = np.random.default_rng(8)
    np.savez(work / "id.npz", x_test=rng.integers(0, 256, (12, 8, 8, 3), dtype=np.uint8), y_test=np.arange(12) % 3)
    np.savez(work / "ood.npz", x=rng.integers(0, 256, (12, 8, 8, 3), dtype=np.uint8))
    out = _json(_run("ood", "--model", "m.pt", "--id", "npz:id.npz", "--ood", "npz:ood.npz", "--device", "cpu",
                     "--score", "maxprob", "--json"))  # was: "'id.npz' has no train split"
    assert "seen_images" not in out["provenance"]["settings"]["sets"]["npz:ood.npz"]
    assert len(out["records"]) == 1

def test_row_digests_are_made_once_per_process(work, monkeypatch):
    from jemeval import image_digests
    from jemeval.errors import JemevalWarning

    _npz_with_repeats(work / "d.npz", {1: 1})
    calls = []
    real = image_digests.row_digests
    monkeypatch.setattr(image_digests, "row_digests", lambda x: calls.append(len(x)) or real(x))
    model = jemeval.load_model("m.pt")
    for _ in range(2):  # from Python, the caveat is a JemevalWarning
        with pytest.warns(JemevalWarning, match=r"1 of the 30 test images of npz:d.npz is also in"):
            jemeval.evaluate(model, "npz:d.npz", device="cpu")
    assert sorted(calls) == [30, 100]  # x_test and x_train, once each


# -- item 27: train --workers ---------------------------------------------------------------------------
def test_train_workers_decode_in_dataloader_processes_with_the_same_run(work, monkeypatch):
    import jemeval.data as data_module

    split_folder(work / "d", {"train": 6, "test": 2})
    loaders = []
    real = data_module.DataLoader
    monkeypatch.setattr(data_module, "DataLoader", lambda *a, **k: loaders.append(k["num_workers"]) or real(*a, **k))
    runs = {}
    for workers in ("0", "2"):
        runs[workers] = _json(_run("train", "folder:d", "--epochs", "2", "--px-weight", "0", "--batch-size", "6",
                                   "--out", f"run{workers}", "--device", "cpu", "--no-progress", "--json",
                                   "--workers", workers))
    assert loaders.count(2) >= 2 and loaders.count(0) >= 2  # training and test splits, each way
    assert runs["2"]["config"]["workers"] == 2
    for key in ("test_acc", "best_val_acc", "final_train_acc", "steps"):
        assert runs["0"][key] == runs["2"][key]
    a, b = (read_checkpoint(work / f"run{w}" / "best.pt")["state_dict"] for w in ("0", "2"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class _Files:
    """Files as an image folder holds them (``files``, ``transform``): what the digests read."""

    def __init__(self, files):
        self.files, self.transform = list(files), None

    def __len__(self):
        return len(self.files)


def test_a_training_split_is_read_whole_only_where_a_file_could_be_an_evaluated_one(tmp_path, monkeypatch):
    """ImageNet's training split is 1.28 million files: only files of an evaluated file's size and edge
    bytes are hashed, and what is found equals hashing every file (the reference: hashlib over all)."""
    from jemeval import image_digests, seen_images

    rng = np.random.default_rng(5)
    edge = rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    train, test = [], []
    for i in range(60):  # sizes from a few values; ten share the first and last 4 KiB and differ within
        size = int(rng.choice([700, 5000, 9000, 20000]))
        body = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        if i < 10:
            body = edge + rng.integers(0, 256, 1000, dtype=np.uint8).tobytes() + edge
        (tmp_path / f"train{i}.jpg").write_bytes(body)
        train.append(tmp_path / f"train{i}.jpg")
    for j, k in enumerate([3, 17, 17, 41, 5]):  # copies of training files (two of one, one edge-sharing)
        (tmp_path / f"copy{j}.jpg").write_bytes(train[k].read_bytes())
        test.append(tmp_path / f"copy{j}.jpg")
    near = bytearray(train[3].read_bytes())  # a file of train3's size and edges, another middle
    near[5000] ^= 1
    (tmp_path / "near.jpg").write_bytes(bytes(near))
    (tmp_path / "other.jpg").write_bytes(b"x" * 123)
    test += [tmp_path / "near.jpg", tmp_path / "other.jpg"]

    read = []
    monkeypatch.setattr(image_digests, "file_sha256", lambda f: read.append(Path(f)) or hashlib.sha256(
        Path(f).read_bytes()).hexdigest())
    found = seen_images.overlap(_Files(test), lambda: _Files(train))

    sha = {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in train + test}
    reference = sorted((i, j) for i, f in enumerate(test) for j, g in enumerate(train) if sha[f] == sha[g])
    got = sorted((int(i), int(found.training.rows[m])) for i, m in zip(found.hit, found.match))
    assert got == reference == [(0, 3), (1, 17), (2, 17), (3, 41), (4, 5)]
    def edges(f):
        b = f.read_bytes()
        return len(b), b[:4096] + b[-4096:] if len(b) >= 8192 else b

    read_train = {f for f in read if f in train}
    same_size = {f for f in train if f.stat().st_size in {g.stat().st_size for g in test}}
    assert read_train == {f for f in train if edges(f) in {edges(g) for g in test}}
    assert set(train[:10]) <= read_train < same_size  # the edge-sharing ten are told apart by SHA-256 only
