"""Nothing silent, round 3 (issue 34): sizes no machine can run, one checkpoint in two compared
models, and leaderboard files their leaderboards would reject or misread.

* item 5: a count a few zeros too large (``--bins 100000000``, ``--steps 1000000000``, ``--eot-samples
  1000000000``, ``--set robust.steps=1000000000``, ...) ran for minutes or died with "can't allocate
  memory"; now one line naming the count, its ceiling and why, before anything is loaded or written,
  from the CLI, from Python and from the report's --set. Each case runs under a deadline, so the
  code that hangs fails here instead of hanging the suite.
* item 10: ``--model 'jem*.pt' --name A --model 'jem_l*.pt' --name B`` put one checkpoint in both
  groups and ran paired tests of that run against itself: refused, naming the checkpoint and both
  groups (by its resolved path, and a copy by its SHA-256).
* items 14 and 15: the rules of OpenOOD's and RobustBench's leaderboards, written here from their
  code (tests/data/leaderboards/*.json say which files) independently of jemeval's, are checked on
  their own real files (kept there byte for byte) and on jemeval's; the report-level tests of the
  exports are in test_report_exports.py.
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import re
import shlex
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_bad_inputs import assert_one_line_refusal, runner, snapshot

import jemeval
from jemeval.cli import cli
from jemeval.errors import UsageError
from jemeval.formats.native import save_checkpoint

DATA = Path(__file__).parent / "data" / "leaderboards"
OPENOOD = json.loads((DATA / "openood_v1.5.json").read_text(encoding="utf-8"))
ROBUSTBENCH = json.loads((DATA / "robustbench_model_info.json").read_text(encoding="utf-8"))
#: what every refusal of a size says
TOO_MANY = "is more than jemeval runs: at most"
#: how long a refusal may take in-process (it reads no data, computes nothing); measured: < 0.2 s
REFUSAL_SECONDS = 5.0


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise TimeoutError in the test when the block runs past ``seconds`` (a hang fails, not waits),
    and again every half second after: code that catches it (a report's failed section) cannot go on."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.5)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def timed_invoke(args: list[str]):
    """The command's result and its seconds, under a deadline of a few refusals' worth."""
    start = time.perf_counter()
    try:
        with deadline(2 * REFUSAL_SECONDS):
            result = runner().invoke(cli, args)
    except TimeoutError as exc:
        pytest.fail(f"{shlex.join(args)}: {exc} instead of refusing at once")
    return result, time.perf_counter() - start


# -- item 5: sizes that cannot run ----------------------------------------------------------------------
SIZE_CASES = [
    ("calibrate --model m.pt --bins 100000000 --device cpu", "--bins 100,000,000 " + TOO_MANY + " 10,000"),
    ("robust --model m.pt --norm l2 --steps 1000000000 --device cpu", "--steps 1,000,000,000 " + TOO_MANY),
    ("robust --model m.pt --norm l2 --eot-samples 1000000000 --grad-mode eot --refine-steps 1 --device cpu",
     "--eot-samples 1,000,000,000 " + TOO_MANY),
    ("robust --model m.pt --norm l2 --restarts 1000000000 --device cpu", "--restarts 1,000,000,000 " + TOO_MANY),
    ("robust --model m.pt --norm l2 --draws 1000000000 --device cpu", "--draws 1,000,000,000 " + TOO_MANY),
    ("robust --model m.pt --norm l2 --chains 1000000000 --refine-steps 1 --device cpu",
     "--chains 1,000,000,000 " + TOO_MANY),
    ("robust --model m.pt --norm l2 --refine-steps 0,1000000000 --device cpu", "--refine-steps 1,000,000,000 "
     + TOO_MANY),
    # each count within its ceiling, their product not: 1000 x 100000 x (10 x 5 + 1) passes per input
    ("robust --model m.pt --norm l2 --steps 100000 --restarts 1000 --refine-steps 10 --device cpu",
     "= 5.1e+09 forward-and-backward passes per input, more than the 1e+09 jemeval runs"),
    ("eval --model m.pt --refine-steps 1000000000 --device cpu", "--refine-steps 1,000,000,000 " + TOO_MANY),
    ("eval --model m.pt --chains 1000000000 --refine-steps 1 --device cpu", "--chains 1,000,000,000 " + TOO_MANY),
    ("sample --model m.pt --steps 1000000000 --n 4 --device cpu", "--steps 1,000,000,000 " + TOO_MANY),
    # within every ceiling, beyond any memory: 10^12 chains of 64 float32 values, held whole
    ("sample --model m.pt --n 1000000000000 --steps 1 --device cpu",
     "--n 1,000,000,000,000 images of 1x8x8 values held at once take 238,418.6 GiB before any activation"),
    ("distal --model m.pt --target 3 --steps 1000000000 --device cpu", "--steps 1,000,000,000 " + TOO_MANY),
    ("distal --model m.pt --target 3 --n 1000000000000 --device cpu", "GiB before any activation, more than the"),
    ("ood --model m.pt --ood uniform --bootstrap 1000000000 --device cpu", "--bootstrap 1,000,000,000 " + TOO_MANY),
    # the report: the same checks on the resolved options, before any section runs
    # training: the same ceilings on its SGLD steps, epochs and replay buffer (no run folder made)
    ("train digits --sgld-steps 1000000000 --out run --device cpu", "--sgld-steps 1,000,000,000 " + TOO_MANY),
    ("train digits --epochs 1000000000 --out run --device cpu", "--epochs 1,000,000,000 " + TOO_MANY),
    ("train digits --buffer-size 1000000000000 --out run --device cpu", "--buffer-size 1,000,000,000,000 "
     + TOO_MANY),
    ("report --model m.pt --out rep --set robust.steps=1000000000 --device cpu",
     "robust.steps: steps 1,000,000,000 " + TOO_MANY),
    ("report --model m.pt --out rep --set robust.eot_samples=1000000000 --device cpu",
     "robust.eot_samples: eot_samples 1,000,000,000 " + TOO_MANY),
    ("report --model m.pt --out rep --set robust.restarts=1000000000 --device cpu",
     "robust.restarts: restarts 1,000,000,000 " + TOO_MANY),
    ("report --model m.pt --out rep --set calibration.bins=100000000 --device cpu",
     "calibration.bins: bins 100,000,000 " + TOO_MANY),
    ("report --model m.pt --out rep --set samples.steps=1000000000 --device cpu",
     "samples.steps: steps 1,000,000,000 " + TOO_MANY),
    ("report --model m.pt --out rep --refine-steps 0,1000000000 --device cpu",
     "accuracy.refine_steps: --refine-steps 1,000,000,000 " + TOO_MANY),
    ("report --model m.pt --out rep --set ood.bootstrap=1000000000 --device cpu",
     "ood.bootstrap: bootstrap 1,000,000,000 " + TOO_MANY),
    ("report --model m.pt --out rep --set robust.chains=abc --device cpu",
     "robust.chains: chains must be a whole number >= 1, got 'abc'"),
]


@pytest.mark.parametrize("command, expected", SIZE_CASES, ids=[f"{i}-{c.split()[0]}" for i, (c, _) in
                                                               enumerate(SIZE_CASES)])
def test_a_size_no_machine_runs_is_refused_at_once(home, command, expected):
    before = snapshot(home)
    result, seconds = timed_invoke(shlex.split(command))
    assert_one_line_refusal(result, expected)
    assert seconds < REFUSAL_SECONDS, f"{command}: refused after {seconds:.2f} s"
    assert snapshot(home) == before  # nothing written, no report folder made


def test_the_python_functions_refuse_the_same_sizes(home):
    model = jemeval.load_model(home / "m.pt")
    calls = [
        (lambda: jemeval.calibrate(model, bins=10**8, device="cpu"), "bins 100,000,000 " + TOO_MANY),
        (lambda: jemeval.robust(model, norm="l2", steps=10**9, device="cpu"), "steps 1,000,000,000 " + TOO_MANY),
        (lambda: jemeval.robust(model, norm="l2", steps=[1, 10**9], device="cpu"), "steps 1,000,000,000 "),
        (lambda: jemeval.robust(model, norm="l2", eot_samples=10**9, grad_mode="eot", refine_steps=1, device="cpu"),
         "eot_samples 1,000,000,000 " + TOO_MANY),
        (lambda: jemeval.evaluate(model, refine_steps=[0, 10**9], device="cpu"), "refine_steps 1,000,000,000 "),
        (lambda: jemeval.sample(model, n=4, steps=10**9, device="cpu"), "steps 1,000,000,000 " + TOO_MANY),
        (lambda: jemeval.report({"M": str(home / "m.pt")}, out=home / "rep", options={"robust": {"steps": 10**9}},
                                device="cpu", progress=False), "robust.steps: steps 1,000,000,000 "),
    ]
    for call, words in calls:
        start = time.perf_counter()
        with deadline(4 * REFUSAL_SECONDS), pytest.raises(UsageError) as caught:
            call()
        assert words in str(caught.value), str(caught.value)
        assert time.perf_counter() - start < REFUSAL_SECONDS
    assert not (home / "rep").exists()


def test_the_ceilings_are_far_above_what_the_presets_and_the_paper_use():
    """Every ceiling is at least 50 x the largest count jemeval's presets or the JEM paper use (each
    reason says which), and the paper preset's robust evaluation is ~10^4 x under the passes ceiling."""
    from jemeval.evaluation import limits
    from jemeval.reports.settings import PRESETS

    paper = PRESETS["paper"]["robust"]
    used = {"attack_steps": paper["steps"], "restarts": paper["restarts"], "refine_steps": max(paper["refine_steps"]),
            "sgld_steps": PRESETS["paper"]["samples"]["steps"], "chains": 5, "eot_samples": 20, "draws": 5,
            "bins": 20, "bootstrap": 2000, "ascent_steps": 200, "epochs": 150, "buffer_size": 10_000}
    assert set(used) == set(limits.CEILINGS)
    for kind, value in used.items():
        assert limits.ceiling(kind) >= 50 * value, kind
    passes = paper["restarts"] * paper["steps"] * (max(paper["refine_steps"]) * 5 + 1)
    assert passes == 102_000 and limits.MAX_PASSES_PER_INPUT >= 9_000 * passes


