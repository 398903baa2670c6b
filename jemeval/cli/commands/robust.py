"""``jemeval robust``: adversarial robustness with SGLD refinement (a shell over evaluation.robustness)."""
from __future__ import annotations

import click

from jemeval.cli.config import config_option
from jemeval.cli.options import (
    chain_sigma_option,
    model_option,
    nproc_option,
    parse_epsilons,
    parse_ints,
    run_options,
    split_list,
)
from jemeval.cli.output import emit, output_options, write_files
from jemeval.cli.paths import Command, class_map_option, dataset_option, output_path_option

COLUMNS = ["attack", "norm", "grad_mode", "refine_steps", "epsilon", "robust_accuracy", "ci_low", "ci_high",
           "robust_accuracy_mean", "clean_accuracy", "n", "draws", "eot_samples", "median_min_perturbation", "seconds"]


def split_attack_specs(value: str) -> list[str]:
    """'pgd:steps=5,restarts=2,boundary' -> ['pgd:steps=5,restarts=2', 'boundary']: the shared spec
    splitter keeps an item ``key=value`` with the spec before it."""
    return split_list(value, "--attack")


@click.command("robust", cls=Command)
@config_option
@model_option
@click.option("--norm", required=True, help="Threat model: l2 or linf.")
@click.option("--refine-steps", default="0", show_default=True,
              help="SGLD refinement steps K before classifying; a list (0,1,10) attacks each K and plots them "
                   "together.")
@click.option("--attack", "attacks", default="pgd", show_default=True,
              help="Attack(s), comma-separated: apgd-ce, apgd-dlr, apgd-t, fab, square, cw, autoattack "
                   "(torchattacks: pip install 'jemeval[attacks]'), pgd, boundary, pointwise (foolbox) or a plugin's; "
                   "options as pgd:steps=100,restarts=5.")
@click.option("--aa-version", type=click.Choice(["standard", "rand"]), default=None,
              help="AutoAttack version: standard (APGD-CE, APGD-T, FAB-T, Square) or rand (APGD-CE, APGD-DLR with "
                   "EOT: AutoAttack's 20 draws per gradient under --grad-mode full/bpda, --eot-samples under "
                   "eot/bpda+eot; for randomised defences). Default: standard.")
@click.option("--epsilons", default=None,
              help="Perturbation sizes in [0, 1] pixel units, e.g. 0,2/255,8/255; max is the norm's largest (Linf 1, "
                   "L2 sqrt(C*H*W)), where every input is within reach (default: a norm-specific list ending at a "
                   "size that should defeat any undefended model).")
@click.option("--n", "n", type=click.IntRange(min=1), default=300, show_default=True,
              help="Seeded random subset of the test set (the paper: 300).")
@click.option("--steps", default=None,
              help="Attack iterations (PGD default 40, the paper 100; APGD, FAB, AutoAttack 100; Boundary 1000); a "
                   "list (10,50,100) is a sweep: each count is run on the same inputs and seeds, and a curve is "
                   "converged only when its last two counts pass --converge-tolerance's paired test. At most 100,000, "
                   "and restarts x steps x EOT samples x (K x chains + 1) at most 10^9 per input.")
@click.option("--restarts", type=int, default=None,
              help="Random restarts of PGD and APGD (default 1; the paper's PGD 20; at most 1,000).")
@click.option("--grad-mode", default="full", show_default=True,
              help="How the attacker differentiates through refinement: full, bpda (the release's), eot, bpda+eot "
                   "(eot: averaged over --eot-samples noise draws); a list runs each.")
@click.option("--draws", type=click.IntRange(min=1), default=1, show_default=True,
              help="Fresh-noise re-checks of every adversarial; an input is robust only if all classify it "
                   "correctly (use >= 5 with refinement; at most 10,000).")
@click.option("--chains", type=int, default=5, show_default=True,
              help="Noisy copies of each input refined and averaged (the paper: 5; at most 10,000).")
@chain_sigma_option(old_sigma=True)
@click.option("--eot-samples", default="10", show_default=True,
              help="Noise draws averaged per gradient with --grad-mode eot or bpda+eot (APGD's eot_iter); a list "
                   "(1,5,10,20) is a sweep, judged like a --steps sweep. At most 10,000.")
@click.option("--converge-tolerance", type=float, default=0.01, show_default=True,
              help="A sweep's curve is converged only when its last two counts differ by no significant drop "
                   "(exact McNemar on the inputs broken and regained) and the drop's upper 95%% limit is below this "
                   "(robust-accuracy units: 0.01 = one percentage point).")
