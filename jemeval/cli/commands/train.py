"""``jemeval train DATASET``: a thin click shell over :func:`jemeval.training.train`.

Unset options keep the dataset's defaults (``jemeval.training.recipes.DATASET_DEFAULTS``): the
paper's settings for cifar10/cifar100/svhn, a laptop recipe for digits; any other set gets epochs,
lr, warm-up, decay epochs, validation and buffer sizes derived from its size
(``jemeval.training.recipes.scaled_defaults``), each marked as derived by ``--print-config``;
``--recipe fast`` lays a faster set of defaults over them (``jemeval.training.recipes.RECIPES``).
With ``--resume`` the stored configuration of DIR/last.pt is used; only --epochs, --device and
output options may change.
A new run refuses a DIR that holds one (last.pt, best.pt or metrics.csv) unless --overwrite; one
process at a time trains in a DIR (a lock file, see jemeval.training.rundir).

Several processes (DistributedDataParallel): ``torchrun --nproc-per-node N -m jemeval train ...``,
or ``jemeval train --nproc N ...``, which re-launches itself through ``torch.distributed.run`` with N
processes on this machine (:mod:`jemeval.runtime.launch`, checks in :func:`jemeval.training.rundir.check_launch`;
``--batch-size`` stays the global batch).

The training code names its parameters in errors (``lr must be > 0``, ``resume=True``,
``nproc=4``); :func:`flag_text` writes them as this command's flags.
"""
from __future__ import annotations

import json
import os
import sys
import textwrap

import click
from click.core import ParameterSource

from jemeval.cli.config import canonical_keys, config_option, config_record, render_config
from jemeval.cli.options import SEED, data_options, parse_ints, without_nproc
from jemeval.runtime.workers import default_workers


@click.command("train")
@click.argument("dataset", required=False)
@config_option
@click.option("--print-config", is_flag=True,
              help="Print a complete config file (YAML) for DATASET's defaults [default: digits], with --config and "
                   "the other options applied, and exit without training.")
@click.option("--recipe", help="A named set of defaults laid over the dataset's: paper (the dataset's own: the paper's "
              "settings for cifar/svhn, the laptop recipe for digits) or fast (digits only: SGLD 10 steps of size 2, "
              "Adam 4e-3, energy L2 0.01, 18 epochs, lr x0.1 at 17, bf16 where the CPU has it: 0.41x the release "
              "sampler's time (0.51x in float32) at higher mean accuracy and log p(x) AUROC over 10 seeds, 9 of 10 "
              "at or above their own seed's release run; docs/training.md, Recipes) or finetune (with --init: 15% "
              "of the epochs, a third of the lr, short SGLD chains of 5 steps of 0.1, three quarters started from "
              "per-class Gaussians of the training images, p(x) weight 0.16, the last epoch kept as best.pt; "
              "from a source with BatchNorm a tenth of the epochs and lr, persistent chains with steps of 0.01, p(x) "
              "weight 0.01; docs/training.md, Warm start); options you "
              "give still win [default: paper].")
@click.option("--init", "init", metavar="SOURCE", help="Start from a classifier's weights: anything --model reads (a "
              "checkpoint, a safetensors export, timm:NAME, torchvision:NAME, pytorch-ood:KEY, hf:ORG/NAME), from the "
              "libraries' caches. The architecture is SOURCE's; its head is kept when the classes match (number, and "
              "names where both record them), re-initialised otherwise (said in one line). Recorded; a --resume "
              "never reads SOURCE again. See --recipe finetune.")
@click.option("--arch", help="Architecture spec, e.g. cnn, wrn:depth=28,widen=10,norm=none, timm:resnet18, igebm "
                             "[default: per dataset; others cnn, cnn:stride=2 for images of 32 pixels a side or "
                             "more].")
@click.option("--epochs", type=int, help="Number of epochs [default: cifar/svhn 150; digits 20; others 20, or more for "
              "at least 500 iterations, at most 200].")
@click.option("--out", "out", type=click.Path(file_okay=False), help="Run folder for best.pt, last.pt, metrics.csv, "
              "samples/ [default: runs/DATASET]; created if missing (its parent must exist). A folder holding a run "
              "needs --resume or --overwrite.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Random seed (recorded).")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--objective", type=click.Choice(["jem", "factored"]), default="jem", show_default=True,
              help="jem: Algorithm 1; factored: the p(x|y) ablation (class-conditional contrast only, no "
              "cross-entropy).")
@click.option("--px-weight", type=float,
              help="Weight of the p(x) contrast; 0 = the plain classifier baseline [default: cifar/svhn, "
                   "digits 1; others 0.1].")
