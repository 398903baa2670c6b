"""``jemeval fidelity``: IS / FID / KID (torch-fidelity, local Inception weights) and a Frechet
distance in any checkpoint's feature space, on samples generated now or saved by
``jemeval sample --save``. The logic lives in :mod:`jemeval.evaluation.fidelity.evaluate`."""
from __future__ import annotations

import click

from jemeval.cli.commands.sample import sample_from_options, sample_run_options, sampling_options
from jemeval.cli.output import emit, output_options
from jemeval.cli.paths import Command, dataset_option, input_path_option, output_path_option


@click.command("fidelity", cls=Command)
@input_path_option("--model", "model_path", what="the input checkpoint", default=None,
                   help="Generate the samples from this checkpoint (see the sampling options).")
@input_path_option("--samples", "samples_path", what="the samples file", type=click.Path(dir_okay=False),
                   default=None, help="Score samples saved by `jemeval sample --save FILE.npz` instead of generating.")
@dataset_option("--ref", "reference", default=None, help="Reference dataset [default: the model's dataset].")
@click.option("--ref-split", default="train", show_default=True, help="Split of the reference dataset.")
@click.option("--ref-n", type=click.IntRange(min=1), default=None,
              help="Use a seeded random subset of N reference images.")
@input_path_option("--features", "features", what="a feature checkpoint", multiple=True,
                   help="A jemeval checkpoint whose penultimate features measure a Frechet distance 'fd' (offline, "
                        "any image size); repeat for several.")
@input_path_option("--inception-weights", what="the Inception weights file", envvar="JEMEVAL_INCEPTION_WEIGHTS",
                   default=None,
                   help="torch-fidelity's InceptionV3 weights file (weights-inception-2015-12-05-6726825d.pth) for "
                        "IS/FID/KID; never downloaded [env: JEMEVAL_INCEPTION_WEIGHTS].")
@input_path_option("--vgg16-weights", what="the VGG16 weights file", envvar="JEMEVAL_VGG16_WEIGHTS", default=None,
                   help="torchvision's VGG16 weights file (vgg16-397923af.pth) for precision/recall (or "
                        "--feature-extractor vgg16); never downloaded [env: JEMEVAL_VGG16_WEIGHTS].")
@click.option("--metrics", default=None,
              help="Comma-separated subset of is,fid,kid,precision,recall,f_score,fd [default: is,fid,kid, plus fd "
                   "with --features; only fd when --features is given without Inception weights]. precision/recall "
                   "(Kynkaanniemi et al., k=3) use VGG16 features.")
@click.option("--feature-extractor", type=click.Choice(["inception-v3-compat", "vgg16"]), default=None,
              help="The network for fid, kid and precision/recall [default: inception-v3-compat for fid/kid, vgg16 "
                   "for precision/recall]; is always uses InceptionV3.")
@output_path_option("--ref-cache", suffix=".npz", metavar="FILE.npz",
                    help="Keep the reference set's features in FILE.npz (Inception's, VGG16's and each --features "
                         "model's): the next run with the same reference images and weights skips their forward passes "
                         "(a file of another reference set is refused; features that fail their checksum are "
                         "recomputed).")
@click.option("--kid-subset-size", type=int, default=1000, show_default=True,
              help="KID subset size (capped at the sample counts).")
@sampling_options
@output_options
@sample_run_options
def cli(model_path, samples_path, reference, ref_split, ref_n, features, inception_weights, vgg16_weights, metrics,
        feature_extractor, ref_cache, kid_subset_size, as_json, csv_path, as_markdown, out_path, context, **sampling):
    """Score samples: IS, FID, KID, precision/recall (torch-fidelity) and Frechet distances in a model's features.

    \b
    Examples:
      jemeval fidelity --model runs/digits/best.pt --features runs/clf/best.pt --top-confident 10
      jemeval fidelity --samples samples.npz --ref cifar10 \\
          --inception-weights weights-inception-2015-12-05-6726825d.pth
      jemeval fidelity --samples samples.npz --ref cifar10 --metrics fid,precision,recall \\
          --inception-weights weights-inception-2015-12-05-6726825d.pth \\
          --vgg16-weights vgg16-397923af.pth --ref-cache cifar10-train-features.npz
    """
    from jemeval.errors import UsageError
    from jemeval.evaluation.fidelity.evaluate import choose_metrics, fidelity

    if (model_path is None) == (samples_path is None):
        raise UsageError("give exactly one of --model CHECKPOINT (generate samples now) or --samples FILE.npz")
    if model_path is not None:
        # fail on a missing weights file or bad metric list before spending time sampling
        chosen, _, _ = choose_metrics(metrics, have_features=bool(features), inception_weights=inception_weights,
                                      vgg16_weights=vgg16_weights, feature_extractor=feature_extractor)
        if reference is None and any(m != "is" for m in chosen):  # the model's own set, if it names no path
            from jemeval.evaluation.inputs import training_dataset
            from jemeval.formats.load import load_model

            training_dataset(load_model(model_path), param="reference")
        samples = sample_from_options(model_path, context, **sampling)
    else:
        samples = samples_path
    result = fidelity(samples, reference, features=list(features) or None, inception_weights=inception_weights,
                      metrics=metrics, ref_split=ref_split, ref_n=ref_n, kid_subset_size=kid_subset_size,
                      feature_extractor=feature_extractor, vgg16_weights=vgg16_weights, ref_cache=ref_cache,
                      context=context)
    emit(result, as_json=as_json, csv_path=csv_path, as_markdown=as_markdown, out_path=out_path,
         columns=["metric", "value", "std", "features", "n_samples", "n_ref"])
