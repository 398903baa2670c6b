"""Issue 37, item 4: every command keeps the buffers a batch needs (glibc's mallopt at CLI start-up),
so a batch does not map fresh pages that the kernel zeroes again; no-op (recorded) elsewhere; memory
still handed back when it grows; the setting in every result's provenance."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jemeval.runtime import memory

ROOT = Path(__file__).resolve().parents[1]
glibc = pytest.mark.skipif(memory._libc() is None, reason="glibc's allocator only")

#: a fresh process (mallopt cannot be undone) allocating, filling and freeing a 64 MiB buffer six
#: times, as a batch's activations are: the minor page faults of each round
FAULTS = """
import json, resource, sys
import numpy as np
from jemeval.runtime.memory import allocator_setting, tune_allocator
if sys.argv[1] == "tune":
    tune_allocator()
counts = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(16 << 20, np.float32)  # above glibc's largest mmap threshold (32 MiB): mapped afresh by default
    del a
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"faults": counts, "setting": allocator_setting()}))
"""


def faults(mode: str, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    return json.loads(out.stdout)


@glibc
def test_tuned_allocator_reuses_a_batchs_pages_instead_of_faulting_them_in_again():
    tuned, default = faults("tune"), faults("none")
    assert tuned["setting"]["allocator"] == "glibc"
    assert tuned["setting"]["mallopt"] == {"M_MMAP_MAX": 0, "M_TRIM_THRESHOLD": 2**31 - 1}
    first = tuned["faults"][0]
    assert first > 0 and sum(tuned["faults"][1:]) <= first // 10  # the pages are kept and reused
    assert default["setting"]["allocator"] == "default"
    assert all(n >= default["faults"][0] // 2 for n in default["faults"])  # every round maps and zeroes anew
    opted_out = faults("tune", JEMEVAL_ALLOCATOR="default")
    assert opted_out["setting"] == {"allocator": "default", "reason": "JEMEVAL_ALLOCATOR=default"}
    assert all(n >= opted_out["faults"][0] // 2 for n in opted_out["faults"])


def test_other_c_libraries_are_left_alone_and_it_is_recorded(monkeypatch):
    monkeypatch.setattr(memory, "_STATE", {})
    monkeypatch.setattr(memory, "_libc", lambda: None)
    monkeypatch.delenv(memory.ALLOCATOR_ENV, raising=False)
    setting = memory.tune_allocator()
    assert setting["allocator"] == "default" and setting["reason"].startswith("not glibc")
    assert memory.release_freed_memory() is False
    from jemeval.provenance import provenance

    assert provenance(command="eval")["allocator"] == setting


def test_a_tuned_allocator_hands_memory_back_only_once_it_has_grown(monkeypatch):
    trims, readings = [], iter([100, 105, 109, 111, 100, 125])
    monkeypatch.setattr(memory, "release_freed_memory", lambda: trims.append(1) or True)
    monkeypatch.setattr(memory, "resident_bytes", lambda: next(readings))
    monkeypatch.setattr(memory, "_FIRST_RSS", [None])
    monkeypatch.setattr(memory, "_STATE", {"allocator": "glibc"})
    assert [memory.keep_memory_flat() for _ in range(6)] == [False, False, False, True, False, True]
    monkeypatch.setattr(memory, "_STATE", {"allocator": "default"})  # glibc's defaults: every time
    assert memory.keep_memory_flat() is True and len(trims) == 3
    assert memory.keep_memory_flat(default_allocator=False) is False and len(trims) == 3  # the trainer: never


@glibc
def test_the_cli_tunes_the_allocator_and_records_it_in_provenance(tmp_path):
    from jemeval.energy.factory import create_model
    from jemeval.formats.native import save_checkpoint

    save_checkpoint(tmp_path / "m.pt", create_model("cnn:width=4", 10, (1, 8, 8)))
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop(memory.ALLOCATOR_ENV, None)
    subprocess.run([sys.executable, "-m", "jemeval", "ood", "--model", str(tmp_path / "m.pt"), "--id", "digits",
                    "--ood", "constant",
                    "--n", "20", "--score", "maxprob", "--device", "cpu", "--out", str(out)], env=env, check=True,
                   capture_output=True)
    record = json.loads(out.read_text())["provenance"]["allocator"]
    assert record["allocator"] == "glibc" and record["mallopt"]["M_MMAP_MAX"] == 0
