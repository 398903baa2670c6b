"""``jemeval sample``: draw samples from a JEM with SGLD, save a grid (one row per class) and the
samples. The logic lives in :mod:`jemeval.evaluation.generation`."""
from __future__ import annotations

import click

from jemeval.cli.options import model_option, nproc_option, run_options
from jemeval.cli.output import emit, output_options, write_files
from jemeval.cli.paths import Command, dataset_option, output_path_option

#: the run options of ``jemeval sample`` and ``jemeval fidelity`` (--seed, --device, --batch-size, --data-root)
sample_run_options = run_options(batch_size=256, batch_help="Chains run at once.", download=False)


def sampling_options(fn):
    """The generation options shared by ``jemeval sample`` and ``jemeval fidelity`` (each named as the
    parameter of :func:`jemeval.evaluation.generation.sample` it fills; the run's seed, device, batch
    size and data root are :data:`sample_run_options`)."""
    options = [
        click.option("--class", "classes", default=None, metavar="C|all",
                     help="Class-conditional chains (ascend log p~(x, y)) for class C, a list 0,3 or all; "
                          "omit for unconditional chains (ascend log p~(x))."),
        click.option("--n", "n", type=int, default=64, show_default=True,
                     help="Chains per class (or in total when unconditional)."),
        click.option("--steps", type=click.IntRange(min=0), default=None, help="SGLD steps [default: 100]."),
        click.option("--init", type=click.Choice(["noise", "buffer", "data"]), default="noise", show_default=True,
                     help="Chain starts: fresh U(-1, 1) noise, the checkpoint's replay buffer, or training images."),
        dataset_option("--data", default=None, help="Dataset for --init data [default: the model's dataset]."),
        click.option("--sgld-lr", "sgld_step_size", type=float, default=None,
                     help="SGLD step size [default: the checkpoint's training value, else JEM's 1.0]."),
        click.option("--sgld-std", "sgld_noise", type=float, default=None,
                     help="SGLD noise std [default: the checkpoint's training value, else JEM's 0.01]."),
        click.option("--bn-mode", type=click.Choice(["eval", "train"]), default=None,
                     help="BatchNorm mode while sampling [default: the checkpoint's, else eval as in JEM]."),
        click.option("--top-confident", type=float, default=None, metavar="P",
                     help="Keep the P% most confident samples of each predicted class (JEM's published IS/FID "
                          "use 10)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def sample_from_options(model_path: str, context, on_plan=None, **opts):
    """Call :func:`jemeval.evaluation.generation.sample` with the parsed click options in the command's
    run context (progress on stderr: a bar on a terminal, stage lines in a pipe, never a bar drawn into
    a pipe); ``on_plan`` as ``sample``'s."""
    from jemeval.evaluation.generation import sample

    return sample(model_path, context=context, on_plan=on_plan, **opts)


def chains_text(plan: dict) -> str:
    """``40 chains (10 classes x 4) x 7 SGLD steps = 280 chain-steps``: the count the announcement, the
    progress (in chain-steps) and the summary share."""
    per_class = f" ({plan['classes']} classes x {plan['per_class']})" if plan["classes"] else ""
    chains = f"{plan['chains']} chains{per_class}"
    return f"{chains} x {plan['steps']} SGLD steps = {plan['chain_steps']} chain-steps"


def announce_plan(plan: dict) -> None:
    """The line said before the first SGLD step: how many chains and steps will run, and how (under
    ``--nproc``: how many this process runs, what its progress counts)."""
    from jemeval.runtime.shards import my_share

    batches = plan["batches"]
    here = my_share(plan["chains"], plan["batch_size"]) * plan["steps"]
    share = f"; {here} of them in this process" if here != plan["chain_steps"] else ""
    click.echo(f"jemeval sample: {chains_text(plan)}, in {batches} batch{'es' if batches != 1 else ''} of up to "
               f"{plan['batch_size']} chains{share}", err=True)


def describe_samples(result) -> str:
    """The line above the table: how the samples were drawn and how far log p~ rose."""
    trace, s = result.extra["log_p_trace"], result.extra["settings"]
    kept = (f"; kept top {s['top_confident']:g}% confident: {s['n_kept']} of {s['n_generated']}"
            if s["top_confident"] else "")
    return (f"{s['mode']} samples ({s['ascends']}), init {s['init']}, {chains_text(s['plan'])}; "
            f"mean {s['ascends']} {trace['first']:.3g} -> {trace['last']:.3g}{kept}")


@click.command("sample", cls=Command)
@model_option
@sampling_options
@output_path_option("--out", "grid_path", suffix=".png", metavar="FILE.png",
                    help="Write the PNG grid of the samples, one row per class: this command's main product.")
@click.option("--per-row", type=int, default=10, show_default=True, help="Images per class row in the grid.")
@output_path_option("--save", "npz_path", suffix=".npz", metavar="FILE.npz",
                    help="Also write the samples as .npz (x, y, log_p, log_px, predicted, confidence, provenance).")
@output_options(result_flag="--result")
@nproc_option
@sample_run_options
def cli(model_path, grid_path, per_row, npz_path, as_json, csv_path, as_markdown, out_path, context, **opts):
    """Draw samples from a JEM by SGLD: per class with --class, from noise, buffer or data.

    \b
    Examples:
      jemeval sample --model runs/digits/best.pt --class all --n 16 --out grid.png
      jemeval sample --model runs/digits/best.pt --init buffer --top-confident 10 --save samples.npz
      jemeval sample --model runs/digits/best.pt --class all --n 1000 --nproc 2 --save samples.npz
    """
    from jemeval.plots.grids import save_samples_grid

    result = sample_from_options(model_path, context, on_plan=announce_plan, **opts)
    samples = result.extra["samples"]
    write_files(result, (grid_path, lambda _, path: save_samples_grid(samples, path, per_row=per_row)),
                (npz_path, lambda _, path: samples.save_npz(path)))
    emit(result, as_json=as_json, csv_path=csv_path, as_markdown=as_markdown, out_path=out_path,
         title=describe_samples(result))
