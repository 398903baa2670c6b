"""Shared fixtures. Models are kept small (CI has 2 CPU cores) and trained once for all xdist
workers and concurrent runs: tests/fixture_cache.py keeps them on disk, keyed by the source code
(``$JEMEVAL_TEST_CACHE`` or ``<temp>/jemeval-test-cache-<uid>``; delete it to retrain)."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

# Before torch is imported (here only inside functions; test modules import it after this file):
# idle OpenMP threads sleep instead of spinning, which otherwise makes small CPU ops orders of
# magnitude slower whenever the machine is oversubscribed.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("MPLBACKEND", "Agg")

HERE = Path(__file__).resolve().parent


def pytest_configure(config):
    import torch

    torch.set_num_threads(1)  # CI has 2 cores; one thread per process avoids oversubscription stalls


# -- the trained models ----------------------------------------------------------------------------
#: A plain cross-entropy CNN on digits: ~97% test accuracy in about 2 s.
DIGITS_CLASSIFIER_FIXTURE = {"epochs": 15, "seed": 0}

#: A shortened version of `jemeval train digits` (fewer epochs and SGLD steps, no grids): ~94% test
#: accuracy and log p(x) AUROC ~1.0 against U(-1, 1) noise; about 15 s of one CPU core.
DIGITS_JEM_FIXTURE = {"epochs": 12, "sgld_steps": 5, "decay_epochs": (9,), "grid_every": 0, "test_eval": False,
                      "progress": False, "seed": 0, "device": "cpu"}


def _train_digits_classifier(folder, epochs, seed):
    """The classifier baseline fixture, trained with a bare loop (no jemeval.training involved)."""
    import torch

    import jemeval
    from jemeval.formats.native import save_checkpoint

    torch.manual_seed(seed)
    ds = jemeval.load_dataset("digits", "train")
    model = jemeval.create_model("cnn", 10, (1, 8, 8), width=16)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(ds), generator=g)
        for i in range(0, len(ds), 64):
            idx = perm[i:i + 64]
            loss = torch.nn.functional.cross_entropy(model(ds.x[idx]), ds.y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    config = {"fixture": "digits_classifier", "epochs": epochs}
    save_checkpoint(folder / "classifier.pt", model, dataset="digits", config=config)


def _train_digits_jem(folder, **settings):
    """A run folder of `jemeval train digits` (folder/run) with the fixture's settings."""
    from jemeval.training import train

    best = Path(train("digits", out=str(folder / "run"), **settings).summary["best"])
    assert best == folder / "run" / "best.pt", best


#: fixture name -> (cache entry name, settings, builder(folder, **settings), file the fixture returns)
#: (the JEM first: the longest build starts at once, see pytest_collection_finish)
TRAINED = {
    "digits_jem_ckpt": ("digits_jem", DIGITS_JEM_FIXTURE, _train_digits_jem, "run/best.pt"),
    "digits_classifier_ckpt": ("digits_classifier", DIGITS_CLASSIFIER_FIXTURE, _train_digits_classifier,
                               "classifier.pt"),
    "digits_baseline_ckpt": ("digits_jem_baseline", {**DIGITS_JEM_FIXTURE, "px_weight": 0.0}, _train_digits_jem,
                             "run/best.pt"),
}


def _cache_entry(fixture, timeout=None):
    """The shared cache folder of a trained fixture, built now if this source tree has none yet.

    The key covers the jemeval package this session imports, this file and the cache module: an
    edit to any of them retrains.
    """
    import fixture_cache

    import jemeval

    name, settings, build, _ = TRAINED[fixture]
    key = fixture_cache.source_key(Path(jemeval.__file__).resolve().parent, {"fixture": name, **settings},
                                   extra_files=[HERE / "conftest.py", HERE / "fixture_cache.py"])
    timeout = fixture_cache.LOCK_TIMEOUT_S if timeout is None else timeout
    return fixture_cache.cached(name, key, lambda folder: build(folder, **settings), timeout=timeout)


def _private_copy(fixture, tmp_path_factory):
    """The fixture's file in this process's own copy of the cache entry: no test can alter the cache."""
    import fixture_cache

    name, _, _, filename = TRAINED[fixture]
    copy = tmp_path_factory.mktemp(name)
    shutil.copytree(_cache_entry(fixture), copy, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(fixture_cache.MANIFEST))
    return copy / filename


