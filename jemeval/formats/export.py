"""``jemeval export``: a model jemeval loads, written in a format other tools read (safetensors).

Any checkpoint :func:`jemeval.formats.load.load_model` reads (jemeval's own, a JEM release file, a
plugin's layout) is exported from the model it builds, so the header always names a registered
jemeval architecture with its options (:mod:`jemeval.formats.safetensors`).
"""
from __future__ import annotations

import os
from collections.abc import Sequence

from jemeval.errors import UsageError, did_you_mean
from jemeval.formats.load import load_model
from jemeval.formats.safetensors import export_safetensors
from jemeval.provenance import provenance
from jemeval.results import Result

EXPORT_FORMATS = ("safetensors",)


def export(model_path: str | os.PathLike, out: str | os.PathLike, *, format: str = "safetensors",
           classes: Sequence[str] | None = None) -> Result:
    """Write the model of ``model_path`` to ``out`` in ``format``; one record saying what was written.

    ``classes`` names the classes (stored in the header; model hubs show them). The header's
    provenance records the source file's SHA-256 and the source checkpoint's own provenance.
    """
    if format not in EXPORT_FORMATS:
        raise UsageError(f"unknown export format {format!r}{did_you_mean(format, EXPORT_FORMATS)}; choose "
                         f"{', '.join(EXPORT_FORMATS)}", param="format")
    model = load_model(model_path)
    prov = provenance(command="export", model=model, settings={"format": format})
    prov["source"] = model.metadata.get("provenance") or None
    record = export_safetensors(model, out, classes=None if classes is None else list(classes), provenance=prov)
    return Result([{"source": str(model_path), **record}], provenance=prov)
