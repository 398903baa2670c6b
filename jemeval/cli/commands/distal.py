"""``jemeval distal``: distal adversarials from noise (a shell over evaluation.distal)."""
from __future__ import annotations

import click

from jemeval.cli.options import chain_sigma_option, model_option, parse_ints, run_options
from jemeval.cli.output import emit, output_options, write_files
from jemeval.cli.paths import Command, output_path_option

COLUMNS = ["target", "n", "steps", "refine_steps", "start_confidence", "mean_confidence", "median_confidence",
           "min_confidence", "max_confidence", "predicted_as_target"]


@click.command("distal", cls=Command)
@model_option
@click.option("--target", "target", required=True, help="Target class index (or a comma-separated list).")
@click.option("--n", "n", type=int, default=16, show_default=True, help="Noise images per target.")
@click.option("--steps", type=int, default=200, show_default=True, help="Gradient-ascent steps on log p(target | x).")
@click.option("--lr", type=float, default=0.05, show_default=True,
              help="Adam learning rate on the pixels ([-1, 1] space).")
@click.option("--refine-steps", type=int, default=0, show_default=True,
              help="SGLD refinement steps inside the classifier.")
@click.option("--grad-mode", type=click.Choice(["full", "bpda", "eot", "bpda+eot"]), default="full",
              show_default=True,
              help="How gradients pass through refinement.")
@click.option("--chains", type=int, default=5, show_default=True, help="Refinement chains averaged.")
@chain_sigma_option(old_sigma=True)
@output_path_option("--grid", suffix=".png", metavar="FILE.png", default="distal.png", show_default=True,
                    help="PNG grid of the images, one row per target, captioned with p(target | x).")
@output_options
@run_options(batch_size=None, data=False)
def cli(model_path, target, n, steps, lr, refine_steps, grad_mode, chains, chain_sigma, grid, context, **output):
    """Distal adversarials: optimise noise until the model is confident it shows --target.

    A model whose confidence follows the data density should not become confident on nonsense
    images; a plain classifier usually does. The confidence is re-measured with fresh chains.

    \b
    Example:
      jemeval distal --model runs/digits/best.pt --target 3 --refine-steps 2 --grid distal3.png
    """
    from jemeval.evaluation.distal import distal
    from jemeval.plots.grids import save_distal_grid

    result = distal(model_path, parse_ints(target, "--target"), n=n, steps=steps, lr=lr, refine_steps=refine_steps,
                    grad_mode=grad_mode, chains=chains, chain_sigma=chain_sigma, context=context)
    write_files(result, (grid, save_distal_grid))
    emit(result, columns=COLUMNS, **output)
