"""A run's presence on a key's budget (``Presence``): who it is (``Member``), what it says of itself in
the runs' registry (published with the calls its pacer makes anyway, at most once a ``PUBLISH_SECONDS``),
and its job's stop, heard on any of those calls and told to the run once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from .exchange import Member, Report, Slot

__all__ = ["Presence", "PUBLISH_SECONDS", "member_of"]

PUBLISH_SECONDS = 1.0  # a run publishes its entry at most this often (it lapses after RUN_LEASE_SECONDS)


def member_of(run_id: str) -> Member:
    """This process's member of the run ``run_id``: its host, pid and a token of its own (two runs of a
    job in one process, a Spark task after another, are two members)."""
    return Member(run_id, f"{socket.gethostname()}/{os.getpid()}/{os.urandom(3).hex()}")


class Presence:
    """A run on one key's budget. ``describe``: what it says of itself (plain data, never a secret),
    asked when its entry is due; ``on_stop``: told the cause of its job's stop once, when a call of
    its pacer first hears it. ``clock``: the monotonic clock publication is timed by.

    A stop already posted when the run first called is not this run's: a lazy plan's run id is the
    same each time it is computed, and the stop of an earlier computation (kept a day) must not stop
    the next one. A driver makes each stop's cause its own (``run.job_stop``), so a stop posted later,
    even for the same reason, is heard."""

    __slots__ = ("member", "describe", "on_stop", "stop", "_clock", "_due", "_answered", "_stale")

    def __init__(
        self,
        member: Member,
        describe: Callable[[], Mapping[str, Any]] | None = None,
        *,
        on_stop: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.member = member
        self.describe = describe
        self.on_stop = on_stop
        self.stop: str | None = None  # the job's stop, once heard
        self._clock = clock
        self._due = -float("inf")
        self._answered = False  # the budget has answered a call of this run
        self._stale: str | None = None  # the stop already posted at its first call: an earlier computation's

    def stamp(self, report: Report) -> Report:
        """``report`` naming the run, with its entry when one is due."""
        now = self._clock()
        entry = None
        if self.describe is not None and now >= self._due:
            self._due = now + PUBLISH_SECONDS
            entry = json.dumps(dict(self.describe()), separators=(",", ":"), default=str)
        return dataclasses.replace(report, run=self.member, entry=entry)

    def published(self) -> None:
        """Publish with the next call, whenever it is (the run's state changed much: it started or ends)."""
        self._due = -float("inf")

    def heard(self, slot: Slot) -> None:
        """What the budget answered: the job's stop, told once (not one it answered the run's first
        call with: that one was posted before the run, for an earlier computation of its job)."""
        first, self._answered = not self._answered, True
        if slot.stop is None or slot.stop == self._stale or self.stop is not None:
            return
        if first:
            self._stale = slot.stop
            return
        self.stop = slot.stop
        if self.on_stop is not None:
            self.on_stop(slot.stop)