def test_a_memory_bound_only_refuses_what_cannot_fit(home, monkeypatch):
    """The memory check is a lower bound against the device's whole memory: a size that fits runs."""
    from jemeval.evaluation import limits

    monkeypatch.setattr(limits, "device_memory", lambda device: 30 * 16 * 64 * 4)  # 30 inputs x 16 chains, float32
    model = jemeval.load_model(home / "m.pt")
    out = jemeval.evaluate(model, n=30, refine_steps=[0, 1], chains=16, device="cpu", batch_size=100, progress=False)
    assert [r["refine_steps"] for r in out.records] == [0, 1]  # 30 x 16 copies fit
    with pytest.raises(UsageError, match=r"batch_size 30 x chains 17 = 510 images of 1x8x8 values"):
        jemeval.evaluate(model, n=30, refine_steps=[0, 1], chains=17, device="cpu", batch_size=100, progress=False)
    assert limits.device_memory.__name__ == "<lambda>"  # the patched bound was the one applied


# -- item 10: one checkpoint in two compared models -----------------------------------------------------
@pytest.fixture
def runs(home):
    """jem_s0.pt and jem_s1.pt (JEM), jem_lr0.pt (another recipe), and copy.pt, a copy of jem_s0.pt."""
    for i, name in enumerate(("jem_s0.pt", "jem_s1.pt", "jem_lr0.pt")):
        torch.manual_seed(i + 1)
        save_checkpoint(home / name, jemeval.create_model("cnn", 10, (1, 8, 8), width=4), dataset="digits")
    shutil.copy(home / "jem_s0.pt", home / "copy.pt")
    return home


