"""What every benchmark shares (dppo/bench/common.py): the comma-separated counts of its options."""

from __future__ import annotations

import pytest

from dppo.bench.common import parse_counts
from dppo.distributed.ports import CHOSEN_PORTS_FROM, ephemeral_ports, free_ports
from dppo.errors import UsageError


def test_parse_counts() -> None:
    assert parse_counts("1,2, 8") == [1, 2, 8]
    for bad in ("a,b", "", "0,1"):
        with pytest.raises(UsageError):
            parse_counts(bad)


def test_a_variants_values_keep_their_bracketed_commas() -> None:
    from benchmarks.variants import parse_variant

    assert parse_variant("shared:env.wrappers=[a:b,c:d],env.agent_id_in_obs=true") == (
        "shared", ["env.wrappers=[a:b,c:d]", "env.agent_id_in_obs=true"])
    assert parse_variant("separate:policies.x=[x_0],policies.y={a: 1, b: [2,3]}") == (
        "separate", ["policies.x=[x_0]", "policies.y={a: 1, b: [2,3]}"])
    assert parse_variant("plain") == ("plain", [])


def test_ports_chosen_for_later_lie_below_the_ephemeral_range_and_differ() -> None:
    """A port chosen there could become a connection's local port before its service binds it (a clean-clone CI
    lost a run's metrics port so)."""
    low, high = ephemeral_ports()
    assert 1024 <= low <= high
    ports = free_ports(8)
    assert len(set(ports)) == 8
    if low - CHOSEN_PORTS_FROM >= 1000:  # the machine leaves room below its range (Linux's default does)
        assert all(CHOSEN_PORTS_FROM <= port < low for port in ports), ports
