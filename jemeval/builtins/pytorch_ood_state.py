"""A fitted pytorch-ood detector's state as tensors and plain values, for jemeval's detector cache.

:func:`encode` turns what a pytorch-ood object holds after its fit (tensors, parameter dicts, numpy arrays,
OpenMax's numpy model and Weibull fits) into values ``torch.load(weights_only=True)`` reads back;
:func:`decode` inverts it. A stored object is rebuilt only from a fixed table of two classes, looked up
by a short name: a cached file can never name a class to import.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn


def _objects() -> dict[str, type]:
    """The only classes a state may rebuild (OpenMax's numpy model and its Weibull fits): never a name from a file."""
    from pytorch_ood.detector.openmax.libnotmr import LibNotMR
    from pytorch_ood.detector.openmax.numpy import OpenMax

    return {"OpenMax": OpenMax, "LibNotMR": LibNotMR}


def encode(value: Any) -> Any:
    """A fitted attribute as tensors and plain values that ``torch.load(weights_only=True)`` reads back."""
    if isinstance(value, nn.ParameterDict):
        return {"kind": "parameterdict", "keys": list(value.keys()), "values": [encode(v) for v in value.values()]}
    if isinstance(value, nn.Parameter):
        return {"kind": "parameter", "value": value.detach().cpu().clone(), "grad": value.requires_grad}
    if torch.is_tensor(value):
        return value.detach().cpu().clone()
    if isinstance(value, np.ndarray):
        return {"kind": "ndarray", "value": torch.from_numpy(value.copy())}
    if isinstance(value, np.generic):
        return {"kind": "npscalar", "value": torch.from_numpy(np.asarray(value).reshape(1))}
    if isinstance(value, dict):
        keys = [int(k) if isinstance(k, np.integer) else k for k in value]
        return {"kind": "dict", "keys": keys, "values": [encode(v) for v in value.values()]}
    if isinstance(value, (list, tuple)):
        return {"kind": type(value).__name__, "values": [encode(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if type(value).__name__ in _objects() and type(value) is _objects()[type(value).__name__]:
        return {"kind": "object", "class": type(value).__name__, "attrs": encode(vars(value))}
    raise TypeError(f"cannot store a fitted {type(value).__name__} as tensors and plain values")


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`."""
    if not isinstance(value, dict):
        return value
    kind = value.get("kind")
    if kind == "parameterdict":
        return nn.ParameterDict({k: decode(v) for k, v in zip(value["keys"], value["values"])})
    if kind == "parameter":
        return nn.Parameter(value["value"].clone(), requires_grad=bool(value["grad"]))
    if kind == "ndarray":
        return value["value"].numpy().copy()
    if kind == "npscalar":
        return value["value"].numpy()[0]
    if kind == "dict":
        return {k: decode(v) for k, v in zip(value["keys"], value["values"])}
    if kind in ("list", "tuple"):
        items = [decode(v) for v in value["values"]]
        return items if kind == "list" else tuple(items)
    if kind == "object":
        cls = _objects()[value["class"]]
        obj = cls.__new__(cls)
        obj.__dict__.update(decode(value["attrs"]))
        return obj
    raise ValueError(f"not a stored detector value: {sorted(value)}")


def fitted_attributes(impl) -> dict[str, Any]:
    """What a pytorch-ood object holds after its fit, encoded; its head and callables are rebuilt instead."""
    out = {}
    for key, value in vars(impl).items():
        kept = torch.is_tensor(value) or isinstance(value, nn.ParameterDict)
        if key == "_device" or (callable(value) and not kept):  # the head, the energy function: rebuilt
            continue
        out[key] = encode(value)
    return out
