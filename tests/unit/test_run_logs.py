"""The per-iteration text line (dppo/run/logs.py): returns with enough digits for the env's scale. The lines a real
run prints and keeps in train.log: tests/integration/test_logs.py."""

from __future__ import annotations

from dppo.run.logs import format_return, text_line


def test_the_return_has_enough_digits_for_the_env_s_scale() -> None:
    assert [format_return(v) for v in (0.955, -0.5, 12.345, 475.33, -1381.25)] == [
        "0.955", "-0.500", "12.35", "475.3", "-1381.2"]
    assert "return=0.955 " in text_line({"episode_return_mean": 0.955})
