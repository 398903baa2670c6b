"""docs/extending.md's examples run exactly as written (issue 24, item 5).

Every ```python block of the page is taken in order and run literally; the blocks of one section
(``## N. ...``) share a fresh namespace, a module of its own in ``sys.modules`` (the examples
register ``sys.modules[__name__]`` as their plugin, as a script run with ``python`` would). All
sections run in one temporary folder, section 0's model serving the others, with the detector
cache there too. A plugin a block registers and leaves registered is unregistered afterwards, so no
other test sees it. What the page states a block prints (``# True``, ``caught: ...``) is checked
on the captured output, and the objects the page defines are checked against the bases.
Kept under 40 s on two loaded cores: one 3-epoch digits classifier, n <= 50 everywhere.
"""
from __future__ import annotations

import contextlib
import io
import re
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

import jemeval
from jemeval.plugins import ENTRY_POINT_GROUP, get_plugin_manager

try:
    import tomllib
except ImportError:  # Python 3.10: the tomli backport jemeval depends on there
    import tomli as tomllib

DOC = Path(__file__).resolve().parent.parent / "docs" / "extending.md"
SECTION = re.compile(r"^## (\d+)\. (.*)$", re.M)
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)
#: ``print(...)  # TEXT``: the page states the line printed (a trailing " ..." leaves the rest open)
STATED = re.compile(r"^\s*print\(.*\)\s+# (.+?)(?: \.\.\.)?$", re.M)


def sections() -> list[tuple[str, list[tuple[int, str, str]]]]:
    """(heading, [(line, language, code), ...]) of every numbered section, in page order."""
    text = DOC.read_text()
    heads = list(SECTION.finditer(text))
    out = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        blocks = [(text[:m.start()].count("\n") + 1, m.group(1), m.group(2))
                  for m in FENCE.finditer(text, head.end(), end)]
        out.append((f"{head.group(1)}. {head.group(2)}", blocks))
    return out


def run_section(index: int, blocks: list[tuple[int, str, str]]) -> tuple[dict, str, list[str]]:
    """Run a section's python blocks in one fresh module: (its namespace, what it printed, the
    deprecation warnings it raised)."""
    name = f"extending_example_{index}"
    module = types.ModuleType(name)
    sys.modules[name] = module
    pm = get_plugin_manager()
    plugins = set(pm.infos)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DeprecationWarning)
            for line, lang, code in blocks:
                if lang == "python":
                    exec(compile(code, f"docs/extending.md:{line}", "exec"), module.__dict__)  # noqa: S102
    finally:
        del sys.modules[name]
        for leftover in set(pm.infos) - plugins:
            pm.unregister(leftover)
    deprecations = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)
                    and not re.search(r"[/\\](foolbox|eagerpy)[/\\]", w.filename)]
    return module.__dict__, out.getvalue(), deprecations


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """Every section run in page order in one folder: section number -> (namespace, printed text,
    deprecation warnings)."""
    folder = tmp_path_factory.mktemp("extending")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("JEMEVAL_CACHE_DIR", str(folder / "cache"))
        mp.delenv("LABZOO", raising=False)
        ran = {}
        for i, (heading, blocks) in enumerate(sections()):
            if any(lang == "python" for _, lang, _ in blocks):
                ran[heading.split(".")[0]] = run_section(i, blocks)
        yield ran


def test_the_page_covers_every_kind():
    heads = [h for h, _ in sections()]
    assert [h.split(".")[0] for h in heads] == [str(i) for i in range(len(heads))]
    text = DOC.read_text()
    for needed in ("register_scores", "register_attacks", "register_models", "register_checkpoint_layouts",
                   "jemeval.Detector", "jemeval.Attack", "jemeval.Score", "@jemeval.score", "match_path",
                   "check_detector", "check_attack", "check_score", "check_model", "[project.entry-points.jemeval]"):
        assert needed in text, f"docs/extending.md never mentions {needed}"


def test_every_example_runs_and_leaves_no_plugin(page):
    assert set(page) == {"0", "1", "2", "3", "4"}, sorted(page)
    assert not set(get_plugin_manager().infos) & {"my-scores", "my-detectors", "my-attacks", "my-lab"}
    for kind, name in (("score", "my-gen"), ("score", "nearest-mean"), ("attack", "bim"), ("model", "lab-mlp"),
                       ("checkpoint_layout", "labzoo")):
        assert name not in jemeval.names(kind)
    assert page["0"][1].splitlines() == ["try-digits/best.pt"]


def test_the_examples_use_the_bases_and_no_deprecated_name(page):
    """A duck-typed component or a moved name would warn; the page teaches neither."""
    for section, (_, _, deprecations) in page.items():
        assert deprecations == [], f"section {section}: {deprecations}"


