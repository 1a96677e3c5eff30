"""Killing workers mid-run, the everyday fault of the distributed doors: a thread that waits until
``count`` requests reached the service, then SIGKILLs the processes ``find`` names (once)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import psutil

from batchsum.local import LocalService


class KillAfter(threading.Thread):
    """SIGKILL what ``find()`` returns once ``service`` has seen ``count`` requests; ``killed``: the
    pids, ``at``: the service's request count then (the texts on the wire were sent by then)."""

    def __init__(self, service: LocalService, count: int, find: Callable[[], list[int]]) -> None:
        super().__init__(daemon=True)
        self.service, self.count, self.find = service, count, find
        self.killed: list[int] = []
        self.at = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
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

    def finish(self) -> None:
        self._done.set()
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
