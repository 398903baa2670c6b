"""Images/s of jemeval's ``eval`` and ``ood`` on a folder of JPEGs against a plain torchvision loop.

    python benchmarks/folder_decoding.py [--n 512] [--batch 64] [--workers 0,1,2] [--repeats 3]
        [--arch mobilenetv3_small_100] [--threads 1]

A class folder of 224 x 224 JPEGs (quality 90, ten classes named with ImageNet synset ids, so an
ImageNet model needs no class map) is written to a temporary folder, with a second flat folder as
the OOD set, and a timm model with random weights is put into a temporary Hugging Face cache as
timm lays out its pretrained files (the cost of a pass does not depend on the weights). For each
number of DataLoader workers, round-robin:

* ``eval``: ``jemeval.evaluate`` (``jemeval eval --workers W``) on the folder, against torchvision's
  ``ImageFolder`` + ``DataLoader(num_workers=W)`` + the same network under ``torch.no_grad``, with
  the transform jemeval applies (the JPEG to a float tensor, the model's mean and std);
* ``ood``: ``jemeval.evaluate_ood`` with ``scores="maxprob,energy"`` on the ID folder and the OOD
  folder, against the same plain loop over both folders computing the two scores.

A small network (mobilenetv3_small_100 by default, ~0.06 GFLOPs an image) makes the decoding a
large share of the time: the case where a loader's overheads show. The figure is jemeval's images/s
over the plain loop's (wall clock: workers run in other processes), goal >= 0.9.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from timing import add_common_args, header, interleave, setup


def write_folders(root: Path, n: int, seed: int) -> tuple[Path, Path]:
    """``id/<synset>/<i>.jpg`` (n images, ten classes) and ``ood/all/<i>.jpg`` (n images): smooth random
    images, 224 x 224, as a camera's JPEGs compress (not flat noise, not one colour)."""
    from PIL import Image
    from timm.data import ImageNetInfo

    synsets = ImageNetInfo().label_names()[:10]
    rng = np.random.default_rng(seed)
    for folder, labelled in (("id", True), ("ood", False)):
        for i in range(n):
            where = root / folder / (synsets[i % 10] if labelled else "all")
            where.mkdir(parents=True, exist_ok=True)
            small = rng.integers(0, 256, (14, 14, 3), dtype=np.uint8)
            Image.fromarray(small).resize((224, 224), Image.BICUBIC).save(where / f"{i:05d}.jpg", quality=90)
    return root / "id", root / "ood"


def publish_timm(root: Path, arch: str) -> str:
    """A random-weight ``arch`` in a Hugging Face cache at ``root`` (blobs, snapshots, refs), as timm
    fetches its default pretrained tag; the Hub set offline. Returns the ``timm:`` source."""
    import timm
    from safetensors.torch import save_file
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(arch)
    net = timm.create_model(arch, pretrained=False).eval()
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(root / "w.safetensors"))
    files = {"model.safetensors": (root / "w.safetensors").read_bytes(),
             "config.json": json.dumps({"architecture": arch, "num_classes": 1000}).encode()}
    repo = root / "hf" / f"models--{cfg.hf_hub_id.replace('/', '--')}"
    rev = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    (repo / "blobs").mkdir()
    (repo / "snapshots" / rev).mkdir(parents=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (repo / "snapshots" / rev / name).symlink_to(os.path.relpath(blob, repo / "snapshots" / rev))
    os.environ.update(HF_HUB_CACHE=str(root / "hf"), HF_HUB_OFFLINE="1")
    return f"timm:{arch}"


def plain_loop(net: torch.nn.Module, folders: list[Path], mean, std, batch: int, workers: int, ood: bool) -> None:
    """torchvision's ImageFolder and a DataLoader; the logits, and with ``ood`` the max softmax and
    the energy of each image."""
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])
    with torch.no_grad():
        for folder in folders:
            ds = datasets.ImageFolder(str(folder), transform=transform)
            for x, _ in torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers):
                logits = net(x)
                if ood:
                    logits.softmax(1).amax(1), torch.logsumexp(logits, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512, help="images in the ID folder and in the OOD folder")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--arch", default="mobilenetv3_small_100")
    add_common_args(parser, repeats=3)
    args = parser.parse_args()
    device = setup(args)
    import jemeval

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        id_dir, ood_dir = write_folders(root, args.n, args.seed)
        model = jemeval.load_model(publish_timm(root, args.arch)).eval()
        net, mean, std = model.net, model.normalization["mean"], model.normalization["std"]
        print(header(f"jemeval vs ImageFolder + DataLoader: {args.n} 224x224 JPEGs per folder, batch {args.batch}, "
                     f"timm {args.arch}", device))
        print(f"{'command':<8} {'workers':>7} {'plain img/s':>12} {'jemeval img/s':>14} {'ratio':>6}")
        context = {"batch_size": args.batch, "progress": False, "seed": 0, "cache": False}
        for workers in (int(w) for w in args.workers.split(",")):
            runs = {
                "eval": (lambda w=workers: plain_loop(net, [id_dir], mean, std, args.batch, w, False),
                         lambda w=workers: jemeval.evaluate(model, f"folder:{id_dir}", workers=w, **context), 1),
                "ood": (lambda w=workers: plain_loop(net, [id_dir, ood_dir], mean, std, args.batch, w, True),
                        lambda w=workers: jemeval.evaluate_ood(model, f"folder:{ood_dir}", id=f"folder:{id_dir}",
                                                               scores="maxprob,energy", workers=w, **context), 2),
            }
            for name, (plain, ours, sets) in runs.items():
                t = interleave({"plain": plain, "jemeval": ours}, args.repeats, device)
                images = sets * args.n
                print(f"{name:<8} {workers:>7} {images / t['plain']['wall']:12.1f} "
                      f"{images / t['jemeval']['wall']:14.1f} {t['plain']['wall'] / t['jemeval']['wall']:6.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
