"""Building models by name: ``create_model("wrn:depth=16,widen=4", 10, (3, 32, 32))`` -> EnergyModel."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jemeval.energy.model import EnergyModel
from jemeval.errors import UsageError
from jemeval.plugins import get_registry
from jemeval.registry import accepted_options, call_with_supported, check_options, parse_spec


def create_model(
    arch: str,
    num_classes: int,
    input_shape: Sequence[int],
    *,
    normalization: dict | None = None,
    metadata: dict | None = None,
    **options: Any,
) -> EnergyModel:
    """Build the registered architecture ``arch`` (a spec: ``NAME[:VARIANT][,k=v...]``).

    Keyword options override the spec's; an explicit ``None`` is kept (``norm=None`` is a real WRN
    setting), so a checkpoint's recorded options rebuild exactly the same model. The returned model
    records its arch name and the full options, which is what a checkpoint needs to rebuild it.
    """
    spec = parse_spec(arch)
    factory = get_registry().get("model", spec.name)
    merged = {**spec.options, **options}
    if spec.variant is not None:
        accepted = accepted_options(factory, skip=2)
        if accepted is not None and "variant" not in accepted:
            example = accepted[0] if accepted else "key"
            raise UsageError(f"model {spec.name!r} takes no ':{spec.variant}' variant, only key=value options "
                             f"({', '.join(accepted) or 'none'}), e.g. {spec.name}:{example}=...")
        merged["variant"] = spec.variant
    # a misspelt option (cnn:widht=8) fails here, listing the valid ones, not as a TypeError inside
    check_options(factory, merged, f"model {spec.name!r}", skip=2)
    net = call_with_supported(factory, int(num_classes), tuple(input_shape), **merged)
    return EnergyModel(
        net,
        num_classes=num_classes,
        input_shape=input_shape,
        arch=spec.name,
        arch_options=merged,
        normalization=normalization,
        metadata=metadata,
    )
