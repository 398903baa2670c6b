"""The model sources: ``timm:NAME``, ``torchvision:NAME[:WEIGHTS]``, ``pytorch-ood:KEY``, ``hf:REPO``.

Each ``resolve_*`` reads the source's spec and finds its cached weights file without any network
(:class:`Resolved`); its ``load`` builds the model through the library's own API (timm's
``create_model(pretrained=True)``, torchvision's weights enums and ``get_model``, pytorch-ood's
``load_model``, jemeval's safetensors reader for ``hf:``) with every ``torch.load`` forced to
tensors only. The result is an :class:`~jemeval.energy.model.EnergyModel` of a registered jemeval
architecture (``timm``, ``torchvision``, ``pytorch-ood``: an export of it loads back) whose
``normalization`` turns jemeval's [-1, 1] input into the model's own: pixels p = (x + 1) / 2
normalised as (p - m) / s are (x - (2m - 1)) / (2s).
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from torch import nn

from jemeval.builtins.models import HeadFeatures
from jemeval.builtins.pretrained.archs import TORCHVISION_OPTIONS
from jemeval.builtins.pretrained.hubs import (
    FETCH,
    cached_hub_file,
    check_torch_hub_file,
    fetch_error,
    hub_file,
    hub_revision,
    library_error,
    regular_file,
    torch_hub_file,
    weights_only_loads,
    weights_record,
)
from jemeval.energy.model import EnergyModel
from jemeval.errors import CheckpointError, JemevalError, UsageError, did_you_mean
from jemeval.formats.load import model_from_checkpoint
from jemeval.formats.native import check_finite
from jemeval.formats.safetensors import read_safetensors
from jemeval.plugins import names

#: loads the model: ``load(download, config, sgld)``; ``config``/``sgld`` are the found checkpoint's
#: dicts, filled by a source whose file records them (an ``hf:`` export)
Loader = Callable[[bool, dict, dict], EnergyModel]


@dataclass
class Resolved:
    """A source read without network: its cached weights file (None: not cached) and its loader."""

    file: Path | None
    load: Loader


def pixel_normalization(mean, std) -> dict:
    """A model's (mean, std) for pixels in [0, 1] as the normalisation of jemeval's [-1, 1] input."""
    return {"mean": [2 * float(m) - 1 for m in mean], "std": [2 * float(s) for s in std]}


def wrapped(net: nn.Module, *, arch: str, options: dict, num_classes: int, shape, mean, std, record: dict,
            dataset: str | None = None, classes: list[str] | None = None,
            class_ids: list[str] | None = None, preprocessing: dict | None = None) -> EnergyModel:
    """The EnergyModel of a pretrained network (weights checked finite, eval mode). ``classes`` and
    ``class_ids`` (other names of the same classes: ImageNet synsets) let a dataset's class names be
    matched to the model's classes (:mod:`jemeval.evaluation.classes`); ``preprocessing`` is how the
    library feeds it images (resize, centre crop, interpolation), which image files then go through."""
    check_finite(net.state_dict(), "its weights", record["path"])
    return EnergyModel(net.eval(), num_classes=num_classes, input_shape=tuple(int(v) for v in shape), arch=arch,
                       arch_options=options, normalization=pixel_normalization(mean, std),
                       metadata={"dataset": dataset, "classes": classes, "class_ids": class_ids, "checkpoint": record,
                                 "preprocessing": preprocessing, "provenance": {}})


def timm_preprocessing(net: nn.Module) -> dict | None:
    """timm's evaluation transform of ``net`` (``resolve_model_data_config``: input size, crop_pct,
    crop_mode, interpolation) as resize + centre crop, as timm's ``transforms_imagenet_eval`` builds
    it: the resize is floor(size / crop_pct). None for a crop mode other than centre or squash, or a
    non-square centre crop (timm keeps the ratio there): files then get jemeval's default."""
    from timm.data import resolve_model_data_config

    cfg = resolve_model_data_config(net)
    size = [int(v) for v in cfg["input_size"][1:]]
    crop_pct, mode = float(cfg.get("crop_pct") or 1.0), cfg.get("crop_mode") or "center"
    scale = [math.floor(v / crop_pct) for v in size]
    if mode == "squash":
        resize = scale
    elif mode == "center" and scale[0] == scale[1]:
        resize = scale[0]
    else:
        return None
    return {"resize": resize, "crop": size, "interpolation": str(cfg["interpolation"]), "crop_pct": crop_pct,
            "crop_mode": mode, "from": "timm pretrained_cfg (resolve_model_data_config)"}


def torchvision_preprocessing(t) -> dict:
    """torchvision's ``weights.transforms()`` (``ImageClassification``: resize_size, crop_size,
    interpolation) as resize + centre crop."""
    resize = [int(v) for v in t.resize_size]
    crop = [int(v) for v in t.crop_size] * (2 if len(t.crop_size) == 1 else 1)
    return {"resize": resize[0] if len(resize) == 1 else resize, "crop": crop,
            "interpolation": t.interpolation.value, "from": "torchvision weights.transforms()"}


