"""The jemeval hook implementations (entry point ``jemeval``): the ``igebm`` model and the
``igebm-tf-release`` checkpoint layout, which lets ``jemeval convert`` read the TensorFlow release.

Only light modules are imported here: jemeval imports this module to list commands (``--help``).
"""
from __future__ import annotations

from jemeval import hookimpl
from jemeval.errors import UsageError


def igebm(num_classes, input_shape, *, width: int = 32, variant: str = "resnet32", blocks: int | None = None,
          stem_width: int | None = None, head: str | None = None, unit_input: bool = False):
    """IGEBM (Du & Mordatch 2019): class-conditional spectral-norm ResNet energy; logits = -E(x, y)."""
    from .model import IGEBM

    try:
        return IGEBM(num_classes, input_shape, width=int(width), variant=str(variant),
                     blocks=None if blocks is None else int(blocks),
                     stem_width=None if stem_width is None else int(stem_width), head=head,
                     unit_input=bool(unit_input))
    except ValueError as exc:
        raise UsageError(f"igebm: {exc}") from None


@hookimpl
def register_models(register):
    register("igebm", igebm)


@hookimpl
def register_checkpoint_layouts(register):
    from jemeval.formats.foreign import CheckpointLayout

    from .convert_tf import LAYOUT_NAME, match_tf_checkpoint

    register(LAYOUT_NAME, CheckpointLayout("IGEBM TensorFlow release (a TF1 checkpoint prefix, its .index file or "
                                           "its folder; needs TensorFlow: pip install 'jemeval-igebm[tf]')",
                                           match_path=match_tf_checkpoint))
