"""``jemeval calibrate``: ECE, MCE, RMS, Brier, NLL, accuracy and the reliability table (a shell over calibrate)."""
from __future__ import annotations

import click

from jemeval.cli.options import model_option, run_options, sigma_option, split_list
from jemeval.cli.output import emit, output_options, write_files
from jemeval.cli.paths import Command, class_map_option, dataset_option, output_path_option

SUMMARY_COLUMNS = ["calibration", "temperature", "ece", "mce", "rms", "brier", "nll", "accuracy", "n"]


def bins_rows(result) -> list[dict]:
    """The per-bin reliability table of every record, one row per (calibration, bin)."""
    return [{"calibration": r.get("calibration", "none"), **b} for r in result.records for b in r["bins"]]


@click.command("calibrate", cls=Command)
@model_option
@dataset_option("--data", default=None, help="Dataset to calibrate on. Default: the model's training dataset.")
@click.option("--split", default="test", show_default=True, help="Split of --data.")
@click.option("--bins", type=int, default=20, show_default=True,
              help="Confidence bins B: equal-width for ece/mce/rms/classwise-ece, equal-mass for adaptive-ece and "
                   "debiased-l2, and the reliability table's (see --bins-strategy); at most 10,000.")
@click.option("--bins-strategy", type=click.Choice(["uniform", "equal-mass"]), default="uniform", show_default=True,
              help="Bins of the reliability table and --plot: equal-width, or equal-mass (each bin about N/B of the "
                   "sorted confidences; cuts at midpoints, ties go to the lower bin).")
@click.option("--metric", "metrics", default=None,
              help="Comma-separated calibration metrics to report, plugin metrics included (see 'jemeval list "
                   "metrics'). Default: the built-ins ece,mce,rms,brier,nll; adaptive-ece, classwise-ece and "
                   "debiased-l2 when named.")
@click.option("--n", "n", type=click.IntRange(min=1), default=None, help="Use a seeded random subset of N examples.")
@sigma_option
@click.option("--temperature-scaling", is_flag=True,
              help="Also fit one temperature T (a bounded search over 0.05..20 minimising the NLL) on images never "
                   "evaluated: the dataset's val split, the validation images the trainer held out, else a seeded "
                   "train subset (a set without a test split: a seeded part left out of the evaluation); report "
                   "the calibrated numbers.")
@click.option("--val-size", type=int, default=5000, show_default=True,
              help="Validation images for --temperature-scaling (capped at 20% of the train split).")
@output_path_option("--plot", suffix=".png", metavar="FILE.png",
                    help="Write a reliability diagram (empty bins marked, ECE printed) to FILE.png.")
@click.option("--no-bins", "hide_bins", is_flag=True, help="Do not print the per-bin table.")
@class_map_option
@output_options
@run_options()
def cli(model_path, data, split, bins, bins_strategy, metrics, n, input_sigma, temperature_scaling, val_size, plot,
        hide_bins, class_map, context, **output):
    """Calibration of a model's confidences (max softmax) on a labelled dataset.

    ECE = sum_b n_b/N |acc_b - conf_b| over equal-width bins (lo, hi] (confidence 0 in the first
    bin, 1 in the last); MCE = max over non-empty bins; RMS = sqrt(sum_b n_b/N (acc_b - conf_b)^2);
    Brier = mean sum_k (p_k - 1[k=y])^2; NLL = mean -log p(y|x). Opt-in: adaptive-ece (equal-mass
    bins), classwise-ece (Kull et al.: ECE of each p_k, averaged over classes), debiased-l2 (Kumar
    et al.). --csv writes the summary; --json also holds every bin.

    \b
    Example:
      jemeval calibrate --model runs/digits/best.pt --temperature-scaling --plot reliability.png
    """
    from jemeval.evaluation.calibration import calibrate
    from jemeval.plots.calibration import plot_calibration_result
    from jemeval.results import markdown_table, text_table

    result = calibrate(
        model_path, data, split=split, bins=bins, bins_strategy=bins_strategy, n=n, input_sigma=input_sigma,
        temperature_scaling=temperature_scaling, val_size=val_size,
        metrics=split_list(metrics, "--metric") if metrics else None, class_map=class_map, context=context,
    )
    write_files(result, (plot, plot_calibration_result))
    emit(result, columns=SUMMARY_COLUMNS + [k for k in result.records[0] if k not in SUMMARY_COLUMNS and k != "bins"],
         **output)
    if output.get("as_json") or hide_bins:
        return
    click.echo("")
    click.echo((markdown_table if output.get("as_markdown") else text_table)(bins_rows(result)))
