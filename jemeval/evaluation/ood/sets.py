"""Which OOD sets an evaluation reads: names, named groups per in-distribution dataset (``--ood
near,far``), and loading them at the model's input shape.

CIFAR-10 and CIFAR-100 follow OpenOOD v1.5: near = the other CIFAR and Tiny ImageNet (``tin``),
far = MNIST, SVHN, Textures (DTD) and Places365. All but ``tin`` are torchvision's and download;
``tin`` is a folder the user provides (:mod:`jemeval.builtins.ood_datasets`, docs/data.md).

digits (sklearn's 8 x 8, all offline): a model trained on all ten digits has no held-out class, so
near = ``interp`` (averages of two test digits) and ``rotate:digits`` (test digits turned 90
degrees: digit strokes, mostly not digit shapes); far = ``uniform``, ``constant`` and ``gaussian``
noise images. When the in-distribution set is a class subset (``digits[0-4]``), the held-out classes
(``digits[5-9]``) join the near group first. ``flip:digits`` (mirrored digits) belongs to no group:
it is the near-OOD set to tune hyperparameters on (``tune_on``).

Each set of a group is evaluated on its own; the group mean is a record of its own.

The in-distribution set (:func:`load_id_set`) shares no image with what detectors are fitted on:
when it has no split apart from the one evaluated (a single-split folder or npz, or ``split="train"``)
and detectors are fitted on it, a seeded half of it is fitted on and the other half evaluated
(:func:`jemeval.data.holdout_parts`, the same partition :func:`jemeval.evaluation.ood.fit.fit_sets`
takes); a set without a test split gets :func:`jemeval.data.no_test_split_note`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jemeval.context import RunContext
from jemeval.data import absolute_spec, has_test_split, holdout_parts, load_dataset, no_test_split_note, subsample, take
from jemeval.errors import UsageError
from jemeval.evaluation.inputs import check_input_shape, model_data_options
from jemeval.openood_benchmarks import benchmark_of, list_spec
from jemeval.registry import Spec, parse_spec
from jemeval.seen_images import check_evaluated

_CIFAR_FAR = ["mnist", "svhn", "textures", "places365"]
#: ID dataset name -> group -> OOD set specs (interp, rotate: of the ID set, see expand_ood_name)
GROUPS: dict[str, dict[str, list[str]]] = {
    "digits": {"near": ["interp", "rotate"], "far": ["uniform", "constant", "gaussian"]},
    "cifar10": {"near": ["cifar100", "tin"], "far": _CIFAR_FAR},
    "cifar100": {"near": ["cifar10", "tin"], "far": _CIFAR_FAR},
}
GROUP_NAMES = ("near", "far")


def held_out_classes(id_name: str, num_classes: int | None) -> str | None:
    """``digits[5-9]`` for ``digits[0-4]`` of a 10-class dataset: the classes the ID subset leaves out."""
    spec = parse_spec(id_name)
    if spec.classes is None or not num_classes:
        return None
    rest = [c for c in range(int(num_classes)) if c not in spec.classes]
    if not rest:
        return None
    return str(Spec(spec.name, spec.variant, dict(spec.options), tuple(rest)))


def group_sets(group: str, id_name: str, num_classes: int | None = None) -> list[str]:
    """The OOD set specs of ``group`` for the in-distribution set ``id_name``."""
    base = parse_spec(id_name).name
    benchmark = benchmark_of(id_name)
    groups = {g: list(sets) for g, sets in benchmark.groups.items()} if benchmark else GROUPS.get(base)
    if groups is None:
        known = ", ".join([*sorted(GROUPS), "imagenet", "imagenet200", "openood:cifar10", "openood:cifar100"])
        raise UsageError(f"OOD group {group!r} is defined for the in-distribution sets {known}, not {id_name!r}; "
                         "name the OOD sets instead (e.g. 'uniform,svhn')", param="ood")
    sets = list(groups[group])
    if group == "near":
        held_out = held_out_classes(id_name, num_classes)
        sets = ([held_out] if held_out else []) + sets
    return sets


def expand_groups(ood: list[str], id_name: str, num_classes: int | None = None) -> list[tuple[str, str | None]]:
    """(set spec, its group or None) for every name in ``ood``: a group name (near, far) stands for its
    sets; a set named on its own and in a group is listed once, with its group."""
    out: dict[str, str | None] = {}
    for name in ood:
        if name in GROUP_NAMES:
            for s in group_sets(name, id_name, num_classes):
                out[s] = name
        else:
            out.setdefault(name, None)
    return list(out.items())


def same_dataset(a: str, b: str) -> bool:
    """Two specs name the same dataset (name, variant and classes; options aside): ``uniform:seed=3``
    is ``uniform``, ``interp:svhn`` is not ``interp:digits``, ``folder:./ood`` is ``folder:ood``."""
    sa, sb = parse_spec(absolute_spec(a)), parse_spec(absolute_spec(b))
    return (sa.name, sa.variant, sa.classes) == (sb.name, sb.variant, sb.classes)


#: datasets made from another one's images: named bare (``interp``, ``rotate``), they are made from the ID set's
OF_ID_SET = ("interp", "rotate", "flip")


def expand_ood_name(name: str, id_name: str) -> tuple[str, str, dict[str, Any]]:
    """(label, spec to load, extra options): a bare ``interp`` (``rotate``, ``flip``) means interp of the ID set."""
    spec = parse_spec(name)
    benchmark = benchmark_of(id_name)
    if benchmark and name in benchmark.ood_sets:  # OpenOOD's set of this benchmark, read from its list
        return name, list_spec(benchmark.name, name), {}
    if spec.name in OF_ID_SET and spec.variant is None and "base" not in spec.options and spec.classes is None:
        # the base goes in as an option, so an ID spec with classes (digits[0-4]) stays whole
        return str(Spec(spec.name, id_name, dict(spec.options))), name, {"base": id_name}
    return name, name, {}


def load_ood_set(model, name: str, id_name: str, id_size: int, *, split: str, n: int | None,
                 context: RunContext) -> tuple[str, Any]:
    """(label, dataset) for one OOD spec; a synthetic set takes the model's input shape and, without
    ``n``, as many examples as the ID set. The ID set itself is refused."""
    label, spec, extra = expand_ood_name(name, id_name)
    if label == id_name:
        raise UsageError(f"OOD set {name!r} is the in-distribution set itself; choose another dataset")
    ds = load_dataset(spec, split, context.data_root, context.download, **model_data_options(model), n=id_size,
                      seed=context.seed, **extra)
    ds = subsample(ds, n, context.seed)
    check_input_shape(model, ds, label)
    return label, ds


def load_ood_sets(model, ood: Sequence[str], id_name: str, id_size: int, *, split: str, n: int | None,
                  context: RunContext, num_classes: int | None = None) -> list[tuple[str, Any, str | None]]:
    """(label, dataset, group) for every OOD spec or group name (:func:`expand_groups`; ``num_classes``
    of the ID dataset names the classes a class subset holds out); a set named twice is refused."""
    loaded: list[tuple[str, Any, str | None]] = []
    for name, group in expand_groups(list(ood), id_name, num_classes):
        label, ds = load_ood_set(model, name, id_name, id_size, split=split, n=n, context=context)
        if label in (lbl for lbl, _, _ in loaded):
            raise UsageError(f"OOD set {label!r} is given twice")
        loaded.append((label, ds, group))
    return loaded


def shares_fit_images(ds, split: str) -> bool:
    """Whether the images of ``ds`` (the ``split`` asked for) are also those detectors fit on (the
    train split): the train split itself, or every split of a set without separate splits."""
    return split == "train" or not has_test_split(ds)


def fit_part(n_images: int, seed: int):
    """(fitted, evaluated) indices of a set that :func:`shares_fit_images`: a seeded half to fit on
    (detectors such as knn need many fit images; temperature scaling holds out less)."""
    return holdout_parts(n_images, max(1, n_images // 2), seed)


def load_id_set(model, id_name: str, *, split: str, n: int | None, fits: bool, fit_on: str | None = None,
                context: RunContext) -> tuple[Any, dict[str, Any]]:
    """(the in-distribution images evaluated, what they are: ``notes`` and, when part of the set is
    left out for fitting, ``held_out``). ``fits``: detectors (or tuning) are fitted, on the train
    split of ``fit_on`` (default: the ID set)."""
    seed = context.seed
    ds = load_dataset(id_name, split, context.data_root, context.download, **model_data_options(model))
    check_input_shape(model, ds, id_name)
    note = no_test_split_note(id_name, ds)
    info: dict[str, Any] = {"notes": [note] if note else []}
    if fits and (fit_on is None or same_dataset(fit_on, id_name)) and shares_fit_images(ds, split):
        fitted, rest = fit_part(len(ds), seed)
        info["held_out"] = {"fitted": len(fitted), "evaluated": len(rest), "seed": int(seed)}
        info["notes"].append(f"{id_name} has no split to fit detectors on apart from the images evaluated: they were "
                             f"fitted on a seeded {len(fitted)} of its {len(ds)} images, and the other {len(rest)} are "
                             "evaluated as in-distribution")
        ds = take(ds, rest)
    ds = subsample(ds, n, seed)
    seen_notes, seen = check_evaluated(model, id_name, split, ds, context=context)
    info["notes"] += seen_notes
    return ds, {**info, **seen}
