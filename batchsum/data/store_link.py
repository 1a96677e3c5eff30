"""``StoreLink``: the answer store shared beyond a run (the machine's, the cluster's) as the event loop
uses it. No call runs on the loop: each runs on the store's own thread, and the calls made while one is
under way are gathered and run together (lookups in one ``get_many``, claims in one ``take_many``,
answers in one ``put_many``, renewals in one call). A store that fails is left at once (its calls
answered as a store with nothing and no claims would answer) and tried again with a backoff; it is
re-attached when it answers, and the answers kept meanwhile are put there then.

Invariant: one call of the store at a time, on its thread, in the order the loop asked for them
(answers kept before claims let go, within a batch and between batches)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .results import Answer

__all__ = ["StoreLink", "Outage", "run_calls", "RETRY_FIRST", "RETRY_MOST", "WATCH_STEP", "BACKLOG"]

log = logging.getLogger("batchsum")

RETRY_FIRST = 1.0  # seconds before a store that failed is tried again; doubled each time, up to:
RETRY_MOST = 30.0
WATCH_STEP = 0.2  # a SQLite store's data_version looked at this often while texts wait on it
BACKLOG = 10_000  # summaries kept while the store is out, put there when it is back

GET, TAKE, LOOK, PUT, RELEASE, RENEW, CHANGED = "get", "take", "look", "put", "release", "renew", "changed"


class _Call:
    __slots__ = ("kind", "keys", "look", "answers", "future")

    def __init__(self, kind: str, keys: Sequence[str] = (), *, look: bool = False, answers: Any = None) -> None:
        self.kind = kind
        self.keys = keys
        self.look = look
        self.answers = answers
        self.future: asyncio.Future[Any] | None = None


class StoreLink:
    """``store`` (``MachineStore``, ``RedisStore``) used from the event loop (see the module docstring).
    ``since``: under ``refresh``, only answers written since then are looked up. ``lost``: told of the
    answers a store that failed did not keep (the run keeps them in its own scope). ``calls`` counts
    the store's calls (each gathered batch of a kind is one)."""

    def __init__(
        self, store: Any, since: float | None = None, lost: Callable[[list[tuple[str, Answer]]], None] | None = None
    ) -> None:
        self.store = store
        self.where = store.where
        self.since = since
        self.calls = 0
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="batchsum-store")
        self.outage = Outage(store, self._thread, lost)
        self._pending: list[_Call] = []
        self._flusher: asyncio.Task[None] | None = None
        self._watcher: Any = None

    @property
    def attached(self) -> bool:
        """Whether the store is in use (not out since it failed)."""
        return self.outage.attached

    @property
    def claims(self) -> bool:
        return bool(getattr(self.store, "claims", False))

    # -- what the run asks ---------------------------------------------------------------------------

    async def get_many(self, keys: Sequence[str]) -> dict[str, Answer]:
        """The answers the store keeps for ``keys`` (none while it is out)."""
        result: dict[str, Answer] = await self._ask(_Call(GET, keys))
        return result

    async def take(self, key: str, look: bool) -> Answer | bool | None:
        """At ``key``'s turn: its answer when the store keeps one (``look``), True when this run now
        holds its claim, False when another run holds it; None while the store is out (no claims)."""
        result: Answer | bool | None = await self._ask(_Call(TAKE, (key,), look=look))
        return result

    async def look(self, keys: Sequence[str]) -> tuple[dict[str, Answer], set[str]] | None:
        """For texts set aside, one read: the answers kept now, and which of the others another run
        still holds; None while the store is out."""
        result: tuple[dict[str, Answer], set[str]] | None = await self._ask(_Call(LOOK, keys))
        return result

    def put(self, key: str, answer: Answer) -> None:
        """Keep ``answer`` (its claim, when this run holds it, let go with it); not awaited."""
        self._queue(_Call(PUT, answers=[(key, answer)]))

    def release(self, key: str) -> None:
        """Let go of this run's claim on ``key``; not awaited."""
        self._queue(_Call(RELEASE, (key,)))

    async def renew(self, keys: Collection[str]) -> None:
        await self._ask(_Call(RENEW, list(keys)))

    async def wait_changed(self, timeout: float, wanted: Collection[str]) -> bool:
        """Wait up to ``timeout`` seconds for the store to say something changed for ``wanted`` (Redis:
        its channel; SQLite: ``data_version``, looked at every ``WATCH_STEP``); whether it did (a store
        that cannot say: True at the end, so that the caller looks)."""
        loop = asyncio.get_running_loop()
        if self.attached and hasattr(self.store, "watcher"):
            try:
                if self._watcher is None:
                    self._watcher = self.store.watcher()
                changed: bool = await self._watcher.wait(timeout, wanted)
                return changed
            except Exception as exc:  # noqa: BLE001 - a store is a help, never a stop
                watcher, self._watcher = self._watcher, None
                await _close(watcher)
                self.outage.out(exc)
                return True
        if not self.attached or not hasattr(self.store, "changed"):
            await asyncio.sleep(timeout)
            return True
        deadline = loop.time() + timeout
        while not await self._ask(_Call(CHANGED)):
            left = deadline - loop.time()
            if left <= 0:
                return False
            await asyncio.sleep(min(WATCH_STEP, left))
        return True

    async def aclose(self) -> None:
        """What is queued (answers, releases) sent to the store; its thread let go."""
        self.outage.close()
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)
        await _close(self._watcher)
        self._thread.shutdown(wait=False)

    # -- calls gathered and run on the store's thread ------------------------------------------------

    async def _ask(self, call: _Call) -> Any:
        call.future = asyncio.get_running_loop().create_future()
        self._queue(call)
        return await call.future

    def _queue(self, call: _Call) -> None:
        self._pending.append(call)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            calls, self._pending = self._pending, []
            if not self.attached:
                self._answer(calls, None)
                continue
            try:
                done = await loop.run_in_executor(self._thread, self._run, calls)
            except Exception as exc:  # noqa: BLE001 - a store is a help, never a stop
                self.outage.out(exc)
                done = None
            self._answer(calls, done)

    def _run(self, calls: list[_Call]) -> dict[Any, Any]:
        done, count = run_calls(self.store, self.since, calls)
        self.calls += count
        return done

    def _answer(self, calls: list[_Call], done: dict[Any, Any] | None) -> None:
        """Each call's result (``done`` None: the store is out, and each gets what a store with
        nothing would give); a claim won for a caller that stopped waiting is let go."""
        for call in calls:
            result = _result(call, done)
            if call.kind == PUT and done is None:
                self.outage.keep(call.answers)
            future = call.future
            if future is None:
                continue
            if future.done():  # its caller was cancelled: a claim it won is let go
                if call.kind == TAKE and result is True:
                    self.release(call.keys[0])
                continue
            future.set_result(result)


