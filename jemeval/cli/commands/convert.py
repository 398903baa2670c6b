"""``jemeval convert IN OUT``: a foreign checkpoint (JEM release, JEM++, SADA-JEM) as a jemeval checkpoint."""
from __future__ import annotations

import click

from jemeval.cli.output import emit, output_options
from jemeval.cli.paths import Command, PathArgument, output_path_option

COLUMNS = ["layout", "arch", "num_classes", "dataset", "bn_mode", "output"]


@click.command("convert", cls=Command)
@click.argument("path_in", metavar="IN", cls=PathArgument, role="input", what="the input checkpoint", type=click.Path())
@click.argument("path_out", metavar="OUT", cls=PathArgument, role="output", type=click.Path(dir_okay=False))
@click.option("--dataset", default=None,
              help="The dataset the model was trained on (e.g. cifar10); recorded so that ood/calibrate default to it.")
@output_options(result_flag="--result")
@output_path_option("--out", "legacy_out", metavar="FILE", hidden=True,
                    help="Deprecated spelling of --result (convert's main product is OUT).")
def cli(path_in, path_out, dataset, legacy_out, **output):
    """Write the foreign checkpoint IN as a jemeval checkpoint OUT (.pt), this command's main product.

    IN may also be a model source (timm:NAME, ...) or a `jemeval export` .safetensors file (its
    dataset, class names and training config are kept).

    \b
    The layout is recognised from the keys: the JEM release WRN (with or without BatchNorm) and
    JEM++ / SADA-JEM WRNs (BatchNorm, no f.linear). OUT records the source layout, the source
    file's SHA-256, the replay buffer if IN has one, and the BatchNorm mode the layout's authors
    sample with (JEM++ / SADA-JEM: train), which `jemeval sample` and the SGLD refinement use.
    --result FILE.json also writes the conversion record (--out FILE.json, its old spelling, still works).

    \b
    Example:
      jemeval convert CIFAR10_jempp.pt jempp.pt --dataset cifar10
    """
    from jemeval.errors import UsageError
    from jemeval.formats.convert import convert

    if legacy_out is not None:
        if output.get("out_path") is not None:
            raise UsageError("give the JSON record once: --result FILE (--out is its deprecated spelling)")
        click.echo("note: convert's --out is deprecated, use --result (OUT is the converted checkpoint)", err=True)
        output["out_path"] = legacy_out
    result = convert(path_in, path_out, dataset=dataset)
    click.echo(f"wrote {path_out}", err=True)
    emit(result, columns=COLUMNS, **output)
