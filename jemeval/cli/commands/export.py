"""``jemeval export MODEL --format safetensors --out FILE``: a shell over :func:`jemeval.formats.export.export`."""
from __future__ import annotations

import click

from jemeval.cli.options import split_list
from jemeval.cli.output import emit, output_options
from jemeval.cli.paths import Command, PathArgument, output_path_option

COLUMNS = ["format", "arch", "num_classes", "dataset", "tensors", "parameters", "bytes", "output"]


@click.command("export", cls=Command)
@click.argument("model_path", metavar="MODEL", cls=PathArgument, role="input", what="the input checkpoint",
                type=click.Path())
@click.option("--format", "format_", type=click.Choice(["safetensors"]), default="safetensors", show_default=True,
              help="Output format: safetensors (weights + a JSON header that jemeval.load_model reads back).")
@output_path_option("--out", "out", suffix=".safetensors", metavar="FILE.safetensors", required=True,
                    help="The exported file, this command's main product.")
@click.option("--classes", default=None,
              help="Comma-separated class names to record in the header (one per class), e.g. 0,1,2,... "
                   "Default: the names the model records (timm's and torchvision's ImageNet names), if any.")
@output_options(result_flag="--result")
def cli(model_path, format_, out, classes, **output):
    """Export MODEL (any checkpoint jemeval loads) as a .safetensors file with a JSON header.

    \b
    The header (safetensors metadata key "jemeval") holds the architecture and its options, the
    number (and --classes names) of classes, the input shape, the normalisation, the dataset, the
    training config and the provenance (the source file's SHA-256 included). jemeval.load_model,
    and every command's --model, read the file back to identical logits; any other tool reads
    the tensors with safetensors.torch.load_file.

    \b
    Example:
      jemeval export runs/digits/best.pt --format safetensors --out digits-jem.safetensors
    """
    from jemeval.formats.export import export

    names = split_list(classes, "--classes") if classes else None
    result = export(model_path, out, format=format_, classes=names)
    click.echo(f"wrote {out}", err=True)
    emit(result, columns=COLUMNS, **output)
