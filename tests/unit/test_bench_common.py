"""What every benchmark shares (dppo/bench/common.py): the comma-separated counts of its options."""

from __future__ import annotations

import pytest

from dppo.bench.common import parse_counts
from dppo.errors import UsageError


def test_parse_counts() -> None:
    assert parse_counts("1,2, 8") == [1, 2, 8]
    for bad in ("a,b", "", "0,1"):
        with pytest.raises(UsageError):
            parse_counts(bad)
