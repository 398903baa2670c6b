"""``jemeval.report``: the whole evaluation of several models, side by side, written into one folder.

For every section (accuracy, calibration, ood, robust, samples) and every model, the section's
evaluation function runs on the same data, seeds and subsets (:mod:`jemeval.reports.settings`),
and its Results are cached in DIR the moment they are computed (:mod:`jemeval.reports.cache`): a
report killed halfway completes on the next run, computing only what is missing. A section that
fails for one model is shown with its one-line error and the rest is still written. Then::

    DIR/report.md     tables (models as columns, best in bold), figures, provenance
    DIR/report.html   the same page, self-contained (figures inlined)
    DIR/report.json   every record with ``section`` and ``model`` keys, each run's provenance
    DIR/figures/      reliability, ROC, robustness and an attack sweep's convergence curves (models
                      overlaid), score histograms, sample grids
    DIR/cache/        the per (model, section) results
    DIR/.jemeval-report.json   the files the report wrote (only those are ever replaced or removed)
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jemeval.atomic import write_text_atomic
from jemeval.context import RunContext, shared_datasets, takes_context
from jemeval.errors import CheckpointError, UsageError
from jemeval.evaluation.classes import align, model_classes, read_class_map
from jemeval.evaluation.inputs import recorded_dataset
from jemeval.formats.load import load_model
from jemeval.progress import ProgressArg, progress_bar, resolve_progress
from jemeval.provenance import file_sha256, provenance
from jemeval.reports.analysis import analyse, labels
from jemeval.reports.cache import PRODUCTS, REPORT_SCHEMA, Entry, ReportFolder, claim_folder, load_entry, save_entry
from jemeval.reports.document import to_html, to_markdown
from jemeval.reports.figures import draw_figures, is_figure_name
from jemeval.reports.groups import check_distinct_runs, default_names, model_groups, run_names
from jemeval.reports.page import ModelInfo, report_blocks
from jemeval.reports.sections import failure, run_section
from jemeval.reports.settings import resolve_options, resolve_sections, settings_hash
from jemeval.reports.summary import training_cost
from jemeval.results import Result
from jemeval.runtime import distributed as D
from jemeval.runtime.devices import resolve_device
from jemeval.runtime.shards import rank_and_world

DEFAULT_OUT = os.path.join("runs", "report")


@dataclass
class ReportResult(Result):
    """What :func:`report` returns: ``records`` (every record, with ``section`` and ``model``) and the
    report's provenance, plus ``results[model][section]`` (the sections' own Results: one, or one per
    norm for robust), ``errors[model][section]`` (one line each), ``status`` (computed, cached or
    failed, and seconds, per model and section) and ``paths`` (the files written)."""

    results: dict[str, dict[str, list[Result]]] = field(default_factory=dict)
    errors: dict[str, dict[str, str]] = field(default_factory=dict)
    status: list[dict[str, Any]] = field(default_factory=list)
    paths: dict[str, Any] = field(default_factory=dict)


__all__ = ["ReportResult", "default_names", "report"]


def describe(name: str, path: str, group: str | None = None) -> ModelInfo:
    """The checkpoint's hash, architecture, training dataset and training cost (it is loaded once, on
    the CPU, to check it); a model source (``timm:NAME``, ...) is identified by the hash of the
    weights file it read. ``group``: the model (seed group) the run belongs to, when not itself."""
    model = load_model(path, device="cpu")
    sha256 = (model.metadata.get("checkpoint") or {}).get("sha256") or file_sha256(path)
    seed = (model.metadata.get("provenance") or {}).get("seed", (model.metadata.get("config") or {}).get("seed"))
    return ModelInfo(name, path, sha256, getattr(model, "arch", None), model.metadata.get("dataset"),
                     group=group or name, training=training_cost(model.metadata), classes=model_classes(model),
                     input_shape=model.input_shape,
                     seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None)


def describe_groups(models: Any, names: Sequence[str] | None) -> list[ModelInfo]:
    """Every run of every model (seed group), described; a group listing one checkpoint twice, or
    whose runs' names clash with another model's, is refused in one line."""
    groups = model_groups(models, names)
    infos = [describe(run, path, name) for name, paths in groups for run, path in zip(run_names(name, paths), paths)]
    runs = [m.name for m in infos]
    if len(set(runs)) != len(runs):
        clash = sorted({r for r in runs if runs.count(r) > 1})
        raise UsageError(f"names: a seed group's runs are named NAME #i, and {clash} is also another model's name; "
                         "rename it", param="names")
    check_distinct_runs({name: [m for m in infos if m.group == name] for name, _ in groups})
    return infos


def common_dataset(models: list[ModelInfo]) -> str:
    """The one dataset every model was trained on (the report compares them on it)."""
    unknown = [m.path for m in models if not m.dataset]
    if unknown:
        raise UsageError(f"checkpoint {unknown[0]!r} does not record its training dataset; give data=DATASET "
                         "(e.g. cifar10)", param="data")
    found = sorted({m.dataset for m in models})
    if len(found) > 1:
        raise UsageError(f"the models were trained on different datasets ({', '.join(found)}); give data=DATASET to "
                         "evaluate them all on one", param="data")
    return recorded_dataset(found[0], param="data")  # a plain name only: a checkpoint never picks files to read


def report_folder(out: str | os.PathLike, main: bool) -> ReportFolder:
    """The report folder: claimed by rank 0 (:func:`~jemeval.reports.cache.claim_folder`); the other ranks
    of a torchrun launch read the cache and never write."""
    if not main:
        return ReportFolder(out)
    return claim_folder(out, create_parents=os.fspath(out) == DEFAULT_OUT, figure_name=is_figure_name)


def class_map_contents(class_map: Any) -> tuple[dict[str, str] | None, dict[str, Any] | None]:
    """``class_map`` (a file or a dict) read once: its pairs go into every section's options (so the
    cache keys hold the map itself, not a path whose file may change), and where they came from."""
    if class_map is None:
        return None, None
    pairs, origin = read_class_map(class_map)
    return dict(pairs), origin


#: the sections that compare predictions with labels, and their dataset option
LABELLED_SECTIONS = {"accuracy": "data", "calibration": "data", "robust": "data"}


def check_classes(models: list[ModelInfo], plan: dict[str, dict[str, Any]], dataset: str | None,
                  context: RunContext) -> None:
    """Every model against the data of every section that compares its predictions with labels
    (:func:`jemeval.evaluation.classes.align`), before any section runs: a model whose classes are not
    the data's (and that the sections' ``class_map``, read once by :func:`class_map_contents`, does not
    map) is refused in one line, not after the others' sections were computed."""
    from jemeval.data import load_dataset

    shapes = {m.input_shape for m in models}
    shape = {"input_shape": shapes.pop()} if len(shapes) == 1 else {}  # the load the sections share
    for section, key in LABELLED_SECTIONS.items():
        spec = (plan.get(section) or {}).get(key) or dataset
        if section not in plan or not spec:
            continue
        ds = load_dataset(spec, "test", context.data_root, context.download, **shape)
        for m in models:
            try:
                align(m.classes, m.dataset, ds, spec, plan[section].get("class_map"))
            except UsageError as exc:
                raise UsageError(f"{m.name}: {exc}", param=exc.param) from None


