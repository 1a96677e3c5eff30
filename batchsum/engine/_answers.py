"""What a batch knows and keeps (``Answers``): its scopes (its own at once; the answer store off the
event loop), the answers its own scope refused to take (kept, tried again, else spilled to a side
file), a request's claim at its turn (``Claim``), and the texts another run has on the wire, set aside
until that run's answer lands (``Waiting``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..data.results import Answer
from ..data.scopes import AsyncScopes, Scopes
from ..data.stores import CLAIM_LOOK_FIRST, CLAIM_LOOK_MOST, AnswerStore, Leases, MemoryStore
from ..service.errors import BatchsumError, JournalError

__all__ = ["Answers", "Claim", "Waiting"]

log = logging.getLogger("batchsum")


class Answers:
    """What a batch knows and keeps: its scopes (``AsyncScopes``: the run's own at once, the answer
    store on its own thread), the answers its own scope refused to take (a full disk, a journal gone
    read-only: still ours, tried again at the end and else spilled to a side file the next run imports
    first), the claims it holds (renewed by ``leases``) and the texts it waits for (``waiting``).

    Which of the store's answers the run is served is its scopes' ``Trust`` (the run's keys in its
    mode, made with them: ``run.answer_scopes.open_scopes``), asked by every read of the store; this run's
    own answer in its mode proves it (``trust``)."""

    def __init__(self, store: AnswerStore, stop: Callable[[BatchsumError], None]) -> None:
        self.store = store
        self.scopes = AsyncScopes(store if isinstance(store, Scopes) else Scopes(store))
        self._stop = stop
        self.unsaved = MemoryStore()
        self.refusing = False  # its own scope refused a write: keep the rest here
        self.shared = self.scopes.claims  # several runs claim what they send
        self.leases = Leases(self.scopes) if self.shared else None
        self.waiting = Waiting(self.scopes)

    @property
    def from_store(self) -> bool:
        """Whether an answer another run got (at a turn, or while set aside) came through the store."""
        return self.scopes.stored_claims

    def trust(self) -> None:
        """A key of the run was answered in its mode: the store's answers may be served from now on."""
        self.scopes.trust.prove()

    def known(self, key: str) -> Answer | None:
        """The answer its own scope knows for ``key`` (at once)."""
        return self._own([key]).get(key)

    def _own(self, keys: list[str]) -> dict[str, Answer]:
        try:
            found = self.scopes.known(keys)
        except Exception as exc:  # a damaged journal: a stop, not a traceback
            self._stop(JournalError(f"cannot read the journal: {exc}"))
            return {}
        if self.unsaved:
            found.update(self.unsaved.get_many(keys))
        return found

    async def lookup(self, keys: list[str]) -> tuple[dict[str, Answer], set[str]]:
        """The known answers of ``keys`` (its own scope, then the store: one call for them all, of
        what it may serve), and which of them the store gave."""
        try:
            found, stored = await self.scopes.lookup(keys)
        except Exception as exc:  # a damaged journal: a stop, not a traceback
            self._stop(JournalError(f"cannot read the journal: {exc}"))
            return {}, set()
        if self.unsaved:
            mine = self.unsaved.get_many(keys)
            found.update(mine)
            stored -= set(mine)
        return found, stored

    async def stored(self, key: str) -> Answer | None:
        """The store's answer for ``key`` (asked with the other requests of the moment), when it may serve it."""
        if self.scopes.link is None:
            return None
        found, stored = await self.scopes.lookup([key])  # copied into a journal, as a block's are
        return found.get(key) if key in stored else None

    def put(self, key: str, answer: Answer) -> None:
        if not self.refusing:
            try:
                self.scopes.put(key, answer)
                return
            except Exception as exc:
                self.refusing = True
                self._stop(JournalError(f"cannot write the journal ({exc}): stopped sending"))
        self.unsaved.put(key, answer)

    async def take(self, key: str) -> Answer | bool:
        """At ``key``'s turn: its answer when another run kept one meanwhile (one the store may serve),
        True when this run now holds its claim (it sends), False when another run has it on the wire."""
        try:
            got = await self.scopes.take(key)
        except Exception as exc:  # its own scope's claims (a shared journal) failed: a stop
            self._stop(JournalError(f"cannot use the shared answer store: {exc}"))
            raise asyncio.CancelledError from None
        if got is True and self.leases is not None:
            self.leases.hold(key)
        return got

    def release(self, key: str) -> None:
        if self.leases is not None:
            self.leases.drop(key)
        try:
            self.scopes.release(key)
        except Exception:  # noqa: BLE001 - an unreleased claim expires on its own
            log.warning("could not release a claim in the shared answer store", exc_info=True)

    async def close(self) -> str | None:
        """One more try to keep what its own scope refused (space may have been freed); what it still
        refuses goes to the side file (``spill``); what is queued for the store sent. Where the side
        file is, or None."""
        if self.leases is not None:
            self.leases.close()
        self.waiting.close()
        for key, answer in self.unsaved.items():
            try:
                self.scopes.put(key, answer)
            except Exception:
                break
            self.unsaved.pop(key)
        await self.scopes.aclose()
        if not self.unsaved:
            return None
        spill = getattr(self.store, "spill", None)
        where: str | None = spill(self.unsaved.items()) if spill is not None else None
        return where


