"""StopSignals with real signals sent to this process (dppo/run/signals.py): raised at once before training
starts, only recorded once it has (the coordinator then ends the round), exit code 128 + the signal."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from dppo.run.signals import Stopped, StopSignals, stop_of


@pytest.fixture
def signals() -> Iterator[StopSignals]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    stop = StopSignals()
    assert stop.install()
    try:
        yield stop
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_signal_inside_interrupting_raises_stopped_at_once(signals: StopSignals) -> None:
    with pytest.raises(Stopped) as raised, signals.interrupting():
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next line
        pytest.fail("the stop did not interrupt")
    assert raised.value.signum == signal.SIGTERM and str(raised.value) == "stopped by SIGTERM before training started"
    assert signals.exit_code == 143 and signals.name == "SIGTERM"


def test_outside_interrupting_a_signal_is_only_recorded_and_the_first_one_counts(signals: StopSignals) -> None:
    assert signals.exit_code is None
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    assert signals.received == signal.SIGINT and signals.exit_code == 130


def test_a_signal_that_came_before_interrupting_raises_on_entry(signals: StopSignals) -> None:
    os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(Stopped), signals.interrupting():
        pytest.fail("entered although a stop was asked for")


def test_the_stop_behind_an_error_is_the_signal_a_keyboard_interrupt_included() -> None:
    """What start-up's cleanup asks: Stopped names its signal; a KeyboardInterrupt is a SIGINT even when the handler
    never saw one; any other error is a stop only when a signal was recorded."""
    quiet, stopped = StopSignals(), StopSignals()
    stopped.received = signal.SIGTERM
    assert stop_of(Stopped(signal.SIGTERM), quiet) == signal.SIGTERM
    assert stop_of(KeyboardInterrupt(), quiet) == signal.SIGINT
    assert stop_of(KeyboardInterrupt(), stopped) == signal.SIGTERM  # the first signal counts
    assert stop_of(SystemError("returned a result with an exception set"), stopped) == signal.SIGTERM
    assert stop_of(RuntimeError("a real error"), quiet) is None


SILENCED_IN_A_THREAD = """
import os, sys, threading
from dppo.distributed.cluster import stderr_silenced

inside, done = threading.Event(), threading.Event()

def silence():
    with stderr_silenced():
        inside.set()
        os.write(2, b"a C++ log line\\n")
        done.wait(30)

threading.Thread(target=silence, daemon=True).start()
inside.wait(30)
print("dppo: stopped by SIGINT before training started: nothing written", file=sys.stderr, flush=True)
os._exit(130)  # as the command exits, while the other thread still silences fd 2
"""


def test_a_line_written_while_another_thread_silences_fd_2_is_heard_and_the_c_logs_are_not() -> None:
    """The thread that starts Ray silences fd 2 while it asks the GCS (Ray's C++ logs); a stop's line written by the
    main thread meanwhile reaches stderr (dppo.distributed.cluster.stderr_silenced)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SILENCED_IN_A_THREAD], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines() == ["dppo: stopped by SIGINT before training started: nothing written"]
