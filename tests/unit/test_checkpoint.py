"""The checkpoint store: the newest intact checkpoint past corrupt ones, and only the last k kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import new_checkpoint

from dppo.config import load_config
from dppo.run.checkpoint import CheckpointStore


def test_corrupt_newest_checkpoints_fall_back_to_the_newest_intact(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = load_config()
    checkpoint = new_checkpoint(config)[0]
    store = CheckpointStore(tmp_path / "checkpoints", keep=3)
    paths = []
    for iteration in (1, 2, 3):
        checkpoint["counters"]["iteration"] = iteration
        paths.append(store.save(checkpoint, iteration))
    paths[2].write_bytes(paths[2].read_bytes()[:1000])  # truncated
    data = bytearray(paths[1].read_bytes())
    data[-50] ^= 0xFF  # one flipped bit
    paths[1].write_bytes(bytes(data))
    found = store.newest_intact()
    assert found is not None and found[0] == paths[0]
    assert found[1]["counters"]["iteration"] == 1
    assert sum("skipping checkpoint" in r.message for r in caplog.records) == 2


def test_store_keeps_the_last_k_checkpoints_and_latest_names_the_newest(tmp_path: Path) -> None:
    checkpoint = new_checkpoint(load_config())[0]
    store = CheckpointStore(tmp_path / "checkpoints", keep=2)
    for iteration in range(1, 6):
        store.save(checkpoint, iteration)
    assert [p.name for p in store.list()] == ["ckpt-00000004.pt", "ckpt-00000005.pt"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "ckpt-00000005.pt"
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