def test_what_the_page_says_is_printed_is_printed(page):
    """Every ``print(...)  # TEXT`` comment of a section is a printed line (in order; "..." leaves its end open)."""
    for heading, blocks in sections():
        stated = [m.group(1) for _, lang, code in blocks if lang == "python" for m in STATED.finditer(code)]
        if not stated:
            continue
        lines = iter(page[heading.split(".")[0]][1].splitlines())
        for text in stated:
            assert any(line.startswith(text) for line in lines), f"section {heading}: no line {text!r} printed"


def test_the_score_example(page):
    ns, printed, _ = page["1"]
    assert isinstance(ns["gen"], jemeval.Score) and ns["gen"].from_logits is ns["gen_from_logits"]
    lines = printed.splitlines()
    assert lines[0] == "True"
    aurocs = {tuple(line.split()[:2]): float(line.split()[2]) for line in lines[1:4]}
    assert set(aurocs) == {("my-gen", "uniform"), ("my-gen:gamma=0.5", "uniform"), ("maxprob", "uniform")}
    assert all(0.5 < v <= 1 for v in aurocs.values()), aurocs  # a trained classifier tells noise from digits
    assert lines[4] == "caught: from_logits(logits) differs from score(model, x)"
    assert len(lines) == 5


def test_the_detector_example(page):
    ns, printed, _ = page["2"]
    cls = ns["NearestMean"]
    assert issubclass(cls, jemeval.Detector) and cls.uses_features and cls.cacheable and cls.needs_labels
    lines = printed.splitlines()
    assert lines[:2] == ["True", "True True"]
    rows = [line.split() for line in lines[2:4]]
    assert [r[:2] for r in rows] == [["nearest-mean", "uniform"], ["nearest-mean:normalize=True", "uniform"]]
    assert all(0.5 < float(r[2]) <= 1 for r in rows), rows
    assert lines[4] == "fitted"
    assert lines[5].startswith("refused: detector 'NearestMean' is not fitted: call fit(model, dataset)")
    assert lines[6] == "caught: score must return Tensor[8], got torch.Size([8, 32])"
    assert len(lines) == 7


def test_the_attack_example(page):
    ns, printed, _ = page["3"]
    assert issubclass(ns["BasicIterative"], jemeval.Attack) and ns["BasicIterative"].norms == ("linf",)
    lines = printed.splitlines()
    assert lines[0] == "True BasicIterative(norm='linf', steps=3)"
    rows = [line.split() for line in lines[1:4]]
    assert [r[:2] for r in rows] == [["bim", "0.0"], ["bim", "0.0314"], ["bim", "0.251"]], rows
    accuracy = [float(r[2]) for r in rows]
    assert accuracy[0] > 0.7 and accuracy[2] < accuracy[0] - 0.5, accuracy  # the attack does its work at 64/255
    assert lines[4] == "refused: attack 'BasicIterative' does not support norm 'l2'; it supports linf"
    assert lines[5].startswith("caught: perturbation of size ") and lines[5].endswith("exceeds epsilon 0.05")
    assert len(lines) == 6


def test_the_model_source_example(page):
    ns, printed, _ = page["4"]
    lines = printed.splitlines()
    assert lines[:2] == ["labzoo/digits-mlp.pt lab-mlp-v1 True", "labzoo:digits-mlp labzoo True"]
    assert lines[2] == "['logpx', 'mahalanobis']"
    assert lines[3].startswith("refused: 'damaged.pt' does not match architecture 'lab-mlp': size mismatch "
                               "for head.weight")
    assert lines[4] == ("refused: 'labzoo:../damaged': NAME must be letters, digits, '.', '-' or '_', "
                        "e.g. labzoo:digits-mlp")
    assert len(lines) == 5
    # the page's claim: the normalisation matters, the network fed [-1, 1] inputs directly is far less accurate
    ds = jemeval.load_dataset("digits", split="test")
    with torch.no_grad():
        raw = float((ns["net"](ds.x).argmax(1) == ds.y).float().mean())
        right = float((ns["net"]((ds.x + 1) / 2).argmax(1) == ds.y).float().mean())
    assert right > 0.85 and raw < right - 0.1, (raw, right)


def test_the_packaging_block_names_jemeval_group():
    blocks = [code for _, lang, code in sections()[-1][1] if lang == "toml"]
    assert sections()[-1][0] == "5. Packaging" and len(blocks) == 1
    pyproject = tomllib.loads(blocks[0])
    plugins = pyproject["project"]["entry-points"][ENTRY_POINT_GROUP]
    assert plugins == {"mylab": "jemeval_mylab.plugin"}
    assert pyproject["project"]["name"] and pyproject["project"]["version"]