class Outage:
    """A store that failed: left at once (said once), tried again after ``RETRY_FIRST`` seconds,
    doubling up to ``RETRY_MOST``, and used again once it answers and takes the answers kept meanwhile
    (the first ``BACKLOG``; ``lost`` is told of them at once: the run's own scope keeps them)."""

    def __init__(self, store: Any, thread: ThreadPoolExecutor, lost: Callable[[list[tuple[str, Answer]]], None] | None):
        self.store = store
        self.attached = True
        self._thread = thread
        self._lost = lost
        self._backlog: list[tuple[str, Answer]] = []
        self._retry: asyncio.Task[None] | None = None
        self._closed = False

    def keep(self, answers: list[tuple[str, Answer]]) -> None:
        """Answers the store did not take (it is out)."""
        if self._lost is not None:
            self._lost(answers)
        room = BACKLOG - len(self._backlog)
        self._backlog.extend(answers[: max(0, room)])

    def out(self, exc: BaseException) -> None:
        """The store failed: left until it answers again."""
        if not self.attached:
            return
        self.attached = False
        where = self.store.where
        log.warning(
            "batchsum: the answer store %s failed (%s): this run goes on with its own answers alone until it "
            "answers again",
            where,
            exc,
            extra={"event": "store", "fields": {"where": where}},
        )
        if not self._closed:
            self._retry = asyncio.ensure_future(self._reattach())

    async def _reattach(self) -> None:
        loop = asyncio.get_running_loop()
        delay = RETRY_FIRST
        while True:
            await asyncio.sleep(delay)
            delay = min(2 * delay, RETRY_MOST)
            try:
                await loop.run_in_executor(self._thread, self.store.ping)
                while self._backlog:  # what was kept meanwhile, and what comes while it is put
                    backlog, self._backlog = self._backlog, []
                    try:
                        await loop.run_in_executor(self._thread, self.store.put_many, backlog)
                    except BaseException:
                        self._backlog = backlog + self._backlog
                        raise
            except Exception:  # noqa: BLE001 - still out
                continue
            self.attached = True  # nothing kept is left behind: no await since the backlog emptied
            log.warning(
                "batchsum: the answer store %s answers again: this run uses it again",
                self.store.where,
                extra={"event": "store", "fields": {"where": self.store.where}},
            )
            return

    def close(self) -> None:
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
        self._backlog = []  # what the store did not take is in the run's own scope (``lost``)


def run_calls(store: Any, since: float | None, calls: list[_Call]) -> tuple[dict[Any, Any], int]:
    """On the store's thread: each kind of call once, for every key asked (answers kept first, then
    claims let go); what each gave, and how many calls of the store that made."""
    done: dict[Any, Any] = {}
    count = 0

    def keys(kind: str, look: bool = False) -> list[str]:
        wanted = {key: None for call in calls if call.kind == kind and call.look == look for key in call.keys}
        return list(wanted)

    if puts := [item for call in calls if call.kind == PUT for item in call.answers]:
        store.put_many(puts)
        count += 1
    if releases := keys(RELEASE):
        store.release_many(releases)
        count += 1
    if gets := keys(GET):
        done[GET] = store.get_many(gets, since)
        count += 1
    for look in (True, False):
        if takes := keys(TAKE, look):
            done[TAKE, look] = store.take_many(takes, since, look)
            count += 1
    if looks := keys(LOOK):
        done[LOOK] = store.look_many(looks, since)
        count += 1
    if renewals := keys(RENEW):
        store.renew(renewals)
        count += 1
    if any(call.kind == CHANGED for call in calls):
        done[CHANGED] = store.changed()
        count += 1
    return done, count


async def _close(watcher: Any) -> None:
    if watcher is not None:
        try:
            await watcher.aclose()
        except Exception:  # noqa: BLE001 - closing what failed already
            pass


def _result(call: _Call, done: dict[Any, Any] | None) -> Any:
    """What ``call`` gets from the batch's ``done`` (None: the store is out)."""
    if call.kind == GET:
        return {} if done is None else {k: a for k in call.keys if (a := done[GET].get(k)) is not None}
    if call.kind == TAKE:
        return None if done is None else done[TAKE, call.look].get(call.keys[0], False)
    if call.kind == LOOK:
        if done is None:
            return None
        found, held = done[LOOK]
        return {k: found[k] for k in call.keys if k in found}, {k for k in call.keys if k in held}
    if call.kind == CHANGED:
        return True if done is None else done[CHANGED]
    return None
