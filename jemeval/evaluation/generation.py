"""Generation: draw samples from a JEM with SGLD, unconditionally or per class.

JEM is a generative model too (the JEM paper, sections 4 and 5). Unconditional chains ascend
log p~(x) = logsumexp f(x); class-conditional chains ascend log p~(x, y) = f(x)[y]. Chains start
from fresh U(-1, 1) noise, from the checkpoint's replay buffer (class-conditional draws use the
buffer's class blocks, as the JEM release does) or from real images.

Published IS/FID numbers depend on *which* samples are scored (replay buffer or fresh chains,
number of steps, the "top-10% most confident per class" filter), so every one of these choices is
returned in the settings and the provenance of the :class:`Samples`, and travels with the ``.npz``
file they are saved to.

SGLD defaults come from the checkpoint (``config["sgld"]``, written by ``jemeval train``) when it
has them, otherwise from the JEM release (step size 1.0, noise 0.01, no clamping, eval mode). The
number of steps defaults to :data:`DEFAULT_STEPS`: training chains are short because they persist
in the buffer; a chain started afresh needs more.
"""
from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jemeval.energy.model import EnergyModel, log_p
from jemeval.errors import CheckpointError, UsageError, did_you_mean
from jemeval.results import Result, _plain
from jemeval.sampling.buffer import ReplayBuffer, uniform_like_shape
from jemeval.sampling.recorded import recorded_sgld
from jemeval.sampling.sgld import SGLD

INITS = ("noise", "buffer", "data")
DEFAULT_STEPS = 100
DEFAULT_BATCH_SIZE = 256
_PROGRESS_CHUNKS = 25  # progress-bar updates per batch of chains (each costs one extra forward)


@dataclass
class Samples:
    """Generated images with what the model says about them, plus the result summarising them.

    ``target`` is the class a chain was conditioned on (-1 for unconditional chains); ``log_p``
    is the quantity the chain ascended (log p~(x, y) or log p~(x)); ``log_px`` is log p~(x) for
    every sample; ``log_p_trace`` is the mean ``log_p`` over all chains before each SGLD step and
    after the last (length steps + 1).
    """

    x: torch.Tensor
    target: torch.Tensor
    log_p: torch.Tensor
    log_px: torch.Tensor
    predicted: torch.Tensor
    confidence: torch.Tensor
    log_p_trace: torch.Tensor
    result: Result

    @property
    def settings(self) -> dict[str, Any]:
        return self.result.extra["settings"]

    @property
    def conditional(self) -> bool:
        return self.settings["mode"] == "class-conditional"

    def __len__(self) -> int:
        return len(self.x)

    def save_npz(self, path: str | os.PathLike) -> Path:
        """Write x, y (target or -1), log_p, log_px, predicted, confidence and the provenance (a
        JSON string, so the file loads with ``np.load(allow_pickle=False)``), atomically."""
        from jemeval.atomic import atomic_path

        prov = json.dumps(_plain({**self.result.provenance, "settings": self.settings}))
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez_compressed(
                fh, x=self.x.numpy().astype(np.float32), y=self.target.numpy(), log_p=self.log_p.numpy(),
                log_px=self.log_px.numpy(), predicted=self.predicted.numpy(),
                confidence=self.confidence.numpy(), log_p_trace=self.log_p_trace.numpy(),
                provenance=np.array(prov),
            )
        return Path(path)

    def save_grid(self, path: str | os.PathLike, per_row: int = 10) -> Path:
        """A PNG grid, one row per class: the target class for conditional samples, the predicted
        class for unconditional ones. Each image is captioned "predicted confidence"."""
        from jemeval.plots.grids import save_image_grid

        x, labels, captions = grid_rows(self, per_row)
        per_row = len(captions) // max(len(labels), 1)
        s = self.settings
        sgld = s["sgld"]
        kind = "class-conditional, rows = target class" if self.conditional else "unconditional, rows = predicted class"
        title = (f"SGLD samples ({kind}); init {s['init']}, {sgld['steps']} SGLD steps, "
                 f"step {sgld['step_size']:g}, noise {sgld['noise']:g}"
                 + (f", top {s['top_confident']:g}% confident" if s["top_confident"] else ""))
        return save_image_grid(x, path, nrow=per_row, row_labels=labels, title=title, captions=captions)