ONE_SECTION = ["--sections", "accuracy", "--n", "20", "--refine-steps", "0", "--device", "cpu"]


def test_one_checkpoint_in_two_models_is_refused(runs):
    """'jem_*.pt' also matches jem_lr0.pt: the two groups share a run."""
    before = snapshot(runs)
    result, seconds = timed_invoke(["report", "--model", "jem_*.pt", "--name", "A", "--model", "jem_l*.pt", "--name",
                                    "B", "--out", "rep", *ONE_SECTION])
    assert_one_line_refusal(result, "checkpoint 'jem_lr0.pt' is in both 'A' and 'B': a paired test between the two "
                                    "would compare that run with itself")
    assert "the patterns 'jem_*.pt' and 'jem_l*.pt' overlap" in result.stderr
    assert seconds < REFUSAL_SECONDS and snapshot(runs) == before
    # patterns that do not overlap still make two groups
    result = runner().invoke(cli, ["report", "--model", "jem_s*.pt", "--name", "A", "--model", "jem_l*.pt", "--name",
                                   "B", "--out", "rep", *ONE_SECTION])
    assert result.exit_code == 0, result.output + result.stderr
    report = json.loads((runs / "rep" / "report.json").read_text())
    assert [len(g["runs"]) for g in report["groups"]["models"]] == [2, 1]


