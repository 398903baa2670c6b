"""Peak memory of ``jemeval ood``, ``calibrate``, ``eval`` and ``train`` against the number of images
(issue 28, item 2; issue 37, item 2).

    python benchmarks/memory_scaling.py [--sizes 1000,50000] [--arch cnn:width=8] [--workdir DIR]
                                        [--score logpx,maxprob,gradnorm] [--threads 1] [--keep]
                                        [--ood npz|interp,constant,rotate,flip] [--only eval,calibrate,ood,train]

Generates, per size N, two CIFAR-shaped user files (3 x 32 x 32 uint8 images, N x H x W x C as
``np.savez`` writes them, uncompressed): ``id_N.npz`` with ``x_test``/``y_test`` (10 classes) and
``ood_N.npz`` with ``x`` (unlabelled images of another distribution); and one untrained model
for that shape saved as a jemeval checkpoint (memory does not depend on training). Then runs, per
size, each command as a fresh process::

    jemeval eval      --model M --data npz:id_N.npz --device cpu
    jemeval calibrate --model M --data npz:id_N.npz --device cpu
    jemeval ood       --model M --id npz:id_N.npz --ood npz:ood_N.npz --score S --device cpu
    jemeval train     npz:train_N.npz --arch ARCH --epochs 1 --px-weight 0 --device cpu --out DIR

(``--ood interp,constant,rotate,flip``: those sets instead of ood_N.npz, each as large as the ID set
and drawn from its rows; ``train`` reads ``train_N.npz``, x/y of N uint8 images, one epoch of the
classifier objective: the data path, without a replay buffer that grows with N)

and reports each child's peak resident memory (``ru_maxrss`` of that child, from ``os.wait4``: file
pages mapped and touched count too) and its process CPU seconds (user + system), then the ratio of
the largest size's peak to the smallest's per command. Goal: <= 1.2 (memory flat in N). The files
are written under ``--workdir`` (default: a temporary folder, removed unless ``--keep``).
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPE = (32, 32, 3)
CLASSES = 10
CHUNK = 5000


def write_sets(folder: Path, n: int, seed: int = 0) -> tuple[Path, Path]:
    """id_N.npz (x_test uint8 N x 32 x 32 x 3, y_test) and ood_N.npz (x), uncompressed. Written in
    chunks into a preallocated array so that generating a large set does not itself need much memory
    beyond the array (np.savez writes it as it is)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    paths = folder / f"id_{n}.npz", folder / f"ood_{n}.npz"
    x = np.empty((n, *SHAPE), np.uint8)
    y = rng.integers(0, CLASSES, n)
    for i in range(0, n, CHUNK):  # class-dependent mean colour, noise on top: an ID set with some structure
        m = min(CHUNK, n - i)
        base = (y[i:i + m, None, None, None] * 20 + 30).astype(np.int16)
        x[i:i + m] = np.clip(base + rng.integers(-40, 41, (m, *SHAPE)), 0, 255)
    np.savez(paths[0], x_test=x, y_test=y)
    for i in range(0, n, CHUNK):  # OOD: uniform noise
        m = min(CHUNK, n - i)
        x[i:i + m] = rng.integers(0, 256, (m, *SHAPE), dtype=np.uint8)
    np.savez(paths[1], x=x)
    return paths


def write_train_set(folder: Path, n: int, seed: int = 0) -> Path:
    """train_N.npz: N uint8 CIFAR-shaped images (x) with labels (y), one split, as a user saves them."""
    import numpy as np

    rng = np.random.default_rng(seed + 1)
    y = rng.integers(0, CLASSES, n)
    x = np.empty((n, *SHAPE), np.uint8)
    for i in range(0, n, CHUNK):
        m = min(CHUNK, n - i)
        x[i:i + m] = np.clip((y[i:i + m, None, None, None] * 20 + 30) + rng.integers(-40, 41, (m, *SHAPE)), 0, 255)
    np.savez(folder / f"train_{n}.npz", x=x, y=y)
    return folder / f"train_{n}.npz"


def prepare(folder: Path, what: str, arch: str) -> None:
    """Runs in a child process (``--prepare``): the parent imports neither numpy nor torch and never
    holds the images, because a child's ``ru_maxrss`` starts from its parent's peak (the child is
    forked, or vforked, from it before it execs), which would hide what the command itself uses."""
    if what == "model":
        import torch

        from jemeval.energy.factory import create_model
        from jemeval.formats.native import save_checkpoint

        torch.manual_seed(0)
        save_checkpoint(folder / "model.pt", create_model(arch, CLASSES, (3, 32, 32)))
    elif what.startswith("train_"):
        write_train_set(folder, int(what[len("train_"):]))
    else:
        write_sets(folder, int(what))


