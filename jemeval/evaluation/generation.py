"""Generation: draw samples from a JEM with SGLD, unconditionally or per class.

JEM is a generative model too (the JEM paper, sections 4 and 5). Unconditional chains ascend
log p~(x) = logsumexp f(x); class-conditional chains ascend log p~(x, y) = f(x)[y]. Chains start
from fresh U(-1, 1) noise, from the checkpoint's replay buffer (class-conditional draws use the
buffer's class blocks, as the JEM release does) or from real images.

Published IS/FID numbers depend on *which* samples are scored (replay buffer or fresh chains,
number of steps, the "top-10% most confident per class" filter), so every one of these choices is
returned in the settings and the provenance of the result, and travels with the ``.npz`` file
the :class:`~jemeval.artifacts.Samples` (``extra["samples"]``) are saved to.

SGLD defaults come from the checkpoint (``config["sgld"]``, written by ``jemeval train``) when it
has them, otherwise from the JEM release (step size 1.0, noise 0.01, no clamping, eval mode). The
number of steps defaults to :data:`DEFAULT_STEPS`: training chains are short because they persist
in the buffer; a chain started afresh needs more.

The work is counted in *chain-steps* (one SGLD update of one chain): ``chains x steps`` in all, the
same however the chains are batched. The plan (:func:`chain_plan`) is fixed before the first step;
``on_plan`` hears it then (``jemeval sample`` says it in one line), the progress counts its
chain-steps and the result's settings record it (``settings["plan"]``).
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from jemeval.artifacts import Samples, SamplesResult, load_samples
from jemeval.context import RunContext, takes_context
from jemeval.data import load_dataset, to_arrays
from jemeval.deprecations import deprecated_keywords
from jemeval.energy.model import EnergyModel, log_p
from jemeval.errors import CheckpointError, UsageError, did_you_mean
from jemeval.evaluation.batching import check_finite_outputs
from jemeval.evaluation.inputs import check_min, prepare_model, stamp, training_dataset
from jemeval.evaluation.limits import check_count, check_memory
from jemeval.formats.native import check_finite, read_checkpoint, replay_buffer_of
from jemeval.progress import progress_bar
from jemeval.runtime.shards import batch_generator, map_batches, my_share
from jemeval.sampling.buffer import ReplayBuffer, uniform_like_shape
from jemeval.sampling.recorded import recorded_sgld
from jemeval.sampling.sgld import SGLD

__all__ = ["DEFAULT_STEPS", "INITS", "Samples", "load_samples", "sample", "top_confident_mask"]

INITS = ("noise", "buffer", "data")
DEFAULT_STEPS = 100
DEFAULT_BATCH_SIZE = 256
_PROGRESS_CHUNKS = 25  # progress updates per batch of chains (each costs one extra forward)
TOP_CONFIDENT_RULE = "per predicted class, ceil(P% of its samples), by max softmax"
SEED_USE = ("init draws: CPU generator(seed); SGLD noise: one device generator per batch of chains, seeded "
            "with seed for batch 0 and a mix of (seed, batch index) after it (the same seed and batch_size give "
            "the same samples, in any number of processes)")


def resolve_classes(classes: int | str | Sequence[int] | None, num_classes: int) -> list[int] | None:
    """None -> unconditional; "all" -> every class; an int, "3", "0,3" or a list -> those classes."""
    if classes is None:
        return None
    if isinstance(classes, str):
        text = classes.strip().lower()
        if text == "all":
            return list(range(num_classes))
        try:
            classes = [int(c) for c in text.split(",") if c.strip()]
        except ValueError:
            raise UsageError(f"classes must be 'all' or class indices such as 3 or 0,3; got {classes!r}",
                             param="classes") from None
    elif isinstance(classes, int):
        classes = [classes]
    classes = [int(c) for c in classes]
    bad = [c for c in classes if not 0 <= c < num_classes]
    if bad or not classes:
        raise UsageError(f"classes: {bad or classes} is not a class of this model: use 0..{num_classes - 1} or 'all'",
                         param="classes")
    return sorted(set(classes), key=classes.index)


def check_init(init: str) -> str:
    if init not in INITS:
        raise UsageError(f"unknown init {init!r}{did_you_mean(init, INITS)}: choose one of {', '.join(INITS)}",
                         param="init")
    return init


# -- chain starts ------------------------------------------------------------------------------
def buffer_from_model(model: EnergyModel, replay_buffer: torch.Tensor | None) -> tuple[torch.Tensor, str]:
    """The replay buffer given, or the one stored in the model's checkpoint; a clear error if none."""
    if replay_buffer is not None:
        return replay_buffer, "given"
    ckpt = (model.metadata.get("checkpoint") or {}).get("path")
    if ckpt is None:
        raise UsageError("init 'buffer' needs the model's checkpoint (or replay_buffer=...); this model has none",
                         param="init")
    buf = replay_buffer_of(read_checkpoint(ckpt))
    if buf is None:
        raise UsageError(f"checkpoint {ckpt!r} stores no replay buffer to start chains from (JEM checkpoints trained "
                         "with a p(x) term and JEM release files have one); set init to 'noise' or 'data'",
                         param="init")
    check_finite(buf, "its replay buffer", ckpt)  # NaN chain starts would sample NaN images
    return buf, ckpt