def test_a_copy_of_a_checkpoint_in_another_model_is_found_by_its_content(runs):
    before = snapshot(runs)
    result, _ = timed_invoke(["report", "--model", "jem_s*.pt", "--name", "A", "--model", "copy.pt", "--name", "B",
                              "--out", "rep", *ONE_SECTION])
    sha = __import__("hashlib").sha256((runs / "copy.pt").read_bytes()).hexdigest()
    assert_one_line_refusal(result, f"checkpoint 'copy.pt' is in both 'A' and 'B' (the same checkpoint as "
                                    f"'jem_s0.pt', SHA-256 {sha[:16]}...)")
    assert snapshot(runs) == before
    # the same file under two spellings, as two single models; and from Python
    result, _ = timed_invoke(["report", "--model", "jem_s0.pt", "--model", "./jem_s0.pt", "--out", "rep",
                              *ONE_SECTION])
    assert_one_line_refusal(result, "checkpoint './jem_s0.pt' is in both")
    with pytest.raises(UsageError, match="is in both 'A' and 'B'"):
        jemeval.report({"A": [str(runs / "jem_s0.pt"), str(runs / "jem_s1.pt")], "B": str(runs / "copy.pt")},
                       out=runs / "rep", sections="accuracy", device="cpu", progress=False)
    assert snapshot(runs) == before


# -- items 14, 15: the leaderboards' rules, written from their code -------------------------------------
#: OpenOOD's number cells (scripts/eval_ood.py: '{:.2f} ± {:.2f}'; '/' where none, as its files write it)
OPENOOD_NUMBER = re.compile(r"\d+\.\d{2} ± \d+\.\d{2}|/")
OPENOOD_NUMBER_COLUMNS = ("Near-OOD_AUROC", "Far-OOD_AUROC", "ID_Accuracy")


def openood_rule_breaks(text: str) -> list[str]:
    """What in a results/<benchmark>.csv text OpenOOD's leaderboard pipeline cannot take: its header,
    unquoted cells (its files quote none), the number grammar, Yes/No, the text columns its converter
    calls str methods on (a NaN crashes it) and names a JSON file after (no '/', <= 255 bytes)."""
    lines = text.rstrip("\n").split("\n")
    breaks = [] if lines[0] == OPENOOD["header"] else [f"header {lines[0]!r}"]
    for line in lines[1:]:
        cells = line.split(",")
        if len(cells) != len(OPENOOD["fields"]) or '"' in line:
            breaks.append(f"{line!r}: not {len(OPENOOD['fields'])} plain cells")
            continue
        row = dict(zip(OPENOOD["fields"], cells))
        breaks += [f"{line!r}: {k} {row[k]!r}" for k in OPENOOD_NUMBER_COLUMNS if not OPENOOD_NUMBER.fullmatch(row[k])]
        breaks += [f"{line!r}: Outlier_Data {row['Outlier_Data']!r}" for _ in [0] if row["Outlier_Data"] not in
                   ("Yes", "No")]
        breaks += [f"{line!r}: {k} empty" for k in ("Training", "Postprocessor", "Arch") if not row[k]]
        breaks += [f"{line!r}: {k} holds '/'" for k in ("Training", "Postprocessor", "Additional_Description")
                   if "/" in row[k]]
        name = f"{row['Training']}_{row['Postprocessor']}_{row['Arch'].replace('/', '-')}"
        name += f"_{row['Additional_Description']}.json" if row["Additional_Description"] else ".json"
        breaks += [f"{line!r}: file name of {len(name.encode())} bytes" for _ in [0] if len(name.encode()) > 255]
    return breaks


