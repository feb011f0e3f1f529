"""The suite's own time (tests/conftest.py): `make test` says it against its budget, and a CI run past its limit
fails with one line that names the ten slowest tests, so the suite cannot creep up to CI's own limit unseen."""

from __future__ import annotations

from conftest import BUDGET_S, CI_LIMIT_S, budget_line


def test_the_suite_s_time_is_said_against_its_budget_and_fails_only_ci_past_its_limit() -> None:
    durations = {f"tests/t.py::test_{i}": float(i) for i in range(12)}
    line, over = budget_line(812.4, durations, in_ci=True)
    assert line == f"suite: 812 s of pytest against a budget of {BUDGET_S} s" and not over
    assert budget_line(CI_LIMIT_S + 1, durations, in_ci=False)[1] is False  # a user's slow machine: said, not failed
    line, over = budget_line(CI_LIMIT_S + 1, durations, in_ci=True)
    assert over and "\n" not in line
    assert line.startswith(f"CI=true: the suite took {CI_LIMIT_S + 1:,} s, over its limit of {CI_LIMIT_S} s")
    named = line.split("the ten slowest: ")[1].split(", ")
    assert named == [f"tests/t.py::test_{i} {i} s" for i in range(11, 1, -1)]
