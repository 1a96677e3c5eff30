"""What a batch knows and keeps (``Answers``): the answer store, the answers it refused to take (kept,
tried again, else spilled to a side file), and the claims of a store several runs share."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..data.results import Answer
from ..data.stores import CLAIM_POLL_SECONDS, AnswerStore, Leases, MemoryStore, SharedAnswerStore
from ..service.errors import BatchsumError, JournalError

__all__ = ["Answers"]

log = logging.getLogger("batchsum")


class Answers:
    """What a batch knows and keeps: the answer store, the answers it refused to take (a full disk,
    a journal gone read-only: still ours, tried again at the end and else spilled to a side file the
    next run imports first), and the claims of a store several runs share."""

    def __init__(self, store: AnswerStore, stop: Callable[[BatchsumError], None]) -> None:
        self.store = store
        self._stop = stop
        self.unsaved = MemoryStore()
        self.refusing = False  # the store refused a write: keep the rest here
        # Claims: a store says whether it has them (``Scopes``), else a store with claim() has.
        self.shared = bool(getattr(store, "claims", callable(getattr(store, "claim", None))))
        self.leases = Leases(store) if self.shared else None  # type: ignore[arg-type]

    def get(self, key: str) -> Answer | None:
        return self.known(key)[0]

    def known(self, key: str) -> tuple[Answer | None, bool]:
        """The known answer of ``key``, and whether the answer store shared beyond the run gave it."""
        found, stored = self.lookup([key])
        return found.get(key), key in stored

    def get_many(self, keys: list[str]) -> dict[str, Answer]:
        return self.lookup(keys)[0]

    def lookup(self, keys: list[str]) -> tuple[dict[str, Answer], set[str]]:
        """The known answers of ``keys``, looked up in bulk where the store can, and which of them the
        answer store shared beyond the run gave (``Scopes.lookup``)."""
        stored: set[str] = set()
        try:
            scoped = getattr(self.store, "lookup", None)
            many = getattr(self.store, "get_many", None)
            if scoped is not None:
                found, stored = scoped(keys)
            elif many is not None:
                found = many(keys)
            else:
                found = {key: answer for key in keys if (answer := self.store.get(key)) is not None}
        except Exception as exc:  # a damaged journal: a stop, not a traceback
            self._stop(JournalError(f"cannot read the journal: {exc}"))
            return {}, set()
        if self.unsaved:
            mine = self.unsaved.get_many(keys)
            found.update(mine)
            stored -= set(mine)
        return found, stored

    def put(self, key: str, answer: Answer) -> None:
        if not self.refusing:
            try:
                self.store.put(key, answer)
                return
            except Exception as exc:
                self.refusing = True
                self._stop(JournalError(f"cannot write the journal ({exc}): stopped sending"))
        self.unsaved.put(key, answer)

    async def claim(self, key: str, stopped: asyncio.Event) -> tuple[Answer | None, bool]:
        """(None, False) once this run holds the claim on ``key`` (it sends); else the answer another
        run got while this one waited (the first to claim a request sends it, the others wait), and
        whether it came through the answer store shared beyond the run."""
        store: SharedAnswerStore = self.store  # type: ignore[assignment]
        while True:
            if stopped.is_set():
                raise asyncio.CancelledError
            try:
                claimed = store.claim(key)
            except Exception as exc:
                self._stop(JournalError(f"cannot use the shared answer store: {exc}"))
                raise asyncio.CancelledError from None
            known, stored = self.known(key)  # answered meanwhile, whether or not the claim is ours
            if known is not None:
                if claimed:
                    self.release(key)
                return known, stored
            if claimed:
                assert self.leases is not None
                self.leases.hold(key)
                return None, False
            await asyncio.sleep(CLAIM_POLL_SECONDS)

    def release(self, key: str) -> None:
        if self.leases is not None:
            self.leases.drop(key)
        try:
            self.store.release(key)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - an unreleased claim expires on its own
            log.warning("could not release a claim in the shared answer store", exc_info=True)

    def close(self) -> str | None:
        """One more try to keep what the store refused (space may have been freed); what it still
        refuses goes to the store's side file (``spill``). Where it went, or None."""
        if self.leases is not None:
            self.leases.close()
        for key, answer in self.unsaved.items():
            try:
                self.store.put(key, answer)
            except Exception:
                break
            self.unsaved.pop(key)
        if not self.unsaved:
            return None
        spill = getattr(self.store, "spill", None)
        where: str | None = spill(self.unsaved.items()) if spill is not None else None
        return where
