"""Issue 28, item 2: datasets stream from disk (memory-mapped npz, images uint8 until the batch,
lazily decoded folders), batches equal to the old whole-load path, and caches still keyed on content."""
from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

import jemeval
from jemeval.builtins import file_datasets
from jemeval.cli import cli
from jemeval.data import ArrayDataset, iterate_batches, load_dataset, subsample, take
from jemeval.energy.factory import create_model
from jemeval.evaluation.batching import resolve_scores, run_batches
from jemeval.evaluation.ood.fit import dataset_fingerprint
from jemeval.formats.native import save_checkpoint
from jemeval.testing import tiny_model


def old_whole_load(path: Path, key: str = "x") -> torch.Tensor:
    """0.3's npz loader, written out independently: np.load the whole array, NHWC -> NCHW, uint8
    scaled in float32."""
    x = np.load(path)[key]
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        x = x.transpose(0, 3, 1, 2)
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0 * 2 - 1
    return torch.from_numpy(x.astype(np.float32))


def all_batches(ds, batch_size=7) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*iterate_batches(ds, batch_size))
    return torch.cat(xs), torch.cat(ys)


def rss_kib() -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS"))


@pytest.fixture
def images():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (40, 8, 8, 3), dtype=np.uint8), rng.integers(0, 3, 40)


def test_uncompressed_npz_is_memory_mapped_and_batches_equal_the_whole_load(tmp_path, images):
    x, y = images
    np.savez(tmp_path / "d.npz", x=x, y=y)
    ds = load_dataset(f"npz:{tmp_path / 'd.npz'}")
    assert isinstance(ds.stored, np.memmap) and ds.stored.dtype == np.uint8 and ds.storage == "memory-mapped"
    ref = old_whole_load(tmp_path / "d.npz")
    got_x, got_y = all_batches(ds)
    assert got_x.dtype == torch.float32 and torch.equal(got_x, ref)  # same values, same order, bit for bit
    assert torch.equal(got_y, torch.from_numpy(y))
    sub = subsample(ds, 13, seed=5)  # a seeded subset, then a reordered take of it: rows in that order
    idx = np.sort(np.random.default_rng(5).choice(40, size=13, replace=False))
    assert torch.equal(all_batches(sub, 4)[0], ref[idx])
    order = np.array([12, 0, 7, 7, 3])
    assert torch.equal(all_batches(take(sub, order), 2)[0], ref[idx[order]])
    assert torch.equal(ds[9][0], ref[9]) and ds[9][1] == int(y[9])


def test_class_subset_and_float_and_grey_layouts_match_the_whole_load(tmp_path):
    rng = np.random.default_rng(1)
    grey = rng.integers(0, 256, (30, 6, 6), dtype=np.uint8)
    floats = (rng.random((12, 3, 5, 5)) * 2 - 1).astype(np.float64)
    np.savez(tmp_path / "g.npz", x_train=grey, y_train=np.arange(30) % 4, x_test=grey[:5], y_test=np.arange(5) % 4)
    np.savez(tmp_path / "f.npz", x=floats)
    ds = load_dataset(f"npz:{tmp_path / 'g.npz'}[1-2]", split="train")
    keep = np.flatnonzero(np.isin(np.arange(30) % 4, [1, 2]))
    assert torch.equal(all_batches(ds, 5)[0], old_whole_load(tmp_path / "g.npz", "x_train")[keep])
    f = load_dataset(f"npz:{tmp_path / 'f.npz'}")
    assert torch.equal(all_batches(f)[0], old_whole_load(tmp_path / "f.npz")) and len(all_batches(f)[1]) == 12


def test_compressed_npz_still_works_read_whole_in_its_dtype(tmp_path, images):
    x, y = images
    np.savez_compressed(tmp_path / "c.npz", x=x, y=y)
    ds = load_dataset(f"npz:{tmp_path / 'c.npz'}")
    assert not isinstance(ds.stored, np.memmap) and ds.stored.dtype == np.uint8
    assert "np.savez" in ds.storage
    assert torch.equal(all_batches(ds)[0], old_whole_load(tmp_path / "c.npz"))


