"""training/ folded into modules that each own a job (issue 24, item 4), checked as the attacks on it:

* a plugin written for 0.2 imports every public name from its old module path: it gets the same
  object, with one DeprecationWarning naming the new path (and a misspelt name is still an error);
* jemeval's own code (and the benchmarks) never goes through an old path, so no user sees the warning;
* what last.pt holds is read and written in one module: no other training module digs into a
  checkpoint's keys, and a last.pt still has exactly 0.2's layout (so 0.2's files resume);
* seeding happens in one place, once: no other code seeds a run's streams, the trainer's generator is
  seeded by one call (the 0.2 code seeded it twice), and two runs of one seed are equal bit for bit;
* names say what they hold: the run's position is a RunPosition (``Trainer.progress`` still answers,
  with a warning), no class in training/ is called Progress, and the loop has no one-letter aliases.
"""
from __future__ import annotations

import ast
import importlib
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

from jemeval.formats.native import read_checkpoint
from jemeval.runtime import distributed as D
from jemeval.runtime.distributed import DistContext
from jemeval.training import resolve_config, train
from jemeval.training import trainer as trainer_module
from jemeval.training.parts import seed_everything
from jemeval.training.position import EpochStats, RunPosition
from jemeval.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
TRAINING = ROOT / "jemeval" / "training"

#: every public name of the 0.2 modules that were folded, and where it lives now (written out by hand
#: from 0.2's files: an independent list, so a name dropped from a shim fails here)
MOVED = {
    "feed": {"batch_plan": "ddp", "epoch_order": "splits", "next_labelled": "splits", "batch": "splits"},
    "launch": {"check_launch": "rundir"},
    "metrics_log": {"COLUMNS": "reporting", "MetricsLog": "reporting"},
    "recovery": {"check": "divergence", "check_validation": "divergence"},
    "runstate": {"STAT_KEYS": "position", "EpochStats": "position", "Progress": "position:RunPosition"},
    "schedule": {"learning_rate": "trainer", "run_rate": "trainer", "schedule_warning": "trainer"},
    "session": {"Session": "trainer", "opened": "trainer"},
    "state": {"capture_rng": "checkpointing", "restore_rng": "checkpointing", "reseed": "parts:seed_everything"},
    "stopping": {"StopRequest": "trainer"},
    "config": {"resume_path": "checkpointing", "resume_from": "checkpointing"},  # 0.3's resume_from too
}
CASES = [(old, name, new) for old, names in MOVED.items() for name, new in names.items()]

# 3 digit classes (343 training images after validation), batch 32 -> 10 iterations per epoch.
TINY = {"arch": "cnn:width=4", "epochs": 1, "batch_size": 32, "lr": 2e-3, "warmup_iters": 4, "decay_epochs": (),
        "sgld_steps": 1, "buffer_size": 60, "val_size": 60, "progress": False, "test_eval": False, "check_every": 2,
        "grid_every": 0, "device": "cpu"}


def tiny(folder: Path, **changes):
    return resolve_config("digits[0-2]", **{**TINY, "out": str(folder), **changes})


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """The folder of a finished one-epoch run (never changed by the tests that use it)."""
    out = tmp_path_factory.mktemp("layout") / "run"
    train(tiny(out))
    return out


def _modules(folder: Path) -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text()) for path in sorted(folder.glob("*.py"))}


# -- the old paths ----------------------------------------------------------------------------------
@pytest.mark.parametrize("old, name, new", CASES, ids=[f"{o}.{n}" for o, n, _ in CASES])
def test_a_0_2_import_path_still_works_and_warns_once(old, name, new):
    module, _, new_name = new.partition(":")
    expected = getattr(importlib.import_module(f"jemeval.training.{module}"), new_name or name)
    namespace: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(f"from jemeval.training.{old} import {name}", namespace)  # what a 0.2 plugin writes
    assert namespace[name] is expected
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(deprecations) == 1
    assert f"jemeval.training.{module}.{new_name or name}" in str(deprecations[0].message)
    assert deprecations[0].filename == "<string>"  # the warning points at the importing line, not at jemeval


def test_a_misspelt_name_on_an_old_path_is_still_an_import_error():
    with pytest.raises(ImportError, match="learning_rates"):
        exec("from jemeval.training.schedule import learning_rates", {})
    with pytest.raises(AttributeError, match="recover"):  # the rollback is the trainer's own method now
        importlib.import_module("jemeval.training.recovery").recover  # noqa: B018


