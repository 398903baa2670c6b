"""``jemeval report``: several models evaluated side by side in one folder (a shell over jemeval.report)."""
from __future__ import annotations

import json

import click

from jemeval.cli.commands.robust import split_attack_specs
from jemeval.cli.config import config_option
from jemeval.cli.options import (
    eval_fraction,
    input_path_option,
    noise_option,
    nproc_option,
    parse_epsilons,
    parse_ints,
    run_options,
    split_list,
)
from jemeval.cli.output import config_provenance
from jemeval.cli.paths import Command, class_map_option, dataset_option
from jemeval.errors import UsageError
from jemeval.results import text_table

SECTIONS_HELP = "accuracy, calibration, ood, robust, samples"
#: the sections whose functions refine inputs by SGLD chains (their ``chain_sigma``)
CHAIN_SECTIONS = ("accuracy", "robust")


def parse_value(text: str):
    """A --set value: JSON (3, 0.5, true, [0,1]), a fraction (8/255), a comma list, else the text."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    if "," in text:
        return [parse_value(part) for part in split_list(text, "--set")]
    try:
        return eval_fraction(text)
    except (ValueError, ZeroDivisionError):
        return text


#: the --set prefix of the export metadata (not a section: what the leaderboards want that no section computes)
EXPORT_SET = "export"


def parse_set(values: tuple[str, ...]) -> dict[str, dict]:
    """('robust.grad_mode=bpda', 'samples.steps=200') -> {'robust': {'grad_mode': 'bpda'}, 'samples': {...}}.
    ``export.[MODEL.]FIELD=VALUE`` keeps the model's name as written (only the field's dashes become
    underscores) and its value as text unless it is JSON (a title with commas stays one title)."""
    options: dict[str, dict] = {}
    for item in values:
        target, eq, value = item.partition("=")
        section, dot, key = target.strip().partition(".")
        if not (eq and dot and section and key):
            raise UsageError(f"--set takes SECTION.KEY=VALUE (e.g. robust.steps=100), got {item!r}")
        if section == EXPORT_SET:
            model, _, field = key.strip().rpartition(".")
            options.setdefault(section, {})[(model + "." if model else "") + field.replace("-", "_")] = \
                _json_or_text(value.strip())
            continue
        options.setdefault(section, {})[key.strip().replace("-", "_")] = parse_value(value.strip())
    return options


def _json_or_text(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def with_chain_sigma(options: dict[str, dict], chain_sigma: float | None) -> dict[str, dict]:
    """``--chain-sigma`` as the ``chain_sigma`` option of the sections that refine (accuracy, robust);
    a --set of the same option as well is refused, not silently overridden."""
    if chain_sigma is None:
        return options
    for section in CHAIN_SECTIONS:
        if "chain_sigma" in options.get(section, {}):
            raise UsageError(f"--chain-sigma and --set {section}.chain_sigma both set the chain noise; give one")
        options.setdefault(section, {})["chain_sigma"] = chain_sigma
    return options


def export_option(ctx, param, value):
    """--export: the leaderboard formats, checked before anything is computed (a typo is one line)."""
    from jemeval.reports.exports import export_formats

    return None if value is None else export_formats(value)


@click.command("report", cls=Command)
@config_option
@input_path_option("--model", "models", what="an input checkpoint", multiple=True, required=True,
                   help="A checkpoint to evaluate; repeat for each model (e.g. --model runs/digits/best.pt "
                        "--model runs/digits-baseline/best.pt). A quoted glob ('runs/jem-s*/best.pt') is a seed "
                        "group: one model, shown as mean +- sd over its runs.")
@click.option("--name", "names", multiple=True,
              help="The model's name in the tables, once per --model in the same order; one --name for several "
                   "--model makes them one seed group. Default: the run folder (runs/digits/best.pt -> digits).")
@click.option("--preset", type=click.Choice(["quick", "paper"]), default="quick", show_default=True,
              help="quick: minutes on a CPU for digits; paper: the JEM paper's settings (sigma 0.03, K = 0,1,10, "
                   "every OOD set, PGD 100 steps x 20 restarts on 300 images, L2 and Linf).")
@click.option("--sections", default=None, help=f"Comma-separated sections [default: all: {SECTIONS_HELP}].")
@click.option("--out", "out", type=click.Path(file_okay=False), default="runs/report", show_default=True,
              help="The report folder: report.md, report.html, report.json, figures/ and the cache/ that lets a "
                   "rerun finish a killed report. A new or empty folder, or one a report wrote (listed in its "
                   ".jemeval-report.json); a folder holding other files is refused.")
@click.option("--force", is_flag=True, help="Recompute every section instead of reusing the cached results.")
@dataset_option("--data", "--id", "data", default=None,
                help="Dataset of every section (accuracy, calibration, OOD in-distribution, robust); --id is the "
                     "same option, as ood names it (--id imagenet: OpenOOD's lists). Default: the models' training "
                     "dataset.")
@click.option("--n", "n", type=click.IntRange(min=1), default=None,
              help="Seeded random subset of N examples in accuracy, calibration, ood and robust.")
@noise_option("input_sigma", default=None, old_sigma=True,
              help="Noise std on evaluation inputs (accuracy, calibration, ood) [quick: 0; paper: 0.03].")
@noise_option("chain_sigma", default=None,
              help="Noise std on each refinement chain (accuracy and robust with --refine-steps > 0) [quick: 0; "
                   "paper: robust 0.03].")
@click.option("--refine-steps", default=None, help="SGLD refinement steps K for accuracy and robust, e.g. 0,1,10.")
@dataset_option("--ood", "ood", default=None,
                help="OOD sets, comma-separated [quick: uniform,constant,interp,gaussian; paper: the dataset's].")
@click.option("--score", "scores", default=None, help="OOD scores, comma-separated [default: logpx,maxprob,gradnorm].")
@click.option("--norm", default=None, help="Robust threat model(s): l2, linf or l2,linf (one attack run each).")
@click.option("--epsilons", default=None, help="Robust epsilons in [0, 1] pixel units, e.g. 0,0.5,1.")
@click.option("--attack", "attacks", default=None, help="Robust attack(s), e.g. pgd or pgd:steps=100,restarts=5.")
@click.option("--set", "options", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Any other option of a section's function, e.g. robust.grad_mode=bpda, samples.steps=200, "
                   "ood.bootstrap=200; repeat for several.")
@click.option("--json", "as_json", is_flag=True, help="Print report.json (records + provenance) on stdout.")
@click.option("--export", "export", default=None, metavar="FORMATS", callback=export_option,
              help="Also write the leaderboards' formats into the report folder, comma-separated: openood "
                   "(openood.csv, OpenOOD v1.5's result file) and/or robustbench (robustbench-<model>-<L2|Linf>.json, "
                   "RobustBench's model_info). What only the authors know comes from --set export.FIELD=VALUE "
                   "(name, link, authors, venue, reported, additional_data, outlier_data; export.MODEL.FIELD for one "
                   "model) or --set export.metadata=FILE (JSON); a file the leaderboard would reject is refused "
                   "before anything is computed.")
@class_map_option(help="Map the data's classes to the models' where they differ (accuracy, calibration, robust, "
                       "and ood's detectors fitted on labels): a JSON object or a CSV of 'data class,model class' "
                       "(docs/data.md, class maps).")
@nproc_option
@run_options(batch_size=None)
def cli(models, names, preset, sections, out, force, data, n, input_sigma, chain_sigma, refine_steps, ood, scores, norm,
        epsilons, attacks, options, as_json, export, class_map, context):
    """Evaluate several models side by side: accuracy, calibration, OOD, robustness, samples.

    Runs jemeval eval, calibrate, ood, robust and sample for every model on the same data, seeds
    and subsets and writes DIR/report.md, DIR/report.html (self-contained), DIR/report.json and
    DIR/figures/. Each (model, section) result is cached in DIR/cache as soon as it is computed:
    rerunning the same command after a kill finishes the report, computing only what is missing.
    A section that fails for one model is shown with its error; the rest is still written.

    \b
    Example:
      jemeval report --model runs/digits/best.pt --model runs/digits-baseline/best.pt \\
          --name JEM --name baseline --out runs/report
      jemeval report --model 'runs/jem-s*/best.pt' --name JEM \\
          --model 'runs/base-s*/best.pt' --name baseline --out runs/report
    """
    from jemeval.cli.paths import check_outside_model_caches
    from jemeval.reports.build import report

    check_outside_model_caches("--out", out)
    options = parse_set(options)
    metadata = options.pop(EXPORT_SET, None)
    if metadata is not None and not export:
        raise UsageError("--set export.* gives the leaderboards' metadata, and there is no --export; add --export "
                         "openood and/or robustbench")
    result = report(
        list(models), names=list(names) or None, out=out, preset=preset, sections=sections, force=force, data=data,
        n=n, input_sigma=input_sigma,
        refine_steps=None if refine_steps is None else parse_ints(refine_steps, "--refine-steps"),
        ood=None if ood is None else split_list(ood, "--ood"),
        scores=None if scores is None else split_list(scores, "--score"),
        norm=None if norm is None else split_list(norm, "--norm"),
        epsilons=None if epsilons is None else parse_epsilons(epsilons, "--epsilons"),
        attacks=None if attacks is None else split_attack_specs(attacks), class_map=class_map,
        options=with_chain_sigma(options, chain_sigma), config=config_provenance(), export=export,
        export_metadata=metadata, context=context,
    )
    exported = result.paths.get("exports", [])
    if as_json:
        click.echo(result.to_json())
    else:
        click.echo(text_table(result.status, ["model", "section", "status", "seconds"], ".1f"))
    for key in ("markdown", "html", "json"):
        click.echo(f"wrote {result.paths[key]}", err=True)
    for path in exported:
        click.echo(f"wrote {path}", err=True)
    for note in result.extra.get("export_notes", []):
        click.echo(f"note: {note}", err=True)
    if result.extra["errors"]:
        failed = "; ".join(f"{e['model']} / {e['section']}: {e['error']}" for e in result.extra["errors"])
        raise click.ClickException(f"the report was written to {result.paths['dir']}, but "
                                   f"{len(result.extra['errors'])} section(s) failed: {failed}")