def test_stored_path_gives_the_logits_of_the_in_memory_path(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (21, 1, 4, 4), dtype=np.uint8)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(21) % 3)
    model = tiny_model()
    mapped = run_batches(model, load_dataset(f"npz:{tmp_path / 'd.npz'}"), scores=resolve_scores(["logpx"]),
                         batch_size=8)
    whole = run_batches(model, ArrayDataset(old_whole_load(tmp_path / "d.npz"), torch.arange(21) % 3),
                        scores=resolve_scores(["logpx"]), batch_size=8)
    assert np.array_equal(mapped.logits, whole.logits) and np.array_equal(mapped.scores["logpx"],
                                                                          whole.scores["logpx"])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_loading_a_50_mb_npz_does_not_hold_its_bytes(tmp_path):
    x = np.random.default_rng(3).integers(0, 256, (17000, 32, 32, 3), dtype=np.uint8)  # 52 MB
    np.savez(tmp_path / "big.npz", x=x)
    np.savez(tmp_path / "small.npz", x=x[:2048])
    del x
    # the same path once on a small file first, so that first-call imports and allocator pools are not
    # counted (under xdist they cost up to 12 MB, depending on which tests the worker ran before)
    for _ in iterate_batches(load_dataset(f"npz:{tmp_path / 'small.npz'}"), 1024):
        pass
    before = rss_kib()
    ds = load_dataset(f"npz:{tmp_path / 'big.npz'}")
    assert rss_kib() - before < 16 * 1024  # the file is 52 MB; the old loader held 4x that (float32)
    peak, batches = before, 0
    for _ in iterate_batches(ds, 1024):
        peak, batches = max(peak, rss_kib()), batches + 1
    # two float32 batches of 1024 are 25 MB; holding the pages read would add the file's 52 MB
    assert batches == 17 and peak - before < 48 * 1024  # the pages read are handed back batch by batch


