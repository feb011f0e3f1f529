"""The long run's verdict (`dppo bench chaos --no-faults`, dppo/bench/chaos_growth.py, chaos.py): growth is flagged
only beyond its own error bar, as the legend says; a run too short to fit any growth after the warm-up is refused
before anything starts, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from dppo.bench import chaos
from dppo.bench.chaos_growth import verdict
from dppo.commands.parser import build_parser
from dppo.errors import UsageError

TOTAL = {"checkpoints max": 2, "keep_checkpoints": 3, "minutes trained": 60.0, "env steps": 1000, "readings": 60,
         "readings after warm-up": 55}


def process(growth: float, error: float) -> dict[str, object]:
    return {"process": "raylet", "node": "head", "pid": 11, "readings": 55, "RSS at warm-up end (MiB)": 40.0,
            "RSS at end (MiB)": 46.0, "growth (%/h)": growth, "± (%/h)": error, "private growth (%/h)": None,
            "open files max": 40}


@pytest.mark.parametrize(("growth", "error", "flagged"), [(14.6, 29.8, False), (14.6, 2.0, True), (4.0, 0.5, False),
                                                          (6.0, 1.5, False), (6.0, 0.5, True)])
def test_growth_is_flagged_only_beyond_its_error_bar(growth: float, error: float, flagged: bool) -> None:
    first = verdict([process(growth, error)], TOTAL, 0, ["SUCCEEDED"], 60)[0]
    assert first.startswith("PROBLEMS: RSS grows" if flagged else "within the targets"), first


@pytest.mark.parametrize(("argv", "fits"), [(["--minutes", "2"], False), (["--minutes", "7.9"], False),
                                            (["--minutes", "2", "--warmup-min", "0.5", "--sample-s", "20"], True)])
def test_a_long_run_too_short_to_fit_growth_is_refused_up_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                argv: list[str], fits: bool) -> None:
    """With the defaults (a 5-minute warm-up, a reading a minute, 3 readings to fit a line) 8 minutes is the least."""
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["bench", "chaos", "--no-faults", "--env", "CartPole-v1", *argv])
    if fits:
        chaos.prepare(args)
        return
    with pytest.raises(UsageError) as refused:
        chaos.prepare(args)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"--minutes {argv[1]} ends before growth can be fitted"), line
    assert "pass --minutes 8 or more, or a shorter --warmup-min" in line
    assert list(tmp_path.iterdir()) == []
