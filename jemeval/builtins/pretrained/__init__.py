"""Pretrained classifiers as models: ``--model timm:resnet18``, ``torchvision:resnet18[:WEIGHTS]``,
``pytorch-ood:wrn-40-2/cifar10/oe``, ``hf:ORG/NAME[@REVISION][:FILE]``.

Any classifier is an energy model (log p~(x) = logsumexp of its logits), so a published one can be
evaluated like a JEM. Each source is a checkpoint layout recognised by its path
(``match_path``): :func:`jemeval.load_model` sends a ``scheme:NAME`` that names no file here, and
``jemeval convert`` can write one as a jemeval checkpoint. The weights come through the library's
own loader and cache (:mod:`.sources`), offline unless a download is allowed, checked against the
hash the cache names them by and read tensors-only (:mod:`.hubs`). The model records the source,
name, revision and the weights file's path and SHA-256 (``model.metadata["checkpoint"]``, which
provenance copies). This plugin also registers the ``torchvision`` and ``pytorch-ood``
architectures (:mod:`.archs`) those models are built as.
"""
from __future__ import annotations

from collections.abc import Callable

from jemeval.builtins.pretrained.archs import pytorch_ood_model, torchvision_model
from jemeval.builtins.pretrained.sources import (
    Resolved,
    resolve_hf,
    resolve_pytorch_ood,
    resolve_timm,
    resolve_torchvision,
)
from jemeval.formats.foreign import CheckpointLayout, FoundCheckpoint
from jemeval.formats.load import downloads_allowed
from jemeval.hookspecs import hookimpl
from jemeval.provenance import file_sha256

#: scheme -> (how it is resolved, the one-line summary ``jemeval list checkpoint_layouts`` shows)
SOURCES: dict[str, tuple[Callable[[str], Resolved], str]] = {
    "timm": (resolve_timm, "--model timm:NAME[.TAG]: timm's pretrained weights from the Hugging Face Hub cache"),
    "torchvision": (resolve_torchvision, "--model torchvision:NAME[:WEIGHTS]: torchvision's weights API "
                                         "(DEFAULT weights), cached in $TORCH_HOME/hub/checkpoints"),
    "pytorch-ood": (resolve_pytorch_ood, "--model pytorch-ood:KEY (e.g. wrn-40-2/cifar10/oe): pytorch-ood's "
                                         "pretrained models, cached in $TORCH_HOME/hub/checkpoints"),
    "hf": (resolve_hf, "--model hf:ORG/NAME[@REVISION][:FILE]: a `jemeval export` safetensors file on the "
                       "Hugging Face Hub"),
}


def source_layout(scheme: str) -> CheckpointLayout:
    """The layout claiming ``scheme:SPEC`` paths. Its ``FoundCheckpoint`` names the cached weights
    file (``source``, what ``jemeval convert`` records and the command line keeps outputs off) and
    loads the model, downloading only when :func:`jemeval.formats.load.downloads_allowed`."""
    resolve, summary = SOURCES[scheme]

    def match_path(path: str) -> FoundCheckpoint | None:
        if not path.startswith(f"{scheme}:"):
            return None
        resolved = resolve(path[len(scheme) + 1:])
        config: dict = {"model_source": path}
        sgld: dict = {}
        return FoundCheckpoint(
            build=lambda _path: resolved.load(downloads_allowed(), config, sgld),
            config=config, sgld=sgld, source=str(resolved.file) if resolved.file else path,
            source_sha256=file_sha256(resolved.file) if resolved.file else None,
            notes={"model_source": path},
        )

    return CheckpointLayout(summary, match_path=match_path)


@hookimpl
def register_models(register):
    register("torchvision", torchvision_model)
    register("pytorch-ood", pytorch_ood_model)


@hookimpl
def register_checkpoint_layouts(register):
    for scheme in SOURCES:
        register(scheme, source_layout(scheme))
