"""The suite on several workers (`pytest -n N`, pytest-xdist; `make test` runs 2): what must not be split or
overlapped.

- The tests of a session resource built once (the image, the RLlib peer's venv: tests/prepared.py) go to one worker,
  which builds it when its first test asks while the other workers run the rest. xdist's own `--dist loadgroup`
  would do it from `xdist_group` marks, but does not group at all with pytest 9.2 (pytest-dev/pytest-xdist#1386:
  it renames node ids, which pytest 9.2 no longer reads), so :class:`ResourceScheduling` groups by module.
- A test marked `alone` measures time (a gap while a node is down, scrapes a second, a minute of kills) and runs
  while no other test does: every test holds a shared lock on a file all workers see, an `alone` test an exclusive
  one; once an `alone` test waits, no other test starts. Its wait is not part of its timeout (the turn is taken
  around pytest-timeout's own hook), and a test that uses a resource being made waits for it before its turn.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling

RESOURCE_MODULES = {  # module -> the session resource its tests share (the workers check it: see unlisted_users)
    "tests/deploy/test_image.py": "docker_image",
    "tests/deploy/test_chart_containers.py": "docker_image",
    "tests/integration/test_bench_peer_runs.py": "peer_python",
}


def resource_of(nodeid: str) -> str | None:
    """The resource a test's module shares, if any."""
    return RESOURCE_MODULES.get(nodeid.split("::")[0])


class ResourceScheduling(LoadScopeScheduling):
    """xdist's load scheduling (one test at a time, to whichever worker is free) but for the modules of one
    resource, which form one unit. Units with more tests go first (xdist's reordering), so the resources' modules
    start at once and their builds overlap the other workers' tests."""

    def _split_scope(self, nodeid: str) -> str:
        return resource_of(nodeid) or nodeid


def unlisted_users(items: list[Any], resources: set[str]) -> list[str]:
    """The tests that use one of ``resources`` from a module RESOURCE_MODULES does not give it to: each of those
    workers would build it again, beside the other."""
    return [item.nodeid for item in items for name in resources.intersection(item.fixturenames)
            if resource_of(item.nodeid) != name]


@contextlib.contextmanager
def turn(lock_file: Path, alone: bool) -> Iterator[None]:
    """Hold ``lock_file`` shared (any number of tests at once) or, ``alone``, exclusive (no other test), blocking.
    Every turn passes a gate first, which an `alone` turn keeps while it waits: flock alone grants a shared hold
    while an exclusive one waits, so the other workers' overlapping tests would keep an `alone` test waiting (398 s
    of setup for one, with 3 workers) until its timeout."""
    with open(lock_file.with_suffix(".gate"), "a+") as gate, open(lock_file, "a+") as f:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(f, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
