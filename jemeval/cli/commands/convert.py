"""``jemeval convert IN OUT``: a foreign checkpoint (JEM release, JEM++, SADA-JEM) as a jemeval checkpoint."""
from __future__ import annotations

import click

from ..options import emit, output_options

COLUMNS = ["layout", "arch", "num_classes", "dataset", "bn_mode", "output"]


@click.command("convert")
@click.argument("path_in", metavar="IN", type=click.Path())
@click.argument("path_out", metavar="OUT", type=click.Path(dir_okay=False))
@click.option("--dataset", default=None,
              help="The dataset the model was trained on (e.g. cifar10); recorded so that ood/calibrate default to it.")
@output_options
def cli(path_in, path_out, dataset, **output):
    """Write the foreign checkpoint IN as a jemeval checkpoint OUT (.pt).

    \b
    The layout is recognised from the keys: the JEM release WRN (with or without BatchNorm) and
    JEM++ / SADA-JEM WRNs (BatchNorm, no f.linear). OUT records the source layout, the source
    file's SHA-256, the replay buffer if IN has one, and the BatchNorm mode the layout's authors
    sample with (JEM++ / SADA-JEM: train), which `jemeval sample` and the SGLD refinement use.

    \b
    Example:
      jemeval convert CIFAR10_jempp.pt jempp.pt --dataset cifar10
    """
    from ...interop import convert

    result = convert(path_in, path_out, dataset=dataset)
    click.echo(f"wrote {path_out}", err=True)
    emit(result, columns=COLUMNS, **output)