class Claim:
    """One request's claim in the store several runs share, taken at its turn on the pace
    (``at_turn``, asked after the start is reserved and before it is committed) and held across its
    retries; ``answer``: what another run kept meanwhile (the turn went to the next text)."""

    __slots__ = ("answers", "key", "held", "answer")

    def __init__(self, answers: Answers, key: str) -> None:
        self.answers = answers
        self.key = key
        self.held = False
        self.answer: Answer | None = None

    async def at_turn(self) -> bool:
        """Does the request go now? Yes when this run holds its claim (already held: a retry after a
        429); no when another run has it on the wire or answered it (``answer``)."""
        if self.held:
            return True
        got = await self.answers.take(self.key)
        if got is True:
            self.held = True
            return True
        if isinstance(got, Answer):
            self.answer = got
        return False

    def release(self) -> None:
        if self.held:
            self.held = False
            self.answers.release(self.key)


class Waiting:
    """Texts another run has on the wire, set aside until that run's answer lands or its claim goes
    (it let the text go unanswered, or died): every text waiting is looked at in one read, when the
    store announces a change (a Redis ``PUBLISH``, SQLite's ``data_version``), when a text is newly set
    aside, or after a backoff from ``CLAIM_LOOK_FIRST`` to ``CLAIM_LOOK_MOST``. ``looks`` counts the reads."""

    __slots__ = ("scopes", "_waiting", "_watch", "_fresh", "looks")

    def __init__(self, scopes: AsyncScopes) -> None:
        self.scopes = scopes
        self._waiting: dict[str, asyncio.Future[Answer | None]] = {}
        self._watch: asyncio.Task[None] | None = None
        self._fresh = False
        self.looks = 0

    async def answer(self, key: str) -> Answer | None:
        """The answer another run got for ``key``; None when no run holds it any more (this run takes
        a turn for it again)."""
        future = self._waiting.get(key)
        if future is None:
            future = self._waiting[key] = asyncio.get_running_loop().create_future()
            self._fresh = True
        if self._watch is None or self._watch.done():
            self._watch = asyncio.ensure_future(self._look_on())
        try:
            return await asyncio.shield(future)
        finally:
            if not future.done() and self._waiting.get(key) is future:  # its caller was cancelled
                del self._waiting[key]
                future.cancel()

    async def _look_on(self) -> None:
        pause = waited = 0.0
        while self._waiting:
            changed = await self.scopes.wait_changed(CLAIM_LOOK_FIRST, self._waiting.keys())
            waited += CLAIM_LOOK_FIRST
            fresh, self._fresh = self._fresh, False
            if not (changed or fresh or waited >= pause) or not self._waiting:
                continue
            keys = list(self._waiting)
            try:
                found, held = await self.scopes.look(keys)
            except Exception as exc:  # its own scope's claims (a shared journal) failed: the run's to say
                for future in self._waiting.values():
                    future.set_exception(exc)
                self._waiting.clear()
                return
            self.looks += 1
            for key in keys:
                waiter = self._waiting.get(key)
                if waiter is None or waiter.done():
                    continue
                if key in found or key not in held:
                    del self._waiting[key]
                    waiter.set_result(found.get(key))
            pause = CLAIM_LOOK_FIRST if changed or fresh else min(2 * max(pause, CLAIM_LOOK_FIRST), CLAIM_LOOK_MOST)
            waited = 0.0

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        for future in self._waiting.values():
            future.cancel()
        self._waiting.clear()
