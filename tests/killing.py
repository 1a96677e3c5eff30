"""Killing workers mid-run, the everyday fault of the distributed doors: a thread that waits until
``count`` requests reached the service, then SIGKILLs the processes ``find`` names (once). The service
holds every request after those until the kill is done: the job cannot end before it, however late a
busy machine lets the thread run."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import psutil

from batchsum.local import Faults, LocalService


class KillAfter(threading.Thread):
    """SIGKILL what ``find()`` returns once ``service`` has seen ``count`` requests; ``killed``: the
    pids, ``at``: the service's request count then (the texts on the wire were sent by then). From
    ``start()`` the service holds every request after the first ``count`` until the kill is done (or
    given up after ``seconds``, a guard against a hang, not a timing)."""

    def __init__(self, service: LocalService, count: int, find: Callable[[], list[int]], seconds: float = 120) -> None:
        super().__init__(daemon=True)
        self.service, self.count, self.find, self.seconds = service, count, find, seconds
        self.killed: list[int] = []
        self.at = 0
        self._done = threading.Event()
        self._faults: Faults | None = None

    def start(self) -> None:
        self._faults = self.service.faults = replace(self.service.faults, hold_after=self.count)
        super().start()

    def run(self) -> None:
        deadline = time.monotonic() + self.seconds
        try:
            while not self._done.is_set() and time.monotonic() < deadline:
                if self.service.state.stats()["requests"] >= self.count:
                    pids = self.find()
                    if pids:
                        for pid in pids:
                            try:
                                os.kill(pid, signal.SIGKILL)
                            except ProcessLookupError:
                                continue
                            self.killed.append(pid)
                        self.at = self.service.state.stats()["requests"]
                        return
                time.sleep(0.01)
        finally:
            self._release()

    def _release(self) -> None:
        if self._faults is not None:
            self._faults.release()

    def finish(self) -> None:
        self._done.set()
        self._release()
        self.join(5)


def descendants(match: Callable[[psutil.Process], bool]) -> list[int]:
    """This process's descendants that ``match`` (ignoring any that ended while looked at)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if match(process):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def cmdline_has(*words: str) -> Callable[[psutil.Process], bool]:
    def match(process: psutil.Process) -> bool:
        line = " ".join(process.cmdline())
        return all(word in line for word in words)

    return match
