"""Killing workers mid-run, the everyday fault of the distributed doors: a thread that waits until
``count`` requests reached the service, then SIGKILLs the processes ``find`` names (once). The service
holds every request after those until the kill is done: the job cannot end before it, however late a
busy machine lets the thread run."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from batchsum.local import Faults, LocalService
from tests.support import wait_for


class KillAfter(threading.Thread):
    """SIGKILL what ``find()`` returns once ``service`` has seen ``count`` requests; ``killed``: the
    pids, ``at``: the service's request count then (the texts on the wire were sent by then). From
    ``start()`` the service holds every request after the first ``count`` until the kill is done (or
    given up after ``seconds``, a guard against a hang, not a timing). As a context manager: started
    on entry, finished on exit, ``took`` the seconds between."""

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
        try:
            wait_for(lambda: self._done.is_set() or self._kill(), self.seconds, self._waited_for, every=0.01)
        finally:
            self._release()

    def _waited_for(self) -> str:
        return f"{self.count} requests and a process to kill ({self.service.stats()['requests']} requests)"

    def _kill(self) -> bool:
        """Kill what ``find()`` names once the service has seen ``count`` requests: done or not."""
        if self.service.stats()["requests"] < self.count or not (pids := self.find()):
            return False
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.killed.append(pid)
        self.at = self.service.stats()["requests"]
        return True

    def _release(self) -> None:
        if self._faults is not None:
            self._faults.release()

    def finish(self) -> None:
        self._done.set()
        self._release()
        self.join(5)

    def __enter__(self) -> KillAfter:
        self.start()
        self.began = time.monotonic()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.took = time.monotonic() - self.began
        self.finish()


@contextlib.contextmanager
def service_for_a_kill(key: str, tmp_path: Path) -> Iterator[tuple[LocalService, dict[str, Any]]]:
    """The local service of a killed-worker test, a strict 1200/min window answering in 0.3 s, and
    the options of the job's run: at the plan, on the machine's budget, its answers journaled."""
    with LocalService([key], rpm=1200, faults=Faults(latency=0.3)) as service:
        journal = tmp_path / "answers.sqlite"
        yield service, {"rpm": 1200, "api_key": key, "base_url": service.url, "progress": False, "journal": journal}


def assert_the_kill_cost_only_the_wire(stats: dict, texts: int) -> None:
    """The service's counts after a job that lost a worker: every text answered, no 429, and at most
    the texts on the wire at the kill (10) paid twice."""
    assert stats["by_status"] == {"200": stats["answered"]}, stats  # 0 429s
    assert stats["answered_unique"] == texts
    assert stats["answered_twice"] <= 10, stats  # at most the texts on the wire at the kill


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
