"""``jemeval eval``: accuracy and NLL, optionally after SGLD refinement (a shell over evaluate)."""
from __future__ import annotations

import click

from jemeval.cli.options import (
    chain_sigma_option,
    model_option,
    parse_ints,
    run_options,
    sigma_option,
)
from jemeval.cli.output import emit, output_options
from jemeval.cli.paths import Command, class_map_option, dataset_option


@click.command("eval", cls=Command)
@model_option
@dataset_option("--data", default=None, help="Labelled dataset to evaluate on. Default: the model's training dataset.")
@click.option("--split", default="test", show_default=True, help="Split of --data.")
@click.option("--n", "n", type=click.IntRange(min=1), default=None, help="Use a seeded random subset of N examples.")
@sigma_option
@click.option("--refine-steps", default="0", show_default=True,
              help="Comma-separated SGLD refinement steps K before classifying (one row each), e.g. 0,1,10.")
@click.option("--chains", type=int, default=5, show_default=True, help="Refinement chains per input (logits averaged).")
@chain_sigma_option
@click.option("--sgld-lr", "sgld_step_size", type=float, default=None,
              help="Refinement SGLD step size. Default: the checkpoint's training setting, else 1.0.")
@click.option("--sgld-std", "sgld_noise", type=float, default=None,
              help="Refinement SGLD noise std. Default: the checkpoint's training setting, else 0.01.")
@class_map_option
@output_options
@run_options()
def cli(model_path, data, split, n, input_sigma, refine_steps, chains, chain_sigma, sgld_step_size, sgld_noise,
        class_map, context, **output):
    """Classification accuracy and NLL (mean -log p(y|x)).

    \b
    Example:
      jemeval eval --model runs/digits/best.pt --refine-steps 0,1,10
    """
    from jemeval.evaluation.accuracy import evaluate

    result = evaluate(
        model_path, data, split=split, n=n, input_sigma=input_sigma,
        refine_steps=parse_ints(refine_steps, "--refine-steps"), chains=chains, chain_sigma=chain_sigma,
        sgld_step_size=sgld_step_size, sgld_noise=sgld_noise, class_map=class_map, context=context,
    )
    emit(result, **output)
