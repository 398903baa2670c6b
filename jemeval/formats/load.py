"""Loading a model from any checkpoint jemeval reads: its own format or a known foreign layout.

``load_model(path)`` reads the file safely (:func:`jemeval.formats.native.read_checkpoint`, or
:func:`jemeval.formats.safetensors.read_safetensors` for a ``.safetensors`` export), builds
the architecture the file names (jemeval's format, its options allow-listed) or a registered layout
recognises in it (:mod:`jemeval.formats.foreign`), loads the weights and records the file's SHA-256
for provenance. A model source (``timm:resnet18``, ``hf:ORG/NAME``: ``scheme:NAME`` naming no
file) goes to the registered layout whose ``match_path`` claims it (the built-in ones are in
:mod:`jemeval.builtins.pretrained`), which may download only inside :func:`model_downloads`.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch.nn.modules.module import (
    register_module_buffer_registration_hook,
    register_module_parameter_registration_hook,
)

from jemeval.energy.factory import create_model
from jemeval.energy.model import EnergyModel
from jemeval.errors import CheckpointError, JemevalError, UnknownNameError, UsageError, did_you_mean
from jemeval.formats.foreign import foreign_model, identify_foreign, identify_path, unknown_layout_error
from jemeval.formats.native import (
    FORMAT,
    FORMAT_VERSION,
    is_jemeval_checkpoint,
    load_state,
    looks_like_state_dict,
    read_checkpoint,
)
from jemeval.formats.safetensors import FORMAT as SAFETENSORS_FORMAT
from jemeval.formats.safetensors import is_safetensors, read_safetensors
from jemeval.plugins import get_registry
from jemeval.provenance import file_sha256
from jemeval.registry import accepted_options
from jemeval.runtime.devices import resolve_device

#: fields a jemeval checkpoint must have, and their types (a damaged file fails on the first wrong one)
_REQUIRED = {"arch": str, "num_classes": int, "input_shape": (list, tuple), "state_dict": dict}


#: option names that can make a factory open a file or fetch something (timm's checkpoint_path,
#: pretrained_cfg, ...): never taken from a checkpoint by a factory that accepts any keyword
_PATHLIKE_OPTION = re.compile(r"path|file|dir|url|cfg|cache|hub|pretrained|checkpoint|ckpt|weights", re.IGNORECASE)
_PLAIN = (bool, int, float, str, type(None))

#: sanity bounds of the fields that size a model: beyond them a file describes no real network, only
#: an allocation of terabytes (a header is a few bytes of JSON anyone can edit)
MAX_CLASSES = 2**24
MAX_INPUT_ELEMENTS = 2**31
MAX_INPUT_DIMS = 8


def _check_fields(obj: dict, path: str) -> None:
    for key, kind in _REQUIRED.items():
        if key not in obj:
            raise CheckpointError(f"{path!r} is a damaged jemeval checkpoint (no {key!r}); re-save it with "
                                  "`jemeval train` or jemeval.save_checkpoint")
        if not isinstance(obj[key], kind):
            raise CheckpointError(f"{path!r} is a damaged jemeval checkpoint ({key!r} is a {type(obj[key]).__name__})")
    if not isinstance(obj.get("arch_options", {}), dict):
        raise CheckpointError(f"{path!r} is a damaged jemeval checkpoint ('arch_options' is not a dict)")


def checkpoint_arch_options(arch: str, options: dict, path: str) -> dict:
    """The ``arch_options`` of a checkpoint that may reach the model factory (an allow-list).

    A factory with a fixed signature (wrn, cnn, most plugins) takes only its own options. No factory,
    least of all one that accepts any keyword (``timm``, which forwards them to ``timm.create_model``),
    gets an option whose name is path-like (``checkpoint_path``, ``pretrained_cfg``, ...) with a
    value, nor a value that is not plain data: a tensor-only file must not make a library open another.
    """
    try:
        accepted = accepted_options(get_registry().get("model", arch), skip=2)
    except UnknownNameError as exc:
        raise CheckpointError(f"{path!r} needs model architecture {arch!r}, which no installed plugin provides; "
                              f"install the plugin that registers it ({exc})") from None
    for key, value in options.items():
        plain = isinstance(value, _PLAIN) or (
            isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value))
        if accepted is not None and key not in accepted:
            refused = f"is not an option of {arch!r} (its options: {', '.join(accepted) or 'none'})"
        elif key != "variant" and value not in (None, False, "") and _PATHLIKE_OPTION.search(key):
            refused = "could make the model factory open a file"
        elif not plain:
            refused = f"is a {type(value).__name__}, not plain data"
        else:
            continue
        raise CheckpointError(f"{path!r} records architecture option {key!r}, which is refused: it {refused}")
    return dict(options)


def check_checkpoint_fields(obj: dict, path: str) -> None:
    """Every field of a jemeval checkpoint (a ``.pt`` or a safetensors header read as one) that sizes
    or feeds the model, checked before anything is built: ``num_classes``, ``input_shape``,
    ``normalization``, ``classes``, ``dataset``, ``config``, ``provenance``.

    The file may come from anywhere, and each of these once went through unchecked: a std of 0 gave
    accuracy 0.0000 with exit code 0, a one-name ``classes`` list was accepted for ten outputs, an
    input of 10**12 pixels reached an allocation. Each refusal is one line naming the file and the field.
    """
    k = obj["num_classes"]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_CLASSES:
        raise CheckpointError(f"{path!r} records num_classes {k!r}: it must be a whole number from 1 to "
                              f"{MAX_CLASSES} (one per output of the network)")
    shape = obj["input_shape"]
    if not shape or len(shape) > MAX_INPUT_DIMS or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape):
        raise CheckpointError(f"{path!r}: input_shape {list(shape)!r} is not a list of positive integers (1 to "
                              f"{MAX_INPUT_DIMS} of them, e.g. [3, 32, 32])")
    if math.prod(shape) > MAX_INPUT_ELEMENTS:
        raise CheckpointError(f"{path!r} records input_shape {list(shape)!r}: {math.prod(shape):,} values per "
                              f"image, more than the {MAX_INPUT_ELEMENTS:,} any model jemeval evaluates takes")
    _check_normalization(obj.get("normalization"), shape[0], path)
    classes = obj.get("classes")
    if classes is not None and (not isinstance(classes, (list, tuple)) or len(classes) != k
                                or not all(isinstance(c, str) for c in classes)):
        what = (f"{len(classes)} name{'s' * (len(classes) != 1)}" if isinstance(classes, (list, tuple))
                else f"a {type(classes).__name__}")
        raise CheckpointError(f"{path!r} records classes as {what} for a model with {k} outputs: it must be "
                              f"a list of {k} strings (one name per class) or absent")
    for key, kinds in (("dataset", (str,)), ("config", (dict,)), ("provenance", (dict,))):
        if obj.get(key) is not None and not isinstance(obj[key], kinds):
            raise CheckpointError(f"{path!r} records {key} as a {type(obj[key]).__name__}, not a "
                                  f"{kinds[0].__name__}")


def _check_normalization(norm: Any, channels: int, path: str) -> None:
    """``normalization``: None, or ``{"mean": ..., "std": ...}`` with one finite value per input channel
    (or one for all), every std > 0: the model divides its input by std."""
    if norm is None:
        return
    if not isinstance(norm, dict) or set(norm) != {"mean", "std"}:
        found = sorted(norm) if isinstance(norm, dict) else type(norm).__name__
        raise CheckpointError(f"{path!r} records normalization {found!r}: it must be null or a dict with exactly "
                              "'mean' and 'std'")
    for key in ("mean", "std"):
        values = norm[key].flatten().tolist() if torch.is_tensor(norm[key]) else norm[key]
        values = values if isinstance(values, (list, tuple)) else [values]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if not numbers or len(values) not in {1, channels}:
            count = "1 number" if channels == 1 else f"1 or {channels} numbers (one per input channel)"
            raise CheckpointError(f"{path!r} records normalization {key} {values!r}: it must be {count}")
        if not all(math.isfinite(v) for v in values) or (key == "std" and min(values) <= 0):
            raise CheckpointError(f"{path!r} records normalization {key} {values!r}: every value must be finite"
                                  + (" and > 0 (the model divides its input by it)" if key == "std" else ""))


class _OverBudget(Exception):
    """Raised from a registration hook when a network being built outgrows its checkpoint's weights."""


