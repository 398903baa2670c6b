"""What a report computes: its sections, the presets, and the options each section's function gets.

A report runs the existing evaluation functions, one per section, with keyword options resolved
in three layers, each over the one before:

1. the preset (:data:`PRESETS`): ``quick`` (minutes on a CPU for digits) or ``paper`` (the JEM
   paper's settings: more inputs, refinement steps 0/1/10, every OOD set of the dataset);
2. the common overrides (``data``, ``n``, ``seed``, ``input_sigma``, ``refine_steps``, ``ood``,
   ``scores``, ``norm``, ``epsilons``, ``attacks``, ``data_root``, ``download``, ``batch_size``), each
   sent to the sections that take it (:data:`COMMON`);
3. ``options``: ``{section: {parameter: value}}`` for anything else a section's function accepts
   (checked against its signature), so options added to those functions flow through unchanged.

The resolved options are JSON-able and, with the checkpoint's hash and the device, hashed into the
key under which a (model, section) result is cached (:func:`settings_hash`).
"""
from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jemeval.errors import UsageError, did_you_mean
from jemeval.evaluation.accuracy import evaluate
from jemeval.evaluation.calibration import calibrate
from jemeval.evaluation.generation import check_sample_args, sample
from jemeval.evaluation.inputs import check_min, check_refine_steps
from jemeval.evaluation.limits import check_count
from jemeval.evaluation.ood.evaluate import DEFAULT_SCORES, check_bootstrap, evaluate_ood
from jemeval.evaluation.robust.evaluate import (
    DEFAULT_EPSILONS,
    MAX_EPSILON,
    check_counts,
    check_robust_args,
    check_robust_counts,
    robust,
)
from jemeval.registry import parse_spec, split_specs
from jemeval.results import _plain

#: the sections in report order, and the function each one runs
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "accuracy": evaluate, "calibration": calibrate, "ood": evaluate_ood, "robust": robust, "samples": sample,
}
SECTIONS = tuple(FUNCTIONS)
#: parameters the report passes itself (never options): the model, where it runs, how progress shows, the
#: run's context they come in
RESERVED = ("model", "device", "progress", "context")
#: robust takes one norm per call; a report's robust section takes a list and calls robust once per norm
ROBUST_NORMS_KEY = "norm"

#: OOD sets used by the quick preset (no download needed) and by the paper preset per dataset
SYNTHETIC_OOD = ["uniform", "constant", "interp", "gaussian"]
PAPER_OOD = {
    "cifar10": ["svhn", "cifar100", "celeba", "interp", "uniform", "constant"],
    "cifar100": ["svhn", "cifar10", "celeba", "interp", "uniform", "constant"],
    "svhn": ["cifar10", "cifar100", "celeba", "interp", "uniform", "constant"],
}
#: epsilons per norm in [0, 1] pixel units. Each list ends at the norm's largest epsilon (Linf 1, L2
#: "max": the input's diameter, whatever the image size), where every image is within reach: only
#: there does the large-epsilon sanity check (evaluation/robust/checks.py) judge a refined model
#: (K > 0), which otherwise may look robust because its randomness undoes the adversarials.
QUICK_EPSILONS = {"l2": [0.0, 0.5, 1.0, 2.0, MAX_EPSILON], "linf": [0.0, 2 / 255, 8 / 255, 16 / 255, 1.0]}
PAPER_EPSILONS = {"l2": [*DEFAULT_EPSILONS["l2"], MAX_EPSILON], "linf": [*DEFAULT_EPSILONS["linf"], 1.0]}

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # two digits models on 2 CPU cores in minutes: the whole test set for the cheap sections, a
    # short PGD on 50 inputs for robustness, 8 short chains per class for the samples
    "quick": {
        "accuracy": {"refine_steps": [0, 1]},
        "calibration": {"temperature_scaling": True},
        "ood": {"scores": list(DEFAULT_SCORES)},
        "robust": {"norm": ["l2"], "refine_steps": [0, 1], "n": 50, "steps": 10, "epsilons": QUICK_EPSILONS},
        "samples": {"classes": "all", "n": 8, "steps": 60},
    },
    # the JEM paper (jem-reference.md, section 4): sigma 0.03 on every evaluation input and chain,
    # K = 0, 1, 10; 300 test images attacked by PGD with 100 steps and 20 restarts in L2 and Linf
    "paper": {
        "accuracy": {"refine_steps": [0, 1, 10], "input_sigma": 0.03},
        "calibration": {"temperature_scaling": True, "input_sigma": 0.03},
        "ood": {"scores": list(DEFAULT_SCORES), "input_sigma": 0.03},
        "robust": {"norm": ["l2", "linf"], "refine_steps": [0, 1, 10], "n": 300, "steps": 100, "restarts": 20,
                   "chain_sigma": 0.03, "epsilons": PAPER_EPSILONS},
        "samples": {"classes": "all", "n": 100, "steps": 100},
    },
}

