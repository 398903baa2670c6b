"""The on-disk cache behind the shared trained fixtures (tests/fixture_cache.py): the right key, one
builder among concurrent processes, and never a half-written entry."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import fixture_cache
import pytest
from fixture_cache import MANIFEST, cached, source_key

HERE = Path(__file__).resolve().parent


@pytest.fixture
def package(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub" / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    (pkg / "sub" / "mod.py").write_text("def f():\n    return 2\n")
    (pkg / "sub" / "__pycache__" / "mod.cpython-312.pyc").write_bytes(b"\x00compiled")
    return pkg


def test_key_follows_every_source_file_and_the_settings(package, tmp_path):
    extra = tmp_path / "conftest.py"
    extra.write_text("A = 1\n")
    key = source_key(package, {"epochs": 3}, [extra])
    assert len(key) == 64 and key == source_key(package, {"epochs": 3}, [extra])
    assert source_key(package, {"epochs": 4}, [extra]) != key
    assert source_key(package, {"epochs": 3}) != key  # the building code is part of the key

    (package / "sub" / "__pycache__" / "mod.cpython-312.pyc").write_bytes(b"\x00other")
    (package / "notes.txt").write_text("not source")
    assert source_key(package, {"epochs": 3}, [extra]) == key  # bytecode and non-Python files don't count

    changes = [
        lambda: (package / "sub" / "mod.py").write_text("def f():\n    return 3\n"),  # an edit
        lambda: (package / "sub" / "new.py").write_text(""),  # a new (even empty) module
        lambda: (package / "sub" / "new.py").rename(package / "sub" / "renamed.py"),  # a rename
        lambda: extra.write_text("A = 2\n"),  # the fixture's own building code
    ]
    seen = {key}
    for change in changes:
        change()
        new = source_key(package, {"epochs": 3}, [extra])
        assert new not in seen
        seen.add(new)


def _builder(log: list, content: str = "weights"):
    def build(folder: Path) -> None:
        log.append(folder)
        (folder / "run").mkdir()
        (folder / "run" / "best.pt").write_text(content)
        (folder / "top.txt").write_text("x")
    return build


def test_built_once_then_reused_and_keys_kept_apart(tmp_path):
    log = []
    entry = cached("fx", "a" * 64, _builder(log), root=tmp_path)
    assert (entry / "run" / "best.pt").read_text() == "weights" and len(log) == 1
    assert cached("fx", "a" * 64, _builder(log), root=tmp_path) == entry and len(log) == 1
    other = cached("fx", "b" * 64, _builder(log, "other"), root=tmp_path)
    assert other != entry and (other / "run" / "best.pt").read_text() == "other" and len(log) == 2
    manifest = json.loads((entry / MANIFEST).read_text())
    assert manifest["key"] == "a" * 64 and sorted(manifest["files"]) == ["run/best.pt", "top.txt"]


def test_failed_build_publishes_nothing_and_the_next_call_builds(tmp_path):
    def broken(folder):
        (folder / "best.pt").write_text("half")
        raise KeyboardInterrupt  # Ctrl-C mid-training

    with pytest.raises(KeyboardInterrupt):
        cached("fx", "a" * 64, broken, root=tmp_path)
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []  # no entry, no leftover build folder
    log = []
    entry = cached("fx", "a" * 64, _builder(log), root=tmp_path)
    assert len(log) == 1 and (entry / "run" / "best.pt").read_text() == "weights"


@pytest.mark.parametrize("damage", ["truncated file", "same size other bytes", "missing file", "extra file",
                                    "no manifest", "garbled manifest", "manifest of another key",
                                    "empty manifest"])
def test_half_written_or_damaged_entry_is_rebuilt_never_used(tmp_path, damage):
    log = []
    entry = cached("fx", "a" * 64, _builder(log), root=tmp_path)
    best, manifest = entry / "run" / "best.pt", entry / MANIFEST
    data = json.loads(manifest.read_text())
    {
        "truncated file": lambda: best.write_text("weig"),
        "same size other bytes": lambda: best.write_text("WEIGHTS"),
        "missing file": lambda: best.unlink(),
        "extra file": lambda: (entry / "run" / "last.pt").write_text("?"),
        "no manifest": lambda: manifest.unlink(),
        "garbled manifest": lambda: manifest.write_text('{"key": "aaa'),
        "manifest of another key": lambda: manifest.write_text(json.dumps({**data, "key": "b" * 64})),
        "empty manifest": lambda: manifest.write_text(json.dumps({"key": "a" * 64, "files": {}})),
    }[damage]()
    again = cached("fx", "a" * 64, _builder(log), root=tmp_path)
    assert again == entry and len(log) == 2
    assert (again / "run" / "best.pt").read_text() == "weights" and not (again / "run" / "last.pt").exists()
    assert json.loads((again / MANIFEST).read_text()) == data


def test_a_build_in_progress_is_invisible(tmp_path):
    """Readers look only at the entry's final name; the build folder next to it is never read."""
    seen = []

    def build(folder):
        (folder / "best.pt").write_text("partial")
        seen.append(sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")))
        (folder / "best.pt").write_text("complete")

    entry = cached("fx", "a" * 64, build, root=tmp_path)
    assert len(seen) == 1 and all(name.startswith(".build-fx-") for name in seen[0])
    assert (entry / "best.pt").read_text() == "complete"


_WORKER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {here!r})
    import fixture_cache

    root, log, mode = sys.argv[1:4]

    def build(folder):
        with open(log, "a") as fh:
            fh.write(f"{{os.getpid()}}\\n")
        if mode == "die":
            (folder / "best.pt").write_text("half")
            os._exit(3)  # killed mid-build: no cleanup, no lock release by Python
        time.sleep(1.0)  # long enough that the other processes arrive while this one builds
        (folder / "best.pt").write_text(f"built by {{os.getpid()}}")

    entry = fixture_cache.cached("fx", "c" * 64, build, root=fixture_cache.Path(root), timeout=60)
    print((entry / "best.pt").read_text())
