"""One run's context: the settings every evaluation entry point shares, defined in one place.

``evaluate_ood``, ``calibrate``, ``evaluate``, ``robust``, ``sample``, ``distal``, ``fidelity`` and
``report`` (and the functions they call) take one :class:`RunContext`: the seed, the device, the
batch size, how progress shows, where datasets live and whether they may be downloaded, and the
:class:`CachePolicy`. A new setting of that kind is a new field here, and every entry point (and
every command, through ``jemeval.cli.options.run_options``) has it at once.

The keyword API stays as it was: :func:`takes_context` folds ``seed=``, ``device=``, ``batch_size=``,
``progress=``, ``data_root=``, ``download=`` and ``cache=`` into the context, so
``evaluate_ood(model, "uniform", seed=1, device="cpu", progress=False)`` and
``evaluate_ood(model, "uniform", context=RunContext(seed=1, device="cpu", progress=False))`` are the
same call (a keyword given beside ``context=`` replaces that field of it).

The side effects an evaluation may have are the caches, and the policy says which it uses: the
fitted-detector cache (``$JEMEVAL_CACHE_DIR/detectors``, default ``~/.cache/jemeval/detectors``;
:mod:`jemeval.caches.detectors`), fidelity's reference-features file (``ref_cache``;
:mod:`jemeval.caches.reference_features`) and the verified extractor weights kept in this process
(:mod:`jemeval.evaluation.fidelity.inception`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jemeval.errors import UsageError

if TYPE_CHECKING:
    import torch

    from jemeval.progress import ProgressArg


@dataclass(frozen=True)
class CachePolicy:
    """Which caches a run may use, and where they are.

    ``read`` / ``write``: whether the on-disk caches (fitted detectors, fidelity's reference
    features) are read / written; ``dir``: the folder of the detector cache (None:
    ``$JEMEVAL_CACHE_DIR`` or ``~/.cache/jemeval``); ``reference_features``: fidelity's ``.npz`` of
    reference features (None: none); ``memory``: keep the verified Inception/VGG16 weights in this
    process after the call (False: they are dropped when ``fidelity`` returns).
    """

    read: bool = True
    write: bool = True
    dir: str | os.PathLike | None = None
    reference_features: str | os.PathLike | None = None
    memory: bool = True

    def replace(self, **changes: Any) -> CachePolicy:
        return dataclasses.replace(self, **changes)


#: the policy of ``cache=False`` (``jemeval ood --no-cache``): nothing read, nothing written
NO_CACHE = CachePolicy(read=False, write=False)


@dataclass(frozen=True)
class RunContext:
    """What every evaluation entry point of one run shares (see the module docstring).

    ``batch_size`` None means each function's own default (256 images for most, 100 inputs per
    attack call in ``robust``); ``device`` None means the model's own device (a checkpoint path is
    loaded on the CPU; ``fidelity`` computes on the CPU); ``progress`` as in :mod:`jemeval.progress`.
    """

    seed: int = 0
    device: str | torch.device | None = None
    batch_size: int | None = None
    progress: ProgressArg = None
    data_root: str | os.PathLike | None = None
    download: bool = False
    cache: CachePolicy = field(default_factory=CachePolicy)
    #: processes decoding a dataset read image by image (folder:, torchvision sets) while the model
    #: computes; sets held as arrays (npz, digits) are sliced directly. The numbers do not depend on it.
    #: None: min(8, CPUs - 1) (:func:`jemeval.runtime.workers.default_workers`).
    workers: int | None = None

    def __post_init__(self) -> None:
        if self.batch_size is not None and not self.batch_size >= 1:  # also refuses NaN
            raise UsageError(f"batch_size must be >= 1, got {self.batch_size}", param="batch_size")
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                         or self.workers < 0):
            raise UsageError(f"workers must be a whole number >= 0, got {self.workers!r}", param="workers")
        if not isinstance(self.cache, CachePolicy):
            object.__setattr__(self, "cache", cache_policy(self.cache, CachePolicy()))

    def replace(self, **changes: Any) -> RunContext:
        """This context with ``changes`` (field names; ``cache`` may be a bool, see :func:`cache_policy`)."""
        if "cache" in changes:
            changes["cache"] = cache_policy(changes["cache"], self.cache)
        return dataclasses.replace(self, **changes)

    def batch(self, default: int) -> int:
        """The batch size: the context's, else ``default`` (the calling function's)."""
        return int(default if self.batch_size is None else self.batch_size)


def cache_policy(value: bool | CachePolicy | None, current: CachePolicy) -> CachePolicy:
    """``cache=`` as a policy: a :class:`CachePolicy` as it is; True reads and writes (the folders of
    ``current`` kept), False neither; None leaves ``current``."""
    if isinstance(value, CachePolicy):
        return value
    if value is None:
        return current
    if isinstance(value, bool):
        return current.replace(read=value, write=value)
    raise UsageError(f"cache must be True, False or a CachePolicy, got {value!r}", param="cache")


#: the keywords every entry point accepts besides ``context=`` (the fields of :class:`RunContext`)
FIELDS = tuple(f.name for f in dataclasses.fields(RunContext))
#: keywords folded into the context's cache policy (fidelity's ``ref_cache=FILE.npz``)
CACHE_KEYWORDS = {"ref_cache": "reference_features"}


def fold(context: RunContext | None, keywords: dict[str, Any], *, batch_size: int | None = None) -> RunContext:
    """``context`` (default: a fresh one) with the context keywords of a call (``keywords``, popped
    from it) applied; a ``batch_size`` still unset becomes the function's default ``batch_size``."""
    if context is not None and not isinstance(context, RunContext):
        raise UsageError(f"context must be a jemeval.RunContext, got {type(context).__name__}", param="context")
    context = context or RunContext()
    changes = {name: keywords.pop(name) for name in FIELDS if name in keywords}
    policy = cache_policy(changes.pop("cache", None), context.cache)
    extra = {CACHE_KEYWORDS[k]: keywords.pop(k) for k in list(keywords) if k in CACHE_KEYWORDS}
    changes["cache"] = policy.replace(**extra) if extra else policy
    if changes.get("batch_size", context.batch_size) is None and batch_size is not None:
        changes["batch_size"] = batch_size
    return context.replace(**changes)