def robustbench_rule_breaks(info: dict) -> list[str]:
    """What in a model_info RobustBench's code rejects or crashes on: the 12 keys all its Linf/L2 files
    hold, none null, each of its type; float() of clean_acc and of external/autoattack_acc (its
    leaderboard's sort key); a BenchmarkDataset value; no key beyond ModelInfo's, external and
    unreliable (the threat model is the folder, never a key)."""
    required = ROBUSTBENCH["fields"][:12]
    allowed = set(ROBUSTBENCH["model_info_dataclass"]["fields"]) | {"external", "unreliable"}
    types = {**dict.fromkeys(required, str), "additional_data": bool, "number_forward_passes": int}
    breaks = [f"no {k}" for k in required if k not in info] + [f"key {k}" for k in info if k not in allowed]
    breaks += [f"{k} is {info[k]!r}" for k, t in types.items() if k in info and (type(info[k]) is not t)]
    breaks += [f"unreliable {info['unreliable']!r}" for _ in [0] if type(info.get("unreliable", False)) is not bool]
    breaks += [f"footnote {info['footnote']!r}" for _ in [0] if not isinstance(info.get("footnote", ""),
                                                                                 (str, type(None)))]
    for key in ("clean_acc", info.get("external") and "external" or "autoattack_acc"):
        try:
            float(info[key])
        except (KeyError, TypeError, ValueError):
            breaks.append(f"float({key}) fails on {info.get(key)!r}")
    if info.get("dataset") not in ("cifar10", "cifar100", "imagenet"):
        breaks.append(f"dataset {info.get('dataset')!r}")
    return breaks


def test_the_rules_hold_for_the_leaderboards_own_files_and_jemevals_agree():
    """The rules written here pass the leaderboards' own files and fail what the brief says they die
    on; jemeval's checker (the one that refuses a file before writing it) agrees on both."""
    from jemeval.reports import leaderboards as L

    text = (DATA / OPENOOD["result_file"]["copy"]).read_text(encoding="utf-8")
    assert __import__("hashlib").sha256(text.encode()).hexdigest() == OPENOOD["result_file"]["sha256"]
    assert openood_rule_breaks(text) == []
    rows = list(csv.DictReader(text.splitlines()))
    assert {r["Outlier_Data"] for r in rows} == {"Yes", "No"} and any(r["ID_Accuracy"] == "/" for r in rows)
    assert any(r["Near-OOD_AUROC"].endswith("± 0.00") for r in rows)  # one run: ± 0.00
    for rel, source in ROBUSTBENCH["real_files"]["files"].items():
        raw = (DATA / rel).read_bytes()
        assert __import__("hashlib").sha256(raw).hexdigest() == source["sha256"]
        assert robustbench_rule_breaks(json.loads(raw)) == [], rel
    # and they catch what the brief says the leaderboards die on
    carmon = json.loads((DATA / "robustbench_cifar10_Linf" / "Carmon2019Unlabeled.json").read_text())
    assert "float(autoattack_acc) fails on None" in robustbench_rule_breaks({**carmon, "autoattack_acc": None})
    assert "key threat_model" in robustbench_rule_breaks({**carmon, "threat_model": "Linf"})
    assert openood_rule_breaks(text.replace("95.06 ± 0.30", "95.06", 1).replace(",No,", ",,", 1))
    rows = list(csv.DictReader((DATA / OPENOOD["result_file"]["copy"]).read_text(encoding="utf-8").splitlines()))
    assert tuple(rows[0]) == L.OPENOOD_FIELDS and all(L.openood_problems(r) == [] for r in rows)
    assert L.openood_problems({**rows[0], "ID_Accuracy": "95.06"}) and L.openood_problems({**rows[0],
                                                                                           "Outlier_Data": ""})
    for rel in ROBUSTBENCH["real_files"]["files"]:
        info = json.loads((DATA / rel).read_text())
        assert L.robustbench_problems(info) == [], rel
        assert L.robustbench_problems({**info, "autoattack_acc": None}) == ["autoattack_acc is null"]
        assert L.robustbench_problems({**info, "threat_model": "Linf"}) == ["threat_model is not a RobustBench key"]
    assert L.ROBUSTBENCH_REQUIRED == tuple(ROBUSTBENCH["fields"][:12])


def test_openood_cells_are_openoods_mean_and_numpy_std():
    from jemeval.reports.leaderboards import openood_cell

    values = [0.9123, 0.9301, 0.8999]
    percent = 100 * np.array(values)
    assert openood_cell(values) == f"{np.mean(percent):.2f} ± {np.std(percent):.2f}"
    assert openood_cell([0.9142]) == "91.42 ± 0.00" and openood_cell([]) == "/"
    assert math.isclose(float(openood_cell(values).split(" ± ")[1]), np.std(percent), abs_tol=0.005)
