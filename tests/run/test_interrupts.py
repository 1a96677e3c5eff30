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
