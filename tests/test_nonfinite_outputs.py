"""Issue 23 item 8: finite weights whose outputs overflow stop every evaluation in one line.

Every weight x 1e30 is finite, so the checkpoint's NaN/inf weight check lets it through; its logits
are inf/NaN. Before the fix ``calibrate`` printed ECE 0.0000 (reads as perfect), ``eval`` NLL "-",
``sample`` wrote a NaN grid and ``distal`` printed "-". Each command must now exit non-zero with one
``Error:`` line naming the checkpoint and the first bad batch, and write nothing (--out given).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

from jemeval.cli import cli
from jemeval.energy.factory import create_model
from jemeval.errors import JemevalError
from jemeval.evaluation.batching import check_finite_outputs, resolve_scores, run_batches
from jemeval.formats.native import save_checkpoint
from jemeval.testing import tiny_dataset, tiny_model


def save_digits_cnn(path: Path, seed: int = 0) -> Path:
    """An untrained digits network saved as a jemeval checkpoint (the weights' values do not matter
    to these tests; no training fixture is needed)."""
    torch.manual_seed(seed)
    model = create_model("cnn", 10, (1, 8, 8), metadata={"dataset": "digits"})
    return save_checkpoint(path, model, dataset="digits")


def overflowing_copy(src: Path, dst: Path, factor: float = 1e30) -> Path:
    """``src`` with every float tensor of its state_dict multiplied by ``factor``: finite weights,
    non-finite logits."""
    ckpt = torch.load(src, weights_only=True)
    ckpt["state_dict"] = {k: v * factor if v.is_floating_point() else v for k, v in ckpt["state_dict"].items()}
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    torch.save(ckpt, dst)
    return dst


@pytest.fixture
def folder(tmp_path, monkeypatch):
    save_digits_cnn(tmp_path / "ok.pt")
    overflowing_copy(tmp_path / "ok.pt", tmp_path / "over.pt")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JEMEVAL_DEBUG", raising=False)
    return tmp_path


COMMANDS = {
    "ood": "ood --model {m} --ood uniform --n 20 --out r.json",
    "calibrate": "calibrate --model {m} --n 20 --out r.json",
    "eval": "eval --model {m} --n 20 --out r.json",
    "sample": "sample --model {m} --n 2 --steps 2 --out g.png",
    "distal": "distal --model {m} --target 3 --n 2 --steps 2 --grid g.png --out r.json",
    "robust": "robust --model {m} --norm linf --n 5 --epsilons 0,0.1 --steps 1 --out r.json",
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_overflowing_model_stops_every_evaluation_in_one_line(folder, command):
    """The attack: a checkpoint whose weights are all finite but x 1e30. Refused in one line naming the
    checkpoint and batch 0; no output file; the folder unchanged."""
    before = snapshot(folder)
    result = runner().invoke(cli, COMMANDS[command].format(m="over.pt").split() + ["--device", "cpu"])
    assert_one_line_refusal(result, "over.pt'")
    line = result.stderr.strip()
    assert "non-finite" in line and "on batch 0 (" in line, line
    assert snapshot(folder) == before
    assert not any((folder / name).exists() for name in ("r.json", "g.png"))


@pytest.mark.parametrize("command", ["calibrate", "sample"])
def test_the_same_commands_run_on_the_finite_model(folder, command):
    """The check does not fire on the model the overflowing one was made from (so the test above
    fails when the refusal has another cause)."""
    result = runner().invoke(cli, COMMANDS[command].format(m="ok.pt").split() + ["--device", "cpu"])
    assert result.exit_code == 0, result.stderr
    assert "non-finite" not in result.stderr


def test_check_names_the_first_bad_batch_and_its_images():
    """Batch 2 of a pass with batches of 16 (images 32-47) is the first non-finite one: the line says so."""
    model = tiny_model(3, (1, 4, 4))
    ds = tiny_dataset(64)
    x = ds.x.clone()
    x[40, 0, 0, 0] = float("inf")  # image 40 is in batch 2 of size 16; its logits are inf/NaN
    ds.x = x
    with pytest.raises(JemevalError, match=r"the model \(tiny\) gives non-finite logits .* on batch 2 "
                                           r"\(images 32-47 of tiny\)"):
        run_batches(model, ds, batch_size=16, device="cpu")
    # gradnorm is served by the same forward pass, whose logits are checked first: they are the cause
    with pytest.raises(JemevalError, match=r"non-finite logits .* on batch 2 \(images 32-47"):
        run_batches(model, ds, scores=resolve_scores(["gradnorm"]), keep_logits=False, batch_size=16, device="cpu")
    with pytest.raises(JemevalError, match=r"non-finite score 'odin' .* on batch 2 \(images 32-47"):
        run_batches(model, ds, scores=resolve_scores(["odin"]), keep_logits=False, batch_size=16, device="cpu")
    flags = [torch.tensor(True), torch.tensor(False)]
    with pytest.raises(JemevalError, match=r"on batch 1 \(chains 3-4 of s\)"):
        check_finite_outputs("samples", flags, model, sizes=[3, 2], of="s", unit="chains")
    check_finite_outputs("samples", [torch.ones(3), None], model, sizes=[3, 2])  # finite: no error


def test_python_api_names_the_checkpoint(folder):
    """Python callers get the same one-line JemevalError, naming the checkpoint path they gave."""
    from jemeval.evaluation.calibration import calibrate

    with pytest.raises(JemevalError) as exc:
        calibrate(str(folder / "over.pt"), n=20, device="cpu", progress=False)
    message = str(exc.value)
    assert "\n" not in message and os.fspath(folder / "over.pt") in message and "batch 0" in message


def test_sample_checks_the_samples_of_every_batch(monkeypatch):
    """Chains that end non-finite in a later batch (finite logits at the start) are named by that batch."""
    from jemeval.evaluation import generation

    real, calls = generation.chain_batch, []

    def second_batch_explodes(*args, **kwargs):
        x, trace = real(*args, **kwargs)
        calls.append(1)
        return (torch.full_like(x, float("nan")) if len(calls) == 2 else x), trace

    monkeypatch.setattr(generation, "chain_batch", second_batch_explodes)
    with pytest.raises(JemevalError, match=r"non-finite samples .* on batch 1 \(chains 2-3\)"):
        generation.sample(tiny_model(3, (1, 4, 4)), n=4, steps=2, batch_size=2, device="cpu", progress=False)


def test_distal_checks_the_optimised_images(monkeypatch):
    """Images that went non-finite during the optimisation are refused, not averaged into "-"."""
    from jemeval.evaluation import distal as distal_module

    real = distal_module.optimise

    def nan_images(*args, **kwargs):
        images, start, trace = real(*args, **kwargs)
        return torch.full_like(images, float("nan")), start, trace

    monkeypatch.setattr(distal_module, "optimise", nan_images)
    with pytest.raises(JemevalError, match=r"non-finite logits .* on batch 0 \(images 0-3 of the optimised images\)"):
        distal_module.distal(tiny_model(3, (1, 4, 4)), [0, 1], n=2, steps=1, device="cpu", progress=False)
