"""tests/parallel.py, what `make test`'s two workers keep together or apart: the modules of one built resource are
one scheduling unit, every other test its own; an `alone` test excludes every other, and the others share."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from parallel import RESOURCE_MODULES, ResourceScheduling, turn, unlisted_users


def test_the_modules_of_one_resource_are_one_unit_and_other_tests_their_own() -> None:
    scheduling = ResourceScheduling.__new__(ResourceScheduling)  # _split_scope reads no state
    image_tests = [f"{module}::test_x" for module, name in RESOURCE_MODULES.items() if name == "docker_image"]
    assert len(image_tests) == 2 and {scheduling._split_scope(t) for t in image_tests} == {"docker_image"}
    other = "tests/unit/test_config.py::test_x[a]"
    assert scheduling._split_scope(other) == other


class Item:
    def __init__(self, nodeid: str, *fixturenames: str) -> None:
        self.nodeid, self.fixturenames = nodeid, list(fixturenames)


def test_a_user_of_a_resource_outside_its_modules_is_named() -> None:
    items = [Item("tests/deploy/test_image.py::test_a", "docker_image", "tmp_path"),
             Item("tests/deploy/test_new.py::test_b", "docker_image"), Item("tests/unit/test_c.py::test_c", "tmp_path")]
    assert unlisted_users(items, {"docker_image", "peer_python"}) == ["tests/deploy/test_new.py::test_b"]


def in_turn(lock: Path, alone: bool, name: str, events: list[str], hold: threading.Event) -> None:
    with turn(lock, alone):
        events.append(f"{name} in")
        hold.wait(10)
        events.append(f"{name} out")


def started(lock: Path, alone: bool, name: str, events: list[str], hold: threading.Event) -> threading.Thread:
    """A turn taken on a thread of its own (a worker's test), held until ``hold`` is set."""
    thread = threading.Thread(target=in_turn, args=(lock, alone, name, events, hold))
    thread.start()
    return thread


def wait_for(entry: str, events: list[str]) -> None:
    deadline = time.monotonic() + 10
    while entry not in events and time.monotonic() < deadline:
        time.sleep(0.01)
    assert entry in events, events


def test_an_alone_turn_waits_for_the_shared_ones_and_keeps_the_next_waiting(tmp_path: Path) -> None:
    lock, events = tmp_path / "turns.lock", []
    first, alone, last = threading.Event(), threading.Event(), threading.Event()
    threads = [started(lock, False, "shared", events, first)]
    wait_for("shared in", events)
    threads.append(started(lock, True, "alone", events, alone))
    time.sleep(0.3)  # room for a wrong entry: the alone turn must not begin while the shared one holds
    assert events == ["shared in"]
    first.set()
    wait_for("alone in", events)
    threads.append(started(lock, False, "next", events, last))
    time.sleep(0.3)
    assert events == ["shared in", "shared out", "alone in"]
    alone.set()
    last.set()
    for thread in threads:
        thread.join(10)
    assert events == ["shared in", "shared out", "alone in", "alone out", "next in", "next out"]


def test_once_an_alone_turn_waits_no_shared_one_starts_before_it(tmp_path: Path) -> None:
    """Writer preference: with the other workers' shared turns overlapping, an alone turn would otherwise wait
    until none is held, which may be never."""
    lock, events = tmp_path / "turns.lock", []
    first, alone, later = threading.Event(), threading.Event(), threading.Event()
    threads = [started(lock, False, "shared", events, first)]
    wait_for("shared in", events)
    threads.append(started(lock, True, "alone", events, alone))
    time.sleep(0.3)  # the alone turn waits at the lock, holding the gate
    threads.append(started(lock, False, "later", events, later))
    time.sleep(0.3)  # room for a wrong entry: a shared turn that starts beside the first one
    assert events == ["shared in"]
    first.set()
    wait_for("alone in", events)
    alone.set()
    wait_for("later in", events)
    later.set()
    for thread in threads:
        thread.join(10)
    assert events == ["shared in", "shared out", "alone in", "alone out", "later in", "later out"]
