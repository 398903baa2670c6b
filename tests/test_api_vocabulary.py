"""One API vocabulary, old keywords kept for a release, progress reported not drawn, data not files.

The evaluation functions share parameter names (``input_sigma`` vs ``chain_sigma``, ``data_root``,
``device``, ``seed``...), return a :class:`~jemeval.results.Result`, report progress through
:mod:`jemeval.progress` and leave plotting and files to their callers; their errors name Python
parameters, which the command line shows as flags.
"""
from __future__ import annotations

import ast
import inspect
import re
import warnings
from pathlib import Path

import pytest

import jemeval
from jemeval.deprecations import deprecated_keywords
from jemeval.errors import UsageError
from jemeval.evaluation.distal import distal
from jemeval.progress import ProgressBar, StderrProgress, progress_bar, resolve_progress, silent
from jemeval.results import Result

PACKAGE = Path(jemeval.__file__).resolve().parent
API = {
    "evaluate_ood": jemeval.evaluate_ood, "calibrate": jemeval.calibrate, "evaluate": jemeval.evaluate,
    "robust": jemeval.robust, "sample": jemeval.sample, "fidelity": jemeval.fidelity, "distal": distal,
}
#: parameter names that meant different things in different functions, or that were renamed
OLD_NAMES = {"sigma", "root", "step_size", "noise", "targets", "plot", "save_scores", "grid"}


# -- the shared helper for renamed and output keywords ----------------------------------------------
def _writer(result, path):
    result["written"].append(path)


@deprecated_keywords(renamed={"old": "new"}, outputs={"save": _writer})
def _fn(a, *, new=1):
    """A function whose keyword ``old`` became ``new`` and that no longer writes ``save``."""
    return {"a": a, "new": new, "written": []}


def test_a_renamed_keyword_still_works_with_a_warning_at_the_caller():
    with pytest.warns(DeprecationWarning, match=r"_fn\(\): the keyword 'old' is now 'new' \(it will be removed") as w:
        assert _fn(1, old=5)["new"] == 5
    assert w[0].filename == __file__  # the warning points at the call, not at jemeval
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _fn(1, new=6)["new"] == 6  # the new name: no warning
    with pytest.raises(TypeError, match="give only 'new'"):
        _fn(1, old=5, new=6)
    assert list(inspect.signature(_fn).parameters) == ["a", "new"]  # help() shows the new API
    assert _fn.renamed_keywords == {"old": "new"} and _fn.output_keywords == ("save",)


def test_an_output_keyword_hands_the_result_to_its_writer():
    with pytest.warns(DeprecationWarning, match=r"_fn\(save=...\): _fn returns data and writes no files; call "
                                                r"test_api_vocabulary._writer\(result, path\)"):
        assert _fn(1, save="x.png")["written"] == ["x.png"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _fn(1, save=None)["written"] == []  # None was the default: nothing to write, nothing to warn


def test_a_writer_named_by_its_path_is_imported_only_when_used():
    from jemeval.deprecations import writer_of
    from jemeval.plots.ood import plot_ood_result

    assert writer_of("jemeval.plots.ood:plot_ood_result") == (plot_ood_result, "jemeval.plots.ood.plot_ood_result")
    assert writer_of(_writer) == (_writer, f"{__name__}._writer")


# -- progress -----------------------------------------------------------------------------------------
def test_resolve_progress():
    assert resolve_progress(False) is silent
    assert isinstance(resolve_progress(True), StderrProgress) and resolve_progress(True).always
    assert isinstance(resolve_progress(None), StderrProgress) and not resolve_progress(None).always
    mine = lambda total, desc, **kw: ProgressBar()  # noqa: E731
    assert resolve_progress(mine) is mine
    with pytest.raises(UsageError, match="progress must be True, False, None or a callable") as info:
        resolve_progress("yes")
    assert info.value.param == "progress"


def test_stderr_progress_draws_on_stderr_only_when_asked(capsys):
    with progress_bar(True, 3, "work", unit="img", leave=True) as bar:
        bar.update(2)
        bar.describe("now this")
        bar.note("7 passes")
        bar.update(1)
    out, err = capsys.readouterr()
    assert out == "" and "now this" in err and "3/3" in err and "7 passes" in err
    with progress_bar(None, 3, "work") as bar:  # None: only on a terminal, and capsys is none
        bar.update(3)
    with progress_bar(False, 3, "work") as bar:
        bar.update(3)
    assert capsys.readouterr() == ("", "")


# -- the vocabulary -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(API))
def test_every_entry_point_speaks_the_same_vocabulary(name):
    fn = API[name]
    params = inspect.signature(fn).parameters
    assert {"seed", "device"} <= set(params), name
    assert not OLD_NAMES & set(params), f"{name} still takes {OLD_NAMES & set(params)}"
    if name in ("evaluate_ood", "calibrate", "evaluate", "robust", "sample", "fidelity"):
        assert "data_root" in params, name
    if name in ("evaluate_ood", "calibrate", "evaluate"):
        assert "input_sigma" in params, name  # noise on the evaluation inputs
    if name in ("evaluate", "robust", "distal"):
        assert "chain_sigma" in params, name  # noise of the refinement chains' copies
    if name in ("evaluate", "robust", "sample"):
        assert {"sgld_step_size", "sgld_noise"} <= set(params), name
    if name != "fidelity":
        assert "progress" in params and "n" in params, name
    annotation = inspect.signature(fn).return_annotation
    assert annotation in ("Result", "SamplesResult", Result), (name, annotation)


def _modules(*relative):
    for rel in relative:
        path = PACKAGE / rel
        yield from (sorted(path.glob("*.py")) if path.is_dir() else [path])


EVALUATION = list(_modules("evaluation"))


@pytest.mark.parametrize("path", EVALUATION, ids=lambda p: p.name)
def test_evaluation_draws_and_writes_nothing(path):
    """No progress bars, figures or file writes inside evaluation/: they are the caller's (a cache file
    the caller asked for is written by jemeval/caches/, which owns its format)."""
    tree = ast.parse(path.read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m.split(".")[0] in ("tqdm", "matplotlib")}, imported
    assert "jemeval.atomic" not in imported
    calls = {node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute)}
    assert not calls & {"savefig", "savez", "savez_compressed", "write_text", "write_bytes", "save_npz",
                        "save_json", "save_csv"}, path.name


CORE = [*EVALUATION, *_modules("data.py", "results.py", "sampling/refinement.py", "artifacts.py", "progress.py",
                                "deprecations.py")]
FLAG = re.compile(r"(?<![\w-])--[a-z]")


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_core_errors_name_parameters_not_flags(path):
    """A raise outside jemeval/cli names the Python parameter (UsageError(..., param=...)); the
    command line shows the flag instead (see test_bad_inputs for the command-line side)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise):
            for const in ast.walk(node):
                if isinstance(const, ast.Constant) and isinstance(const.value, str) and FLAG.search(const.value):
                    bad.append(f"line {node.lineno}: {const.value!r}")
    assert bad == []