@click.option("--pyx-weight", type=float, help="Weight of the cross-entropy p(y|x) term [default: 1].")
@click.option("--pxy-weight", type=float,
              help="Weight of the p(x, y) contrast with class-conditional samples [default: 0].")
@click.option("--px-warmup-iters", type=click.IntRange(min=0),
              help="Iterations over which the p(x) and p(x, y) weights rise linearly to theirs, so the classifier "
              "learns first [default: 0 (the paper's, digits'); others 40% of the run's iterations].")
@click.option("--class-cond-px", is_flag=True, default=None,
              help="Draw the p(x) negatives class-conditionally (y uniform).")
@click.option("--energy-l2", type=float,
              help="L2 penalty on data and sample energies (the authors' remedy, ~0.1) [default: 0].")
@click.option("--sgld-steps", type=int, help="SGLD steps per iteration [default: 20; digits 10].")
@click.option("--sgld-lr", type=float, help="SGLD step size alpha [default: 1.0].")
@click.option("--sgld-std", type=float, help="SGLD noise std [default: 0.01].")
@click.option("--sampler", type=click.Choice(["sgld", "proximal"]), help="sgld (JEM) or proximal (JEM++'s proximal "
              "SGLD: --sgld-steps outer steps, each followed by --inner-steps first-layer steps) [default: sgld].")
@click.option("--inner-steps", type=int, help="Proximal sampler: inner steps per outer step [default: 5].")
@click.option("--inner-step-size", type=float,
              help="Proximal sampler: inner step size (JEM++'s pyld_lr) [default: 0.2].")
@click.option("--inner-grad-clip", type=float,
              help="Proximal sampler: inner gradient clip (JEM++'s eps) [default: 1.0].")
@click.option("--buffer-size", type=int, help="Replay buffer size, over all processes [default: 10000; digits 1000; "
              "others one chain per training image (at least a batch), at most 10000].")
@click.option("--reinit-freq", type=float, help="Probability of restarting a chain from U(-1, 1) [default: 0.05].")
@click.option("--short-run", is_flag=True, default=None,
              help="Non-persistent chains from U(-1, 1) every iteration (no buffer).")
@click.option("--gaussian-starts", type=float, help="The fraction of chain starts (short-run chains; the buffer's "
              "first states and restarts) drawn from a Gaussian per class fit to the training images (JEM++'s "
              "informative initialisation) instead of U(-1, 1) [default: 0; --recipe finetune 0.75].")
@click.option("--sigma", type=float, help="Gaussian noise std added to training inputs [default: 0.03].")
@click.option("--augment",
              help="auto (the dataset's recipe: CIFAR pad 4 + crop + flip, SVHN no flip), none, or 'pad=4,flip=1'.")
@click.option("--labels-per-class", type=int, help="Semi-supervised: keep K labels per class (p(x) sees every image).")
@click.option("--val-size", type=int,
              help="Validation images held out with a fixed seed [default: cifar/svhn 5000; digits 150; others 10%, "
              "at most 5000].")
@click.option("--batch-size", type=int, help="Global batch size (split evenly over --nproc processes) [default: 64].")
@click.option("--lr", type=float, help="Learning rate [default: 1e-4; digits 3e-3; others from the training images: "
              "3e-3 up to 1647, 1e-4 from 45000, log-linear between].")
@click.option("--optimizer", type=click.Choice(["adam", "sgd"]), help="Optimizer [default: adam].")
@click.option("--momentum", type=float, help="SGD momentum [default: 0.9].")
@click.option("--weight-decay", type=float, help="Weight decay [default: 0].")
@click.option("--warmup-iters", type=int, help="Linear learning-rate warm-up iterations [default: 1000; digits 20; "
              "others 5% of the run's iterations, at most 1000].")
@click.option("--decay-epochs",
              help="Epochs after which the lr is multiplied by --decay-rate, e.g. 50,100 [default: cifar/svhn 50,100; "
              "digits 15; others 0.8 and 0.9 of --epochs].")
@click.option("--decay-rate", type=float, help="Learning-rate decay factor [default: 0.3].")
@click.option("--max-recoveries", type=int, help="Automatic divergence recoveries before giving up [default: 5].")
@click.option("--max-val-drop", type=float, help="Roll back (as a divergence) an epoch whose validation accuracy is "
              "more than this below the best so far; 1 turns the check off [default: 0.2].")
@click.option("--best-by", type=click.Choice(["val_acc", "last"]), help="What best.pt keeps: the first epoch of "
              "the best validation accuracy, or the last epoch [default: val_acc; --recipe finetune last].")
