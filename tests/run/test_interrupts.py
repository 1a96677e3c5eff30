"""SIGINT heard on the main thread's behalf (``run.interrupts``): the stoppers that asked are called
with ``RunInterrupted``, and every signal still reaches the wakeup fd that was set before ours."""

from __future__ import annotations

import signal
import socket
import threading

import pytest

from batchsum.errors import RunInterrupted
from batchsum.run import interrupts


@pytest.fixture
def signals():
    """SIGINT and SIGUSR1 handled by Python without raising (so the C handler writes the wakeup
    fd), an earlier wakeup fd of someone else's, and everything put back afterwards."""
    theirs_read, theirs_write = socket.socketpair()
    theirs_write.setblocking(False)
    theirs_read.settimeout(30)  # a guard against a hang, not a timing
    heard: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda number, frame: heard.append(number))
        for signum in (signal.SIGINT, signal.SIGUSR1)
    }
    before = signal.set_wakeup_fd(theirs_write.fileno(), warn_on_full_buffer=False)
    try:
        yield theirs_read, heard
    finally:
        signal.set_wakeup_fd(before)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        theirs_read.close()
        theirs_write.close()


def test_sigint_calls_the_stoppers_and_every_signal_reaches_the_fd_set_before(signals):
    theirs, python_heard = signals
    stopped: list[BaseException] = []
    called = threading.Event()

    def stopper(error: RunInterrupted) -> None:
        stopped.append(error)
        called.set()

    assert interrupts.listen()
    with interrupts.on_interrupt(stopper):
        signal.raise_signal(signal.SIGUSR1)  # not an interrupt: passed on, no stopper called
        assert theirs.recv(1) == bytes([signal.SIGUSR1])
        signal.raise_signal(signal.SIGINT)
        assert theirs.recv(1) == bytes([signal.SIGINT])  # the fd set before ours still hears it
        assert called.wait(30)
    assert len(stopped) == 1 and isinstance(stopped[0], RunInterrupted)
    assert python_heard == [signal.SIGUSR1, signal.SIGINT]  # the Python handlers ran as before


def test_a_stopper_removed_is_not_called_and_listening_off_the_main_thread_changes_nothing(signals):
    theirs, _ = signals
    stopped: list[BaseException] = []
    assert interrupts.listen()
    with interrupts.on_interrupt(stopped.append):
        pass
    off_main: list[bool] = []
    worker = threading.Thread(target=lambda: off_main.append(interrupts.listen()))
    worker.start()
    worker.join()
    assert off_main == [False]
    still = threading.Event()
    with interrupts.on_interrupt(lambda error: still.set()):  # called with any other stopper there is
        signal.raise_signal(signal.SIGINT)
        assert theirs.recv(1) == bytes([signal.SIGINT])
        assert still.wait(30)
    assert stopped == []


def test_a_signal_a_wait_of_the_main_thread_raises_itself_is_not_raised_again_and_every_other_is(signals):
    """Polars raises a ``KeyboardInterrupt`` of its own from the collect a signal interrupted: the
    handler ``listen()`` puts in front of Python's raises nothing for a signal heard while such a
    wait (a hearing ``main_waits``) was under way, and hands every other on, one call a signal."""
    theirs, python_heard = signals
    assert interrupts.listen()
    assert isinstance(signal.getsignal(signal.SIGINT), interrupts._OneInterrupt)
    called = threading.Event()
    with interrupts.on_interrupt(lambda error: called.set(), main_waits=True):
        signal.raise_signal(signal.SIGINT)  # the handler runs as this returns: the wait raises this one
        assert theirs.recv(1) == bytes([signal.SIGINT]) and called.wait(30)
    assert python_heard == []
    signal.raise_signal(signal.SIGINT)  # no such wait now: Python's handler raises, as ever
    assert theirs.recv(1) == bytes([signal.SIGINT])
    with interrupts.on_interrupt(lambda error: None):  # a wait that does not raise on its own (DuckDB's)
        signal.raise_signal(signal.SIGINT)
    assert theirs.recv(1) == bytes([signal.SIGINT])
    assert python_heard == [signal.SIGINT, signal.SIGINT]


def test_a_stopper_that_lets_the_main_thread_hear_first_is_called_after_its_handler(signals):
    """DuckDB's wait turns the signal the main thread hears into its own one error: a ``main_first``
    hearing's stopper (which would end the query first, with another) is called once the handler in
    front of Python's has run for that signal."""
    theirs, python_heard = signals
    assert interrupts.listen()
    seen: list[list[int]] = []
    called = threading.Event()

    def stopper(error: RunInterrupted) -> None:
        seen.append(list(python_heard))
        called.set()

    with interrupts.on_interrupt(stopper, main_first=True):
        signal.raise_signal(signal.SIGINT)
        assert theirs.recv(1) == bytes([signal.SIGINT]) and called.wait(30)
    assert seen == [[signal.SIGINT]]  # Python's handler had run when the stopper was called


SIGACTION = """
import ctypes, signal, sys
import polars  # noqa: F401  (puts its own SIGINT handler in front of Python's: it aborts a query)
from batchsum.run import interrupts

libc = ctypes.CDLL(None, use_errno=True)
size = ctypes.sizeof(ctypes.c_void_p)


def handler() -> bytes:
    action = ctypes.create_string_buffer(1024)
    assert libc.sigaction(signal.SIGINT, None, action) == 0
    return action.raw[:size]  # the handler's address, the first field of a struct sigaction


before = handler()
assert interrupts.listen()
kept = handler() == before and isinstance(signal.getsignal(signal.SIGINT), interrupts._OneInterrupt)
signal.signal(signal.SIGINT, signal.getsignal(signal.SIGINT))  # what a plain signal.signal does
print(kept, handler() != before)
"""


def test_listening_keeps_the_handler_polars_put_in_front_of_pythons():
    """``signal.signal`` puts Python's own C handler in place of the one Polars chained in front of
    it (which aborts a running query): ``listen()`` installs its handler with the process's action
    for SIGINT kept as it was."""
    import os
    import subprocess
    import sys

    pytest.importorskip("polars")
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    done = subprocess.run([sys.executable, "-c", SIGACTION], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]  # kept by listen(); a plain signal.signal would replace it