def prefixed(progress: ProgressArg, prefix: str):
    """The progress ``progress`` stands for, its bars' descriptions starting with ``prefix``."""
    inner = resolve_progress(progress)
    return lambda total, desc, **kw: inner(total, f"{prefix} {desc}", **kw)


def compute(folder: ReportFolder, models: list[ModelInfo], plan: dict[str, dict[str, Any]], context: RunContext, *,
            force: bool, dataset: str | None = None) -> dict[tuple[str, str], Entry]:
    """Every (model, section) Entry: from the cache when its settings match (and not ``force``) and it
    is what jemeval wrote, else computed and cached at once (the Entry's ``note`` says why a cached
    one was not used); a failure becomes the Entry's one-line error. The cache key covers ``dataset``
    (the sections' default data) as it covers the data the options name, and the context's device
    (resolved); the sections run in ``context`` (its progress shown per section).

    Under torchrun every rank computes every section together (the sections share out their batches);
    rank 0 decides what the cache holds and alone writes it, and the ranks agree on every error.
    """
    entries: dict[tuple[str, str], Entry] = {}
    writes = rank_and_world()[0] == 0
    with progress_bar(context.progress, len(plan) * len(models), "report", unit="section", leave=True) as bar:
        for section, options in plan.items():
            for m in models:
                bar.describe(f"report: {section} {m.name}")
                key = settings_hash(section, options, checkpoint_sha256=m.sha256, device=str(context.device),
                                    datasets=[dataset] if dataset else [])
                notes: list[str] = []
                entry = None if force else load_entry(folder.path, section, m.sha256, key, notes)
                if not D.main_value(entry is not None):
                    entry = compute_entry(folder, section, m, options, key, context, write=writes)
                    entry.note = notes[0] if notes else None
                elif entry is None:  # rank 0's cache hit (this rank writes nothing, so needs no Results)
                    entry = Entry(section, m.sha256, cached=True)
                else:  # the same bytes, maybe cached under another path: the runs name this model's path
                    for result in entry.runs:
                        named_path(result.provenance, m)
                entries[(m.name, section)] = entry
                bar.update(1)
    return entries