def grid_rows(samples: Samples, per_row: int) -> tuple[torch.Tensor, list[str], list[str]]:
    """Images laid out one row per class (at most ``per_row`` each); short rows are padded with
    NaN images, which matplotlib leaves blank."""
    group = samples.target if samples.conditional else samples.predicted
    prefix = "y=" if samples.conditional else "pred "
    blank = torch.full_like(samples.x[:1], float("nan"))
    rows, labels, captions = [], [], []
    per_row = max(1, min(per_row, int(torch.bincount(group - group.min()).max()) if len(group) else 1))
    for c in torch.unique(group).tolist():
        idx = torch.nonzero(group == c).flatten()[:per_row]
        pad = per_row - len(idx)
        rows.append(torch.cat([samples.x[idx], blank.expand(pad, *blank.shape[1:])]))
        labels.append(f"{prefix}{c}")
        captions += [f"{int(p)} {float(q):.2f}" for p, q in zip(samples.predicted[idx], samples.confidence[idx])]
        captions += [""] * pad
    return torch.cat(rows), labels, captions


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
            raise UsageError(f"--class must be 'all' or class indices such as 3 or 0,3; got {classes!r}") from None
    elif isinstance(classes, int):
        classes = [classes]
    classes = [int(c) for c in classes]
    bad = [c for c in classes if not 0 <= c < num_classes]
    if bad or not classes:
        raise UsageError(f"--class {bad or classes} is not a class of this model: use 0..{num_classes - 1} or 'all'")
    return sorted(set(classes), key=classes.index)


def check_init(init: str) -> str:
    if init not in INITS:
        raise UsageError(f"unknown --init {init!r}{did_you_mean(init, INITS)}: choose one of {', '.join(INITS)}")
    return init


# -- chain starts ------------------------------------------------------------------------------
def buffer_from_model(model: EnergyModel, replay_buffer: torch.Tensor | None) -> tuple[torch.Tensor, str]:
    """The replay buffer given, or the one stored in the model's checkpoint; a clear error if none."""
    if replay_buffer is not None:
        return replay_buffer, "given"
    from jemeval.formats.native import check_finite, read_checkpoint, replay_buffer_of

    ckpt = (model.metadata.get("checkpoint") or {}).get("path")
    if ckpt is None:
        raise UsageError("--init buffer needs the model's checkpoint (or replay_buffer=...); this model has none")
    buf = replay_buffer_of(read_checkpoint(ckpt))
    if buf is None:
        raise UsageError(f"--init buffer: checkpoint {ckpt!r} stores no replay buffer (JEM checkpoints from "
                         "`jemeval train` with --px-weight > 0 and JEM release files do); use --init noise or --init data")
    check_finite(buf, "its replay buffer", ckpt)  # NaN chain starts would sample NaN images
    return buf, ckpt


