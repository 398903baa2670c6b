"""``jemeval ood``: OOD detection table for a model against named datasets (a shell over evaluate_ood)."""
from __future__ import annotations

import click

from jemeval.cli.config import config_option
from jemeval.cli.options import model_option, nproc_option, run_options, sigma_option, split_list
from jemeval.cli.output import emit, output_options, write_files
from jemeval.cli.paths import Command, class_map_option, dataset_option, output_path_option

COLUMNS = None  # every record key: the chosen metrics and any CI columns


@click.command("ood", cls=Command)
@config_option
@model_option
@dataset_option("--ood", "ood", required=True,
                help="Comma-separated OOD datasets (uniform, constant, gaussian, interp = interp of the ID set, "
                     "svhn, cifar100, celeba, digits[5-9], npz:FILE, ...) and groups: near, far (per ID set: "
                     "digits, cifar10, cifar100; each set gets its own row, each group a mean row).")
@dataset_option("--id", "id", default=None,
                help="In-distribution dataset. Default: the model's training dataset.")
@click.option("--split", default="test", show_default=True, help="Split of the ID and OOD datasets.")
@click.option("--score", "scores", default="logpx,maxprob,gradnorm", show_default=True,
              help="Comma-separated scores and detectors, with options as 'energy:T=2', 'odin:T=1000,eps=0.0014' (an "
                   "item key=value continues the score before it): logpx, maxprob, "
                   "gradnorm, energy, entropy, odin, mahalanobis, knn, vim, react, dice, ash, ... "
                   "See 'jemeval list scores'.")
@dataset_option("--tune-on", "tune_on", default=None,
                help="OOD validation set (never a test set) on which to pick the hyperparameters of every score "
                     "with a grid (odin T/eps, knn k, react percentile, ...), by AUROC; the choice is recorded.")
@dataset_option("--fit-on", "fit_on", default=None,
                help="Dataset whose train split the detectors are fitted on. Default: the ID set (less the images "
                     "training held out).")
@click.option("--fit-n", "fit_n", type=click.IntRange(min=1), default=None,
              help="Fit detectors on a seeded random subset of N training images (default: all).")
@click.option("--metric", "metrics", default=None,
              help="Comma-separated OOD metrics to report, plugin metrics included (see 'jemeval list metrics'). "
                   "Default: the built-ins auroc,aupr_in,aupr_out,fpr95.")
@click.option("--n", "n", type=click.IntRange(min=1), default=None,
              help="Examples per set (a seeded random subset). Synthetic sets default to the ID set's size.")
@sigma_option
@click.option("--bootstrap", type=int, default=0, show_default=True,
              help="Bootstrap resamples for confidence intervals (adds <metric>_lo/_hi columns); 0 = none.")
@click.option("--level", type=float, default=0.95, show_default=True,
              help="Confidence level of the bootstrap intervals.")
@output_path_option("--save-scores", suffix=".npz", metavar="FILE.npz",
                    help="Write every set's per-example scores to FILE.npz (recompute any metric from them).")
@output_path_option("--plot", suffix=".png", metavar="FILE.png",
                    help="Write the figure to FILE.png: per score (one row each), histograms of in- vs "
                         "out-of-distribution scores, ROC curves and precision-recall curves (AUROC, AUPR-In in "
                         "the legends).")
@class_map_option(help="Map the fit set's classes to the model's, for detectors fitted on labels (mahalanobis, gmm, "
                       "tscaling, openmax, she, ...) where the two differ: a JSON object or a CSV of 'data class,model "
                       "class' (docs/data.md, class maps).")
@output_options
@nproc_option
@run_options(no_cache=True, no_cache_help="Refit detectors instead of reading (or writing) the cache of fitted states "
                                          "($JEMEVAL_CACHE_DIR/detectors, default ~/.cache/jemeval/detectors).")
def cli(model_path, ood, id, split, scores, tune_on, fit_on, fit_n, metrics, n, input_sigma, bootstrap, level,
        save_scores, plot, class_map, context, **output):
    """AUROC, AUPR-In, AUPR-Out and FPR95 of each score on each OOD set.

    In-distribution is the positive class for AUROC and AUPR-In; AUPR-Out treats OOD as positive
    with negated scores; FPR95 is the fraction of OOD inputs accepted at the threshold keeping 95%
    of in-distribution inputs (lower is better). Scores: higher = more in-distribution.

    Detectors (mahalanobis, knn, vim, react, dice) are fitted on the model's training images once and
    cached, so a second run does not refit. --plot draws, per score, the histograms, ROC and PR curves.

    \b
    Examples:
      jemeval ood --model runs/digits/best.pt --ood uniform,constant,interp,gaussian --plot ood.png
      jemeval ood --model runs/digits/best.pt --ood near,far \\
          --score logpx,maxprob,energy,knn,vim,odin
      jemeval ood --model timm:resnet50 --data-root ~/OpenOOD/data --id imagenet \\
          --ood near,far --score maxprob,energy
    """
    from jemeval.artifacts import save_ood_scores
    from jemeval.evaluation.ood.evaluate import evaluate_ood
    from jemeval.plots.ood import plot_ood_result

    result = evaluate_ood(
        model_path, split_list(ood, "--ood"), id=id, split=split, scores=split_list(scores, "--score"),
        metrics=split_list(metrics, "--metric") if metrics else None, n=n, input_sigma=input_sigma,
        bootstrap=bootstrap, level=level, tune_on=tune_on, fit_on=fit_on, fit_n=fit_n, class_map=class_map,
        context=context,
    )
    write_files(result, (save_scores, save_ood_scores), (plot, plot_ood_result))
    emit(result, columns=COLUMNS, **output)
