"""OpenOOD v1.5's image lists read as they lie under the data root (:mod:`jemeval.openood_benchmarks`
says which list is which set; source: OpenOOD's ``openood/evaluation_api/datasets.py``, DATA_INFO).

* ``imagenet``, ``imagenet200``: the ID set of the benchmark, split ``test`` = ``test_<name>.txt``
  (ImageNet-1k val for ``imagenet``), ``val`` and ``train`` likewise. The labels are the list's
  (ImageNet class indices for ``imagenet``), so a 1000-class ImageNet model needs no class map.
* ``openood:BENCHMARK`` (``openood:cifar10``): the same for any benchmark; ``openood:BENCHMARK/SET``
  (``openood:imagenet/ssb_hard``): one of its OOD sets, unlabelled (y = -1), every split the same images.

A list line is ``relative/path label`` (OpenOOD splits it at the first space). Its path must stay
inside the images folder: an absolute path or a ``..`` is refused in one line (the folders themselves
may be links, as OpenOOD users keep images on another disk). A list naming files that are not there
is one line naming how many and the first. Labels are read as whole numbers, never evaluated
(OpenOOD's ``ast.literal_eval`` of the rest of the line is not needed for a label). The images go
through the model's own preprocessing when it has one (``preprocess``: timm's pretrained config,
torchvision's weights transforms; :func:`jemeval.builtins.file_datasets.preprocessing_record`),
recorded in the set's ``info``.
"""
from __future__ import annotations

from pathlib import Path, PurePosixPath, PureWindowsPath

from jemeval.builtins.file_datasets import ImageFiles, _resize_to, _tv_transform, preprocessing_record
from jemeval.errors import DatasetNotFoundError, UsageError, did_you_mean
from jemeval.hookspecs import hookimpl
from jemeval.openood_benchmarks import BENCHMARKS, ID_SPLITS, LISTS, SOURCE, Benchmark, ImageList

HOW = ("point --data-root (data_root) at the folder OpenOOD's scripts/download/download.py fills: images_largescale/, "
       "images_classic/ and benchmark_imglist/ (docs/evaluation.md, \"OpenOOD's data as it lies\")")


def benchmark_named(name: str, root: Path) -> Benchmark:
    """The benchmark ``name``, whose list folder must be under ``root``; one line (with a did-you-mean)
    for a name OpenOOD has no benchmark of, or a data root without its lists."""
    if name not in BENCHMARKS:
        raise UsageError(f"OpenOOD has no benchmark {name!r}{did_you_mean(name, BENCHMARKS)}; jemeval reads "
                         f"{', '.join(BENCHMARKS)}")
    lists = root / LISTS
    if not (lists / name).is_dir():
        if not lists.is_dir():
            nested = " (it has data/benchmark_imglist: point at data/)" if (root / "data" / LISTS).is_dir() else ""
            raise DatasetNotFoundError(f"data root {str(root)!r} has no {LISTS}/ folder{nested}: {HOW}")
        have = sorted(d.name for d in lists.iterdir() if d.is_dir())
        raise DatasetNotFoundError(f"{str(lists)!r} has no folder {name!r}{did_you_mean(name, have)} (it holds "
                                   f"{', '.join(have) or 'none'}); {HOW}")
    return BENCHMARKS[name]


def _escapes(rel: str) -> bool:
    """Whether a list path leaves its images folder: absolute (POSIX or Windows) or with a ``..``."""
    posix, win = PurePosixPath(rel), PureWindowsPath(rel)
    return posix.is_absolute() or win.is_absolute() or bool(win.drive) or ".." in posix.parts or ".." in win.parts


def read_list(root: Path, entry: ImageList, *, labelled: bool) -> tuple[list[Path], list[int] | None]:
    """(files, labels or None) of one list, every file checked to be there; one line for a list that
    is missing, a line that is not ``path label``, a path outside the images folder, missing files."""
    path, images = root / entry.path, root / entry.images
    if not path.is_file():
        raise DatasetNotFoundError(f"OpenOOD list {str(path)!r} does not exist; {HOW}")
    lines = [(i, line.strip()) for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)]
    rows = [(i, *line.split(" ", 1)) for i, line in lines if line]
    bad = next((r for r in rows if len(r) != 3), None)
    if not rows or bad is not None:
        what = f"line {bad[0]} is {bad[1]!r}" if bad else "it lists no image"
        raise UsageError(f"{str(path)!r}: {what}; each line of an OpenOOD list is 'relative/path label'")
    out = next((r for r in rows if _escapes(r[1])), None)
    if out is not None:
        raise UsageError(f"{str(path)!r}, line {out[0]}: {out[1]!r} leaves {str(images)!r} (an absolute path or "
                         "'..'); list paths are relative to the images folder and stay inside it")
    files = [images / rel for _, rel, _ in rows]
    missing = [k for k, f in enumerate(files) if not f.is_file()]
    if missing:
        first = rows[missing[0]]
        raise DatasetNotFoundError(f"{len(missing)} of the {len(files)} images {str(path)!r} names are not under "
                                   f"{str(images)!r} (the first: line {first[0]}, {first[1]!r}); {HOW}")
    return files, (_labels(path, rows) if labelled else None)