def compute_entry(folder: ReportFolder, section: str, m: ModelInfo, options: dict[str, Any], key: str,
                  context: RunContext, *, write: bool) -> Entry:
    """One (model, section) computed now, and cached when ``write``; a failure is its one-line error
    (agreed on by every rank: :func:`jemeval.runtime.distributed.shared_error`)."""
    start = time.perf_counter()
    try:
        runs = run_section(section, m.path, options,
                           context=context.replace(progress=prefixed(context.progress, f"[{m.name} {section}]")))
        check_unchanged(m, runs)
        if not write:
            return Entry(section, m.sha256, runs=runs, seconds=round(time.perf_counter() - start, 3))
        return save_entry(folder, section, m.sha256, key, runs, time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - reported in the page; the other sections go on
        seconds = round(time.perf_counter() - start, 3)
        return Entry(section, m.sha256, error=failure(D.shared_error(exc)), seconds=seconds)


def check_unchanged(m: ModelInfo, runs: list[Result]) -> None:
    """The runs read the bytes the report hashed (its cache key): a checkpoint replaced at the same path
    while the report ran would otherwise be cached under the old file's hash, and shown as it."""
    for result in runs:
        read = (result.provenance.get("checkpoint") or {}).get("sha256")
        if read and read != m.sha256:
            raise CheckpointError(f"checkpoint {m.path!r} changed while the report ran (SHA-256 {m.sha256[:12]}... "
                                  f"when described, {str(read)[:12]}... when {result.provenance.get('command')} "
                                  "read it); rerun the report once the file is final")


def named_path(prov: dict[str, Any], m: ModelInfo) -> None:
    """A cached run's provenance names ``m``'s checkpoint path when it read the same bytes (the cache is
    keyed on the checkpoint's content: a copy at another path reuses the entry)."""
    checkpoint = prov.get("checkpoint")
    if isinstance(checkpoint, dict) and checkpoint.get("sha256") == m.sha256 and os.path.isfile(m.path):
        checkpoint["path"] = str(m.path)


@takes_context
def report(
    models: Any,
    *,
    names: Sequence[str] | None = None,
    out: str | os.PathLike = DEFAULT_OUT,
    preset: str = "quick",
    sections: str | Sequence[str] | None = None,
    force: bool = False,
    data: str | None = None,
    n: int | None = None,
    input_sigma: float | None = None,
    refine_steps: int | Sequence[int] | None = None,
    ood: str | Sequence[str] | None = None,
    scores: str | Sequence[str] | None = None,
    norm: str | Sequence[str] | None = None,
    epsilons: Sequence[float] | None = None,
    attacks: Any = None,
    class_map: Any = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    config: Mapping[str, Any] | None = None,
    export: str | Sequence[str] | None = None,
    export_metadata: Mapping[str, Any] | None = None,
    context: RunContext,
) -> ReportResult:
    """Evaluate ``models`` (checkpoint paths, or a mapping name -> path) side by side into ``out``.

    ``preset`` (quick or paper) sets every section's options; ``data``, ``n``, ``seed``,
    ``input_sigma``, ``refine_steps``, ``ood``, ``scores``, ``norm`` (robust: one call per norm),
    ``epsilons``, ``attacks``, ``data_root``, ``download`` and ``batch_size`` override them in the
    sections that take them, and ``options`` (``{"robust": {"grad_mode": "bpda"}}``) sets any other
    parameter of a section's function; ``class_map`` (file or dict) as in :func:`check_classes`. ``seed``,
    ``data_root``, ``download``, ``batch_size``, ``device`` (default: cuda when available), ``progress``
    and ``cache`` are the run's :class:`~jemeval.context.RunContext`, which every section runs in.
    ``force`` recomputes cached results. ``config`` (what a ``--config`` file set) is recorded in the
    provenance. ``export``/``export_metadata``: the leaderboards' files, checked before any section
    runs (:func:`with_exports`). Returns a :class:`ReportResult`; files: the module docstring.
    """
    chosen = resolve_sections(sections)
    infos = describe_groups(models, names)
    dataset = data or common_dataset(infos)
    mapping, map_origin = class_map_contents(class_map)
    overrides = common_overrides(context, data=data, n=n, input_sigma=input_sigma, refine_steps=refine_steps, ood=ood,
                                 scores=scores, norm=norm, epsilons=epsilons, attacks=attacks, class_map=mapping)
    plan = resolve_options(preset=preset, sections=chosen, dataset=dataset, overrides=overrides, options=options)
    formats, metadata = planned_exports(export, export_metadata, infos, dataset=dataset, plan=plan)
    context = context.replace(device=resolve_device(context.device))
    main = rank_and_world()[0] == 0  # under torchrun rank 0 alone writes (the others compute with it)
    with shared_datasets():  # each set loaded once for every (model, section), not once per pair
        check_classes(infos, plan, dataset, context)  # before the folder is made: a refusal leaves nothing
        folder = report_folder(out, main)
        entries = compute(folder, infos, plan, context, force=force, dataset=dataset)
    prov = provenance(command="report", device=context.device, seed=int(context.seed), settings={
        "preset": preset, "sections": chosen, "data": dataset, "options": plan, "class_map": map_origin,
        "models": model_provenance(infos), **({"export": {"formats": formats, "metadata": metadata}} if formats
                                              else {})}) | ({"config": dict(config)} if config is not None else {})
    if not main:
        return rank_result(folder, prov)
    result = write_report(folder, infos, plan, entries, prov, preset=preset)
    return with_exports(result, formats, metadata) if formats else result


def model_provenance(infos: list[ModelInfo]) -> list[dict[str, Any]]:
    """Every run the report read: its name, checkpoint, SHA-256, architecture, dataset and group."""
    return [{"name": m.name, "checkpoint": m.path, "sha256": m.sha256, "arch": m.arch, "dataset": m.dataset,
             **({"group": m.group} if m.group != m.name else {})} for m in infos]


def common_overrides(context: RunContext, **given: Any) -> dict[str, Any]:
    """The common overrides (:data:`jemeval.reports.settings.COMMON`): ``given``, and what the run's
    context sets (seed, data_root, download, batch_size)."""
    return {**given, "seed": int(context.seed),
            "data_root": None if context.data_root is None else os.fspath(context.data_root),
            "download": context.download or None, "batch_size": context.batch_size}


def rank_result(folder: ReportFolder, prov: dict[str, Any]) -> ReportResult:
    """What a rank other than 0 returns under torchrun: no records (rank 0's report has everything)."""
    out = folder.path
    return ReportResult([], prov, extra={"runs": [], "errors": []},
                        paths={"dir": out, "markdown": out / "report.md", "html": out / "report.html",
                               "json": out / "report.json"})


def planned_exports(export: str | Sequence[str] | None, metadata: Mapping[str, Any] | None, infos: list[ModelInfo],
                    *, dataset: str, plan: dict[str, dict[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    """(the export formats, the metadata as :func:`~jemeval.reports.leaderboards.export_metadata`
    reads it), checked against the plan before any section runs."""
    if export is None:
        return [], {}
    from jemeval.reports.exports import check_export_plan, export_formats
    from jemeval.reports.leaderboards import export_metadata as read_metadata

    formats, metadata = export_formats(export), read_metadata(metadata)
    check_export_plan(formats, metadata, list(dict.fromkeys(m.model for m in infos)), dataset=dataset, plan=plan)
    return formats, metadata


def with_exports(result: ReportResult, formats: list[str], metadata: dict[str, Any]) -> ReportResult:
    """``result`` once its exports are written (:mod:`jemeval.reports.exports`: ``formats`` openood,
    robustbench; the fields only the authors know from ``metadata``) into ``paths["exports"]``, and
    why a cell is '/' into ``extra["export_notes"]``; a refused export is one line saying that the
    report itself is written."""
    from jemeval.reports.exports import write_exports

    notes: list[str] = []
    try:
        result.paths["exports"] = write_exports(result.paths["dir"], formats, metadata=metadata, notes=notes)
    except UsageError as exc:
        raise UsageError(f"the report is written to {str(result.paths['dir'])!r}, its export is not: {exc}",
                         param=exc.param) from None
    result.extra["export_notes"] = notes
    return result


def write_report(folder: ReportFolder, models: list[ModelInfo], plan: dict[str, dict[str, Any]],
                 entries: dict[tuple[str, str], Entry], prov: dict[str, Any], *, preset: str) -> ReportResult:
    """Assemble the records, draw the figures, write report.md/.html/.json; the ReportResult. Its
    notes name the failed sections and the cached entries that were recomputed (and why)."""
    out = folder.path
    outcomes: dict[str, dict[str, list[Result]]] = {s: {} for s in plan}
    errors: dict[str, dict[str, str]] = {s: {} for s in plan}
    records, runs, failed, status, recomputed = [], [], [], [], []
    sizes = {m.model: sum(1 for o in models if o.model == m.model) for m in models}
    for section in plan:
        for m in models:
            entry, named = entries[(m.name, section)], labels(m, sizes[m.model])
            state = "failed" if entry.error else "cached" if entry.cached else "computed"
            status.append({"model": m.name, "section": section, "status": state, "seconds": entry.seconds})
            if entry.note:
                recomputed.append(f"{m.name} / {section}: {entry.note}")
            if entry.error:
                errors[section][m.name] = entry.error
                failed.append({"section": section, **named, "error": entry.error})
                continue
            outcomes[section][m.name] = entry.runs
            for result in entry.runs:
                records += [{"section": section, **named, **r} for r in result.records]
                runs.append({"section": section, **named, "seconds": entry.seconds,
                             **{k: v for k, v in result.to_dict().items() if k != "records"}})
    analysis = analyse(models, plan, outcomes, entries, seed=int(prov.get("seed") or 0))
    figures = draw_figures(folder, outcomes)
    title = "jemeval report: " + " vs ".join(dict.fromkeys(m.model for m in models))
    blocks = report_blocks(title=title, preset=preset, models=models, plan=plan, outcomes=outcomes, errors=errors,
                           figures=figures, provenance=prov, out=out, analysis=analysis)
    notes = [f"{f.get('run', f['model'])} / {f['section']}: failed: {f['error']}" for f in failed] + recomputed
    extra = {"schema": REPORT_SCHEMA, "runs": runs, "errors": failed,
             **{k: analysis[k] for k in ("groups", "comparisons", "summary", "cost")}}
    result = ReportResult(records, prov, extra=extra, notes=notes,
                          results={m.name: {s: outcomes[s][m.name] for s in plan if m.name in outcomes[s]}
                                   for m in models},
                          errors={m.name: {s: errors[s][m.name] for s in plan if m.name in errors[s]} for m in models},
                          status=status)
    paths = {"dir": out, "markdown": out / "report.md", "html": out / "report.html", "json": out / "report.json",
             "figures": [p for figs in figures.values() for p, _, error in figs if error is None]}
    folder.record(*PRODUCTS)
    write_text_atomic(folder.target("report.md"), to_markdown(blocks))
    write_text_atomic(folder.target("report.html"), to_html(blocks, title))
    result.save_json(folder.target("report.json"))
    result.paths = paths
    return result