@pytest.mark.parametrize("name", ["uniform", "gaussian:std=0.5"])
@pytest.mark.parametrize("shape,n", [((3, 32, 32), 1000), ((1, 1, 1), 777), ((1, 5, 5), 33), ((3, 2, 2), 5)])
def test_noise_sets_drawn_block_by_block_are_the_whole_draw(name, shape, n):
    # the reference: the whole set drawn at once, as 0.2 (and torch users) draw it
    g = torch.Generator().manual_seed(0)
    whole = (torch.rand((n, *shape), generator=g) * 2 - 1 if name == "uniform"
             else (torch.randn((n, *shape), generator=g) * 0.5).clamp(-1, 1))
    ds = load_dataset(name, "test", input_shape=shape, n=n)
    assert ds.storage == "generated"
    assert torch.equal(torch.cat([x for x, _ in iterate_batches(ds, 7)]), whole)
    idx = np.random.default_rng(n).integers(0, n, 11)  # any order, repeats, jumps back
    assert torch.equal(torch.cat([x for x, _ in iterate_batches(take(ds, idx), 4)]), whole[idx])
    assert torch.equal(ds.x, whole) and torch.equal(ds[n - 1][0], whole[n - 1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_a_large_noise_set_is_never_held_whole():
    before = rss_kib()
    ds = load_dataset("uniform", "test", input_shape=(3, 32, 32), n=50000)  # 614 MB drawn at once
    peak, count = before, 0
    for x, _ in iterate_batches(ds, 500):
        peak, count = max(peak, rss_kib()), count + len(x)
    assert count == 50000 and peak - before < 40 * 1024


@pytest.fixture
def checkpoint(tmp_path):
    return save_checkpoint(tmp_path / "m.pt", create_model("cnn:width=4", 3, (3, 8, 8)))


def _stored_npz_bytes(payload: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("x.npy", payload)
        labels = io.BytesIO()
        np.save(labels, np.zeros(40, np.int64))
        zf.writestr("y.npy", labels.getvalue())
    return buf.getvalue()


def _refused(tmp_path, checkpoint, data: Path, expected: str) -> None:
    before = snapshot(tmp_path)
    result = runner().invoke(cli, ["eval", "--model", str(checkpoint), "--data", f"npz:{data}", "--device", "cpu"])
    assert_one_line_refusal(result, expected)
    assert snapshot(tmp_path) == before


def test_a_payload_byte_flipped_in_a_mapped_npz_is_refused(tmp_path, checkpoint, images):
    np.savez(tmp_path / "d.npz", x=images[0], y=images[1])
    raw = bytearray((tmp_path / "d.npz").read_bytes())
    raw[2000] ^= 0xFF  # inside x's pixels: mapping would read it silently, the CRC does not
    (tmp_path / "d.npz").write_bytes(bytes(raw))
    _refused(tmp_path, checkpoint, tmp_path / "d.npz", "CRC-32")


def test_a_header_promising_more_pixels_than_the_entry_holds_is_refused(tmp_path, checkpoint, images):
    npy = io.BytesIO()
    np.save(npy, images[0])
    payload = npy.getvalue().replace(b"(40, 8, 8, 3)", b"(90, 8, 8, 3)")  # CRC recomputed by the zip writer
    (tmp_path / "d.npz").write_bytes(_stored_npz_bytes(payload))
    _refused(tmp_path, checkpoint, tmp_path / "d.npz", "truncated")


def test_a_truncated_npz_is_refused(tmp_path, checkpoint, images):
    np.savez(tmp_path / "d.npz", x=images[0], y=images[1])
    raw = (tmp_path / "d.npz").read_bytes()
    (tmp_path / "d.npz").write_bytes(raw[: len(raw) // 2])
    _refused(tmp_path, checkpoint, tmp_path / "d.npz", "d.npz")


@pytest.mark.slow  # torchvision's import, under load
def test_an_image_folder_is_decoded_lazily(tmp_path, monkeypatch):
    from PIL import Image

    for i in range(9):
        Image.fromarray(np.full((8, 8, 3), i * 20, np.uint8)).save(tmp_path / f"{i}.png")
    calls = []
    real = file_datasets._read_image
    monkeypatch.setattr(file_datasets, "_read_image", lambda p: calls.append(p) or real(p))
    ds = load_dataset(f"folder:{tmp_path}")
    assert len(calls) == 1  # the shape probe only: nothing decoded while loading
    first = next(iterate_batches(ds, 4, num_workers=0))  # decoded here, in this process
    assert len(calls) == 5 and first[0].shape == (4, 3, 8, 8)


@pytest.mark.slow  # worker processes start
def test_workers_decode_a_folder_in_parallel_with_the_same_outputs(tmp_path, monkeypatch):
    from PIL import Image

    import jemeval.data as data_module

    rng = np.random.default_rng(3)
    for i in range(11):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / f"{i:02d}.png")
    ds = load_dataset(f"folder:{tmp_path}")
    model = tiny_model(3, (3, 8, 8))
    loaders = []
    real = data_module.DataLoader
    monkeypatch.setattr(data_module, "DataLoader", lambda *a, **k: loaders.append(k["num_workers"]) or real(*a, **k))
    scores = resolve_scores(["logpx", "gradnorm"])
    alone = run_batches(model, ds, scores=scores, batch_size=4, sigma=0.1, seed=2, progress=False, workers=0)
    helped = run_batches(model, ds, scores=scores, batch_size=4, sigma=0.1, seed=2, progress=False, workers=2)
    assert loaders == [0, 2]
    np.testing.assert_array_equal(helped.logits, alone.logits)
    for label in ("logpx", "gradnorm"):
        np.testing.assert_array_equal(helped.scores[label], alone.scores[label])


def test_workers_is_checked_in_one_line(tmp_path):
    with pytest.raises(jemeval.errors.UsageError, match="workers must be a whole number >= 0, got -1"):
        jemeval.RunContext(workers=-1)
    result = runner().invoke(cli, ["eval", "--model", "m.pt", "--workers", "-1"])
    assert_one_line_refusal(result, "--workers")


def test_a_mapped_file_whose_bytes_change_does_not_hit_an_old_cache_key(tmp_path, images):
    x, y = images
    path = tmp_path / "d.npz"
    np.savez(path, x=x, y=y)
    key = dataset_fingerprint(load_dataset(f"npz:{path}"))
    sub_keys = {dataset_fingerprint(take(load_dataset(f"npz:{path}"), idx)) for idx in ([0, 1, 2], [0, 1, 3])}
    assert len(sub_keys) == 2  # a subset is keyed on its rows
    stat = path.stat()
    x2 = x.copy()
    x2[7, 3, 3, 0] ^= 1  # one pixel, same shape, same size, old times put back
    np.savez(path, x=x2, y=y)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size
    changed = load_dataset(f"npz:{path}")
    assert dataset_fingerprint(changed) != key
    assert torch.equal(all_batches(changed)[0], old_whole_load(path))  # the new bytes are read


def test_python_api_keeps_x_as_a_float_tensor(tmp_path, images):
    np.savez(tmp_path / "d.npz", x=images[0], y=images[1])
    ds = jemeval.load_dataset(f"npz:{tmp_path / 'd.npz'}")
    assert ds.x.dtype == torch.float32 and torch.equal(ds.x, old_whole_load(tmp_path / "d.npz"))


@pytest.mark.slow
def test_fitted_detectors_say_how_large_their_state_is(tmp_path):
    rng = np.random.default_rng(4)
    train = rng.integers(0, 256, (30, 8, 8, 3), dtype=np.uint8)
    np.savez(tmp_path / "id.npz", x_train=train, y_train=np.arange(30) % 3,  # test images: none of train's
             x_test=rng.integers(0, 256, (12, 8, 8, 3), dtype=np.uint8), y_test=np.arange(12) % 3)
    torch.manual_seed(0)
    model = create_model("cnn:width=4", 3, (3, 8, 8))
    result = jemeval.evaluate_ood(model, "uniform", id=f"npz:{tmp_path / 'id.npz'}", scores=["knn:k=3", "maxprob"],
                                  n=12, cache=False)
    fits = result.provenance["settings"]["detectors"]
    features = run_batches(model, load_dataset(f"npz:{tmp_path / 'id.npz'}", split="train"), keep_features=True)
    # knn keeps the fit features, float32, and nothing else of size
    assert [f["state_bytes"] for f in fits.values()] == [features.features.shape[0] * features.features.shape[1] * 4]


def test_the_default_workers_follow_the_cpus_this_process_may_use(monkeypatch):
    """min(8, CPUs - 1) over the affinity mask, not the machine's count; array sets start none."""
    from jemeval.data import ArrayDataset, loader_workers
    from jemeval.runtime import workers

    for cpus, expected in ((1, 0), (2, 1), (5, 4), (9, 8), (64, 8)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)), raising=False)
        assert workers.default_workers() == expected
    assert jemeval.RunContext().workers is None and jemeval.RunContext(workers=0).workers == 0
    arrays = ArrayDataset(torch.zeros(4, 1, 2, 2), torch.zeros(4, dtype=torch.long))
    assert loader_workers(arrays, None) == 0 and loader_workers(arrays, 3) == 0


@pytest.mark.slow  # worker processes start
def test_a_folder_is_decoded_by_the_default_workers_with_the_outputs_of_none(tmp_path, monkeypatch):
    from PIL import Image

    import jemeval.data as data_module
    from jemeval.runtime import workers

    rng = np.random.default_rng(4)
    for i in range(9):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / f"{i:02d}.png")
    ds = load_dataset(f"folder:{tmp_path}")
    model = tiny_model(3, (3, 8, 8))
    monkeypatch.setattr(workers, "usable_cpus", lambda: 3)
    loaders = []
    real = data_module.DataLoader
    monkeypatch.setattr(data_module, "DataLoader", lambda *a, **k: loaders.append(k["num_workers"]) or real(*a, **k))
    scores = resolve_scores(["maxprob"])
    auto = run_batches(model, ds, scores=scores, batch_size=4, progress=False)
    alone = run_batches(model, ds, scores=scores, batch_size=4, progress=False, workers=0)
    assert loaders == [2, 0] and auto.settings["workers"] == 2 and alone.settings["workers"] == 0
    np.testing.assert_array_equal(auto.logits, alone.logits)
    np.testing.assert_array_equal(auto.scores["maxprob"], alone.scores["maxprob"])
