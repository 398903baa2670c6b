"""The architectures of pretrained sources, registered as jemeval models: ``torchvision:NAME`` (any
torchvision classifier) and ``pytorch-ood:KEY`` (the network of a pytorch-ood registry model), built
randomly initialised and read through :class:`~jemeval.builtins.models.HeadFeatures`. A model loaded
from ``torchvision:``/``pytorch-ood:`` is one of these with the published weights, so a checkpoint
or ``jemeval export`` of it names an architecture jemeval can build again.
"""
from __future__ import annotations

from torch import nn

from jemeval.builtins.models import HeadFeatures
from jemeval.errors import UsageError, did_you_mean

#: torchvision builder options that pretrained weights change and a rebuilt network must repeat
#: (inception_v3/googlenet: transform_input, aux_logits; ViT: image_size); read from the network
TORCHVISION_OPTIONS = ("transform_input", "aux_logits", "image_size")


def torchvision_model(num_classes, input_shape, *, variant: str | None = None, transform_input: bool | None = None,
                      aux_logits: bool | None = None, image_size: int | None = None):
    """Any torchvision classifier (``torchvision:resnet18``), randomly initialised, with :class:`HeadFeatures`."""
    from torchvision import models

    known = models.list_models(module=models)
    if not variant:
        raise UsageError("name the torchvision classifier, e.g. torchvision:resnet18")
    if variant not in known:
        raise UsageError(f"unknown torchvision classifier {variant!r}{did_you_mean(variant, known)}")
    if input_shape[0] != 3:
        raise UsageError(f"torchvision classifiers take 3-channel images, not {input_shape[0]}-channel ones")
    options = {"transform_input": transform_input, "aux_logits": aux_logits, "image_size": image_size}
    options = {k: v for k, v in options.items() if v is not None}
    return HeadFeatures(models.get_model(variant, weights=None, num_classes=num_classes, **options))


def pytorch_ood_model(num_classes, input_shape, *, variant: str | None = None):
    """The architecture of a pytorch-ood registry model (``pytorch-ood:wrn-40-2/cifar10/oe``), randomly
    initialised, with :class:`HeadFeatures`. Only classes of ``pytorch_ood.model`` are built."""
    import pytorch_ood.model as ood_models

    if not variant:
        raise UsageError("name the pytorch-ood model, e.g. pytorch-ood:wrn-40-2/cifar10/oe")
    try:
        entry = ood_models.get_model_info(variant)
    except ValueError:
        known = ood_models.list_models()
        raise UsageError(f"unknown pytorch-ood model {variant!r}{did_you_mean(variant, known)}") from None
    module, _, name = entry.arch_class.rpartition(".")
    cls = getattr(ood_models, name, None)
    if module != "pytorch_ood.model" or not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise UsageError(f"pytorch-ood model {variant!r} is a {entry.arch_class}, which jemeval does not build")
    if input_shape[0] != 3:
        raise UsageError(f"pytorch-ood's models take 3-channel images, not {input_shape[0]}-channel ones")
    return HeadFeatures(cls(**{**entry.arch_kwargs, "num_classes": num_classes}))
