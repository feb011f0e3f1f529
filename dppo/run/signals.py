"""SIGTERM (what Kubernetes sends) and SIGINT (Ctrl-C) stop a run at any moment, with the shell's exit code.

Before training starts (config check, Ray start, actor start) a stop ends the process at once and nothing is
written: the handler raises :class:`Stopped` in the main thread wherever it is. Once training has started the
handler only records the signal; the coordinator ends the round in progress and writes a final checkpoint.
Either way the exit code is 128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as a shell reports a
process ended by that signal.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):
    """A stop signal arrived before training started: the run ends at once, with nothing written. A
    BaseException, like KeyboardInterrupt: no ``except Exception`` on the way out catches it."""

    def __init__(self, signum: int) -> None:
        super().__init__(stopped_before_training(signum))
        self.signum = signum


def stopped_before_training(signum: int) -> str:
    """What a stop before training is said as (after ``dppo: ``, before ``: nothing written``)."""
    return f"stopped by {signal.Signals(signum).name} before training started"


def stop_of(err: BaseException, signals: StopSignals) -> int | None:
    """The stop signal behind ``err``, raised while a stop ends the process at once (``interrupting()``), or None
    when no stop was asked for. The stop may surface as another error than :class:`Stopped`: Ray's Cython calls
    (``ray.wait`` while the actors start) turn an exception raised in a signal handler into ``SystemError:
    <cyfunction CoreWorker.wait ...> returned a result with an exception set``, and a local Ray's processes, sent
    the same Ctrl-C, fail the calls on them. A KeyboardInterrupt is a SIGINT too, whether or not the handler saw it
    (a library may raise one for a call a SIGINT cut short). Whatever surfaced, the stop is what happened."""
    if isinstance(err, Stopped):
        return err.signum
    if signals.received is None and isinstance(err, KeyboardInterrupt):
        return signal.SIGINT
    return signals.received


class StopSignals:
    """Records the first SIGTERM/SIGINT; the coordinator checks ``received`` between and during rounds."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._raising = False  # inside interrupting(): the handler raises Stopped

    def install(self) -> bool:
        """Handle SIGTERM and SIGINT from now on (again after Ray's start, which installs handlers of its own).
        False off the main thread, where Python cannot: the embedding program handles signals there."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        return True

    def _handle(self, signum: int, _frame: object) -> None:
        if self.received is None:
            self.received = signum
        if self._raising:
            self._raising = False  # once: the code unwinding from Stopped is not interrupted again
            raise Stopped(self.received)

    @contextlib.contextmanager
    def interrupting(self) -> Iterator[None]:
        """Inside, a stop raises :class:`Stopped` at once in the main thread (also one that arrived before)."""
        self._raising = True
        try:
            if self.received is not None:
                raise Stopped(self.received)
            yield
        finally:
            self._raising = False

    def sleep(self, seconds: float, step: float = 0.1) -> None:
        """Sleep, cut short by a stop signal (a signal handler that returns does not end time.sleep)."""
        deadline = time.monotonic() + seconds
        while self.received is None and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(step, left))

    @property
    def exit_code(self) -> int | None:
        """128 + the signal's number (130 SIGINT, 143 SIGTERM), or None when no stop was asked for."""
        return None if self.received is None else 128 + self.received

    @property
    def name(self) -> str | None:
        return None if self.received is None else signal.Signals(self.received).name