def chain_starts(model: EnergyModel, n: int, targets: torch.Tensor | None, init: str, generator: torch.Generator, *,
                 replay_buffer: torch.Tensor | None = None, data: str | None = None,
                 context: RunContext) -> tuple[torch.Tensor, dict[str, Any]]:
    """``n`` chain starts on the CPU (drawn from ``generator``) and a description of their source."""
    shape = model.input_shape
    if init == "noise":
        return uniform_like_shape(n, shape, generator=generator), {"source": "U(-1, 1)"}
    if init == "buffer":
        buf, where = buffer_from_model(model, replay_buffer)
        if tuple(buf.shape[1:]) != tuple(shape):
            raise CheckpointError(f"replay buffer images are {tuple(buf.shape[1:])} but the model takes "
                                  f"{tuple(shape)}")
        if targets is not None and len(buf) < model.num_classes:
            raise CheckpointError(f"replay buffer holds {len(buf)} images, fewer than the {model.num_classes} "
                                  "class blocks")
        rb = ReplayBuffer.from_tensor(buf, num_classes=model.num_classes, reinit_freq=0.0)
        x0, idx = rb.sample(n, targets, generator=generator)
        layout = "class blocks (index = y * size // K + offset)" if targets is not None else "uniform over the buffer"
        return x0, {"source": "replay buffer", "checkpoint": where, "buffer_size": len(buf), "layout": layout}
    # init == "data": real images of any class (conditional chains then show class conversion)
    spec = data or (model.metadata.get("dataset") and training_dataset(model, param="data"))  # never a path
    if not spec:
        raise UsageError("data must name a dataset to start chains from its images (the model's checkpoint "
                         "names none)", param="data")
    xs, _ = to_arrays(load_dataset(spec, split="train", root=context.data_root))
    if tuple(xs.shape[1:]) != tuple(shape):
        raise UsageError(f"data {spec!r} has images {tuple(xs.shape[1:])} but the model takes {tuple(shape)}",
                         param="data")
    idx = torch.randint(0, len(xs), (n,), generator=generator)
    return xs[idx].clone(), {"source": "dataset images (any class)", "dataset": str(spec), "split": "train"}


# -- the sampler loop --------------------------------------------------------------------------
def chain_plan(chains: int, classes: int | None, steps: int, batch_size: int) -> dict[str, Any]:
    """What ``sample`` will run: ``chains`` chains (``classes`` x n per class, or n unconditional ones:
    ``classes`` None) of ``steps`` SGLD steps each, ``batch_size`` at a time. The same in any number of
    processes (under ``--nproc`` each runs a share of the batches, and its progress counts that share:
    :func:`jemeval.runtime.shards.my_share` chains times ``steps``)."""
    return {"chains": chains, "classes": classes, "per_class": None if classes is None else chains // classes,
            "steps": steps, "chain_steps": chains * steps, "batch_size": batch_size,
            "batches": math.ceil(chains / batch_size)}