def test_no_code_of_jemeval_or_its_benchmarks_imports_an_old_path():
    """Otherwise every `jemeval train` would show users a DeprecationWarning about jemeval itself."""
    old_paths = {f"jemeval.training.{old}" for old in MOVED if old != "config"}
    offenders = []
    for path in [*sorted((ROOT / "jemeval").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))]:
        if path.parent == TRAINING and f"jemeval.training.{path.stem}" in old_paths:
            continue  # the shims themselves
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names = {a.name for a in node.names}
            else:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in sorted(names & old_paths)]
        offenders += [f"{path.relative_to(ROOT)} {a.name}" for node in ast.walk(ast.parse(path.read_text()))
                      if isinstance(node, ast.ImportFrom) and node.module == "jemeval.training.config"
                      for a in node.names if a.name in MOVED["config"]]
    assert offenders == []


def test_the_old_paths_hold_no_code():
    """A shim is a table of moved names, nothing else: no logic can hide (and drift) in an old module."""
    for old in (o for o in MOVED if o != "config"):
        tree = ast.parse((TRAINING / f"{old}.py").read_text())
        kinds = [type(node).__name__ for node in tree.body]
        assert kinds == ["Expr", "ImportFrom", "Assign"], (old, kinds)


# -- what last.pt holds ---------------------------------------------------------------------------------
CHECKPOINT_KEYS = ("training_state", "replay_buffer", "state_dict")


def test_only_checkpointing_reads_what_a_checkpoint_holds():
    """``ckpt["training_state"]``, ``["replay_buffer"]``, ``["state_dict"]``: in one module of training/."""
    found = []
    for name, tree in _modules(TRAINING).items():
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key = node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                key = node.args[0].value
            if key in CHECKPOINT_KEYS and name != "checkpointing":
                found.append(f"{name}:{node.lineno} {key}")
    assert found == []


def test_last_pt_keeps_the_0_2_layout(tiny_run):
    """The keys 0.2 wrote (so a 0.2 last.pt has everything this version reads, and the reverse)."""
    ckpt = read_checkpoint(tiny_run / "last.pt")
    assert {"state_dict", "replay_buffer", "training_state", "config", "provenance"} <= set(ckpt)
    state = ckpt["training_state"]
    assert set(state) == {"epoch", "batch", "step", "world_size", "perm", "lab_perm", "lab_pos", "rng", "epoch_stats",
                          "ranks", "best_val_acc", "best_epoch", "recoveries", "adjustments", "optimizer",
                          "scheduler", "metrics", "elapsed"}
    assert set(state["rng"]) == {"torch", "cuda", "numpy", "python", "generator"}
    assert set(state["adjustments"]) == {"lr_scale", "sgld_steps", "energy_l2", "seed"}
    assert (state["epoch"], state["batch"], state["step"], state["world_size"]) == (1, 0, 10, 1)
    assert ckpt["config"]["resolved"]["per_rank_batch"] == 32


def test_resuming_a_best_pt_is_one_line_and_touches_nothing(tmp_path, tiny_run):
    """The reading moved to checkpointing: its refusal must still be one line, the folder unchanged."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "last.pt").write_bytes((tiny_run / "best.pt").read_bytes())  # a best.pt under last.pt's name
    before = snapshot(tmp_path)
    result = runner().invoke(_cli(), ["train", "digits[0-2]", "--resume", "--out", str(run), "--device", "cpu"])
    assert_one_line_refusal(result, "holds no training state")
    assert snapshot(tmp_path) == before


def test_resuming_with_another_number_of_processes_is_refused_before_any_starts(tmp_path, tiny_run):
    """check_launch reads the world size through checkpointing now: still refused, still one line."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("last.pt", "best.pt", "metrics.csv"):
        (run / name).write_bytes((tiny_run / name).read_bytes())
    before = snapshot(tmp_path)
    result = runner().invoke(_cli(), ["train", "digits[0-2]", "--resume", "--nproc", "2", "--out", str(run),
                                      "--device", "cpu"])
    assert_one_line_refusal(result, "written by 1 process(es) but this run has 2")
    assert snapshot(tmp_path) == before


def _cli():
    from jemeval.cli import cli

    return cli


# -- seeding: one place, once -------------------------------------------------------------------------
class SpyGenerator:
    """Stands in for the trainer's generator and counts how it is seeded."""

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.calls: list[str] = []

    def manual_seed(self, seed: int) -> SpyGenerator:
        self.calls.append(f"manual_seed({seed})")
        return self

    def set_state(self, state: torch.Tensor) -> None:
        self.calls.append("set_state")


@pytest.mark.parametrize("ctx", [None, DistContext(), DistContext(rank=1, world_size=2)], ids=["none", "one", "ddp"])
def test_the_generator_is_seeded_once(ctx):
    spy = SpyGenerator()
    seed_everything(7, spy, ctx)
    assert len(spy.calls) == 1, spy.calls  # 0.2: reseed, then ddp.seed_generator seeded it again