#: common override -> the parameter it sets in each section that has one
COMMON = {
    "data": {"accuracy": "data", "calibration": "data", "ood": "id", "robust": "data"},
    "n": {"accuracy": "n", "calibration": "n", "ood": "n", "robust": "n"},
    "seed": {s: "seed" for s in SECTIONS},
    "input_sigma": {"accuracy": "input_sigma", "calibration": "input_sigma", "ood": "input_sigma"},
    "refine_steps": {"accuracy": "refine_steps", "robust": "refine_steps"},
    "ood": {"ood": "ood"},
    "scores": {"ood": "scores"},
    "norm": {"robust": ROBUST_NORMS_KEY},
    "epsilons": {"robust": "epsilons"},
    "attacks": {"robust": "attacks"},
    "data_root": {"accuracy": "data_root", "calibration": "data_root", "ood": "data_root", "robust": "data_root",
                  "samples": "data_root"},
    "download": {"accuracy": "download", "calibration": "download", "ood": "download", "robust": "download"},
    "class_map": {"accuracy": "class_map", "calibration": "class_map", "ood": "class_map", "robust": "class_map"},
    "batch_size": {s: "batch_size" for s in SECTIONS},
}


def check_choice(value: str, choices: Sequence[str], param: str) -> str:
    if value not in choices:
        raise UsageError(f"unknown {param} {value!r}{did_you_mean(value, choices)}; choose from "
                         f"{', '.join(choices)}", param=param)
    return value


def resolve_sections(sections: str | Sequence[str] | None) -> list[str]:
    """The sections asked for (a list or a comma list), in report order; default: all of them."""
    if sections is None:
        return list(SECTIONS)
    names = split_specs(sections, "sections") if isinstance(sections, str) else [str(s) for s in sections]
    if not names:
        raise UsageError(f"sections is empty; choose from {', '.join(SECTIONS)}", param="sections")
    chosen = {check_choice(name, SECTIONS, "sections") for name in names}
    return [s for s in SECTIONS if s in chosen]


def default_ood(dataset: str, preset: str) -> list[str]:
    """The OOD sets of a preset: the paper's sets for the paper's datasets, else synthetic ones."""
    base = parse_spec(dataset).name
    return list(PAPER_OOD.get(base, SYNTHETIC_OOD)) if preset == "paper" else list(SYNTHETIC_OOD)


def check_options(section: str, options: Mapping[str, Any]) -> None:
    """Every option names a parameter of the section's function (did-you-mean otherwise)."""
    params = [p for p in inspect.signature(FUNCTIONS[section]).parameters if p not in RESERVED]
    for key in options:
        if key not in params:
            raise UsageError(f"{section} has no option {key!r}{did_you_mean(key, params)}; it takes: "
                             f"{', '.join(map(repr, params))}", param="options")


def resolve_options(*, preset: str, sections: Sequence[str], dataset: str, overrides: Mapping[str, Any],
                    options: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Section -> the keyword options its function is called with (preset < overrides < options)."""
    check_choice(preset, tuple(PRESETS), "preset")
    options = dict(options or {})
    for section in options:
        if section not in SECTIONS:
            raise UsageError(f"unknown section {section!r} in options{did_you_mean(section, SECTIONS)}; choose from "
                             f"{', '.join(SECTIONS)}", param="options")
    resolved: dict[str, dict[str, Any]] = {}
    for section in sections:
        chosen = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PRESETS[preset][section].items()}
        if section == "ood":
            chosen["ood"] = default_ood(dataset, preset)
        for name, value in overrides.items():
            if value is not None and section in COMMON[name]:
                chosen[COMMON[name][section]] = value
        chosen.update(options.get(section) or {})
        check_options(section, {k: v for k, v in chosen.items() if not (section == "robust" and k == "norm")})
        resolved[section] = _plain(chosen)
    if "robust" in resolved:
        robust_options = resolved["robust"]
        robust_options[ROBUST_NORMS_KEY] = norms = robust_norms(robust_options.get(ROBUST_NORMS_KEY, "l2"))
        if isinstance(robust_options.get("epsilons"), dict):  # per norm: keep the norms that run
            robust_options["epsilons"] = {k: v for k, v in robust_options["epsilons"].items() if k in norms}
        check_sweep(robust_options)
    check_counts_early(resolved)
    return resolved


def check_sweep(options: Mapping[str, Any]) -> None:
    """robust's ``eot_samples`` (a count or a sweep such as 1,4,16) and a ``steps`` sweep, checked as
    robust checks them but before anything runs: a bad count is one line now, not a failed section
    after every other section has been computed."""
    for key in ("eot_samples", "steps"):
        value = options.get(key)
        if value is None or (key == "steps" and not isinstance(value, list)):
            continue  # a single steps count goes to the attacks as it always did (they check it)
        try:
            check_counts(key, value)
        except UsageError as exc:
            raise UsageError(f"robust.{key}: {exc} (e.g. robust.{key}=1,4,16)", param="options") from None


def _robust_counts(options: Mapping[str, Any]) -> None:
    """robust's own checks of its counts, per norm, and of the passes they make per input."""
    for norm in options["norm"]:
        _, ks, modes, _ = check_robust_args(norm, options["refine_steps"], options["grad_mode"], options["attacks"],
                                            chains=options["chains"], draws=options["draws"],
                                            aa_version=options["aa_version"], chain_sigma=options["chain_sigma"])
        check_robust_counts(ks, modes, chains=options["chains"], restarts=options["restarts"],
                            eot_samples=options["eot_samples"], steps=options["steps"])


#: per section, the checks its function makes of its counts before it loads anything
#: (:mod:`jemeval.evaluation.limits`), run on the resolved options before any section runs
EARLY_CHECKS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "accuracy": lambda o: (check_refine_steps(o["refine_steps"]), check_min("chains", o["chains"], 1),
                           check_count("chains", o["chains"])),
    "calibration": lambda o: (check_min("bins", o["bins"], 1), check_count("bins", o["bins"])),
    "ood": lambda o: check_bootstrap(o["bootstrap"], o["level"]),
    "robust": _robust_counts,
    "samples": lambda o: check_sample_args(o["init"], o["n"], o["top_confident"], o["steps"]),
}


