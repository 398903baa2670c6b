"""A run that starts from a classifier's weights (``jemeval train DATA --init SOURCE``).

Most of what a JEM costs is learning p(y|x), which a classifier has already paid for. SOURCE is any
model ``--model`` reads (a jemeval checkpoint, a safetensors export, ``timm:``, ``torchvision:``,
``pytorch-ood:``, ``hf:``; from the libraries' caches, never the network unless ``--download``).

* **When the run is configured** (:func:`describe_source`) SOURCE is loaded once: its architecture
  becomes the run's ``arch`` and its record (source, resolved name, file SHA-256, classes,
  normalisation, input shape) the run's ``init_from``, stored in every checkpoint.
* **When a fresh run starts** (:func:`warm_start`) the network is built at the data's input shape
  and number of classes with the source's normalisation, and every weight is copied from SOURCE
  again, after its SHA-256 is checked against the record. The head (the last linear layer) is kept
  when the label spaces match (same number of classes, the same names where both record them) and
  re-initialised otherwise, said in one line and recorded (``init_from["head"]``).
* **A resume** builds the same architecture and restores last.pt: SOURCE is not read again, so a
  resumed run is the uninterrupted one even where SOURCE has changed or gone.

Any other weight whose shape differs (a network whose layers depend on the input size, or 3-channel
weights for 1-channel data) is one line, before any file is written: copying part of a network
silently would train something that is neither the source nor a fresh network.
"""
from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from jemeval.energy.model import EnergyModel
from jemeval.errors import JemevalError, UsageError
from jemeval.evaluation.classes import _key  # class names matched as the label-space check matches them
from jemeval.registry import Spec
from jemeval.runtime.fastpath import has_batchnorm


def describe_source(source: str, *, download: bool = False) -> tuple[str, dict[str, Any], EnergyModel]:
    """(arch spec, record, the loaded model) of the classifier at ``source``: what the run builds, and
    what it records."""
    from jemeval.formats.load import load_model

    model = load_model(source, download=download)
    if int(model.num_classes) < 2:
        raise UsageError(f"init {source!r} has {model.num_classes} output; a classifier to start from needs "
                         "one output per class", param="init")
    arch = str(Spec(model.arch, None, dict(model.arch_options)))
    meta = model.metadata
    checkpoint = dict(meta.get("checkpoint") or {})
    classes = meta.get("classes")
    record = {
        "source": source, "name": checkpoint.get("name") or os.path.basename(str(checkpoint.get("path") or source)),
        "sha256": checkpoint.get("sha256"), "revision": checkpoint.get("revision"), "arch": arch,
        "num_classes": int(model.num_classes), "input_shape": list(model.input_shape),
        "classes": list(classes) if isinstance(classes, (list, tuple)) else None,
        "normalization": model.normalization, "dataset": meta.get("dataset"),
        "batchnorm": has_batchnorm(model),  # recipe finetune's settings depend on it
    }
    return arch, record, model


def check_fits(source: EnergyModel, record: dict[str, Any], num_classes: int, input_shape: tuple[int, ...],
               names: tuple[str, ...] | None) -> dict[str, Any]:
    """``record`` with the head decision for data of ``num_classes`` classes of ``input_shape`` images,
    after checking every other weight of the source fits the network built for them (one line if not):
    at configuration, before any file is written."""
    from jemeval.energy.factory import create_model

    fresh = create_model(record["arch"], num_classes, input_shape, normalization=record.get("normalization"))
    keep, why = head_decision(record, num_classes, names)
    head = set() if keep else set(head_parameters(fresh.net, num_classes))
    copy_weights(source.net, fresh.net, skip=head, source=record["source"], check_only=True)
    return {**record, "head": "kept" if keep else "re-initialised", "head_why": why}