def test_seed_everything_gives_each_stream_its_reference_state():
    generator = torch.Generator()
    seed_everything(11, generator)
    draws = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=generator))
    torch.manual_seed(11), np.random.seed(11), random.seed(11)
    reference = torch.Generator().manual_seed(11)
    expected = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=reference))
    assert torch.equal(draws[0], expected[0]) and np.array_equal(draws[1], expected[1]) and draws[2] == expected[2]
    assert torch.equal(draws[3], expected[3])
    for rank in (0, 1):  # under DDP: each rank its own stream, the one runtime.distributed defines
        seed_everything(11, generator, DistContext(rank=rank, world_size=2))
        assert torch.equal(generator.get_state(), D.rank_generator(11, rank).get_state())
    assert not torch.equal(D.rank_generator(11, 0).get_state(), D.rank_generator(11, 1).get_state())


def _seeding_calls(tree: ast.Module):
    """(enclosing function, line, call) of every call that seeds a random stream, except the seeding
    of a generator made on the spot (``torch.Generator().manual_seed(...)``: the sample grids' own)."""
    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                fresh = (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call)
                         and getattr(func.value.func, "attr", None) == "Generator")
                if name in ("manual_seed", "seed", "rank_generator") and not fresh:
                    yield function, child.lineno, ast.unparse(child)
            yield from visit(child, inner)

    yield from visit(tree, None)


def test_a_run_is_seeded_in_one_place():
    calls = [(module, *call) for module, tree in _modules(TRAINING).items() for call in _seeding_calls(tree)]
    elsewhere = [c for c in calls if (c[0], c[1]) != ("parts", "seed_everything")]
    assert elsewhere == [] and len(calls) == 5, calls  # torch, numpy, random, the generator, its rank stream


def test_two_runs_of_one_seed_are_equal_bit_for_bit(tmp_path, tiny_run, monkeypatch):
    seeded = []
    real = trainer_module.seed_everything
    monkeypatch.setattr("jemeval.training.parts.seed_everything",
                        lambda *args, **kw: (seeded.append(args[0]), real(*args, **kw))[1])
    train(tiny(tmp_path / "again"))
    assert seeded == [0]  # once per run (and once more per rollback, with its own seed)
    a, b = read_checkpoint(tiny_run / "last.pt"), read_checkpoint(tmp_path / "again" / "last.pt")
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    assert torch.equal(a["replay_buffer"], b["replay_buffer"])
    rng_a, rng_b = a["training_state"]["rng"], b["training_state"]["rng"]
    assert torch.equal(rng_a["torch"], rng_b["torch"]) and torch.equal(rng_a["generator"], rng_b["generator"])
    assert torch.equal(rng_a["numpy"]["keys"], rng_b["numpy"]["keys"])
    assert rng_a["numpy"]["pos"] == rng_b["numpy"]["pos"]
    # (Python's own `random` is seeded too but never drawn by training; a test runner's plugins may draw from it)
    timings = ("seconds", "images_per_s")
    rows = [[{k: v for k, v in r.items() if k not in timings} for r in c["training_state"]["metrics"]] for c in (a, b)]
    assert rows[0] == rows[1]


# -- names ------------------------------------------------------------------------------------------------
def test_the_run_position_is_a_run_position(tmp_path):
    trainer = Trainer(tiny(tmp_path / "run"))
    trainer.position = RunPosition(stats=EpochStats(torch.device("cpu")), step=3)
    assert trainer.step == 3
    with pytest.warns(DeprecationWarning, match="Trainer.position"):
        assert trainer.progress is trainer.position
    classes = [node.name for tree in _modules(TRAINING).values() for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef)]
    assert "Progress" not in classes and "RunPosition" in classes


def test_the_loop_has_no_one_letter_aliases():
    tree = ast.parse((TRAINING / "trainer.py").read_text())
    loop = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Trainer")
    stored = sorted({node.id for node in ast.walk(loop) if isinstance(node, ast.Name)
                     and isinstance(node.ctx, ast.Store) and (len(node.id) == 1 or node.id in ("cfg", "m"))})
    assert stored == []


def test_training_modules_and_functions_stay_small():
    """The limits the architecture test will apply to all of jemeval/ (400 lines, 60 per function)."""
    for path in sorted(TRAINING.glob("*.py")):
        text = path.read_text()
        assert len(text.splitlines()) < 400, path.name
        long = [f"{node.name} ({node.end_lineno - node.lineno + 1})" for node in ast.walk(ast.parse(text))
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60]
        assert long == [], path.name