@click.option("--bf16/--no-bf16", default=None, help="bf16 autocast [default: on for CUDA, off on CPU].")
@click.option("--channels-last/--no-channels-last", default=None,
              help="channels_last memory format [default: on; faster conv passes on CPU and GPU].")
@click.option("--compile/--no-compile", "compile_", default=None,
              help="torch.compile the network [default: off; no steady-state gain measured, ~20 s start-up].")
@click.option("--resume", is_flag=True, default=None, help="Continue the run in --out from its last.pt, exactly.")
@click.option("--overwrite", is_flag=True, default=None, help="Replace the run in --out: delete its last.pt, best.pt, "
              "metrics.csv and sample grids, then start a new run.")
@click.option("--nproc", type=int, help="Train with N processes on this machine (DistributedDataParallel, "
              "gloo on CPU / nccl on CUDA), re-launched through torchrun; at most one per GPU (CUDA) or CPU core.")
@click.option("--log-to", "log_to", multiple=True, metavar="LOGGER",
              help="Also log to tensorboard (event files in DIR/tensorboard), wandb (DIR/wandb, offline unless "
                   "wandb:mode=online) or a plugin's logger (jemeval list loggers); repeat for several. metrics.csv "
                   "is always written.")
@click.option("--log-every", type=click.IntRange(min=1), help="Iterations between the loggers' train/* scalars "
              "[default: 10].")
@click.option("--no-progress", is_flag=True, help="No progress bar and no per-epoch lines on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON on stdout.")
@click.option("--workers", type=click.IntRange(min=0), help="Processes decoding a dataset read image by image "
              "(folder:, torchvision sets) as training reads it (the training split once, the test split at the end): "
              "the same images, hence the same run, for any count; 0 decodes in this process "
              f"[default: min(8, CPUs - 1): {default_workers()} here].")
@data_options
@click.pass_context
def cli(ctx, dataset, print_config, as_json, no_progress, compile_, decay_epochs, nproc, **params):
    """Train a JEM on DATASET (digits, cifar10, svhn, npz:FILE, digits[0-4], ...).

    \b
    Writes DIR/best.pt (best validation accuracy), DIR/last.pt (resumable), DIR/metrics.csv and
    DIR/samples/*.png; a DIR that holds a run needs --resume (continue) or --overwrite (replace).
    Divergence is detected and recovered from automatically (rollback, reseed, lower lr, more SGLD
    steps, energy L2), every recovery logged. Examples:
      jemeval train digits                          # ~30 s on a 2-core CPU
      jemeval train digits --recipe fast            # 0.41x the release sampler's time (docs/training.md)
      jemeval train digits --px-weight 0 --out runs/digits-baseline
      jemeval train cifar10 --download              # the paper's settings (WRN-28-10, GPU)
      jemeval train digits --arch igebm --objective factored
      jemeval train digits --nproc 2                # DDP, 2 processes
      torchrun --nproc-per-node 2 -m jemeval train digits   # the same, launched by torchrun
      jemeval train --print-config cifar10 > c.yaml   # a complete config file; edit it, then:
      jemeval train --config c.yaml --epochs 10     # every option from c.yaml, --epochs from here
    """
    # the training stack (torch) is imported when the command runs, not when the CLI starts
    from jemeval.cli.paths import check_outside_model_caches
    from jemeval.cli.ranks import agree_on_command
    from jemeval.runtime.launch import launched_by_torchrun, relaunch
    from jemeval.training import train
    from jemeval.training.checkpointing import resume_from
    from jemeval.training.config import resolve_config
    from jemeval.training.rundir import check_launch

    if dataset is None and not print_config:
        raise click.UsageError("Missing argument 'DATASET': give it (jemeval train digits) or set 'dataset' in the "
                               "--config file")
    dataset = dataset or "digits"
    given = _given(ctx, params, compile_=compile_, decay_epochs=decay_epochs, no_progress=no_progress)
    config = resume_from(dataset, **given) if given.get("resume") else resolve_config(dataset, **given)
    if print_config:
        text = render_config(ctx.command, _config_values(ctx, config), title=_config_title(config))
        click.echo(_mark_derived(text, ctx.command, config.derived), nl=False)
        return
    check_outside_model_caches("--out", config.out_dir)
    if nproc is not None and not launched_by_torchrun(nproc):
        check_launch(config, nproc)
        sys.exit(relaunch(nproc, without_nproc(sys.argv[1:])))
    agree_on_command(ctx)  # under a launch: every node given the same command and files, or one line
    summary = train(config).summary
    interrupted = summary["status"] == "interrupted"
    if os.environ.get("RANK", "0") != "0":  # under torchrun only rank 0 reports
        sys.exit(130 if interrupted else 0)
    click.echo(json.dumps(_plain(summary), indent=2) if as_json else _summary_text(summary))
    if interrupted:
        sys.exit(130)


