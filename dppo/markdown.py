"""Markdown tables (readable in a terminal too): the benchmark sections of docs/benchmarks.md and a sweep's
trials.md."""

from __future__ import annotations

from typing import Any


def cell(value: Any) -> str:
    """A table cell: ``-`` for None, ``median (min-max)`` for a spread, numbers to 3 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, dict) and {"median", "min", "max"} <= value.keys():
        return f"{cell(value['median'])} ({cell(value['min'])}-{cell(value['max'])})"
    if isinstance(value, float):
        if value >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:,}"
    return str(value)


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A Markdown table (also readable in a terminal)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