@contextmanager
def _size_budget(limit: int) -> Iterator[dict]:
    """Count the values of every parameter and buffer registered while the block runs; past ``limit``,
    raise :class:`_OverBudget` (at registration, before a CPU tensor's pages are ever written).
    The yielded dict's ``"exceeded"`` stays set even if a factory swallows the exception."""
    seen = {"total": 0, "exceeded": False}

    def count(module: Any, name: str, tensor: Any) -> None:
        if tensor is not None:
            seen["total"] += tensor.numel()
            if seen["total"] > limit:
                seen["exceeded"] = True
                raise _OverBudget(seen["total"])

    handles = [register_module_parameter_registration_hook(count), register_module_buffer_registration_hook(count)]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def _build(obj: dict, options: dict, path: str) -> EnergyModel:
    try:
        return create_model(
            obj["arch"], obj["num_classes"], obj["input_shape"],
            normalization=obj.get("normalization"),
            metadata={"dataset": obj.get("dataset"), "classes": obj.get("classes"),
                      "provenance": obj.get("provenance") or {}, "config": obj.get("config") or {},
                      "source_format": FORMAT},
            **options,
        )
    except UsageError as exc:  # options the factory itself refuses (a WRN depth that is not 6n + 4, ...)
        raise CheckpointError(f"{path!r} records an architecture jemeval cannot build: {exc}") from None


