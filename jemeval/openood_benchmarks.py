"""OpenOOD v1.5's benchmarks as its download script leaves them on disk: which image list is which set.

Source: https://github.com/Jingkang50/OpenOOD, ``openood/evaluation_api/datasets.py`` (``DATA_INFO``,
v1.5). Read through a code index: the versions of that file it holds from Jingkang50/OpenOOD itself
predate v1.5's ImageNet sets (``species``, ``imagenet_21k`` as near-OOD); v1.5's entries below
(near ``ssb_hard``, ``ninco``; far ``inaturalist``, ``textures`` in images_classic, ``openimage_o``;
ImageNet-200 with its own ``benchmark_imglist/imagenet200/test_*.txt``; CIFAR unchanged) were read from
copies of v1.5's file in other repositories of the index (three of them, which agree with each other).
The download script (``scripts/download/download.py``)
leaves a folder holding

* ``images_largescale/`` (ImageNet-1k val as ``imagenet_1k/``, ``ssb_hard/``, ``ninco/``,
  ``inaturalist/``, ``openimage_o/``, ...), ``images_classic/`` (``cifar10/``, ``tin/``, ``texture/``, ...),
* ``benchmark_imglist/<benchmark>/<split>_<set>.txt``: one image a line, ``relative/path label``,
  the path relative to the images folder of the set.

``--data-root`` pointing at that folder makes ``--id imagenet --ood near,far`` OpenOOD v1.5's
ImageNet-1k protocol with exactly its lists: ID = ``test_imagenet.txt`` (ImageNet-1k val), near =
SSB-hard and NINCO, far = iNaturalist, Textures and OpenImage-O. ``imagenet200`` is its ImageNet-200
benchmark (the same OOD sets, its own lists), and ``openood:cifar10`` / ``openood:cifar100`` its
CIFAR benchmarks read from its lists (plain ``cifar10`` stays torchvision's CIFAR). Each OOD set is
named as OpenOOD names it (``texture`` for CIFAR, ``textures`` for ImageNet), and its ``near`` and
``far`` groups are its configs' groups. The readers are in :mod:`jemeval.builtins.openood_lists`.
"""
from __future__ import annotations

from dataclasses import dataclass

from jemeval.registry import parse_spec

SOURCE = "https://github.com/Jingkang50/OpenOOD/blob/main/openood/evaluation_api/datasets.py (DATA_INFO, v1.5)"
LISTS = "benchmark_imglist"
LARGE, CLASSIC = "images_largescale", "images_classic"
#: the ID splits OpenOOD lists (``<split>_<benchmark>.txt``)
ID_SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class ImageList:
    """One list: the images folder its paths are relative to, and the list file (both under the data root)."""

    images: str
    path: str


@dataclass(frozen=True)
class Benchmark:
    """One OpenOOD benchmark: its number of classes, the images folder of its ID lists, its groups
    (near/far -> set names in OpenOOD's order) and the images folder of each OOD set."""

    name: str
    num_classes: int
    images: str
    groups: dict[str, tuple[str, ...]]
    folders: dict[str, str]

    def id_list(self, split: str) -> ImageList:
        return ImageList(self.images, f"{LISTS}/{self.name}/{split}_{self.name}.txt")

    def ood_list(self, set_name: str) -> ImageList:
        return ImageList(self.folders[set_name], f"{LISTS}/{self.name}/test_{set_name}.txt")

    @property
    def ood_sets(self) -> tuple[str, ...]:
        return tuple(s for group in self.groups.values() for s in group)


def _imagenet(name: str, num_classes: int) -> Benchmark:
    groups = {"near": ("ssb_hard", "ninco"), "far": ("inaturalist", "textures", "openimage_o")}
    folders = {s: LARGE for g in groups.values() for s in g} | {"textures": CLASSIC}
    return Benchmark(name, num_classes, LARGE, groups, folders)


def _cifar(name: str, num_classes: int, other: str) -> Benchmark:
    groups = {"near": (other, "tin"), "far": ("mnist", "svhn", "texture", "places365")}
    return Benchmark(name, num_classes, CLASSIC, groups, {s: CLASSIC for g in groups.values() for s in g})


BENCHMARKS: dict[str, Benchmark] = {
    "imagenet": _imagenet("imagenet", 1000),
    "imagenet200": _imagenet("imagenet200", 200),
    "cifar10": _cifar("cifar10", 10, "cifar100"),
    "cifar100": _cifar("cifar100", 100, "cifar10"),
}
#: the dataset names that are OpenOOD benchmarks' ID sets by themselves (no other source of them exists)
ID_NAMES = ("imagenet", "imagenet200")


def benchmark_of(id_name: str) -> Benchmark | None:
    """The OpenOOD benchmark whose ID set ``id_name`` is (``imagenet``, ``imagenet200``,
    ``openood:cifar10``), else None."""
    spec = parse_spec(id_name)
    if spec.name in ID_NAMES and spec.variant is None:
        return BENCHMARKS[spec.name]
    if spec.name == "openood" and spec.variant in BENCHMARKS:
        return BENCHMARKS[spec.variant]
    return None


def list_spec(benchmark: str, set_name: str) -> str:
    """The dataset spec of an OOD set of ``benchmark`` read from its list: ``openood:imagenet/ssb_hard``."""
    return f"openood:{benchmark}/{set_name}"
