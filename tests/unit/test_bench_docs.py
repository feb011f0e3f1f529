"""A benchmark's section of docs/benchmarks.md (dppo/bench/docs.py): a rerun replaces its own section only."""

from __future__ import annotations

from dppo.bench.docs import replace_section, section_markers


def test_replace_section_replaces_only_its_own() -> None:
    text = replace_section("# Benchmarks\n", "a", "first A")
    text = replace_section(text, "b", "only B")
    text = replace_section(text, "a", "second A")
    assert "first A" not in text and "second A" in text and "only B" in text
    begin, end = section_markers("a")
    assert text.count(begin) == 1 and text.count(end) == 1
    assert text.index("second A") < text.index("only B")  # replaced in place, order kept