@click.option("--grad-checkpoint/--no-grad-checkpoint", "checkpoint", default=None,
              help="Recompute each SGLD step in the backward pass (memory-safe full gradients). Default: on from "
                   "2 steps.")
@click.option("--sgld-lr", "sgld_step_size", type=float, default=None,
              help="SGLD step size for refinement (default: the checkpoint's, else 1.0).")
@click.option("--sgld-std", "sgld_noise", type=float, default=None,
              help="SGLD noise std for refinement (default: the checkpoint's, else 0.01).")
@dataset_option("--data", default=None,
                help="Dataset whose test split is attacked. Default: the model's training dataset.")
@output_path_option("--plot", suffix=".png", metavar="FILE.png",
                    help="Write robust accuracy vs epsilon (one line per K, attack and gradient mode) to FILE.png; "
                         "after an --eot-samples or --steps sweep, beside it robust accuracy vs the count.")
@class_map_option
@output_options
@nproc_option
@run_options(batch_size=100, batch_help="Inputs per attack call.")
def cli(model_path, norm, refine_steps, attacks, aa_version, epsilons, n, steps, restarts, grad_mode, draws, chains,
        chain_sigma, eot_samples, converge_tolerance, checkpoint, sgld_step_size, sgld_noise, data, plot, class_map,
        context, **output):
    """Robust accuracy under adversarial attack, optionally behind K steps of SGLD refinement.

    Each input is duplicated into --chains copies with --chain-sigma noise, refined by K SGLD steps up
    log p(x) and classified by the averaged logits (the JEM paper's defence). Every adversarial is
    re-classified with fresh chains, --draws times; an input is robust if correct clean and under
    every draw. Each robust accuracy has a 95% Wilson interval (ci_low, ci_high). Sanity checks
    (accuracy at epsilon 0 = clean, non-increasing in epsilon, near zero at the largest epsilon for
    K=0 and, for K>0, where every image is reachable, gradient-free not beating white-box, EOT not
    beating single-draw gradients, and after a --eot-samples or --steps sweep the attack's convergence)
    are printed as notes and listed under "checks" in --json.

    \b
    Examples:
      jemeval robust --model runs/digits/best.pt --norm l2 --refine-steps 0,2 \\
          --grad-mode full,bpda --plot r.png
      jemeval robust --model jem.pt --norm linf --refine-steps 0,2 --draws 5 \\
          --grad-mode full,bpda+eot --attack apgd-ce,square,autoattack --aa-version rand \\
          --epsilons 0,4/255,8/255,1
      jemeval robust --model jem.pt --norm linf --refine-steps 0,1,10 --steps 100 --restarts 20 \\
          --chain-sigma 0.03
      jemeval robust --model jem.pt --norm l2 --attack pgd,boundary --refine-steps 10
      jemeval robust --model jem.pt --norm linf --refine-steps 10 --chain-sigma 0.03 \\
          --grad-mode eot --eot-samples 1,5,10,20 --steps 10,50,100 --plot sweep.png
    """
    from jemeval.evaluation.robust.evaluate import robust
    from jemeval.plots.robustness import plot_robust_result

    result = robust(
        model_path, norm=norm, refine_steps=parse_ints(refine_steps, "--refine-steps"),
        attacks=split_attack_specs(attacks),
        epsilons=None if epsilons is None else parse_epsilons(epsilons, "--epsilons"),
        data=data, n=n, steps=None if steps is None else counts(steps, "--steps"), restarts=restarts,
        grad_mode=split_list(grad_mode, "--grad-mode"), draws=draws, aa_version=aa_version, chains=chains,
        chain_sigma=chain_sigma, eot_samples=counts(eot_samples, "--eot-samples"), checkpoint=checkpoint,
        sgld_step_size=sgld_step_size, sgld_noise=sgld_noise, converge_tolerance=converge_tolerance,
        class_map=class_map, context=context,
    )
    write_files(result, (plot, plot_robust_result))
    emit(result, columns=columns_for(result), **output)


def counts(value: str, what: str) -> int | list[int]:
    """'10' -> 10 (one count, as before); '1,5,10' -> [1, 5, 10] (a sweep)."""
    values = parse_ints(value, what)
    return values[0] if len(values) == 1 else values


def columns_for(result) -> list[str]:
    """The table's columns; after a sweep also each record's steps and convergence verdict."""
    if "convergence" not in result.extra:
        return COLUMNS
    i = COLUMNS.index("eot_samples") + 1
    return COLUMNS[:i] + ["steps", "converged"] + COLUMNS[i:]