""")


def _workers(tmp_path, mode, n):
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(here=str(HERE)))
    root, log = tmp_path / "cache", tmp_path / "builds.log"
    root.mkdir(exist_ok=True)
    return [subprocess.Popen([sys.executable, str(script), str(root), str(log), mode], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(n)], log


def test_concurrent_processes_build_once_and_share_it(tmp_path):
    procs, log = _workers(tmp_path, "build", 3)
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    builders = log.read_text().split()
    assert len(builders) == 1  # exactly one process trained; the other two waited and reused it
    assert {out.strip() for out, _ in outputs} == {f"built by {builders[0]}"}


def test_a_killed_builder_blocks_no_one_and_leaves_nothing_usable(tmp_path):
    procs, log = _workers(tmp_path, "die", 1)
    procs[0].communicate(timeout=60)
    assert procs[0].returncode == 3
    root = tmp_path / "cache"
    leftovers = [p for p in root.iterdir() if p.is_dir()]
    assert [p.name.startswith(".build-fx-") for p in leftovers] == [True]  # the abandoned half build
    calls = []
    entry = cached("fx", "c" * 64, _builder(calls), root=root, timeout=10)  # the lock died with its holder
    assert len(calls) == 1 and (entry / "run" / "best.pt").read_text() == "weights"

    old = time.time() - fixture_cache.ABANDONED_BUILD_S - 60
    os.utime(leftovers[0], (old, old))
    cached("fx", "d" * 64, _builder(calls), root=root)  # the next build prunes abandoned ones
    assert not leftovers[0].exists() and entry.exists()


def test_entries_unused_for_long_are_pruned(tmp_path):
    calls = []
    unused = cached("fx", "a" * 64, _builder(calls), root=tmp_path)
    used = cached("fx", "b" * 64, _builder(calls), root=tmp_path)
    old = time.time() - fixture_cache.MAX_AGE_DAYS * 86400 - 60
    for entry in (unused, used):
        os.utime(entry / MANIFEST, (old, old))
    cached("fx", "b" * 64, _builder(calls), root=tmp_path)  # a use marks the entry as recent
    cached("fx", "e" * 64, _builder(calls), root=tmp_path)
    assert not unused.exists() and used.exists() and len(calls) == 3


def test_cache_folder_from_the_environment_must_be_private(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(fixture_cache.ENV, str(folder))
    assert fixture_cache.cache_root() == folder and (folder.stat().st_mode & 0o777) == 0o700
    folder.chmod(0o777)
    with pytest.raises(RuntimeError, match="is not private to this user .*mode 0o777.*JEMEVAL_TEST_CACHE"):
        fixture_cache.cache_root()


def test_session_fixtures_come_from_the_cache(digits_classifier_ckpt):
    """The conftest fixture is a private copy of a cache entry keyed by this very source tree."""
    copy = Path(digits_classifier_ckpt)
    entries = [p for p in fixture_cache.cache_root().glob("digits_classifier-*")
               if p.is_dir() and (p / "classifier.pt").read_bytes() == copy.read_bytes()]
    assert entries and all(not p.samefile(copy.parent) for p in entries)
