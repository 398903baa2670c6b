"""Which files a dataset spec names, and the hash of their contents.

``folder:DIR``, ``npz:FILE``, ``interp:npz:FILE``, an option holding a path: :func:`dataset_files`
finds them; :func:`dataset_sha256` hashes their contents (every file read once per process,
:func:`jemeval.provenance.file_sha256`), what the report's cache and every result's provenance
(:func:`data_hashes`, ``data_sha256``) record of the data; :func:`names_no_path` tells a plain
registered name, the only kind of spec a checkpoint may choose (it cannot point at local files).
Imported from :mod:`jemeval.data` as well, where they lived first.
"""
from __future__ import annotations

from pathlib import Path

from jemeval.errors import JemevalError
from jemeval.provenance import content_sha256
from jemeval.registry import parse_spec


def dataset_files(spec: str) -> list[Path]:
    """The existing files and folders a dataset spec names (npz:FILE, folder:DIR, interp:npz:FILE,
    an option holding a path): what a command reads when it loads the set, and what a cache of
    results derived from it is keyed on (:func:`dataset_sha256`). A malformed spec names none
    (loading it reports why)."""
    try:
        parsed = parse_spec(spec)
    except JemevalError:
        return []
    found = []
    for text in [parsed.variant, *parsed.options.values()]:
        if not isinstance(text, str) or not text:
            continue
        if Path(text).expanduser().exists():
            found.append(Path(text).expanduser())
        elif ":" in text:
            found.extend(dataset_files(text))
    return found


def names_no_path(spec: str) -> bool:
    """Whether a dataset spec is a plain name (``cifar10``, ``digits[0-4]``): no ``:ARG`` and no
    options, so it cannot point at a local file or folder. A spec read from a file someone else
    wrote (a checkpoint's recorded training set) is used only when this holds: a downloaded
    checkpoint must not choose which local paths a command reads (``folder:/`` would crawl the disk)."""
    try:
        parsed = parse_spec(spec)
    except JemevalError:
        return False
    return parsed.variant is None and not parsed.options and not dataset_files(spec)


def dataset_sha256(spec: str) -> str | None:
    """The SHA-256 of the contents of the files a dataset spec names, or None for a set that names
    none (a registered set such as ``digits``, identified by its name)."""
    files = dataset_files(spec)
    return content_sha256(files) if files else None


def data_hashes(specs) -> dict[str, str]:
    """``{spec: SHA-256 of its files}`` for the dataset specs that name files (:func:`dataset_sha256`;
    each file is read once per process): what a result's provenance records as its data."""
    hashes = {spec: dataset_sha256(spec) for spec in dict.fromkeys(s for s in specs if isinstance(s, str) and s)}
    return {spec: h for spec, h in hashes.items() if h is not None}