def _given(ctx: click.Context, params: dict, *, compile_, decay_epochs, no_progress) -> dict:
    """Only the settings the user typed (so dataset defaults and --resume's stored config win)."""
    given = {k: v for k, v in params.items()
             if ctx.get_parameter_source(k) not in (ParameterSource.DEFAULT, None)}
    if compile_ is not None:
        given["compile"] = compile_
    if decay_epochs is not None:
        given["decay_epochs"] = tuple(parse_ints(decay_epochs, "--decay-epochs")) if decay_epochs.strip() else ()
    if no_progress:
        given["progress"] = False
    if config_record(ctx) is not None:
        given["config_file"] = config_record(ctx)
    return given


def _config_values(ctx: click.Context, config) -> dict:
    """Every option of the command as the run would use it: the resolved training settings, and the
    command's own options (``--json``, ``--nproc``, ...) as given."""
    values = dict(ctx.params)
    settings = config.to_dict()
    for name in values:
        key = name.rstrip("_")
        if key in settings and key not in ("out", "resume", "overwrite"):
            values[name] = settings[key]
    values["dataset"], values["out"] = config.dataset, config.out
    for name in (config.derived or {}).get("pending", ()):  # null: the run derives them (a placeholder would stick)
        values[name] = None
    values["no_progress"] = config.progress is False
    return values


def _mark_derived(text: str, command: click.Command, derived: dict | None) -> str:
    """``text`` with a comment above each setting derived from the data saying how (or, where the data
    cannot be read yet, that the run derives it): reading the file back gives the same run."""
    if not derived:
        return text
    keys = canonical_keys(command)
    reasons = derived.get("settings") or dict.fromkeys(derived.get("pending", ()), "null: the run derives it from "
                                                       f"the data's size ({derived.get('why')})")
    lines = text.splitlines(keepends=True)
    for name, why in reasons.items():
        prefix = f"{keys.get(name, name.replace('_', '-'))}: "
        at = next((i for i, line in enumerate(lines) if line.startswith(prefix)), None)
        if at is not None:
            note = f"derived: {why}" if derived.get("settings") else why
            lines[at:at] = [f"# {line}\n" for line in textwrap.wrap(note, 98, break_on_hyphens=False)]
    return "".join(lines)


def _config_title(config) -> str:
    from jemeval import __version__

    title = (f"jemeval train configuration ({config.dataset}; jemeval {__version__})\n"
             "run it: jemeval train --config FILE; an option given on the command line overrides the file;\n"
             "null leaves an option at its default; keys are the option names (- or _)")
    source = (config.derived or {}).get("from") or {}
    if source.get("recipe") == "finetune":
        title += ("\nrecipe finetune: from the classifier named by init, with the settings below marked "
                  "'recipe finetune' and their reasons (docs/training.md, Warm start)")
    if "train_images" in source:  # a dataset without defaults of its own: what was derived, from what
        names = ", ".join(k.replace("_", "-") for k in config.derived["settings"])
        title += (f"\nderived from the data ({source['train_images']} training-split images, batch "
                  f"{source['batch_size']}, {source['epochs']} epochs):\n{names};\nset one to null to derive "
                  "it again (after changing epochs: warmup-iters, px-warmup-iters, decay-epochs; docs/training.md)")
    return title


def _plain(obj):
    from jemeval.results import _plain as plain

    return plain(obj)


def _summary_text(s: dict) -> str:
    def pct(v):
        return "-" if v is None else f"{100 * v:.2f}%"

    lines = [
        f"status        {s['status']}",
        f"epochs        {s['epochs']} ({s['steps']} iterations, {s['seconds']:.1f} s"
        + (f", {s['images_per_s']:.0f} images/s)" if s.get("images_per_s") else ")"),
        f"best val acc  {pct(s['best_val_acc'])} (epoch {s['best_epoch']})",
        f"test acc      {pct(s['test_acc'])} (best.pt)" + (f"  note: {s['test_note']}" if s.get("test_note") else ""),
        f"recoveries    {s['recoveries']}",
        f"best.pt       {s['best']}",
        f"last.pt       {s['last']}",
        f"metrics       {s['metrics']}",
    ]
    return "\n".join(lines)
