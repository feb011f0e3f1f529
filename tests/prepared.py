"""Slow session resources made in the background: the image (built with buildah and loaded into a private dockerd,
about 6 minutes in CI) and the RLlib peer's venv (about a minute) are started in a thread as soon as the session
knows it needs them, and the tests that use them run last. The build is CPU work as much as waiting (alone, about
254 s of CPU in 280 s for the image after its base), so what it gains is the CPU the other tests leave idle (a third
of it, on 2 cores) and their wait for it: a test that asks for one waits only for what is left of it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class Prepared:
    """One resource made by a context manager in a thread of its own; :meth:`close` exits the context (the thread
    is waited for first: a build is never left half made)."""

    def __init__(self, name: str, make: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        self.stack = contextlib.ExitStack()
        self.made: Future[Any] = Future()
        self.thread = threading.Thread(target=self._make, args=(make,), name=f"prepare-{name}")
        self.thread.start()

    def _make(self, make: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        try:
            self.made.set_result(self.stack.enter_context(make()))
        except BaseException as err:  # the test that asks for it reports it, with the build's own message
            self.made.set_exception(err)

    def result(self) -> Any:
        return self.made.result()

    def close(self) -> None:
        self.thread.join()
        self.stack.close()


def users_and_others(items: list[Any], fixtures: set[str]) -> tuple[list[Any], list[Any]]:
    """``items`` split in those that use any of ``fixtures`` and the rest, each in its own order."""
    users = [item for item in items if fixtures.intersection(getattr(item, "fixturenames", ()))]
    return users, [item for item in items if item not in users]


def ordered_last(items: list[Any], fixtures: set[str]) -> list[Any]:
    """``items`` with those that use any of ``fixtures`` moved to the end."""
    users, others = users_and_others(items, fixtures)
    return others + users


def first_used(items: list[Any], fixtures: set[str]) -> list[Any]:
    """``items`` with those that use any of ``fixtures`` moved to the front."""
    users, others = users_and_others(items, fixtures)
    return users + others