def run_child(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    """Run ``cmd`` as a fresh process: its peak RSS (MiB), user and system CPU seconds, wall seconds."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {stderr.decode()[-2000:]}")
    return {"peak_mib": usage.ru_maxrss / 1024, "user_s": usage.ru_utime, "sys_s": usage.ru_stime,
            "wall_s": time.perf_counter() - t0}


def commands(model: Path, folder: Path, n: int, args: argparse.Namespace) -> dict[str, list[str]]:
    exe = [sys.executable, "-m", "jemeval"]
    common = ["--model", str(model), "--device", "cpu"]
    id_file = folder / f"id_{n}.npz"
    ood = f"npz:{folder / f'ood_{n}.npz'}" if args.ood == "npz" else args.ood
    table = {
        "eval": [*exe, "eval", *common, "--data", f"npz:{id_file}"],
        "calibrate": [*exe, "calibrate", *common, "--data", f"npz:{id_file}"],
        "ood": [*exe, "ood", *common, "--id", f"npz:{id_file}", "--ood", ood, "--score", args.score],
        "train": [*exe, "train", f"npz:{folder / f'train_{n}.npz'}", "--arch", args.arch, "--epochs", "1",
                  "--px-weight", "0", "--device", "cpu", "--no-progress", "--out", str(folder / f"run_{n}")],
    }
    return {name: table[name] for name in args.only.split(",")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,50000")
    parser.add_argument("--arch", default="cnn:width=8")
    parser.add_argument("--score", default="logpx,maxprob,gradnorm")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--ood", default="npz", help="npz (ood_N.npz) or --ood sets of jemeval, e.g. "
                        "interp,constant,rotate,flip (drawn from the ID set)")
    parser.add_argument("--only", default="eval,calibrate,ood", help="commands to run, of eval,calibrate,ood,train")
    parser.add_argument("--prepare", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prepare:
        return prepare(args.workdir, args.prepare, args.arch)
    sizes = [int(s) for s in args.sizes.split(",")]
    folder = Path(args.workdir or tempfile.mkdtemp(prefix="jemeval-memory-"))
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "JEMEVAL_CACHE_DIR": str(folder / "cache")}
    me = [sys.executable, __file__, "--workdir", str(folder), "--arch", args.arch, "--prepare"]
    subprocess.run([*me, "model"], env=env, check=True)
    model = folder / "model.pt"
    print(f"# memory_scaling: {args.arch}, sizes {sizes}, threads {args.threads}, --ood {args.ood}, "
          f"JEMEVAL_ALLOCATOR={os.environ.get('JEMEVAL_ALLOCATOR', '(unset: tuned)')}, load average "
          f"{os.getloadavg()[0]:.1f}, parent peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")
    print(f"{'command':<10} {'N':>7} {'peak MiB':>9} {'user s':>8} {'sys s':>8} {'wall s':>8}")
    peaks: dict[str, dict[int, float]] = {}
    for n in sizes:
        subprocess.run([*me, str(n)], env=env, check=True)
        if "train" in args.only.split(","):
            subprocess.run([*me, f"train_{n}"], env=env, check=True)
        for name, cmd in commands(model, folder, n, args).items():
            r = run_child(cmd, env)
            peaks.setdefault(name, {})[n] = r["peak_mib"]
            print(f"{name:<10} {n:>7} {r['peak_mib']:>9.1f} {r['user_s']:>8.2f} {r['sys_s']:>8.2f} {r['wall_s']:>8.2f}",
                  flush=True)
        if not args.keep:
            for file in (f"id_{n}.npz", f"ood_{n}.npz", f"train_{n}.npz"):
                (folder / file).unlink(missing_ok=True)
    for name, by_n in peaks.items():
        ratio = by_n[max(sizes)] / by_n[min(sizes)]
        print(f"{name}: peak RSS at N={max(sizes)} / N={min(sizes)} = {ratio:.3f} "
              f"({'within' if ratio <= 1.2 else 'OVER'} 1.2x)")


if __name__ == "__main__":
    main()
