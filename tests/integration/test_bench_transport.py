"""`dppo bench transport`: an actor's round trip to the inference service through shared memory and by Ray call, in
the same run, per count of actors asking at once. No wall time is asserted: the rows, the batches the service formed
and the section written are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bench_driver import run_bench

from dppo.bench.docs import section_markers
from dppo.errors import UsageError


def test_transport_command_times_both_transports_per_client_count(ray_address: str, tmp_path: Path) -> None:
    out, docs = tmp_path / "transport.json", tmp_path / "benchmarks.md"
    argv = ["transport", "--clients", "2", "--requests", "30", "--json", str(out), "--write-docs", str(docs),
            "--address", ray_address]
    assert run_bench(argv) == 0
    rows = json.loads(out.read_text())
    assert [(r["transport"], r["clients"]) for r in rows] == [("shared memory", 2), ("ray call", 2)]
    for row in rows:
        assert row["requests"] == 30 * row["clients"] and row["rows"] == 4
        assert 0 < row["round_trip_ms_median"] <= row["round_trip_ms_p90"] and row["forward_ms_median"] > 0
        assert 1 <= row["requests_per_batch"] <= row["clients"] and row["of_ray_call"] > 0
    assert rows[1]["of_ray_call"] == 1.0
    text = docs.read_text()
    begin, end = section_markers("transport")
    assert begin in text and end in text and "dppo bench transport" in text and "round_trip_ms_median" in text


def test_transport_bad_input_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--clients"):
        run_bench(["transport", "--clients", "0"])
