"""What the key's budget remembers of one (key, service) pair from run to run, and what this run adds:
when the key was last answered in each mode (a proven key skips the lone first request), whether it
was refused since, whether the service's stated room was contradicted, the quota the service states
for it and until when a quota is spent.

Invariant: a proof is used only when it is younger than ``PROOF_SECONDS`` and no refusal of the key
(or of that mode) was written after it; an entry is written only from what this run saw answered.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from ...service.errors import BudgetError
from ..budgets.exchange import RECORD_SECONDS, Budget, Remembered
from ..budgets.quota import Spent, StatedQuota
from .limit import LIMIT_SECONDS, Found

__all__ = ["KeyRecord", "PROOF_SECONDS"]

log = logging.getLogger("batchsum")

PROOF_SECONDS = 86400.0  # a key answered this recently, by this service, in this mode, is proven
REFUSED = "refused"  # the key itself refused (a 401 for the key): every mode
LIMIT = "limit"  # the limit last found (or stated) for the key at the service: ``Found`` as JSON
ROOM_CONTRADICTED = "room_contradicted"  # a 429 came while the service stated room
QUOTA = "quota"  # a quota longer than a minute the service stated: JSON, its limit, window, room and reset
QUOTA_SPENT = "quota_spent"  # the key's quota spent until a time: ``quota.Spent`` as JSON


def _answered(mode: int) -> str:
    return f"answered:{int(mode)}"


def _refused(mode: int) -> str:
    return f"refused:{int(mode)}"  # the plan refused this mode ("not premium")


class KeyRecord:
    """One (key, service) pair's remembered entries, as of the start of the run, and what this run
    has to add (``pending``), written by ``flush`` from wherever an event loop is at hand."""

    __slots__ = ("budget", "key_hash", "service", "pending", "_entries", "_wrote", "_clock")

    def __init__(
        self,
        budget: Budget,
        key_hash: str,
        service: str,
        entries: Iterable[Remembered] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.budget = budget
        self.key_hash = key_hash
        self.service = service
        self.pending: dict[str, str] = {}
        self._entries = {entry.name: entry for entry in entries}
        self._wrote: dict[str, Remembered] = {}  # what this run wrote, stamped when written
        self._clock = clock

    @classmethod
    async def recall(cls, budget: Budget, key_hash: str, service: str) -> KeyRecord:
        return cls(budget, key_hash, service, await budget.recall(key_hash, service))

    def written(self, name: str, within: float = PROOF_SECONDS) -> float | None:
        """When ``name`` was written, if within the last ``within`` seconds."""
        entry = self._entries.get(name)
        if entry is None or entry.at < self._clock() - within:
            return None
        return entry.at

    def value(self, name: str, within: float) -> str | None:
        """``name``'s value, if written within the last ``within`` seconds."""
        return self._entries[name].value if self.written(name, within) is not None else None

    def proven(self, mode: int) -> float | None:
        """When the key was last answered by the service in ``mode``, if within a day and not refused
        since (None: the run's first request goes alone)."""
        answered = self.written(_answered(mode))
        refused = max(self.written(REFUSED) or 0.0, self.written(_refused(mode)) or 0.0)
        return answered if answered is not None and answered > refused else None

    def limit(self) -> Found | None:
        """The limit last found for this key at this service, if within a week (a starting point)."""
        at = self.written(LIMIT, LIMIT_SECONDS)
        text = self.value(LIMIT, LIMIT_SECONDS)
        return None if at is None or text is None else Found.from_json(text, at)

    def quota(self) -> dict[str, Any] | None:
        """The quota the service last stated for this key (``limit``, ``window``, ``remaining`` as of
        ``at``, ``reset_at``, Unix times), while its reset is ahead; None when none is known."""
        text, at = self.value(QUOTA, RECORD_SECONDS), self.written(QUOTA, RECORD_SECONDS)
        try:
            data = json.loads(text) if text is not None else None
        except ValueError:
            return None
        if not isinstance(data, dict) or at is None or not isinstance(data.get("reset_at"), (int, float)):
            return None
        return {**data, "at": at} if data["reset_at"] > self._clock() else None

    def quota_spent(self) -> Spent | None:
        """The key's quota spent, while its period lasts (None: not known spent)."""
        text = self.value(QUOTA_SPENT, RECORD_SECONDS)
        spent = Spent.from_json(text) if text is not None else None
        return spent if spent is not None and spent.until > self._clock() else None

    @property
    def room_distrusted(self) -> bool:
        """Did a 429 contradict the room this service stated for this key, within a day?"""
        return self.written(ROOM_CONTRADICTED) is not None

    def describe(self, mode: int) -> str:
        """Whether the run's first request goes alone, and why, in one line."""
        proven = self.proven(mode)
        if proven is not None:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(proven))
            return f"at the pace: this key was answered by this service in mode {mode} at {when} (proven)"
        if self.written(REFUSED) is not None or self.written(_refused(mode)) is not None:
            return "alone: this key was refused by this service since it was last answered"
        return f"alone: this key has no answer from this service in mode {mode} within a day"

    # -- what this run adds ----------------------------------------------------------------------

    def answered(self, mode: int) -> None:
        self.pending[_answered(mode)] = ""

    def refused(self, mode: int | None) -> None:
        """The key was refused (``mode`` None), or only ``mode`` (the plan does not allow it)."""
        self.pending[REFUSED if mode is None else _refused(mode)] = ""

    def room_contradicted(self) -> None:
        self.pending[ROOM_CONTRADICTED] = ""

    def limit_found(self, found: Found) -> None:
        self.pending[LIMIT] = found.to_json()

    def quota_stated(self, quota: StatedQuota) -> None:
        """What the service states of the key's quota now (written with the record's next flush)."""
        quota.news = False
        self.pending[QUOTA] = json.dumps(
            {
                "limit": quota.limit,
                "window": quota.window,
                "remaining": None if quota.left is None else max(0, quota.left),
                "reset_at": None if quota.wall_until is None else round(quota.wall_until, 3),
            }
        )

    def spent(self, spent: Spent) -> None:
        """The key's quota is spent until ``spent.until``: every run on the key acts on it."""
        self.pending[QUOTA_SPENT] = spent.to_json()

    async def flush(self) -> None:
        """Write what this run has to add. A budget that fails now loses only these notes (the run
        itself has its budget checked where it matters)."""
        if not self.pending:
            return
        pending, self.pending = self.pending, {}
        try:
            await self.budget.remember(self.key_hash, self.service, pending)
        except BudgetError as exc:
            log.debug("could not remember %s for the key at %s: %s", sorted(pending), self.service, exc)
            return
        now = self._clock()
        self._wrote.update({n: Remembered(self.key_hash, self.service, n, v, now) for n, v in pending.items()})

    def known(self) -> list[Remembered]:
        """What this run knows of the key: the entries recalled at its start and what it wrote since
        (written again, with their stamps, into a budget that came back empty)."""
        return list({**self._entries, **self._wrote}.values())
