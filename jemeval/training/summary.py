"""What :func:`jemeval.train` returns: the run summary as a :class:`~jemeval.results.Result`.

One record (status, the paths of best.pt, last.pt and metrics.csv, best/final/test accuracies,
recoveries, timings), the provenance, and the full configuration in ``extra["config"]``. The test
accuracy is best.pt's on the dataset's test split, its weights loaded through
:func:`.checkpointing.load_weights` (non-finite weights are refused).
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from jemeval.data import load_dataset, no_test_split_note
from jemeval.errors import JemevalError
from jemeval.evaluation.accuracy import accuracy_on_arrays
from jemeval.results import Result
from jemeval.training.checkpointing import config_record, load_weights, run_provenance
from jemeval.training.parts import Parts
from jemeval.training.position import RunPosition
from jemeval.training.reporting import MetricsLog
from jemeval.training.splits import held_images


class TrainResult(Result):
    """The result of :func:`jemeval.train` (see the module docstring).

    Up to 0.1 ``train`` returned the summary as a dict; ``result["best"]``, ``result.get(...)`` and
    ``"best" in result`` keep working for one release, with a DeprecationWarning: read
    ``result.records[0]["best"]``, or :attr:`summary` for that dict whole.
    """

    @property
    def summary(self) -> dict[str, Any]:
        """The record with ``config`` and ``provenance``: what ``jemeval train --json`` prints."""
        return {**self.records[0], "config": self.extra.get("config"), "provenance": self.provenance}

    def __getitem__(self, key: str) -> Any:
        _deprecated(f"result[{key!r}]")
        return self.summary[key]

    def get(self, key: str, default: Any = None) -> Any:
        _deprecated(f"result.get({key!r})")
        return self.summary.get(key, default)

    def __contains__(self, key: object) -> bool:
        _deprecated(f"{key!r} in result")
        return key in self.summary

    def keys(self):
        _deprecated("result.keys()")
        return self.summary.keys()


def _deprecated(what: str) -> None:
    warnings.warn(f"jemeval.train() returns a Result now; {what} reads the old summary dict and will be removed "
                  "in the next release: use result.records[0] (or result.summary)", DeprecationWarning, stacklevel=3)


def summarize(parts: Parts, position: RunPosition, metrics: MetricsLog, status: str) -> TrainResult:
    """The run's result (on every rank; the test accuracy is computed on rank 0 of a completed run)."""
    config, out = parts.config, parts.out
    epoch_rows = [r for r in metrics.rows if not r.get("event")]
    last = epoch_rows[-1] if epoch_rows else {}
    best = out / "best.pt"
    test_acc, note = None, None
    if status == "completed" and config.test_eval and parts.ctx.is_main and best.exists():
        test_acc, note = best_test_accuracy(parts, best)
    rates = [r["images_per_s"] for r in epoch_rows if r.get("images_per_s")]
    record = {
        "status": status, "dataset": config.dataset, "arch": config.arch, "out": str(out),
        "best": str(best) if best.exists() else None, "last": str(out / "last.pt"), "metrics": str(metrics.path),
        "epochs": position.epoch, "steps": position.step,
        "best_epoch": position.best_epoch, "best_val_acc": position.best_val_acc,
        "final_train_acc": last.get("train_acc"), "final_val_acc": last.get("val_acc"),
        "test_acc": test_acc, "test_note": note,
        "recoveries": position.recoveries, "world_size": parts.ctx.world_size, "seconds": position.elapsed,
        "images_per_s": sum(rates) / len(rates) if rates else None,
    }
    return TrainResult([record], provenance=run_provenance(parts, position, best_val_acc=position.best_val_acc),
                       extra={"config": config_record(parts, position)})


def best_test_accuracy(parts: Parts, best: Path) -> tuple[float | None, str | None]:
    """Accuracy of best.pt on the test split (eval_sigma noise; logits once, no gradients), and a
    note when that number needs one: no test split at all, or a dataset without a test split of its
    own (a single-split folder or npz, whose "test" images are the ones it trained on)."""
    config = parts.config
    try:
        test = load_dataset(config.dataset, "test", root=config.data_root, download=config.download)
    except JemevalError as exc:
        return None, f"no test accuracy: {exc}"
    x, y = held_images(test, config.workers)  # an npz's test images stay as stored
    load_weights(parts.model, best)
    notes = [no_test_split_note(config.dataset, test), parts.data.info.get("test_seen")]  # as eval, calibrate, ood
    note = "; ".join(n for n in notes if n) or None
    return accuracy_on_arrays(parts.model, x, y, batch_size=config.eval_batch_size, sigma=config.eval_sigma,
                              seed=config.seed), note