def init_settings(merged: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``arch``, ``init`` and ``init_from`` of a warm start configured as ``merged`` (``given``: what the
    user set). The architecture is the source's (an ``arch`` given beside it must name the same); the
    head decision and the weights' fit are checked against the training split where it can be read
    without a download (else when the run starts)."""
    from jemeval.data import input_shape_of, load_dataset, num_classes_of
    from jemeval.evaluation.classes import data_classes
    from jemeval.formats.load import is_model_source

    source = merged["init"]
    if isinstance(source, str) and not is_model_source(source):
        source = os.path.abspath(os.path.expanduser(source))
    arch, record, model = describe_source(source, download=bool(merged.get("download")))
    if "arch" in given and str(given["arch"]) != arch:
        raise UsageError(f"arch={given['arch']!r} and init={merged['init']!r} (a {arch} network) both name the "
                         "architecture; drop arch: a warm start keeps its source's", param="arch")
    try:
        ds = load_dataset(merged["dataset"], "train", root=merged.get("data_root"), download=False)
    except JemevalError:
        return {"arch": arch, "init": source, "init_from": record}
    record = check_fits(model, record, num_classes_of(ds), tuple(input_shape_of(ds)), data_classes(ds).names)
    return {"arch": arch, "init": source, "init_from": record}


def head_decision(record: dict[str, Any], num_classes: int, names: tuple[str, ...] | None) -> tuple[bool, str]:
    """(keep the head?, why) for a source recorded as ``record`` and data of ``num_classes`` classes
    named ``names`` (None: the data names none)."""
    theirs = record.get("classes")
    if int(record["num_classes"]) != int(num_classes):
        return False, f"the source has {record['num_classes']} classes, the data {num_classes}"
    if theirs and names and [_key(n) for n in theirs] != [_key(n) for n in names]:
        first = next(i for i, (a, b) in enumerate(zip(theirs, names)) if _key(a) != _key(b))
        return False, (f"the source's class {first} is {theirs[first]!r}, the data's {names[first]!r} (the same "
                       f"{num_classes} classes by number, not by name)")
    named = " and names" if theirs and names else ""
    return True, f"the same {num_classes} classes{named}"


def warm_start(model: EnergyModel, record: dict[str, Any], names: tuple[str, ...] | None, *,
               download: bool = False) -> tuple[dict[str, Any], str]:
    """Copy SOURCE's weights into ``model`` (built fresh for the data); returns (the record with the
    head decision, the line that says it)."""
    from jemeval.formats.load import load_model

    source = record["source"]
    loaded = load_model(source, download=download)
    sha = (loaded.metadata.get("checkpoint") or {}).get("sha256")
    if record.get("sha256") and sha != record["sha256"]:
        raise UsageError(f"init {source!r} changed since the run was configured (SHA-256 {sha} instead of "
                         f"{record['sha256']}); configure the run again", param="init")
    if "head" in record:  # decided when the run was configured
        keep, why = record["head"] == "kept", record["head_why"]
    else:
        keep, why = head_decision(record, model.num_classes, names)
    head = set() if keep else set(head_parameters(model.net, model.num_classes))
    copy_weights(loaded.net, model.net, skip=head, source=source)
    decided = {**record, "head": "kept" if keep else "re-initialised", "head_why": why}
    line = (f"--init {record['name']}: {record['arch']}, head {'kept' if keep else 're-initialised'} ({why})")
    return decided, line


def head_parameters(net: nn.Module, num_classes: int) -> list[str]:
    """The state-dict keys of the head: the last linear layer (or 1x1 convolution) with one output
    per class."""
    last = None
    for name, module in net.named_modules():
        if isinstance(module, nn.Linear) and module.out_features == num_classes:
            last = name
        elif isinstance(module, nn.Conv2d) and module.out_channels == num_classes and module.kernel_size == (1, 1):
            last = name
    if last is None:
        raise UsageError(f"the architecture has no layer with one output per class ({num_classes}) to re-initialise; "
                         "init needs a classifier whose last layer is linear", param="init")
    prefix = f"{last}." if last else ""
    return [k for k in net.state_dict() if k.startswith(prefix) and "." not in k[len(prefix):]]


def copy_weights(src: nn.Module, dst: nn.Module, *, skip: set[str], source: str, check_only: bool = False) -> None:
    """Every state-dict entry of ``dst`` but ``skip`` from ``src`` (the same names and shapes, or one line);
    ``check_only``: the checks alone."""
    theirs, ours = src.state_dict(), dst.state_dict()
    missing = [k for k in ours if k not in skip and k not in theirs]
    if missing:
        raise UsageError(f"init {source!r} has no weight {missing[0]!r} that this run's network has "
                         f"({len(missing)} missing); the architectures differ", param="init")
    for key in ours:
        if key in skip:
            continue
        if theirs[key].shape != ours[key].shape:
            raise UsageError(f"init {source!r}: weight {key!r} is {tuple(theirs[key].shape)} there and "
                             f"{tuple(ours[key].shape)} for this data; the source was built for inputs of "
                             "another shape (channels or size) than these images", param="init")
    if check_only:
        return
    with torch.no_grad():
        for key, value in ours.items():
            if key not in skip:
                value.copy_(theirs[key])
