"""docs/data.md's examples run exactly as written (issue 25 item 3).

Every fenced block marked ``data-example`` is taken from the page in order and run in one temporary
folder that first gets what the page says it holds: ``data/blobs`` (an image folder with train/ and
test/ splits of three colour classes) and ``data/ood_images`` (a flat folder of images). ``bash``
blocks run in bash with the venv's ``jemeval`` first on PATH and no GPU visible; ``python`` blocks
run in this process (they only load data, no model computes); ``file=NAME`` writes the block to
NAME for a later block to import. Kept under 30 s: two jemeval processes, the rest in-process.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "data.md"
FENCE = re.compile(r"^```(\w+) data-example(?: file=(\S+))?\n(.*?)^```", re.M | re.S)


def examples() -> list[tuple[int, str, str | None, str]]:
    """(line, language, file name or None, code) of every data-example block, in page order."""
    text = DOC.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1), m.group(2), m.group(3)) for m in FENCE.finditer(text)]


def build_data(root: Path) -> None:
    """data/blobs/{train,test}/{red,green,blue}/*.png (8 x 8, the class's channel bright) and
    data/ood_images/*.png (noise), as the page describes them."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 20), ("test", 6)):
        for c, name in enumerate(("red", "green", "blue")):
            folder = root / "data" / "blobs" / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 90, (8, 8, 3)).astype(np.uint8)
                img[..., c] += 160
                Image.fromarray(img).save(folder / f"{i:03d}.png")
    (root / "data" / "ood_images").mkdir(parents=True)
    for i in range(12):
        noise = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
        Image.fromarray(noise).save(root / "data" / "ood_images" / f"{i}.png")


def test_the_page_has_an_example_of_every_format():
    blocks = examples()
    code = "\n".join(c for _, _, _, c in blocks)
    for needed in ("folder:data/blobs", "--ood folder:data/ood_images", "x_train=", "np.savez(\"mine.npz\", x=",
                   "digits[0-4]", "register_datasets", "u8.npz"):
        assert needed in code, f"docs/data.md has no data-example using {needed!r}"
    assert {lang for _, lang, _, _ in blocks} == {"bash", "python"}


def test_every_example_runs_as_written(tmp_path, monkeypatch):
    build_data(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "CUDA_VISIBLE_DEVICES": "", "JEMEVAL_CACHE_DIR": str(tmp_path / "cache")}
    imported = set(sys.modules)
    try:
        for line, lang, file, code in examples():
            where = f"docs/data.md:{line}"
            if file:
                (tmp_path / file).write_text(code)
            elif lang == "bash":
                done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env,
                                      capture_output=True, text=True, timeout=120)
                assert done.returncode == 0, f"{where} failed:\n{done.stdout}\n{done.stderr}"
                assert "Traceback" not in done.stderr, f"{where}:\n{done.stderr}"
            else:
                exec(compile(code, where, "exec"), {"__name__": "__data_example__"})  # noqa: S102
    finally:
        for name in set(sys.modules) - imported:  # the plugin module written by the page
            if name == "my_data_plugin":
                del sys.modules[name]
    assert (tmp_path / "run-blobs" / "best.pt").exists()


@pytest.mark.parametrize("needle", ["has no test split: these are all its images"])
def test_the_page_quotes_the_note_jemeval_prints(needle):
    from jemeval.data import no_test_split_note

    class SingleSplit:
        splits = ()

    assert needle in DOC.read_text().replace("\n", " ") and needle in no_test_split_note("npz:FILE", SingleSplit())
