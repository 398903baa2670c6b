"""The page's table of tests between models: one row per test, in the value tables' row order,
saying in words what each test claims (:mod:`jemeval.reports.compare`)."""
from __future__ import annotations

from typing import Any

from jemeval.reports.compare import LEVEL, NEEDS_TWO
from jemeval.reports.tables import SPECS, Table, fmt, fmt_key, fmt_p

CLAIM_WORDS = {"method": "the methods differ", "runs": "these runs differ"}
TESTS_TEXT = (
    'What each test claims. **The methods differ** (two seed groups): the Obuchowski-Rockette analysis with '
    "Hillis' degrees of freedom (`or-hillis`), seeds and inputs both random, as radiology compares two modalities "
    'read by several readers on the same cases; runs pair up by training seed (`crossed`) when both groups hold '
    'the same seeds, else every run of both groups counts on its own (`nested`). Bold follows this test. **These '
    'runs differ**: the trained networks held fixed and the inputs random (a paired bootstrap over inputs of the '
    "groups' mean, every input's outcomes from every run kept together; DeLong or exact McNemar for two single "
    'runs); beside a method-level test it says whether these particular checkpoints differ, not whether another '
    'training run would. A single run against a group gets only this test: the method-level test needs two runs a '
    "side. Holm's correction runs over the tests bold follows, and separately over those beside them.")


def _test_text(c: dict[str, Any]) -> str:
    test = c.get("test") or "-"
    if test == "or-hillis" and c.get("design"):
        df = c.get("df")
        test += f" ({c['design']}, df {df:.1f})" if isinstance(df, (int, float)) else f" ({c['design']})"
    elif c.get("n_boot"):
        test += f" ({c['n_boot']} resamples, seed {c['seed']})"
    return test


def _difference(c: dict[str, Any]) -> str:
    text = fmt(c.get("difference"))
    if c.get("ci_low") is not None and text != "-":
        text += f" [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]"
    return text


def _verdict(c: dict[str, Any]) -> str:
    if c.get("error"):
        return "cannot run: " + c["error"]
    verdict = "significant" if c.get("significant") else "not significant"
    return verdict + (f"; {NEEDS_TWO}" if c.get("method_level") else "")


def comparison_table(section: str, comparisons: list[dict[str, Any]]) -> Table | None:
    """The section's tests (their order is the value tables' row order); None without any."""
    rows = [c for c in comparisons if c["section"] == section]
    if not rows:
        return None
    keys = SPECS[section].keys
    body = [[fmt_key(k, c.get(k), c) for k, _ in keys] + [
        c["metric"], f"{c['model_a']} - {c['model_b']}", f"{c.get('seeds_a', 1)} vs {c.get('seeds_b', 1)}",
        CLAIM_WORDS.get(c.get("scope"), "-") + (" (bold)" if c.get("decides") else ""), _test_text(c),
        _difference(c), fmt_p(c.get("p_value")), fmt_p(c.get("p_holm")), _verdict(c)] for c in rows]
    columns = [label for _, label in keys] + ["metric", "difference of", "runs", "claim", "test",
                                              f"difference [{LEVEL:.0%} interval]", "p", "p (Holm)",
                                              f"at {1 - LEVEL:g}"]
    return Table(columns, body, [[False] * len(columns) for _ in body], title="Tests between models on the same inputs",
                 label_columns=len(columns))