def _architecture_error(obj: dict, options: dict, path: str, why: str) -> CheckpointError:
    return CheckpointError(f"{path!r} records architecture {obj['arch']!r} with arch_options {options}, num_classes "
                           f"{obj['num_classes']} and input_shape {list(obj['input_shape'])}: {why}")


def build_for_state(obj: dict, options: dict, path: str) -> EnergyModel:
    """The model a checkpoint describes, built only once it is known to fit the checkpoint's weights.

    The network is first built on the ``meta`` device (no memory) under a size budget of twice the
    file's tensors: options such as ``width: 10**12`` would otherwise ask for terabytes, and a model
    larger than the file's weights cannot load them anyway. Its tensor dtypes must equal the file's
    (an ``I32`` tensor for a float weight gave accuracy 0.06). The real build runs under the same
    budget, which also guards a plugin network that cannot be built on ``meta``.
    """
    state = obj["state_dict"]
    if not looks_like_state_dict(state):
        raise CheckpointError(f"{path!r} is a damaged checkpoint: its state_dict is not a dict of named tensors")
    held = sum(int(t.numel()) for t in state.values())
    limit = 2 * held + 2**22
    too_big = (f"that network would hold more than {limit:,} values (parameters and buffers) where the file's "
               f"weights hold {held:,}, so it cannot be the file's model; refused before allocating it")
    try:
        with _size_budget(limit) as seen, torch.device("meta"):
            expected = _build(obj, options, path).net.state_dict()
    except _OverBudget:
        raise _architecture_error(obj, options, path, too_big) from None
    except CheckpointError:
        raise
    except Exception:  # noqa: BLE001 - a network that cannot be built on meta: the budgeted CPU build decides
        expected = {}
    if seen["exceeded"]:
        raise _architecture_error(obj, options, path, too_big)
    for key, tensor in state.items():
        if key in expected and expected[key].dtype != tensor.dtype:
            raise CheckpointError(f"{path!r} stores tensor {key!r} as {str(tensor.dtype).removeprefix('torch.')}, "
                                  f"but architecture {obj['arch']!r} holds "
                                  f"{str(expected[key].dtype).removeprefix('torch.')} there: the file was altered "
                                  "or written by another tool; export the model again with `jemeval export`")
    try:
        with _size_budget(limit) as seen:
            model = _build(obj, options, path)
    except _OverBudget:
        raise _architecture_error(obj, options, path, too_big) from None
    except (RuntimeError, MemoryError, OverflowError, ValueError) as exc:
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise _architecture_error(obj, options, path, f"jemeval cannot build it ({detail})") from None
    if seen["exceeded"]:
        raise _architecture_error(obj, options, path, too_big)
    return model


def model_from_checkpoint(obj: Any, path: str = "<checkpoint>", device: str | torch.device = "cpu") -> EnergyModel:
    """Build the EnergyModel a loaded checkpoint object describes (either format).

    A ``.pt`` and a ``.safetensors`` file (read as the same dict) pass the same checks here: field
    types, :func:`check_checkpoint_fields`, the options' allow-list, :func:`build_for_state`, and
    :func:`~jemeval.formats.native.load_state` (names, shapes, finite values).
    """
    device = resolve_device(device)
    if is_jemeval_checkpoint(obj):
        if not isinstance(obj.get("format_version", 0), int):
            raise CheckpointError(f"{path!r} is a damaged jemeval checkpoint ('format_version' is not a number)")
        if obj.get("format_version", 0) > FORMAT_VERSION:
            raise CheckpointError(f"{path!r} was written by a newer jemeval (format {obj['format_version']}); "
                                  "upgrade jemeval")
        _check_fields(obj, path)
        check_checkpoint_fields(obj, path)
        options = checkpoint_arch_options(obj["arch"], obj.get("arch_options") or {}, path)
        model = build_for_state(obj, options, path)
        load_state(model, obj["state_dict"], path)
        return model.to(device).eval()

    found = identify_foreign(obj)
    if found is None:
        raise unknown_layout_error(obj, path)
    return foreign_model(found, path).to(device).eval()


