"""Markdown tables (dppo/markdown.py): spreads as ``median (min-max)``, missing values as ``-``."""

from __future__ import annotations

from dppo.markdown import table


def test_table_formats_spread_and_missing() -> None:
    md = table([{"a": 1, "b": {"median": 2.0, "min": 1.0, "max": 3.0}, "c": None}], ["a", "b", "c"])
    assert md.splitlines()[2] == "| 1 | 2 (1-3) | - |"
