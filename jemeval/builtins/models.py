"""Built-in models: ``wrn`` (the JEM release's Wide ResNet), ``cnn`` (small, for digits),
``timm:<name>`` (any timm architecture, built without pretrained weights; pretrained ones come
from :mod:`jemeval.builtins.pretrained`, which also registers ``torchvision`` and ``pytorch-ood``).

A torchvision or pytorch-ood classifier has no feature protocol of its own; :class:`HeadFeatures`
gives it timm's (``forward_features``, ``forward_head``, ``get_classifier``) by reading the input
of its last linear layer, so the feature scores (knn, vim, mahalanobis, ...) work on it.
"""
from __future__ import annotations

import torch
from torch import nn

from jemeval.errors import UsageError, did_you_mean
from jemeval.hookspecs import hookimpl

#: timm.create_model options that make timm open a file or fetch weights/configs: jemeval never passes
#: them on (a checkpoint could otherwise name a pickle for timm to load; see checkpoints.py)
TIMM_LOADER_OPTIONS = ("pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path", "cache_dir")


def _size_option(model: str, name: str, value, most: int) -> int:
    """A whole-number size option in [1, most]: beyond, a spec or a checkpoint asks for terabytes
    (``width=10**12``), and 0 or a fraction builds an empty or silently truncated network."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or not 1 <= value <= most:
        raise UsageError(f"{model} {name} must be a whole number from 1 to {most}, got {value!r}")
    return int(value)


def wrn(num_classes, input_shape, *, depth: int = 28, widen: int = 10, norm: str | None = None,
        dropout: float = 0.0):
    """Pre-activation Wide ResNet with the JEM release's layout (depth, widen, norm none|batch, dropout)."""
    from jemeval.builtins.wrn import WRN

    if isinstance(norm, str) and norm.lower() in ("none", "null", ""):
        norm = None
    if norm not in (None, "batch"):
        raise UsageError(f"unknown WRN norm {norm!r}: choose 'none' or 'batch'")
    depth, widen = _size_option("WRN", "depth", depth, 10_000), _size_option("WRN", "widen", widen, 1024)
    if (depth - 4) % 6 != 0 or depth < 10:
        raise UsageError(f"WRN depth must be 6n + 4 (10, 16, 22, 28, ...), got {depth}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise UsageError(f"WRN dropout must be a probability in [0, 1), got {dropout!r}")
    return WRN(num_classes, input_shape, depth=depth, widen=widen, norm=norm, dropout=float(dropout))


def cnn(num_classes, input_shape, *, width: int = 32, stride: int = 1):
    """Small LeakyReLU CNN without BatchNorm, for 8x8 / 28x28 inputs (the digits default); ``stride=2``
    strides its first convolution (32x32 images: a quarter of the work, twice the receptive field)."""
    from jemeval.builtins.small_cnn import SmallCNN

    return SmallCNN(num_classes, input_shape, width=_size_option("cnn", "width", width, 2**16),
                    stride=_size_option("cnn", "stride", stride, 8))


def timm_model(num_classes, input_shape, *, variant: str | None = None, **options):
    """Any timm architecture (``timm:resnet18``), randomly initialised: pretrained weights are never fetched."""
    import timm

    if not variant:
        raise UsageError("name the timm architecture, e.g. timm:resnet18")
    available = timm.list_models()
    if variant not in available:
        raise UsageError(f"unknown timm architecture {variant!r}{did_you_mean(variant, available)}")
    for key in TIMM_LOADER_OPTIONS:
        if options.pop(key, None):
            raise UsageError(f"timm option {key!r} is refused: jemeval builds timm models randomly initialised and "
                             "loads weights only from its own tensor-only checkpoints")
    return timm.create_model(variant, pretrained=False, num_classes=num_classes, in_chans=input_shape[0], **options)


class HeadFeatures(nn.Module):
    """A classifier read as penultimate features -> its last linear layer (timm's feature protocol).

    ``forward`` is the network's own; ``forward_features(x)`` runs it once and returns the input of
    its last ``nn.Linear`` (torchvision's ResNet: everything before ``fc``). That is only the
    penultimate layer if the linear layer's output *is* the network's output, which every call
    checks (a network that post-processes its logits gets one line, not wrong features).
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        linears = [name for name, m in net.named_modules() if isinstance(m, nn.Linear)]
        #: the dotted name of the last linear layer in the network (None: the network has none)
        self.head_name = linears[-1] if linears else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def get_classifier(self) -> nn.Module:
        if self.head_name is None:
            raise UsageError(f"{type(self.net).__name__} has no linear last layer, so it gives no penultimate "
                             "features; use scores that need only logits or input gradients (logpx, maxprob, energy, "
                             "entropy, gradnorm, odin)")
        return self.net.get_submodule(self.head_name)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        head, seen = self.get_classifier(), {}

        def keep(module, args, output):
            seen["features"], seen["logits"] = args[0], output

        handle = head.register_forward_hook(keep)
        try:
            out = self.net(x)
        finally:
            handle.remove()
        if "logits" not in seen or not (out is seen["logits"] or torch.equal(out, seen["logits"])):
            raise UsageError(f"{type(self.net).__name__}: its last linear layer ({self.head_name!r}) does not give "
                             "the network's output, so its input is not the penultimate features; use scores that "
                             "need only logits or input gradients (logpx, maxprob, energy, entropy, gradnorm, odin)")
        return seen["features"].reshape(out.shape[0], -1)

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return features if pre_logits else self.get_classifier()(features)


@hookimpl
def register_models(register):
    register("wrn", wrn)
    register("cnn", cnn)
    register("timm", timm_model)
