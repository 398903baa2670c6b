"""``jemeval convert``: write a foreign checkpoint as a jemeval checkpoint, with its source recorded.

The output records the source layout and SHA-256, the BatchNorm mode the layout's authors sample
with, provenance and (optionally) the training dataset. :func:`write_converted` is shared with
plugin converters (jemeval-igebm's TensorFlow one).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jemeval.energy.model import EnergyModel
from jemeval.errors import UsageError, did_you_mean
from jemeval.formats.foreign import identify_foreign, unknown_layout_error
from jemeval.formats.native import check_finite, is_jemeval_checkpoint, read_checkpoint, save_checkpoint
from jemeval.plugins import names
from jemeval.provenance import file_sha256, provenance
from jemeval.registry import parse_spec
from jemeval.results import Result


def check_output_path(src: Path | str, dst: Path | str) -> Path:
    """A converter's output: a new .pt file that is not the input."""
    src, dst = Path(src), Path(dst)
    if dst.exists():
        what = "is the input file" if dst.resolve() == src.resolve() else "already exists"
        raise UsageError(f"output {str(dst)!r} {what}; remove it or give another output path")
    if dst.suffix != ".pt":
        raise UsageError(f"output must be a .pt file, got {str(dst)!r}")
    return dst


def write_converted(model: EnergyModel, source: str, dst: Path | str, *, layout: str, source_sha256: Any,
                    dataset: str | None = None, replay_buffer: Any = None, config: dict | None = None,
                    extra: dict | None = None, command: str = "convert"):
    """Save a converted model as a jemeval checkpoint (with provenance) and return the Result record.

    Shared by ``jemeval convert`` and plugin converters (e.g. jemeval-igebm's TensorFlow one).
    """
    config = {"source_layout": layout, "source_file": source, "source_sha256": source_sha256, **(config or {})}
    source_file = source if Path(source).is_file() else None  # a TF checkpoint is a prefix, hashed in settings
    prov = provenance(command=command, checkpoint=source_file, settings={"source_layout": layout, "dataset": dataset,
                                                                          "source_sha256": source_sha256})
    save_checkpoint(dst, model, dataset=dataset, replay_buffer=replay_buffer, config=config, provenance=prov)
    record = {
        "source": source, "output": str(dst), "layout": layout, "arch": model.arch, "arch_options": model.arch_options,
        "num_classes": model.num_classes, "dataset": dataset,
        "replay_buffer": None if replay_buffer is None else list(replay_buffer.shape),
        "source_sha256": source_sha256, **(extra or {}),
    }
    return Result([record], provenance=prov)


# -- jemeval convert ---------------------------------------------------------------------------
def _looks_like_tensorflow(path: Path) -> bool:
    if path.is_dir():
        return (path / "checkpoint").exists()
    return path.suffix == ".index" or re.search(r"\.data-\d+-of-\d+$", path.name) is not None or (
        not path.exists() and Path(f"{path}.index").exists()
    )


def convert(path_in: str | Path, path_out: str | Path, *, dataset: str | None = None):
    """Write the foreign checkpoint ``path_in`` as a jemeval checkpoint at ``path_out``.

    The output records the source layout, the source file's SHA-256, the BatchNorm mode the
    layout's authors sample with (``config["sgld"]["bn_mode"]``) and, with ``dataset``, the
    training set (which a foreign checkpoint does not name; ``ood`` and ``calibrate`` use it as
    the in-distribution default). Returns a :class:`~jemeval.results.Result` describing the output.
    """
    src, dst = Path(path_in), Path(path_out)
    if _looks_like_tensorflow(src):
        raise UsageError(
            f"{str(src)!r} is a TensorFlow checkpoint; IGEBM release checkpoints are converted by the "
            "jemeval-igebm plugin: pip install 'jemeval-igebm[tf]', then jemeval-igebm-convert IN OUT"
        )
    check_output_path(src, dst)
    if dataset is not None:
        check_dataset_name(dataset)
    obj = read_checkpoint(src)
    if is_jemeval_checkpoint(obj):
        raise UsageError(f"{str(src)!r} is already a jemeval checkpoint; nothing to convert")
    found = identify_foreign(obj)
    if found is None:
        raise unknown_layout_error(obj, str(src))
    model = found.build(str(src))
    if found.replay_buffer is not None:
        check_finite(found.replay_buffer, "its replay buffer", str(src))
    return write_converted(
        model, str(src), dst, layout=found.layout, source_sha256=file_sha256(src), dataset=dataset,
        replay_buffer=found.replay_buffer, config=found.source_config(), extra={"bn_mode": found.sgld.get("bn_mode")},
    )


def check_dataset_name(dataset: str) -> None:
    known = names("dataset")
    name = parse_spec(dataset).name
    if name not in known:
        raise UsageError(f"unknown dataset {dataset!r}{did_you_mean(name, known)}; known datasets: {', '.join(known)}")