def chain_starts(model: EnergyModel, n: int, targets: torch.Tensor | None, init: str, generator: torch.Generator, *,
                 replay_buffer: torch.Tensor | None = None, data: str | None = None,
                 data_root: str | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """``n`` chain starts on the CPU (drawn from ``generator``) and a description of their source."""
    shape = model.input_shape
    if init == "noise":
        return uniform_like_shape(n, shape, generator=generator), {"source": "U(-1, 1)"}
    if init == "buffer":
        buf, where = buffer_from_model(model, replay_buffer)
        if tuple(buf.shape[1:]) != tuple(shape):
            raise CheckpointError(f"replay buffer images are {tuple(buf.shape[1:])} but the model takes {tuple(shape)}")
        if targets is not None and len(buf) < model.num_classes:
            raise CheckpointError(f"replay buffer holds {len(buf)} images, fewer than the {model.num_classes} class blocks")
        rb = ReplayBuffer.from_tensor(buf, num_classes=model.num_classes, reinit_freq=0.0)
        x0, idx = rb.sample(n, targets, generator=generator)
        layout = "class blocks (index = y * size // K + offset)" if targets is not None else "uniform over the buffer"
        return x0, {"source": "replay buffer", "checkpoint": where, "buffer_size": len(buf), "layout": layout}
    # init == "data": real images of any class (conditional chains then show class conversion)
    from jemeval.data import load_dataset, to_arrays

    spec = data or model.metadata.get("dataset")
    if not spec:
        raise UsageError("--init data needs a dataset: pass --data NAME (the model's checkpoint names none)")
    xs, _ = to_arrays(load_dataset(spec, split="train", root=data_root))
    if tuple(xs.shape[1:]) != tuple(shape):
        raise UsageError(f"--data {spec!r} has images {tuple(xs.shape[1:])} but the model takes {tuple(shape)}")
    idx = torch.randint(0, len(xs), (n,), generator=generator)
    return xs[idx].clone(), {"source": "dataset images (any class)", "dataset": str(spec), "split": "train"}


# -- the sampler loop --------------------------------------------------------------------------
def run_chains(model: EnergyModel, sgld: SGLD, x0: torch.Tensor, targets: torch.Tensor | None, *,
               batch_size: int, generator: torch.Generator, progress: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run SGLD from ``x0`` in batches of chains; returns (samples on CPU, mean log p~ trace).

    Each batch runs in chunks of steps so that the progress bar (stderr) moves during long chains;
    a chunk's trace ends where the next one begins, so the joined trace has steps + 1 values.
    """
    from tqdm.auto import tqdm

    device = model.device
    n, steps = len(x0), sgld.steps
    chunk = max(1, math.ceil(steps / _PROGRESS_CHUNKS))
    n_batches = math.ceil(n / batch_size)
    outs, trace_sum = [], torch.zeros(steps + 1, device=device)
    with tqdm(total=steps * n_batches, unit="step", desc="SGLD", file=sys.stderr,
              disable=(None if progress is None else not progress), leave=False) as bar:
        for start in range(0, n, batch_size):
            x = x0[start:start + batch_size].to(device)
            y = None if targets is None else targets[start:start + batch_size].to(device)
            parts = []
            done = 0
            while True:
                k = min(chunk, steps - done)
                x, tr = sgld.sample(model, x, y, steps=k, generator=generator, return_trace=True)
                parts.append(tr if done + k == steps else tr[:-1])
                done += k
                bar.update(k)
                if done >= steps:
                    break
            trace_sum += torch.cat(parts) * len(x)
            outs.append(x.detach().cpu())
    return torch.cat(outs), (trace_sum / n).cpu()


@torch.no_grad()
def describe(model: EnergyModel, x: torch.Tensor, targets: torch.Tensor | None, batch_size: int) -> dict[str, torch.Tensor]:
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
def sample(
    model: EnergyModel | str | os.PathLike,
    *,
    classes: int | str | Sequence[int] | None = None,
    n: int = 64,
    steps: int | None = None,
    step_size: float | None = None,
    noise: float | None = None,
    clamp: Sequence[float] | None = None,
    bn_mode: str | None = None,
    init: str = "noise",
    replay_buffer: torch.Tensor | None = None,
    data: str | None = None,
    data_root: str | None = None,
    top_confident: float | None = None,
    seed: int = 0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: str | torch.device | None = None,
    progress: bool | None = None,
) -> Samples:
    """Draw samples from a JEM by SGLD (see the module docstring).

    ``classes=None`` runs ``n`` unconditional chains (ascending log p~(x)); ``classes="all"`` or a
    list runs ``n`` chains per class (ascending log p~(x, y)). ``init`` is ``noise`` (U(-1, 1)),
    ``buffer`` (the checkpoint's replay buffer, or ``replay_buffer``) or ``data`` (training images
    of ``data``, default the model's dataset). ``top_confident=P`` keeps the P% most confident
    samples of each predicted class. ``progress=None`` shows a bar only on a terminal.
    """
    from jemeval.evaluation.batching import prepare_model
    from jemeval.provenance import provenance

    model = prepare_model(model, device)
    check_init(init)
    if n < 1:
        raise UsageError(f"--n must be >= 1, got {n}")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
    if top_confident is not None and not 0 < top_confident <= 100:
        raise UsageError(f"--top-confident is a percentage in (0, 100], got {top_confident:g}")
    cls = resolve_classes(classes, model.num_classes)
    sgld, sgld_source = recorded_sgld(model, DEFAULT_STEPS if steps is None else int(steps), step_size=step_size,
                                      noise=noise, clamp=clamp, bn_mode=bn_mode)

    targets = None if cls is None else torch.tensor(cls).repeat_interleave(n)
    total = n if cls is None else n * len(cls)
    init_gen = torch.Generator().manual_seed(seed)
    x0, init_info = chain_starts(model, total, targets, init, init_gen, replay_buffer=replay_buffer,
                                 data=data, data_root=data_root)
    noise_gen = torch.Generator(device=model.device).manual_seed(seed)
    x, trace = run_chains(model, sgld, x0, targets, batch_size=batch_size, generator=noise_gen, progress=progress)
    parts = describe(model, x, targets, batch_size)
    targets_out = torch.full((total,), -1, dtype=torch.long) if targets is None else targets

    n_generated = total
    if top_confident is not None:
        keep = torch.from_numpy(top_confident_mask(parts["predicted"].numpy(), parts["confidence"].numpy(), top_confident))
        x, targets_out = x[keep], targets_out[keep]
        parts = {k: v[keep] for k, v in parts.items()}

    settings = {
        "mode": "unconditional" if cls is None else "class-conditional",
        "ascends": "log p~(x)" if cls is None else "log p~(x, y)",
        "classes": cls, "n_per_class" if cls is not None else "n": n,
        "init": init, "init_details": init_info,
        "sgld": sgld.settings(), "sgld_defaults_from": sgld_source,
        "top_confident": top_confident,
        "top_confident_rule": "per predicted class, ceil(P% of its samples), by max softmax" if top_confident else None,
        "n_generated": n_generated, "n_kept": len(x), "batch_size": batch_size,
        "seed": seed,
        "seed_use": "init draws: CPU generator(seed); SGLD noise: device generator(seed), drawn batch by batch "
                    "(the same seed and batch_size give the same samples)",
    }
    records = summarise(parts, targets_out, cls, model.num_classes)
    trace_list = [float(v) for v in trace]
    result = Result(
        records,
        provenance=provenance(command="sample", model=model, device=model.device, seed=seed, settings=settings),
        extra={"settings": settings, "log_p_trace": {"first": trace_list[0], "last": trace_list[-1],
                                                     "values": trace_list}},
    )
    return Samples(x=x, target=targets_out, log_p=parts["log_p"], log_px=parts["log_px"],
                   predicted=parts["predicted"], confidence=parts["confidence"], log_p_trace=trace, result=result)


def load_samples(path: str | os.PathLike) -> tuple[torch.Tensor, dict[str, Any]]:
    """Images and generation provenance from a ``jemeval sample --save`` file (no pickle)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"samples file {str(p)!r} does not exist; write one with `jemeval sample --save FILE.npz`")
    try:
        with np.load(p, allow_pickle=False) as f:
            x = torch.from_numpy(np.asarray(f["x"], dtype=np.float32))
            prov = json.loads(str(f["provenance"])) if "provenance" in f.files else {}
    except (KeyError, ValueError, OSError) as exc:
        raise UsageError(f"{str(p)!r} is not a samples file from `jemeval sample --save` ({str(exc).splitlines()[0][:120]})") from None
    if x.dim() != 4:
        raise UsageError(f"{str(p)!r}: x must be N x C x H x W, got shape {tuple(x.shape)}")
    return x, prov
