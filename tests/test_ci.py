"""CI runs what README.md tells a contributor to run, and installs what the suite needs."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if "pytest" in line and not line.lstrip().startswith("#")]


def test_ci_runs_the_readme_test_command():
    readme = [c for c in _commands((ROOT / "README.md").read_text()) if c.startswith("python3 -m venv")]
    ci = _commands((ROOT / ".ci" / "run").read_text())
    assert len(readme) == 1 and ci == readme, (readme, ci)
    command = ci[0]
    # a fresh venv, lint before the tests, the tests in parallel
    assert command.startswith("python3 -m venv .venv && ") and ' -e ".[test]"' in command
    assert command.index("ruff check .") < command.index("-m pytest") and re.search(r"pytest .*-n (2|auto)", command)
    assert "rm -rf .venv" in (ROOT / ".ci" / "run").read_text()


def test_test_extra_installs_what_the_suite_and_ci_use():
    line = re.search(r"^test = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.MULTILINE)  # no tomllib on 3.10
    names = {name.lower() for name in re.findall(r'"([A-Za-z0-9_.-]+)', line.group(1))}
    assert {"pytest", "pytest-xdist", "filelock", "ruff"} <= names