def _labels(path: Path, rows: list[tuple[int, str, str]]) -> list[int]:
    """The label of every row, a whole number >= 0 (read, never evaluated)."""
    text = [label.strip() for _, _, label in rows]
    bad = next((k for k, t in enumerate(text) if not t.isdigit()), None)
    if bad is not None:
        raise UsageError(f"{str(path)!r}, line {rows[bad][0]}: the label {text[bad]!r} is not a class index (a whole "
                         "number >= 0); an in-distribution list's lines are 'relative/path class-index'")
    return [int(t) for t in text]


def list_images(root: Path, benchmark: Benchmark, set_name: str | None, split: str, input_shape,
                preprocess: dict | None) -> ImageFiles:
    """The ID set of ``benchmark`` (``set_name`` None; ``split``'s list) or its OOD set ``set_name``."""
    if set_name is None:
        if split not in ID_SPLITS:
            raise UsageError(f"OpenOOD's {benchmark.name} lists the splits {', '.join(ID_SPLITS)}, not {split!r}")
        entry = benchmark.id_list(split)
    else:
        entry = benchmark.ood_list(set_name)
    files, labels = read_list(root, entry, labelled=set_name is None)
    shape = tuple(int(s) for s in input_shape) if input_shape is not None else (3, 224, 224)
    record = preprocessing_record(shape, preprocess)
    info = {"source": SOURCE, "benchmark": benchmark.name, "set": set_name or benchmark.name,
            "list": str(root / entry.path), "images": str(root / entry.images), "files": len(files),
            "input_shape": list(shape), "preprocessing": record}
    ds = ImageFiles(files, _tv_transform(_resize_to(shape, preprocess)), name=set_name or benchmark.name,
                    input_shape=shape, info=info, labels=labels)
    ds.num_classes = benchmark.num_classes if set_name is None else None
    ds.splits = _present_splits(root, benchmark) if set_name is None else ()
    return ds


def _present_splits(root: Path, benchmark: Benchmark) -> tuple[str, ...]:
    """The ID splits whose list is there and whose first image is: OpenOOD's download script leaves
    ``train_imagenet.txt`` without ImageNet's training images, and that split then is not there."""
    present = []
    for split in ID_SPLITS:
        entry = benchmark.id_list(split)
        path = root / entry.path
        first = next((line.split(" ", 1)[0] for line in _head(path) if line.strip()), None) if path.is_file() else None
        if first is not None and not _escapes(first) and (root / entry.images / first).is_file():
            present.append(split)
    return tuple(present)


def _head(path: Path, lines: int = 4) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return [fh.readline().strip() for _ in range(lines)]


def imagenet(split, root, download, *, input_shape=None, preprocess=None):
    """OpenOOD v1.5's ImageNet-1k ID set (``test``: ImageNet-1k val, ``test_imagenet.txt``)."""
    return list_images(Path(root), benchmark_named("imagenet", Path(root)), None, split, input_shape, preprocess)


def imagenet200(split, root, download, *, input_shape=None, preprocess=None):
    """OpenOOD v1.5's ImageNet-200 ID set (``test_imagenet200.txt``; labels index its 200 classes)."""
    return list_images(Path(root), benchmark_named("imagenet200", Path(root)), None, split, input_shape, preprocess)


def openood(split, root, download, *, variant=None, input_shape=None, preprocess=None):
    """``openood:BENCHMARK`` (its ID set) or ``openood:BENCHMARK/SET`` (one of its OOD sets)."""
    name, _, set_name = (variant or "").partition("/")
    if not name:
        raise UsageError(f"name the OpenOOD benchmark, e.g. openood:imagenet or openood:imagenet/ssb_hard "
                         f"({', '.join(BENCHMARKS)})")
    benchmark = benchmark_named(name, Path(root))
    if set_name and set_name not in benchmark.ood_sets:
        raise UsageError(f"OpenOOD's {name} benchmark has no OOD set {set_name!r}"
                         f"{did_you_mean(set_name, benchmark.ood_sets)}; its sets: {', '.join(benchmark.ood_sets)}")
    return list_images(Path(root), benchmark, set_name or None, split, input_shape, preprocess)


@hookimpl
def register_datasets(register):
    register("imagenet", imagenet)
    register("imagenet200", imagenet200)
    register("openood", openood)
