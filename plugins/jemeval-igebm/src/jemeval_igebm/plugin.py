"""The jemeval hook implementation: registers the ``igebm`` model (entry point ``jemeval``)."""
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