def check_counts_early(resolved: Mapping[str, Mapping[str, Any]]) -> None:
    """Every section's counts checked as its function checks them (with its defaults where the
    options leave one out), before any section runs: ``--set robust.steps=1000000000`` is one line
    now, not a section that runs for days after the others were computed."""
    for section, options in resolved.items():
        defaults = {name: p.default for name, p in inspect.signature(FUNCTIONS[section]).parameters.items()
                    if p.default is not inspect.Parameter.empty}
        try:
            EARLY_CHECKS[section]({**defaults, **options})
        except (TypeError, ValueError) as exc:  # a UsageError, or a value of the wrong type
            param = getattr(exc, "param", None)
            raise UsageError(f"{section}.{param}: {exc}" if param else f"{section}: {exc}", param="options") from None


def robust_norms(norm: str | Sequence[str]) -> list[str]:
    """robust's norm as a list (``"l2,linf"`` or ``["l2", "linf"]``): one robust call per norm."""
    norms = split_specs(norm, "norm") if isinstance(norm, str) else [str(n) for n in norm]
    if not norms:
        raise UsageError("norm is empty; give l2, linf or both", param="norm")
    return list(dict.fromkeys(norms))


def epsilons_for(epsilons: Any, norm: str) -> Any:
    """The epsilons of one norm: a dict holds one list per norm (None: robust's default list)."""
    return epsilons.get(norm) if isinstance(epsilons, dict) else epsilons


def settings_hash(section: str, options: Mapping[str, Any], *, checkpoint_sha256: str, device: str,
                  datasets: Sequence[str] = ()) -> str:
    """The cache key of one (model, section) result: what was computed, on which weights, where.

    What was computed includes the contents of every file or folder a dataset spec in the options
    names (``npz:d.npz``, ``folder:DIR``, in ``data``, ``ood``, ``fit_on``, any option) and in
    ``datasets`` (the dataset the sections default to: the models' recorded training set), by
    :func:`jemeval.data.dataset_sha256`: a data file replaced at the same path is another key, so a
    report never shows the numbers of the file it replaced. Registered sets are known by their name.
    """
    import secrets

    from jemeval import __version__
    from jemeval.data import dataset_sha256

    def specs(value: Any) -> list[str]:
        if isinstance(value, str):  # a spec, or a comma list of specs ("uniform,npz:d.npz")
            return [value, *split_specs(value, "options")] if ":" in value else []
        values = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
        return [spec for v in values for spec in specs(v)]

    plain = _plain(dict(options))
    data: dict[str, str | None] = {}
    for spec in dict.fromkeys(specs(plain) + specs(list(datasets))):
        try:
            data[spec] = dataset_sha256(spec)
        except OSError:  # unreadable: a key no entry can match (loading the set reports why)
            data[spec] = "unreadable " + secrets.token_hex(8)
    text = json.dumps({"section": section, "options": plain, "checkpoint": checkpoint_sha256, "device": device,
                       "jemeval": __version__, "data_sha256": {k: v for k, v in data.items() if v}}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
