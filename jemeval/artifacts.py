"""What evaluation returns besides records, and the files it is saved to.

Evaluation functions return a :class:`~jemeval.results.Result`; its ``extra`` may hold data objects
too large or too raw for the JSON result: the per-example OOD scores (:class:`OODScores`), generated
samples (:class:`Samples`), optimised images (:class:`Images`). They are :class:`~jemeval.results.Artifact`
subclasses, which JSON/CSV output leaves out, and they carry their own file formats (``.npz``, written
atomically and readable with ``numpy.load(allow_pickle=False)``). Computing them is evaluation's job;
writing them is the caller's (the command line, or a Python user calling ``save_npz``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jemeval.atomic import atomic_path
from jemeval.deprecations import warn_deprecated, writer_of
from jemeval.errors import UsageError
from jemeval.results import Artifact, Result, _plain

#: what draws a Samples grid (named, not imported: plots sit above this module)
GRID_WRITER = "jemeval.plots.grids:save_samples_grid"


# -- OOD scores ----------------------------------------------------------------------------------
@dataclass
class OODScores(Artifact):
    """Per-example scores of the in-distribution set and of each OOD set."""

    id_name: str
    score_names: list[str]
    id_scores: dict[str, np.ndarray]
    ood_scores: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # set -> score -> values

    @property
    def ood_names(self) -> list[str]:
        return list(self.ood_scores)

    def save_npz(self, path: str | Path, provenance: dict | None = None) -> Path:
        """Write every set's scores to one .npz (atomically).

        Keys: ``id/<score>`` and ``ood/<set>/<score>`` (float64 arrays), plus ``id_name``,
        ``ood_names``, ``score_names`` and ``provenance`` (a JSON string). Read back with
        :meth:`load_npz` or plain ``numpy.load``.
        """
        arrays: dict[str, np.ndarray] = {
            "id_name": np.array(self.id_name),
            "ood_names": np.array(self.ood_names),
            "score_names": np.array(self.score_names),
            "provenance": np.array(json.dumps(_plain(provenance or {}))),
        }
        for s in self.score_names:
            arrays[f"id/{s}"] = self.id_scores[s]
            for name, per_score in self.ood_scores.items():
                arrays[f"ood/{name}/{s}"] = per_score[s]
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        return Path(path)

    @classmethod
    def load_npz(cls, path: str | Path) -> OODScores:
        with np.load(path, allow_pickle=False) as f:
            scores = [str(s) for s in f["score_names"]]
            oods = [str(s) for s in f["ood_names"]]
            return cls(
                id_name=str(f["id_name"]),
                score_names=scores,
                id_scores={s: f[f"id/{s}"] for s in scores},
                ood_scores={o: {s: f[f"ood/{o}/{s}"] for s in scores} for o in oods},
            )


def save_ood_scores(result: Result, path: str | Path) -> Path:
    """Write the per-example scores of an ``evaluate_ood`` result (with its provenance) to ``path``."""
    return result.extra["scores"].save_npz(path, result.provenance)


# -- images --------------------------------------------------------------------------------------
@dataclass
class Images(Artifact):
    """Images a command produced (N x C x H x W in [-1, 1], on the CPU), e.g. distal adversarials."""

    x: torch.Tensor

    def __len__(self) -> int:
        return len(self.x)


# -- generated samples ---------------------------------------------------------------------------
@dataclass
class Samples(Artifact):
    """Generated images with what the model says about them.

    ``target`` is the class a chain was conditioned on (-1 for unconditional chains); ``log_p``
    is the quantity the chain ascended (log p~(x, y) or log p~(x)); ``log_px`` is log p~(x) for
    every sample; ``log_p_trace`` is the mean ``log_p`` over all chains before each SGLD step and
    after the last (length steps + 1). ``settings`` and ``provenance`` say how they were made.
    """

    x: torch.Tensor
    target: torch.Tensor
    log_p: torch.Tensor
    log_px: torch.Tensor
    predicted: torch.Tensor
    confidence: torch.Tensor
    log_p_trace: torch.Tensor
    settings: dict[str, Any]
    provenance: dict[str, Any]

    @property
    def conditional(self) -> bool:
        return self.settings["mode"] == "class-conditional"

    def __len__(self) -> int:
        return len(self.x)

    def save_npz(self, path: str | os.PathLike) -> Path:
        """Write x, y (target or -1), log_p, log_px, predicted, confidence and the provenance (a
        JSON string, so the file loads with ``np.load(allow_pickle=False)``), atomically."""
        prov = json.dumps(_plain({**self.provenance, "settings": self.settings}))
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez_compressed(
                fh, x=self.x.numpy().astype(np.float32), y=self.target.numpy(), log_p=self.log_p.numpy(),
                log_px=self.log_px.numpy(), predicted=self.predicted.numpy(),
                confidence=self.confidence.numpy(), log_p_trace=self.log_p_trace.numpy(),
                provenance=np.array(prov),
            )
        return Path(path)

    def save_grid(self, path: str | os.PathLike, per_row: int = 10) -> Path:
        """Deprecated: :func:`jemeval.plots.grids.save_samples_grid` draws the grid (data does not draw
        itself: this module sits below the plots). Kept for one release, the writer named by its path."""
        writer, where = writer_of(GRID_WRITER)
        warn_deprecated(f"Samples.save_grid(path) is deprecated; call {where}(samples, path)")
        return writer(self, path, per_row=per_row)


class SamplesResult(Result):
    """What :func:`jemeval.sample` returns: a Result whose ``extra["samples"]`` holds the :class:`Samples`.

    ``sample`` returned the Samples themselves before; their attributes (``x``, ``save_grid``,
    ``result``, ``len()``...) still work on the result for one release, with a DeprecationWarning.
    """

    @property
    def samples(self) -> Samples:
        return self.extra["samples"]

    def __getattr__(self, name: str):
        if name.startswith("__") or "extra" not in self.__dict__:
            raise AttributeError(name)
        if name == "result":
            warn_deprecated("sample(...).result: sample returns the Result itself now")
            return self
        samples = self.__dict__["extra"].get("samples")
        if samples is None or not hasattr(samples, name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        warn_deprecated(f"sample(...).{name}: sample returns a Result; use result.extra['samples'].{name}")
        return getattr(samples, name)

    def __len__(self) -> int:
        warn_deprecated("len(sample(...)): sample returns a Result; use len(result.extra['samples'])")
        return len(self.samples)

    def __bool__(self) -> bool:  # a result is true, as every Result is (not "has samples", via __len__)
        return True


def load_samples(path: str | os.PathLike) -> tuple[torch.Tensor, dict[str, Any]]:
    """Images and generation provenance from a file written by :meth:`Samples.save_npz` (no pickle)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"samples file {str(p)!r} does not exist; save samples first (Samples.save_npz, "
                         "or the save option of jemeval sample)")
    try:
        with np.load(p, allow_pickle=False) as f:
            x = torch.from_numpy(np.asarray(f["x"], dtype=np.float32))
            prov = json.loads(str(f["provenance"])) if "provenance" in f.files else {}
    except (KeyError, ValueError, OSError) as exc:
        raise UsageError(f"{str(p)!r} is not a samples file written by jemeval sample "
                         f"({str(exc).splitlines()[0][:120]})") from None
    if x.dim() != 4:
        raise UsageError(f"{str(p)!r}: x must be N x C x H x W, got shape {tuple(x.shape)}")
    return x, prov