def checked_plan(model: EnergyModel, x0: torch.Tensor, classes: list[int] | None, sgld: SGLD, batch_size: int,
                 on_plan: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
    """The last check (the chain starts' logits, :func:`check_starts`), then the plan, told to
    ``on_plan``: after it nothing is refused, so the announcement never precedes a refusal."""
    check_starts(model, x0, batch_size)
    plan = chain_plan(len(x0), None if classes is None else len(classes), sgld.steps, batch_size)
    if on_plan is not None:
        on_plan(plan)
    return plan


def run_chains(model: EnergyModel, sgld: SGLD, x0: torch.Tensor, targets: torch.Tensor | None, *,
               context: RunContext) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Run SGLD from ``x0`` in batches of chains; returns (the samples and what the model says about
    them, all on the CPU; the mean log p~ trace).

    Batch b's noise comes from its own generator (:func:`jemeval.runtime.shards.batch_generator`), so
    the batches can run in any process (:func:`jemeval.runtime.shards.map_batches`) and give the
    samples of one process. The trace is summed in batch order, as one process would. Non-finite
    samples or log p~ (a model whose finite weights overflow) stop with one line naming the batch.
    The progress counts chain-steps (this process's: all of them outside ``--nproc``).
    """
    n, steps, seed, batch_size = len(x0), sgld.steps, context.seed, context.batch(DEFAULT_BATCH_SIZE)
    n_batches = math.ceil(n / batch_size)
    with progress_bar(context.progress, steps * my_share(n, batch_size), "SGLD", unit="chain-step") as bar:
        def one(b: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
            part = slice(b * batch_size, (b + 1) * batch_size)
            y = None if targets is None else targets[part]
            x, trace = chain_batch(model, sgld, x0[part], y, batch_generator(seed, b, model.device), bar)
            return {"x": x, **describe(model, x, y, batch_size)}, trace * len(x)

        done = map_batches(one, n_batches)
    sizes = [len(p["x"]) for p, _ in done]
    for key, what in (("x", "samples"), ("log_px", "log p~(x) of its samples")):
        check_finite_outputs(what, [p[key] for p, _ in done], model, sizes=sizes, unit="chains")
    trace_sum = torch.zeros(steps + 1)
    for _, trace in done:
        trace_sum += trace
    parts = {k: torch.cat([p[k] for p, _ in done]) for k in done[0][0]}
    return parts, trace_sum / n


def check_starts(model: EnergyModel, x0: torch.Tensor, batch_size: int) -> None:
    """Stop before any SGLD step when the model's logits on the first batch of chain starts are not
    finite (finite weights that overflow): one forward instead of a whole run of NaN chains."""
    with torch.no_grad():
        logits = model.logits(x0[:batch_size].to(model.device)).cpu()
    check_finite_outputs("logits", [logits], model, sizes=[len(logits)], unit="chains", of="the chain starts")


def chain_batch(model: EnergyModel, sgld: SGLD, x0: torch.Tensor, y: torch.Tensor | None,
                generator: torch.Generator, bar) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of chains (on the CPU) and its mean log p~ trace (steps + 1 values, on the CPU).

    The steps run in chunks so that the progress (in chain-steps) moves during long chains; a chunk's
    trace ends where the next one begins.
    """
    device, steps = model.device, sgld.steps
    chunk = max(1, math.ceil(steps / _PROGRESS_CHUNKS))
    x = x0.to(device)
    y = None if y is None else y.to(device)
    parts, done = [], 0
    while True:
        k = min(chunk, steps - done)
        x, tr = sgld.sample(model, x, y, steps=k, generator=generator, return_trace=True)
        parts.append(tr if done + k == steps else tr[:-1])
        done += k
        bar.update(k * len(x))
        if done >= steps:
            break
    return x.detach().cpu(), torch.cat(parts).cpu()


@torch.no_grad()
def describe(model: EnergyModel, x: torch.Tensor, targets: torch.Tensor | None,
             batch_size: int) -> dict[str, torch.Tensor]:
    """What the model says about the samples: log p~(x), log p~(x, y), prediction, confidence."""
    device = model.device
    logits = torch.cat([model.logits(x[i:i + batch_size].to(device)) for i in range(0, len(x), batch_size)]).cpu()
    log_px = log_p(logits)
    conf, pred = logits.softmax(dim=1).max(dim=1)
    log_p_y = log_px if targets is None else log_p(logits, targets)
    return {"log_px": log_px, "log_p": log_p_y, "predicted": pred, "confidence": conf}


def top_confident_mask(predicted: np.ndarray, confidence: np.ndarray, percent: float) -> np.ndarray:
    """Keep the ``percent`` % most confident samples of each predicted class (at least one per
    non-empty class; ceil of the fraction): the filter behind JEM's published IS/FID."""
    predicted = np.asarray(predicted)
    confidence = np.asarray(confidence)
    order = np.lexsort((-confidence, predicted))  # by class, most confident first
    sorted_pred = predicted[order]
    first = np.searchsorted(sorted_pred, sorted_pred, side="left")
    rank = np.arange(len(order)) - first
    counts = np.bincount(predicted, minlength=int(predicted.max(initial=-1)) + 1)
    keep_n = np.ceil(counts * (percent / 100.0) - 1e-9).astype(int)
    mask = np.zeros(len(predicted), dtype=bool)
    mask[order] = rank < keep_n[sorted_pred]
    return mask


def summarise(parts: dict[str, torch.Tensor], targets: torch.Tensor, classes: list[int] | None,
              num_classes: int) -> list[dict[str, Any]]:
    """One record per class (the target class, or the predicted class when unconditional) plus
    an "all" row. ``mean_log_p`` is the ascended quantity: log p~(x, y) or log p~(x)."""
    conditional = classes is not None
    group = targets if conditional else parts["predicted"]
    count = torch.bincount(group, minlength=num_classes).double()
    hit = (parts["predicted"] == targets).double()
    columns = {"mean_log_p": parts["log_p"], "mean_log_px": parts["log_px"], "mean_confidence": parts["confidence"]}
    if conditional:
        columns = {"target_rate": hit, **columns}
    means = {k: torch.bincount(group, weights=v.double(), minlength=num_classes) / count for k, v in columns.items()}
    n_all = len(group)
    rows = []
    for c in (classes if conditional else range(num_classes)):
        row: dict[str, Any] = {"class": c, "n": int(count[c])}
        if not conditional:
            row["fraction"] = float(count[c]) / max(n_all, 1)
        row.update({k: (float(m[c]) if count[c] > 0 else None) for k, m in means.items()})
        rows.append(row)
    overall: dict[str, Any] = {"class": "all", "n": n_all}
    if not conditional:
        overall["fraction"] = 1.0
    overall.update({k: (float(v.double().mean()) if n_all else None) for k, v in columns.items()})
    rows.append(overall)
    return rows


# -- public entry point ------------------------------------------------------------------------
@deprecated_keywords(renamed={"step_size": "sgld_step_size", "noise": "sgld_noise"})
@takes_context(batch_size=DEFAULT_BATCH_SIZE)
def sample(
    model: EnergyModel | str | os.PathLike,
    *,
    classes: int | str | Sequence[int] | None = None,
    n: int = 64,
    steps: int | None = None,
    sgld_step_size: float | None = None,
    sgld_noise: float | None = None,
    clamp: Sequence[float] | None = None,
    bn_mode: str | None = None,
    init: str = "noise",
    replay_buffer: torch.Tensor | None = None,
    data: str | None = None,
    top_confident: float | None = None,
    on_plan: Callable[[dict[str, Any]], None] | None = None,
    context: RunContext,
) -> SamplesResult:
    """Draw samples from a JEM by SGLD (see the module docstring).

    ``classes=None`` runs ``n`` unconditional chains (ascending log p~(x)); ``classes="all"`` or a
    list runs ``n`` chains per class (ascending log p~(x, y)). ``init`` is ``noise`` (U(-1, 1)),
    ``buffer`` (the checkpoint's replay buffer, or ``replay_buffer``) or ``data`` (training images
    of ``data``, default the model's dataset). ``steps``, ``sgld_step_size``, ``sgld_noise``,
    ``clamp`` and ``bn_mode`` set the chains' SGLD. ``top_confident=P`` keeps the P% most confident
    samples of each predicted class. ``seed``, ``device``, ``batch_size`` (chains run at once),
    ``progress`` and ``data_root``: the run's :class:`~jemeval.context.RunContext`. Returns a Result:
    one record per class plus "all", the settings and the log p~ trace in ``extra``, and the
    :class:`~jemeval.artifacts.Samples` in ``extra["samples"]`` (``save_npz``, ``save_grid``).
    ``on_plan(plan)`` is called once every argument has been checked, before the first SGLD step,
    with the :func:`chain_plan` (chains, steps, chain-steps, batches); the progress counts chain-steps.
    """
    check_sample_args(init, n, top_confident, steps)
    model = prepare_model(model, context.device)
    seed, batch_size = context.seed, context.batch(DEFAULT_BATCH_SIZE)
    cls = resolve_classes(classes, model.num_classes)
    check_memory("n", [("n", n)] + ([("classes", len(cls))] if cls is not None else []), model.input_shape,
                 model.device)  # every chain's start and end are held whole
    sgld, sgld_source = recorded_sgld(model, DEFAULT_STEPS if steps is None else int(steps), step_size=sgld_step_size,
                                      noise=sgld_noise, clamp=clamp, bn_mode=bn_mode)
    targets = None if cls is None else torch.tensor(cls).repeat_interleave(n)
    total = n if cls is None else n * len(cls)
    x0, init_info = chain_starts(model, total, targets, init, torch.Generator().manual_seed(seed),
                                 replay_buffer=replay_buffer, data=data, context=context)
    plan = checked_plan(model, x0, cls, sgld, batch_size, on_plan)
    parts, trace = run_chains(model, sgld, x0, targets, context=context)
    parts["target"] = torch.full((total,), -1, dtype=torch.long) if targets is None else targets
    if top_confident is not None:
        keep = top_confident_mask(parts["predicted"].numpy(), parts["confidence"].numpy(), top_confident)
        parts = {k: v[torch.from_numpy(keep)] for k, v in parts.items()}
    settings = {
        "mode": "unconditional" if cls is None else "class-conditional",
        "ascends": "log p~(x)" if cls is None else "log p~(x, y)",
        "classes": cls, "n_per_class" if cls is not None else "n": n,
        "init": init, "init_details": init_info, "sgld": sgld.settings(), "sgld_defaults_from": sgld_source,
        "top_confident": top_confident, "top_confident_rule": TOP_CONFIDENT_RULE if top_confident else None,
        "n_generated": total, "n_kept": len(parts["x"]), "batch_size": batch_size, "seed": seed, "seed_use": SEED_USE,
        "plan": plan,
    }
    return samples_result(model, parts, trace, settings, cls, context)


def check_sample_args(init: str, n: int, top_confident: float | None, steps: int | None = None) -> None:
    check_init(init)
    check_min("n", n, 1)
    if steps is not None:
        check_count("steps", steps, "sgld_steps", low=0)
    if top_confident is not None and not 0 < top_confident <= 100:
        raise UsageError(f"top_confident is a percentage in (0, 100], got {top_confident:g}", param="top_confident")


def samples_result(model: EnergyModel, parts: dict[str, torch.Tensor], trace: torch.Tensor, settings: dict[str, Any],
                   classes: list[int] | None, context: RunContext) -> SamplesResult:
    """The Result of ``sample``: records per class, settings and trace, the Samples themselves."""
    prov = stamp("sample", model, context, settings, data=[(settings.get("init_details") or {}).get("dataset")])
    samples = Samples(x=parts["x"], target=parts["target"], log_p=parts["log_p"], log_px=parts["log_px"],
                      predicted=parts["predicted"], confidence=parts["confidence"], log_p_trace=trace,
                      settings=settings, provenance=prov)
    trace_list = [float(v) for v in trace]
    return SamplesResult(
        summarise(parts, parts["target"], classes, model.num_classes),
        provenance=prov,
        extra={"settings": settings, "log_p_trace": {"first": trace_list[0], "last": trace_list[-1],
                                                     "values": trace_list},
               "samples": samples},
    )