# -- model sources: timm:NAME, torchvision:NAME, pytorch-ood:KEY, hf:REPO, a plugin's --------------
#: ``scheme:rest`` with a scheme of two or more characters (``C:\\x`` stays a Windows path)
_SOURCE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:\S")
#: whether the model source being loaded may be fetched (``load_model(download=True)``, ``--download``)
_DOWNLOAD: ContextVar[bool] = ContextVar("jemeval_model_download", default=False)


@contextmanager
def model_downloads(allowed: bool = True) -> Iterator[None]:
    """Inside the block, model sources that are not cached may be fetched (``--download``): the
    command line wraps a command in it, so evaluation code that loads by path needs no flag."""
    token = _DOWNLOAD.set(bool(allowed))
    try:
        yield
    finally:
        _DOWNLOAD.reset(token)


def downloads_allowed() -> bool:
    """Read by the layouts that resolve model sources: fetch what is not cached only when True."""
    return _DOWNLOAD.get()


def is_model_source(path: str | os.PathLike) -> bool:
    """``scheme:NAME`` naming no existing file (a file of that name is loaded as a file; write
    ``./timm:x`` to be explicit)."""
    return isinstance(path, str) and bool(_SOURCE.match(path)) and not os.path.lexists(path)


def _source_layouts() -> list[str]:
    return [c.name for c in get_registry().components("checkpoint_layout") if callable(getattr(c.obj, "match_path",
                                                                                                None))]


def load_source(source: str, device: str | torch.device = "cpu") -> EnergyModel:
    """The model a source names, built by the layout that claims it (one line when none does)."""
    device = resolve_device(device)
    found = identify_path(source)
    if found is None:
        scheme = source.split(":", 1)[0]
        known = _source_layouts()
        raise CheckpointError(f"{source!r} is neither a file nor a model source{did_you_mean(scheme, known)}: no "
                              f"layout that reads paths ({', '.join(known)}; jemeval list checkpoint_layouts) claims "
                              "it; give a model source such as timm:resnet18 or the path of a checkpoint file")
    return foreign_model(found, source).to(device).eval()


def model_source_files(value: str | os.PathLike) -> list[str]:
    """The local files a model source reads (its cached weights), without network: the command line
    treats them as inputs, so no output may be written over them. [] for a path or an unknown source."""
    if not is_model_source(value):
        return []
    try:
        found = identify_path(str(value))
    except JemevalError:  # the command's own loading reports it
        return []
    return [found.source] if found is not None and found.source and os.path.isfile(found.source) else []


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu", *, download: bool = False) -> EnergyModel:
    """Load a model, in eval mode, from a jemeval checkpoint, a ``.safetensors`` file written by
    ``jemeval export``, a file in a registered foreign layout (JEM release, JEM++, SADA-JEM, a
    plugin's) or a model source: ``timm:NAME``, ``torchvision:NAME[:WEIGHTS]``, ``pytorch-ood:KEY``,
    ``hf:ORG/NAME[@REVISION][:FILE]`` (docs/models.md). A source is read from its library's cache;
    ``download`` fetches it when it is not cached. Layouts that are not one torch file need
    ``jemeval convert``."""
    if is_model_source(path):
        with model_downloads(download or downloads_allowed()):
            return load_source(str(path), device)
    if is_safetensors(path):
        obj = read_safetensors(path)
        model = model_from_checkpoint(obj, str(path), device)
        model.metadata.update(source_format=SAFETENSORS_FORMAT, classes=obj.get("classes"))
    else:
        model = model_from_checkpoint(read_checkpoint(path, map_location="cpu"), str(path), device)
    model.metadata.setdefault("checkpoint", {"path": str(path), "sha256": file_sha256(path)})
    return model
