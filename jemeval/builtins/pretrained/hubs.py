"""Where pretrained weights live, and reading them without running code.

Two caches, each the library's own: the Hugging Face Hub cache (timm's weights and ``hf:``
exports: ``models--ORG--NAME/{blobs,refs,snapshots}``; ``HF_HUB_CACHE``, ``HF_HOME``) and torch
hub's (torchvision's and pytorch-ood's: ``$TORCH_HOME/hub/checkpoints/FILE``). Nothing is fetched
unless the caller allows it (``--download``, ``load_model(..., download=True)``), and never while
``HF_HUB_OFFLINE`` is set; a missing file is one line saying how to fetch it.

A cached file is checked against the hash its cache names it by before it is read: a Hub blob is
named by its SHA-256, torch hub's files carry a SHA-256 prefix (``resnet18-f37072fd.pth``) and
pytorch-ood's registry records the full SHA-256. The libraries check these only while
downloading, so a file replaced in the cache later would otherwise be read, and reported in
provenance, as the published weights.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from jemeval.errors import CheckpointError
from jemeval.formats.native import pickle_refusal
from jemeval.provenance import file_sha256

#: torch.load reads tensors only while this is set, whatever weights_only its caller passes
FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
_FORCE_PICKLE = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
_TRUE = {"1", "on", "yes", "true", "y"}
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: how to allow a download, in every "not cached" message
#: (``download=True`` in Python; the command line shows ``--download``: :func:`jemeval.cli.flag_message`)
FETCH = "fetch it once with download=True"


def fetch_error(message: str) -> CheckpointError:
    """The error of a weights file that is missing or must be fetched again (``message`` says how, with
    :data:`FETCH`): about the ``download`` parameter, which the command line writes as its flag."""
    error = CheckpointError(message)
    error.param = "download"
    return error


@contextlib.contextmanager
def weights_only_loads() -> Iterator[None]:
    """Every ``torch.load`` in the block reads tensors only (``TORCH_FORCE_WEIGHTS_ONLY_LOAD``, read by
    torch at each call). torchvision's and pytorch-ood's loaders go through
    ``torch.hub.load_state_dict_from_url``, which passes ``weights_only=False``: full pickle, so a
    file in the cache could run code. Inside the block such a file fails to load instead."""
    saved = {key: os.environ.get(key) for key in (FORCE_WEIGHTS_ONLY, _FORCE_PICKLE)}
    os.environ[FORCE_WEIGHTS_ONLY] = "1"
    os.environ.pop(_FORCE_PICKLE, None)  # torch refuses both set at once
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def library_error(exc: Exception, what: str, path: Path | str | None) -> CheckpointError:
    """One line for an exception a library raised while building or loading ``what``."""
    text = str(exc)
    if path is not None and ("Weights only load failed" in text or "Unsupported global" in text):
        return pickle_refusal(str(path), text)
    detail = (text.strip().splitlines() or [type(exc).__name__])[0][:200]
    return CheckpointError(f"{what}: loading {str(path or 'its weights')!r} failed ({type(exc).__name__}: {detail})")


def weights_record(source: str, name: str, revision: str | None, path: Path) -> dict:
    """``model.metadata["checkpoint"]``, which provenance records: where the weights came from and
    the SHA-256 of the file that was read."""
    return {"path": str(path), "sha256": file_sha256(path), "source": source, "name": name, "revision": revision}


def regular_file(path: Path, what: str) -> Path:
    """``path`` when it is a regular file (after symlinks); a FIFO or device would block the reader."""
    if path.exists() and not path.is_file():
        raise fetch_error(f"{what}: cache entry {str(path)!r} is not a regular file; delete it and {FETCH}")
    return path


# -- the Hugging Face Hub cache -------------------------------------------------------------------
def hf_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) as set now (huggingface_hub reads it once, at import)."""
    return any(os.environ.get(key, "").strip().lower() in _TRUE for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hf_cache_dir() -> Path:
    """The Hub cache folder as the environment names it now: ``HF_HUB_CACHE``, ``HF_HOME``/hub, or
    ``~/.cache/huggingface/hub`` (passed explicitly, so a variable set after import still counts)."""
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(key):
            return Path(os.environ[key]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def model_cache_dirs() -> list[tuple[str, Path]]:
    """(what, folder) of every cache the model sources read weights from, as the environment names
    it now: the Hugging Face Hub cache (timm, hf:) and torch hub's folder (``$TORCH_HOME/hub``:
    torchvision's and pytorch-ood's weights, timm's URL ones). A file there is what a later load
    trusts, so no command writes into them (:func:`jemeval.cli.paths.check_paths`)."""
    import torch.hub

    return [("the Hugging Face cache", hf_cache_dir()),
            ("torch hub's cache ($TORCH_HOME/hub)", Path(torch.hub.get_dir()))]


def hub_revision(path: Path) -> str | None:
    """The commit a Hub cache file belongs to: the folder after ``snapshots``."""
    parts = Path(path).parts
    return parts[parts.index("snapshots") + 1] if "snapshots" in parts[:-1] else None


def cached_hub_file(repo: str, filenames: list[str], revision: str | None, what: str) -> Path | None:
    """The first of ``filenames`` that the Hub cache holds for ``repo`` at ``revision`` (default: the
    cached ``main``), without any network; None when none is cached."""
    from huggingface_hub import try_to_load_from_cache

    for name in filenames:
        try:
            found = try_to_load_from_cache(repo, name, cache_dir=str(hf_cache_dir()), revision=revision)
        except ValueError as exc:  # HFValidationError: not a repository id
            raise CheckpointError(f"{what}: {repo!r} is not a Hugging Face repository id ({exc})") from None
        if isinstance(found, str):
            return regular_file(Path(found), what)
    return None


def check_hub_blob(path: Path, what: str) -> Path:
    """A Hub cache file whose blob is named by a SHA-256 (every LFS file: weights) must have that
    SHA-256; the snapshot path is returned (its name keeps the file's extension)."""
    blob = regular_file(path, what).resolve()
    if _SHA256.fullmatch(blob.name) and file_sha256(blob) != blob.name:
        raise fetch_error(f"{what}: the Hugging Face cache file {str(path)!r} does not have the SHA-256 its blob "
                          f"is named by: the cache entry was altered or damaged; delete {str(blob)!r} and {FETCH}")
    return path


def hub_file(repo: str, filenames: list[str], revision: str | None, *, download: bool, what: str) -> Path:
    """The cached (checked) file of ``repo``; fetched into the cache first only when ``download``."""
    found = cached_hub_file(repo, filenames, revision, what)
    if found is not None:
        return check_hub_blob(found, what)
    where = f"{repo}{'@' + revision if revision else ''} ({' or '.join(filenames)})"
    if not download:
        raise fetch_error(f"{what}: {where} is not in the Hugging Face cache {str(hf_cache_dir())!r}; {FETCH}")
    if hf_offline():
        raise CheckpointError(f"{what}: {where} is not in the Hugging Face cache {str(hf_cache_dir())!r} and "
                              "HF_HUB_OFFLINE is set; unset it to fetch the file")
    return check_hub_blob(_download(repo, filenames, revision, what), what)


def _download(repo: str, filenames: list[str], revision: str | None, what: str) -> Path:
    """The first of ``filenames`` the repository has, fetched into the cache by huggingface_hub. Each is
    first asked for once (:func:`_reachable`): offline, huggingface_hub would retry for half a minute,
    a warning per try, before giving up."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    for name in filenames:
        if not _reachable(repo, name, revision, what):
            continue
        try:
            with contextlib.redirect_stdout(sys.stderr):
                return Path(hf_hub_download(repo, name, revision=revision, cache_dir=str(hf_cache_dir())))
        except EntryNotFoundError as exc:
            if not isinstance(exc, LocalEntryNotFoundError):  # the repository has no such file: try the next
                continue
            raise CheckpointError(f"{what}: fetching {name!r} from {repo!r} failed (the Hub cannot be "
                                  "reached)") from None
        except Exception as exc:  # noqa: BLE001 - no network, unknown repository or revision, ...: one line
            raise CheckpointError(f"{what}: fetching {name!r} from {repo!r} failed ({_first_line(exc)})") from None
    raise CheckpointError(f"{what}: repository {repo!r} has none of {', '.join(filenames)}")


def _reachable(repo: str, name: str, revision: str | None, what: str) -> bool:
    """Whether the Hub has ``name`` in ``repo``, asked once with no retries: False when it answers that
    the file does not exist; one line when the Hub cannot be reached or refuses (unknown repository or
    revision, a gated one)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    try:
        get_hf_file_metadata(hf_hub_url(repo, name, revision=revision), timeout=10)
    except EntryNotFoundError:
        return False
    except HfHubHTTPError as exc:
        raise CheckpointError(f"{what}: fetching {name!r} from {repo!r} failed ({_first_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - httpx's connection errors and timeouts, an unusable proxy, ...
        raise CheckpointError(f"{what}: fetching {name!r} from {repo!r} failed: the Hugging Face Hub cannot be "
                              f"reached ({_first_line(exc)}); connect to the internet, or put the file in the cache "
                              f"{str(hf_cache_dir())!r}") from None
    return True


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


# -- torch hub's cache (torchvision, pytorch-ood) -------------------------------------------------
def torch_hub_file(file_name: str) -> Path:
    """Where torch hub keeps ``file_name``: ``$TORCH_HOME/hub/checkpoints`` (read now)."""
    import torch.hub

    return Path(torch.hub.get_dir()) / "checkpoints" / file_name


def check_torch_hub_file(path: Path, what: str, *, sha256: str | None = None) -> Path:
    """A torch hub cache file checked against the full ``sha256`` (pytorch-ood's registry) or else the
    SHA-256 prefix its name carries (``resnet18-f37072fd.pth``, what torch hub's check_hash uses)."""
    regular_file(path, what)
    prefix = sha256 or _name_prefix(path.name)
    digest = file_sha256(path)
    if prefix and not digest.startswith(prefix.lower()):
        expected = "the SHA-256 its registry entry records" if sha256 else f"the SHA-256 prefix {prefix} of its name"
        raise fetch_error(f"{what}: the cached file {str(path)!r} does not have {expected}: the cache entry was "
                          f"altered or damaged; delete it and {FETCH}")
    return path


def _name_prefix(name: str) -> str | None:
    import torch.hub

    found = torch.hub.HASH_REGEX.search(name)
    return found.group(1) if found and found.group(1) else None
