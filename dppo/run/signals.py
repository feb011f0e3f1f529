"""SIGTERM (what Kubernetes sends) and SIGINT end a run with a final checkpoint instead of killing it."""

from __future__ import annotations

import contextlib
import signal


class StopSignals:
    """Records the first SIGTERM/SIGINT; the coordinator checks ``received`` between and during rounds."""

    def __init__(self) -> None:
        self.received: int | None = None

    def install(self) -> None:
        def handler(signum: int, _frame: object) -> None:
            self.received = signum

        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: the embedding program handles signals
                signal.signal(sig, handler)