def takes_context(fn: Callable | None = None, *, batch_size: int | None = None, cache_keywords: tuple[str, ...] = ()):
    """Decorator of a function with a keyword-only ``context: RunContext`` parameter: it also accepts
    every field of :class:`RunContext` as a keyword (plus ``cache_keywords``, e.g. ``ref_cache``) and
    folds them into ``context`` (:func:`fold`; ``batch_size`` is the function's default batch size).
    The signature it shows lists those keywords, so ``help()`` and the report's option check see them.
    """
    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs["context"] = fold(kwargs.pop("context", None), kwargs, batch_size=batch_size)
            return fn(*args, **kwargs)

        wrapper.__signature__ = _signature(fn, batch_size, cache_keywords)
        wrapper.context_default_batch_size = batch_size
        return wrapper

    return decorate(fn) if fn is not None else decorate


def _signature(fn: Callable, batch_size: int | None, cache_keywords: tuple[str, ...]) -> inspect.Signature:
    """``fn``'s signature with the context keywords before its ``context`` parameter."""
    sig = inspect.signature(fn)
    own = [p for name, p in sig.parameters.items() if name != "context"]
    if any(p.kind == p.VAR_KEYWORD for p in own):
        raise TypeError(f"{fn.__qualname__} takes **kwargs: context keywords would vanish into them")
    defaults = RunContext()
    default = {**{name: getattr(defaults, name) for name in FIELDS}, "batch_size": batch_size, "cache": True}
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default.get(name))
             for name in (*FIELDS, *cache_keywords) if name not in sig.parameters]
    context = inspect.Parameter("context", inspect.Parameter.KEYWORD_ONLY, default=None)
    return sig.replace(parameters=[*own, *added, context])


# -- datasets shared by the evaluations of one report ------------------------------------------------
#: the datasets :func:`shareable` kept inside :func:`shared_datasets` (None outside it)
_SHARED_SETS: ContextVar[dict[tuple, Any] | None] = ContextVar("jemeval_shared_datasets", default=None)


@contextlib.contextmanager
def shared_datasets() -> Iterator[dict[tuple, Any]]:
    """Inside it, each dataset (spec, split, root, download, options) is loaded once and every later
    :func:`jemeval.data.load_dataset` call gets that same Dataset: ``jemeval report`` evaluates N
    models on the same sets, and loading them once per (model, section) read a CIFAR test set or an
    npz 5N times. The evaluations never modify a Dataset (subsets are views), so sharing changes no
    number; the sets are held until the block ends. Outside it (every single command) nothing is kept.
    Yields the dict of what was loaded (the report's benchmark and tests count it)."""
    token = _SHARED_SETS.set({})
    try:
        yield _SHARED_SETS.get()
    finally:
        _SHARED_SETS.reset(token)


def shareable(load: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator of :func:`jemeval.data.load_dataset`: inside :func:`shared_datasets`, a set asked
    for again with the same arguments is the one loaded the first time (a failed load is not kept)."""
    @functools.wraps(load)
    def wrapper(name: str, split: str = "test", root: Any = None, download: bool = False, **options: Any) -> Any:
        shared = _SHARED_SETS.get()
        if shared is None:
            return load(name, split, root, download, **options)
        key = (str(name), str(split), None if root is None else os.fspath(root), bool(download),
               repr(sorted(options.items())))
        if key not in shared:
            shared[key] = load(name, split, root, download, **options)
        return shared[key]

    return wrapper
