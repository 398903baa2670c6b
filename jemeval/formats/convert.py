"""``jemeval convert``: write a foreign checkpoint as a jemeval checkpoint, with its source recorded.

A ``jemeval export`` safetensors file is converted too (:func:`convert_export`): any model
``--model`` reads can be written as a ``.pt`` checkpoint (docs/interop.md).

The layout is found among the registered ones (``register_checkpoint_layouts``): first those that
recognise the path itself (``match_path``: a TensorFlow checkpoint prefix...), then those that
recognise the file's contents (``match``). The output records the source layout and SHA-256, the
SGLD settings the layout's authors sample with (BatchNorm mode, clamp), provenance and (optionally)
the training dataset. :func:`convert_found` is shared with plugin converters (jemeval-igebm's).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from jemeval.energy.model import EnergyModel
from jemeval.errors import UsageError, did_you_mean
from jemeval.formats.foreign import (
    FoundCheckpoint,
    foreign_model,
    identify_foreign,
    identify_path,
    unknown_layout_error,
)
from jemeval.formats.load import model_from_checkpoint
from jemeval.formats.native import check_finite, is_jemeval_checkpoint, read_checkpoint, save_checkpoint
from jemeval.formats.safetensors import FORMAT as SAFETENSORS_FORMAT
from jemeval.formats.safetensors import is_safetensors, read_safetensors
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
    """Save a converted model as a jemeval checkpoint (with provenance) and return the Result record."""
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


def convert_found(found: FoundCheckpoint, src: Path | str, dst: Path | str, *, dataset: str | None = None,
                  command: str = "convert") -> Result:
    """Build a found checkpoint's model and write it to ``dst`` (checked by :func:`check_output_path`)."""
    model = foreign_model(found, str(src))
    if found.replay_buffer is not None:
        check_finite(found.replay_buffer, "its replay buffer", str(src))
    source_sha256 = found.source_sha256 if found.source_sha256 is not None else file_sha256(src)
    return write_converted(
        model, found.source or str(src), dst, layout=found.layout, source_sha256=source_sha256, dataset=dataset,
        replay_buffer=found.replay_buffer, config=found.source_config(),
        extra={"bn_mode": found.sgld.get("bn_mode"), **found.notes}, command=command,
    )


def find_layout(src: Path) -> FoundCheckpoint:
    """The registered layout of ``src``: by its path, else by its contents; one line when there is none."""
    found = identify_path(src)
    if found is not None:
        return found
    obj = read_checkpoint(src)
    if is_jemeval_checkpoint(obj):
        raise UsageError(f"{str(src)!r} is already a jemeval checkpoint; nothing to convert")
    found = identify_foreign(obj)
    if found is None:
        raise unknown_layout_error(obj, str(src))
    return found


def convert(path_in: str | Path, path_out: str | Path, *, dataset: str | None = None) -> Result:
    """Write the foreign checkpoint ``path_in`` as a jemeval checkpoint at ``path_out``.

    The output records the source layout, the source's SHA-256, the SGLD settings the layout's
    authors sample with (``config["sgld"]``: the BatchNorm mode, a clamp) and, with ``dataset``, the
    training set (which a foreign checkpoint does not name; ``ood`` and ``calibrate`` use it as the
    in-distribution default). Returns a :class:`~jemeval.results.Result` describing the output.
    """
    src, dst = Path(path_in), Path(path_out)
    check_output_path(src, dst)
    if dataset is not None:
        check_dataset_name(dataset)
    if src.is_file() and is_safetensors(src):
        return convert_export(src, dst, dataset=dataset)
    return convert_found(find_layout(src), src, dst, dataset=dataset)


def convert_export(src: Path, dst: Path, *, dataset: str | None = None) -> Result:
    """A ``jemeval export`` safetensors file as a jemeval ``.pt`` checkpoint: the model its header
    describes (read with every check of :func:`jemeval.formats.load.load_model`), its recorded
    dataset (unless ``dataset`` is given), class names and training config (the SGLD settings) kept."""
    obj = read_safetensors(src)
    model = model_from_checkpoint(obj, str(src))
    model.metadata["classes"] = obj.get("classes")
    recorded = {k: v for k, v in (obj.get("config") or {}).items() if k not in ("source_layout", "source_file",
                                                                                "source_sha256")}
    return write_converted(model, str(src), dst, layout=SAFETENSORS_FORMAT, source_sha256=file_sha256(src),
                           dataset=dataset if dataset is not None else obj.get("dataset"), config=recorded,
                           extra={"bn_mode": (recorded.get("sgld") or {}).get("bn_mode")})


def check_dataset_name(dataset: str) -> None:
    known = names("dataset")
    name = parse_spec(dataset).name
    if name not in known:
        raise UsageError(f"unknown dataset {dataset!r}{did_you_mean(name, known)}; known datasets: {', '.join(known)}")