def _call(what: str, path: Path | None, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` with tensor-only loads, download chatter on stderr, and one line for any failure."""
    try:
        with weights_only_loads(), contextlib.redirect_stdout(sys.stderr):
            return build()
    except JemevalError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the library raises: one line
        raise library_error(exc, what, path) from None


# -- timm ---------------------------------------------------------------------------------------------
def resolve_timm(spec: str) -> Resolved:
    """``timm:NAME`` (``resnet18``, ``resnet18.a1_in1k``): timm's pretrained weights from the Hub cache."""
    import timm
    from timm.models import get_pretrained_cfg, split_model_name_tag

    what = f"model source 'timm:{spec}'"
    arch, _ = split_model_name_tag(spec)
    if not arch or not timm.is_model(arch):
        raise UsageError(f"{what}: unknown timm architecture {arch!r}{did_you_mean(arch, timm.list_models())}")
    try:
        cfg = get_pretrained_cfg(spec)
    except RuntimeError:  # an architecture timm knows, a tag it does not
        cfg = None
    if cfg is None:
        tags = timm.list_pretrained(f"{arch}.*")
        raise UsageError(f"{what}: timm has no pretrained weights {spec!r}{did_you_mean(spec, tags)}; "
                         f"its weights: {', '.join(tags) or 'none'}")
    if not cfg.hf_hub_id:
        raise CheckpointError(f"{what}: timm publishes these weights only at a URL, not on the Hugging Face Hub, "
                              "whose cache jemeval reads timm weights from")
    name = f"{arch}.{cfg.tag}" if cfg.tag else arch
    repo, _, revision = cfg.hf_hub_id.partition("@")
    files = [cfg.hf_hub_filename] if cfg.hf_hub_filename else ["model.safetensors", "pytorch_model.bin"]

    def load(download: bool, config: dict, sgld: dict) -> EnergyModel:
        path = hub_file(repo, files, revision or None, download=download, what=what)
        # timm's own loader, reading the one cached file found above (never the network)
        net = _call(what, path, lambda: timm.create_model(name, pretrained=True,
                                                          pretrained_cfg_overlay={"file": str(path)}))
        pc = dict(net.pretrained_cfg)
        k = int(getattr(net, "num_classes", 0) or pc["num_classes"])
        record = weights_record(f"timm:{spec}", name, hub_revision(path), path)
        classes, ids = _timm_classes(net, k)
        return wrapped(net, arch="timm", options={"variant": pc.get("architecture") or arch}, num_classes=k,
                       shape=pc["input_size"], mean=pc["mean"], std=pc["std"], record=record,
                       classes=classes, class_ids=ids, preprocessing=timm_preprocessing(net))

    return Resolved(cached_hub_file(repo, files, revision or None, what), load)


def _timm_classes(net: nn.Module, k: int) -> tuple[list[str] | None, list[str] | None]:
    """(class names, synset ids) of a timm ImageNet model (timm's own table), else (None, None)."""
    try:
        from timm.data import ImageNetInfo, infer_imagenet_subset

        subset = infer_imagenet_subset(net)
        info = ImageNetInfo(subset) if subset else None
        names, ids = (list(info.label_descriptions()), list(info.label_names())) if info else (None, None)
    except Exception:  # noqa: BLE001 - names are a convenience; an older timm has no table
        return None, None
    if names is None or len(names) != k:
        return None, None
    return names, ids if ids is not None and len(ids) == k else None


# -- torchvision --------------------------------------------------------------------------------------
def resolve_torchvision(spec: str) -> Resolved:
    """``torchvision:NAME[:WEIGHTS]``: torchvision's weights API (DEFAULT weights when none is named)."""
    from torchvision import models

    what = f"model source 'torchvision:{spec}'"
    name, _, wanted = spec.partition(":")
    known = models.list_models(module=models)
    if name not in known:
        raise UsageError(f"{what}: unknown torchvision classifier {name!r}{did_you_mean(name, known)}")
    enum = models.get_model_weights(name)
    key = (wanted or "DEFAULT").removeprefix(f"{enum.__name__}.")
    if key not in enum.__members__:
        raise UsageError(f"{what}: torchvision's {name} has no weights {wanted!r}; its weights: "
                         f"{', '.join(enum.__members__)}")
    weights = enum[key]
    path = torch_hub_file(os.path.basename(urlparse(weights.url).path))

    def load(download: bool, config: dict, sgld: dict) -> EnergyModel:
        if not path.exists() and not download:
            raise fetch_error(f"{what}: {weights!r} is not in torch hub's cache ({str(path)!r}, under "
                              f"$TORCH_HOME); {FETCH}")
        if path.exists():
            check_torch_hub_file(path, what)
        net = _call(what, path, lambda: models.get_model(name, weights=weights))
        check_torch_hub_file(path, what)
        options = {"variant": name, **{k: getattr(net, k) for k in TORCHVISION_OPTIONS
                                       if isinstance(getattr(net, k, None), (bool, int))}}
        t = weights.transforms()
        classes = list(weights.meta.get("categories") or []) or None
        record = weights_record(f"torchvision:{spec}", name, repr(weights), path)
        k = len(classes) if classes else _outputs(net)
        return wrapped(HeadFeatures(net), arch="torchvision", options=options, num_classes=k,
                       shape=(3, t.crop_size[0], t.crop_size[-1]), mean=t.mean, std=t.std, record=record,
                       classes=classes, preprocessing=torchvision_preprocessing(t))

    return Resolved(regular_file(path, what) if path.exists() else None, load)


def _outputs(net: nn.Module) -> int:
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise CheckpointError(f"{type(net).__name__} names no classes and has no linear last layer")
    return int(linears[-1].out_features)


# -- pytorch-ood --------------------------------------------------------------------------------------
def resolve_pytorch_ood(spec: str) -> Resolved:
    """``pytorch-ood:KEY`` (``wrn-40-2/cifar10/oe``): a model of pytorch-ood's registry."""
    import pytorch_ood.model as ood_models

    what = f"model source 'pytorch-ood:{spec}'"
    try:
        entry = ood_models.get_model_info(spec)
    except ValueError:
        known = ood_models.list_models()
        raise UsageError(f"{what}: pytorch-ood has no model {spec!r}{did_you_mean(spec, known)}; its models: "
                         f"pytorch_ood.model.list_models()") from None
    path = torch_hub_file(entry.file_name)

    def load(download: bool, config: dict, sgld: dict) -> EnergyModel:
        if not path.exists() and not download:
            raise fetch_error(f"{what}: {entry.key} is not in torch hub's cache ({str(path)!r}, under "
                              f"$TORCH_HOME); {FETCH}")
        if path.exists():
            check_torch_hub_file(path, what, sha256=entry.sha256)
        net = _call(what, path, lambda: ood_models.load_model(entry.key, map_location="cpu"))
        check_torch_hub_file(path, what, sha256=entry.sha256)
        prep = entry.preprocessing
        if not all(hasattr(prep, a) for a in ("mean", "std", "size")):
            raise CheckpointError(f"{what}: pytorch-ood records no input normalisation for {entry.key}, so its "
                                  "inputs cannot be prepared as it was trained")
        size = prep.crop_size or prep.size
        k = int(entry.arch_kwargs.get("num_classes") or _outputs(net))
        dataset = entry.dataset if entry.dataset in names("dataset") else None
        record = weights_record(f"pytorch-ood:{spec}", entry.key, entry.file_name, path)
        return wrapped(HeadFeatures(net), arch="pytorch-ood", options={"variant": entry.key}, num_classes=k,
                       shape=(3, *size), mean=prep.mean, std=prep.std, record=record, dataset=dataset)

    return Resolved(regular_file(path, what) if path.exists() else None, load)


# -- hf: a jemeval export on the Hub --------------------------------------------------------------
_HF = re.compile(r"(?P<repo>[\w.-]+/[\w.-]+)(?:@(?P<rev>[^:\s]+))?(?::(?P<file>\S+))?")


def resolve_hf(spec: str) -> Resolved:
    """``hf:ORG/NAME[@REVISION][:FILE]``: a ``jemeval export`` safetensors file on the Hub (default
    ``model.safetensors``), read by jemeval's safetensors reader with all its checks."""
    what = f"model source 'hf:{spec}'"
    found = _HF.fullmatch(spec)
    if found is None:
        raise UsageError(f"{what}: expected hf:ORG/NAME[@REVISION][:FILE.safetensors], e.g. hf:me/jem-cifar10")
    repo, revision, file = found["repo"], found["rev"], found["file"] or "model.safetensors"
    if not file.endswith(".safetensors"):
        raise UsageError(f"{what}: hf: reads only .safetensors files (jemeval exports), not {file!r}, which could "
                         "hold pickled code; write one with `jemeval export`")

    def load(download: bool, config: dict, sgld: dict) -> EnergyModel:
        path = hub_file(repo, [file], revision, download=download, what=what)
        obj = read_safetensors(path)
        model = model_from_checkpoint(obj, str(path))
        recorded = obj.get("config") or {}
        config.update({k: v for k, v in recorded.items() if k != "sgld"})
        sgld.update(recorded.get("sgld") if isinstance(recorded.get("sgld"), dict) else {})
        record = weights_record(f"hf:{spec}", f"{repo}/{file}", hub_revision(path), path)
        model.metadata.update(classes=obj.get("classes"), checkpoint=record)
        return model

    return Resolved(cached_hub_file(repo, [file], revision, what), load)
