"""The release the code says it is (issue 34 item 30): every result's provenance names jemeval's
version, so the version, the installed metadata and the changelog's newest release must agree."""
from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import jemeval
from jemeval.provenance import provenance

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_version() -> str:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_version_is_the_changelogs_newest_release():
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases, "CHANGELOG.md names no release"
    newest = releases[0][0]
    assert jemeval.__version__ == _pyproject_version() == newest == "0.3.0"
    assert importlib.metadata.version("jemeval") == jemeval.__version__  # the installed package says the same
    assert provenance(command="eval")["jemeval_version"] == "0.3.0"


def test_unreleased_holds_nothing_released():
    text = (ROOT / "CHANGELOG.md").read_text()
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    assert "## [0.3.0]" not in unreleased and text.index("## [Unreleased]") < text.index("## [0.3.0]")
