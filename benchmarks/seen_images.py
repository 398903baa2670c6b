"""What finding the images a model has seen costs (issue 34 item 6; docs/data.md, "Images a model has seen").

    python benchmarks/seen_images.py [--npz 10000] [--files 10000] [--rounds 3] [--workdir DIR] [--keep]

Writes a CIFAR-shaped npz (``--npz`` training images, a fifth as many test images, 3 x 32 x 32
uint8) and an image folder (``--files`` training PNGs of 32 x 32 in 10 class folders, a tenth as
many test PNGs), then, per round in a fresh process (the caches are per process), times what every
evaluation adds before its first batch: :func:`jemeval.seen_images.check_evaluated` on the test
split (the training split loaded and both digested; files by SHA-256, npz rows by their hash) and
:func:`jemeval.data.data_hashes` (the provenance's ``data_sha256``), each the first time and again.
Prints the medians over the rounds (wall seconds: the work is file reading and hashing).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CHILD = r"""
import json, sys, time
from jemeval.context import RunContext
from jemeval.data import data_hashes, load_dataset
from jemeval.seen_images import check_evaluated

class Model:  # trained on another set: only the comparison with the train split runs
    metadata = {"dataset": "digits"}

spec, out = sys.argv[1], {}
ds = load_dataset(spec, "test")
for label, run in (("check", lambda: check_evaluated(Model(), spec, "test", ds, context=RunContext())),
                   ("data_sha256", lambda: data_hashes([spec]))):
    for when in ("first", "again"):
        start = time.perf_counter()
        run()
        out[f"{label} {when}"] = time.perf_counter() - start
print(json.dumps(out))
"""


def write_data(folder: Path, n_npz: int, n_files: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    n_test = max(1, n_npz // 5)
    np.savez(folder / "set.npz", x_train=rng.integers(0, 256, (n_npz, 32, 32, 3), dtype=np.uint8),
             y_train=np.arange(n_npz) % 10, x_test=rng.integers(0, 256, (n_test, 32, 32, 3), dtype=np.uint8),
             y_test=np.arange(n_test) % 10)
    for split, n in (("train", n_files), ("test", max(10, n_files // 10))):
        for c in range(10):
            where = folder / "images" / split / f"c{c}"
            where.mkdir(parents=True)
            for i in range(n // 10):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(where / f"{i:05d}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npz", type=int, default=10000)
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    tmp = None if args.workdir else tempfile.TemporaryDirectory()
    folder = Path(args.workdir or tmp.name)
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "set.npz").exists():
        write_data(folder, args.npz, args.files)
    for spec in (f"npz:{folder / 'set.npz'}", f"folder:{folder / 'images'}"):
        rounds = [json.loads(subprocess.run([sys.executable, "-c", CHILD, spec], check=True, capture_output=True,
                                            text=True).stdout) for _ in range(args.rounds)]
        medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        print(spec.split(":")[0], "  ".join(f"{key} {value:.3f} s" for key, value in medians.items()))
    if tmp is not None and not args.keep:
        tmp.cleanup()


if __name__ == "__main__":
    main()