def pytest_collection_modifyitems(config, items):
    """Under xdist, an order that keeps both workers busy (files stay whole, so module fixtures are
    built once, and keep their own order):

    1. files holding ``slow`` tests (minutes of torchrun and subprocesses) first: started last, one
       of them would keep one worker busy long after the other ran out of tests;
    2. files that use the trained JEMs last: by the time either worker reaches them, the worker
       that took that build at start-up (pytest_collection_finish) has finished it.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    # read the file: some ask for a JEM through request.getfixturevalue, which fixturenames misses
    jem = {path for path in {item.path for item in items}
           if re.search(r"\bdigits_(jem|baseline)_ckpt\b", path.read_text(errors="replace"))}
    items.sort(key=lambda item: (item.path not in slow, item.path in jem))  # a stable sort


def pytest_collection_finish(session):
    """Under xdist, build the trained fixtures this run needs before the first test, each worker
    starting with a different one and skipping those another worker is building: two workers
    train two models at once, and none sits waiting for a model while tests that need none could
    run (their users run last, see above). A failed build is left to the fixture, which retries
    and reports it in a test."""
    import fixture_cache

    if session.config.option.collectonly:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    needed = [f for f in TRAINED if any(f in getattr(item, "fixturenames", ()) for item in session.items)]
    if not worker.startswith("gw") or not needed:
        return
    first = int(worker[2:]) % len(needed)
    for fixture in needed[first:] + needed[:first]:
        try:
            _cache_entry(fixture, timeout=0)
        except fixture_cache.Busy:
            continue  # another worker builds it; tests that need it wait in the fixture, others run
        except Exception:
            return


@pytest.fixture(scope="session", autouse=True)
def detector_cache(tmp_path_factory):
    """Fitted detector states go to a temporary folder, never to the user's ~/.cache/jemeval."""
    folder = tmp_path_factory.mktemp("jemeval-cache")
    old = os.environ.get("JEMEVAL_CACHE_DIR")
    os.environ["JEMEVAL_CACHE_DIR"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("JEMEVAL_CACHE_DIR", None)
    else:
        os.environ["JEMEVAL_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def digits_classifier_ckpt(tmp_path_factory):
    """Path to a checkpoint of a plain digits classifier (cnn, width 16, ~97% test accuracy)."""
    return _private_copy("digits_classifier_ckpt", tmp_path_factory)


@pytest.fixture(scope="session")
def digits_jem_ckpt(tmp_path_factory):
    """Path to best.pt of a small JEM trained on digits with `jemeval train` settings (cnn width 32,
    12 epochs, 5 SGLD steps, buffer 1000, sigma 0.03); its config holds "sgld" and "sigma"."""
    return _private_copy("digits_jem_ckpt", tmp_path_factory)


@pytest.fixture(scope="session")
def digits_baseline_ckpt(tmp_path_factory):
    """Path to best.pt of the same run with --px-weight 0: the plain classifier baseline (no sampling)."""
    return _private_copy("digits_baseline_ckpt", tmp_path_factory)


# -- every test pins its device --------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _device_is_pinned(request, monkeypatch):
    """Fail a test that lets jemeval pick the device ("auto", None): CI has no GPU, but the suite
    must also pass where CUDA is visible, and there such a test would compute on the GPU (bf16,
    TF32 convolutions) against references computed on the CPU. Tests that only reach an error, or
    test "auto" itself, are marked ``any_device``."""
    if request.node.get_closest_marker("any_device"):
        yield
        return
    import sys

    from jemeval.runtime import devices

    real, unpinned = devices.resolve_device, []

    def pinned_only(device, *args, **kwargs):
        if device is None or (isinstance(device, str) and device.strip().lower() in ("", "auto")):
            unpinned.append(device)
        return real(device, *args, **kwargs)

    for name, module in list(sys.modules.items()):  # also where the function was imported by name
        if name.startswith("jemeval") and getattr(module, "resolve_device", None) is real:
            monkeypatch.setattr(module, "resolve_device", pinned_only)
    yield
    if unpinned:
        pytest.fail(f"the test let jemeval pick the device ({unpinned[0]!r}); pass device='cpu' / --device cpu, "
                    "or mark it any_device if it only reaches an error", pytrace=False)


# -- fixtures several test modules share (a module's own fixture of the same name wins there) -----------
@pytest.fixture(scope="module")
def clf(digits_classifier_ckpt):
    """The digits classifier of :func:`digits_classifier_ckpt`, loaded once per test module."""
    import jemeval

    return jemeval.load_model(digits_classifier_ckpt)


@pytest.fixture(scope="module")
def reference(clf):
    """The digits test set's float64 probabilities under ``clf`` and its labels, computed without
    jemeval's evaluation code (what the calibration tests compare with)."""
    import torch

    import jemeval

    ds = jemeval.load_dataset("digits", "test")
    with torch.no_grad():
        probs = torch.softmax(clf.net(ds.x).double(), dim=1).numpy()
    return probs, ds.y.numpy()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A working folder holding an untrained digits-shaped model m.pt, with an empty detector cache."""
    import torch

    import jemeval
    from jemeval.formats.native import save_checkpoint

    torch.manual_seed(0)
    save_checkpoint(tmp_path / "m.pt", jemeval.create_model("cnn", 10, (1, 8, 8), width=4), dataset="digits")
    monkeypatch.setenv("JEMEVAL_CACHE_DIR", str(tmp_path / "jc"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JEMEVAL_DEBUG", raising=False)
    return tmp_path


@pytest.fixture
def samples(home):
    """s.npz in ``home``: 3 samples of m.pt (2 SGLD steps), written by ``jemeval sample``."""
    from test_bad_inputs import runner

    from jemeval.cli import cli

    result = runner().invoke(cli, ["sample", "--model", "m.pt", "--n", "3", "--steps", "2", "--save", "s.npz",
                                   "--device", "cpu"])
    assert result.exit_code == 0, result.output + result.stderr
    return home / "s.npz"
