"""A run's answers in their two scopes (``Scopes``): its own (the output's journal, or this process's
memory when it has none) and the answer store shared beyond it (the machine's, the cluster's), which
``open_store`` opens from what ``store=`` names; ``AsyncScopes``, the same as the engine uses them from
its event loop (the store through ``store_link.StoreLink``, claims taken at a request's turn); and
``Trust``, which of the store's answers the run may be served.

Invariant: every read of the store's answers is made here (``Scopes.lookup``, ``Scopes.stored``,
``AsyncScopes.lookup``, ``take``, ``look``), and each asks ``Scopes.trust`` first: a caller never
decides what the store may serve it. This process's memory is read by every run of the process (a
notebook's next cell): it is a store shared by runs, not a run's own scope, and its reads
(``Scopes.lookup_own``) ask the same trust for every answer but the run's own."""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, Protocol

from ..service import contract
from ..service.location import STORE, Location
from .results import OK, Answer
from .store_link import RETRY_FIRST, RETRY_MOST, StoreLink
from .stores import AnswerStore, StoreError

__all__ = ["Scopes", "AsyncScopes", "Trust", "Proof", "trusting", "open_store", "look_at_store", "store_path"]

log = logging.getLogger("batchsum")


def open_store(
    where: Location | str, service: str, identity: str | None = None, job: str | None = None, scope: str = ""
) -> Any:
    """The answer store ``where`` names (``service.settings.store_spec``) for ``service``'s answers in
    ``scope`` (``""``: every key's; a key's hash: that key's alone): ``machine`` (the user's cache
    folder), ``sqlite:///PATH``, a Redis URL (the cluster's; ``?prefix=NAME`` puts its keys under
    ``NAME:``; the old answers of the key ``identity`` are taken in the first time), or None for
    ``none``. ``job``: a job whose only scope the store is (a shared run with no journal): its
    refusals are kept there too, for itself and for a day. A machine's store this user cannot write
    is opened to read (``writable`` False). ``StoreError`` when it cannot be opened."""
    place = Location.of(where, STORE)
    if place.none:
        return None
    if place.redis:
        from .redis_store import RedisStore, take_in_old

        cluster = RedisStore(place, service, job=job, scope=scope)
        try:
            if identity is not None:
                take_in_old(cluster, identity)
        except StoreError:
            cluster.close()
            raise
        return cluster
    from .machine_store import MachineStore
    from .store_upkeep import keep_up

    path = store_path(place)
    store = MachineStore(path, service, job=job, scope=scope)
    if not store.writable:
        return store
    try:
        keep_up(path, store.connection)  # the old stores taken in before anything is looked up; pruning when due
    except BaseException:
        store.close()
        raise
    return store


def store_path(where: Location | str) -> Path:
    """The file of a machine's store ``where`` names (``machine``, ``sqlite:///PATH``)."""
    path = Location.of(where, STORE).file
    assert path is not None, "a store on disk"
    return path


def look_at_store(where: Location | str, service: str, scope: str = "") -> Any:
    """The answer store ``where`` names, to look only (a dry run): nothing is made or written; None
    when it is ``none`` or not made yet. ``StoreError`` when it cannot be read."""
    place = Location.of(where, STORE)
    if place.none:
        return None
    if place.redis:
        from .redis_store import RedisStore

        return RedisStore(place, service, scope=scope)
    from .machine_store import MachineStore

    path = store_path(place)
    return MachineStore(path, service, readonly=True, scope=scope) if path.exists() else None


class Proof(Protocol):
    """What ``Trust`` reads of a key: when the service last answered it in a mode (``pacing.KeyRecord``)."""

    def proven(self, mode: int) -> float | None: ...


class Trust:
    """Which of the answer store's answers a run may be served. Those of its service and its request
    (the store is opened for one service, in one scope; an answer is found by its request's
    fingerprint); and of a mode a plan may refuse (mode 2), only while a key of the run is proven in
    that mode: its record shows the service answered it there within the day (``of``), or this run's
    own request in that mode was answered (``prove``). A key whose plan refuses mode 2 is never served
    an answer another key paid for: not from the store, not from this process's memory (whose
    answers other runs of the process kept). ``strangers``: the askers are not the store's own user but the
    clients of a door open to others (the gateway's, whose keys are theirs): nothing is served, in
    any mode, before a key of theirs is proven in it, so a key the service never accepted gets nothing.
    ``Trust()``, who asks not said: nothing of the store is served.

    The rule's one place: ``Scopes`` asks ``serves`` before every read of the store, so a caller (a
    run, a dry run, an estimate, a gateway) says who asks and never applies the rule itself."""

    __slots__ = ("mode", "proven", "strangers")

    def __init__(self, mode: int | None = None, proven: bool = False, *, strangers: bool = False) -> None:
        self.mode = mode
        self.proven = proven
        self.strangers = strangers

    @classmethod
    def of(cls, mode: int, keys: Iterable[Proof | None], *, strangers: bool = False) -> Trust:
        """The trust of a run in ``mode`` on ``keys`` (their records; None: a key with none)."""
        return cls(mode, any(key is not None and key.proven(mode) is not None for key in keys), strangers=strangers)

    @property
    def serves(self) -> bool:
        """Whether the store's answers may be served now."""
        if self.mode is None:
            return False
        return self.proven or (self.mode == contract.Mode.STANDARD and not self.strangers)

    def prove(self) -> None:
        """A key of the run was answered in its mode: the store's answers may be served from now on."""
        self.proven = True

    def __repr__(self) -> str:
        return f"Trust(mode={self.mode}, proven={self.proven}, strangers={self.strangers})"


class _Outage:
    """A store that failed (a full disk, Redis gone): said once, left until its next try (a backoff
    from ``RETRY_FIRST`` doubling to ``RETRY_MOST``), and tried at once again when it answers."""

    def __init__(self, where: str | None) -> None:
        self.where = where
        self._until = 0.0  # left until then (``time.monotonic()``)
        self._backoff = RETRY_FIRST

    def due(self) -> bool:
        return time.monotonic() >= self._until

    def failed(self, exc: BaseException) -> None:
        if not self._until:
            log.warning(
                "batchsum: the answer store %s failed (%s): this run goes on with its own answers alone until it "
                "answers again",
                self.where,
                exc,
                extra={"event": "store", "fields": {"where": self.where}},
            )
        self._until = time.monotonic() + self._backoff
        self._backoff = min(2 * self._backoff, RETRY_MOST)

    def answered(self) -> None:
        if self._until:
            self._until, self._backoff = 0.0, RETRY_FIRST


def _claimer(scope: Any) -> bool:
    return scope is not None and bool(getattr(scope, "claims", callable(getattr(scope, "claim", None))))


class Scopes:
    """A run's answers: its own (``own``: the output's journal, or this process's memory for a run with
    none; ``keeps_all``: a journal keeps every answer, memory only what no store on disk keeps) and
    the store shared beyond it (``store``: None for none). Looked up in that order, the store's
    answers copied into a journal; a summary goes to both, a refusal to its own scope only (with no
    own scope, a shared run's, to the store, which keeps it for the job alone and a day). Claims
    (``AsyncScopes``) are the store's when it has some, else its own's (a shared journal). ``refresh``: nothing written
    before ``started`` (the run's start, or its job's; default: now) is looked up, so every request
    is sent again and its answer replaces the stored one; what was written since (this run's own
    answers, another's while it ran) answers as always, so a text is paid for once in the run.
    ``trust``: which store answers it may be served (``Trust``; none by default); its own scope's all.
    ``shared_own``: its own scope is this process's memory, which every run of the process reads and
    writes: a store shared by runs, whose answers are served by ``trust`` as the store's are, but for
    those this run kept there itself (``keep_own``): a run never pays twice for its own texts.

    A store that fails (a full disk, Redis gone) is said once and left, and tried again after a
    backoff: the run goes on with its own scope meanwhile. Its own scope's failures are the run's
    (``JournalError``: the run stops). The engine uses them through ``AsyncScopes``."""

    def __init__(
        self,
        own: AnswerStore | None,
        store: Any = None,
        *,
        keeps_all: bool = True,
        refresh: bool = False,
        started: float | None = None,
        trust: Trust | None = None,
        shared_own: bool = False,
    ) -> None:
        self.own = own
        self.shared_own = shared_own
        self._kept: set[str] = set()  # what this run kept in a shared own scope (``keep_own``)
        self.store = store
        self.trust = trust if trust is not None else Trust()
        self.keeps_all = keeps_all
        self.refresh = refresh
        # Under refresh, answers written before this (``time.time()``) are not looked up.
        self.since = (time.time() if started is None else started) if refresh else None
        self.where = getattr(store, "where", None)
        self._outage = _Outage(self.where)

    @property
    def writable(self) -> bool:
        """Whether the store takes answers and claims (one this user cannot write is only read)."""
        return self.store is not None and bool(getattr(self.store, "writable", True))

    def _store_now(self) -> Any:
        """The store, unless it failed and is not due to be tried again."""
        return self.store if self._outage.due() else None

    def lookup_own(self, keys: list[str]) -> dict[str, Answer]:
        """The answers its own scope knows for ``keys`` (under refresh, those kept since it started;
        in memory shared by runs, those ``trust`` serves and this run's own)."""
        own, since = self.own, self.since
        if own is None:
            return {}
        many = getattr(own, "get_many", None)
        if many is not None:
            found: dict[str, Answer] = many(keys) if since is None else many(keys, since)
        elif since is None:  # a store that cannot say when it kept an answer: nothing of it under refresh
            found = {k: a for k in keys if (a := own.get(k)) is not None}
        else:
            return {}
        if self.shared_own and found and not self.trust.serves:
            found = {key: answer for key, answer in found.items() if key in self._kept}
        return found

    def keep_own(self, key: str, answer: Answer) -> None:
        """``answer`` kept in its own scope (noted as this run's own, in memory shared by runs)."""
        assert self.own is not None
        self.own.put(key, answer)
        if self.shared_own:
            self._kept.add(key)

    def stored(self, keys: list[str]) -> dict[str, Answer]:
        """The store's answers for ``keys`` the run may be served now (``trust``; its failure is the caller's)."""
        serves = self.store is not None and self.trust.serves
        return dict(self.store.get_many(keys, self.since)) if serves else {}

    def lookup(self, keys: list[str]) -> tuple[dict[str, Answer], set[str]]:
        """The answers known for ``keys``, and which of them the store gave (not its own scope)."""
        found = self.lookup_own(keys)
        missing = [key for key in keys if key not in found] if found else keys
        if self._store_now() is None or not missing:
            return found, set()
        try:
            stored = self.stored(missing)
        except Exception as exc:  # noqa: BLE001 - a store is a help, never a stop
            self._outage.failed(exc)
            return found, set()
        self._outage.answered()
        self.copy(stored.items())
        found.update(stored)
        return found, set(stored)

    def copy(self, answers: Iterable[tuple[str, Answer]]) -> None:
        """The store's answers into the journal, which then holds every answer of its output."""
        own = self.own if self.keeps_all else None
        answers = list(answers)
        if own is None or not answers:
            return
        put_many = getattr(own, "put_many", None)
        if put_many is not None:
            put_many(answers)
        else:
            for key, answer in answers:
                own.put(key, answer)

    def get_many(self, keys: list[str]) -> dict[str, Answer]:
        return self.lookup(keys)[0]

    def get(self, key: str) -> Answer | None:
        return self.lookup([key])[0].get(key)

    def to_store(self, answer: Answer) -> bool:
        """Whether ``answer`` goes to the store: a summary, or anything when the run has no own scope."""
        return self.writable and (answer.status == OK or self.own is None)

    def put(self, key: str, answer: Answer) -> None:
        """``answer`` kept: in the run's own scope (memory: only when no store keeps it) and, a
        summary, in the store; a refusal goes to the store only when the run has no own scope."""
        kept = False
        store = self._store_now()
        if store is not None and self.to_store(answer):
            try:
                store.put(key, answer)
                kept = True
                self._outage.answered()
            except Exception as exc:  # noqa: BLE001 - a store is a help, never a stop
                self._outage.failed(exc)
        if self.own is not None and (self.keeps_all or not kept):
            self.keep_own(key, answer)

    def spill(self, answers: list[tuple[str, Answer]]) -> str | None:
        """The answers its own scope refused, to the journal's side file (``Journal.spill``)."""
        spill = getattr(self.own, "spill", None)
        where: str | None = spill(answers) if spill is not None else None
        return where

    def __len__(self) -> int:
        """Answers in its own scope (what a rerun of the same output finds there)."""
        return len(self.own) if self.own is not None else 0  # type: ignore[arg-type]

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def trusting(scopes: Scopes, trust: Trust) -> Scopes:
    """``scopes`` as another asker is served them (``trust``: a door whose requests come in any mode,
    the gateway's): the same own scope and store, the store's answers by that trust."""
    view = copy.copy(scopes)
    view.trust = trust
    return view


class AsyncScopes:
    """``Scopes`` as the engine uses them from its event loop: its own scope at once (a journal, memory:
    the run's own file), the store through a ``StoreLink`` (never on the loop; calls gathered), claims
    taken at a request's turn (``take``), and texts another run has on the wire looked at together
    (``look``, ``wait_changed``). ``aclose`` sends what is queued."""

    def __init__(self, scopes: Scopes) -> None:
        self.scopes = scopes
        store = scopes.store
        self.link = StoreLink(store, scopes.since, self._lost) if store is not None else None

    @property
    def stored_claims(self) -> bool:
        """Whether claims are taken in the store (else in its own scope, or none)."""
        return self.link is not None and self.link.claims and self.scopes.writable

    @property
    def claims(self) -> bool:
        """Whether this run claims what it sends (in the store, else in its own scope)."""
        return self.stored_claims or _claimer(self.scopes.own)

    def known(self, keys: list[str]) -> dict[str, Answer]:
        """What its own scope knows (at once: the run's own file or memory)."""
        return self.scopes.lookup_own(keys)

    @property
    def trust(self) -> Trust:
        """Which of the store's answers the run may be served (``Scopes.trust``)."""
        return self.scopes.trust

    async def lookup(self, keys: list[str]) -> tuple[dict[str, Answer], set[str]]:
        """The answers known for ``keys``, and which of them the store gave (when it may serve them)."""
        found = self.known(keys)
        missing = [key for key in keys if key not in found] if found else keys
        if self.link is None or not missing or not self.trust.serves:
            return found, set()
        stored = await self.link.get_many(missing)
        self.scopes.copy(stored.items())
        found.update(stored)
        return found, set(stored)

    def put(self, key: str, answer: Answer) -> None:
        """As ``Scopes.put``: its own scope at once (``JournalError`` when it cannot), the store queued."""
        scopes, link = self.scopes, self.link
        kept = link is not None and scopes.to_store(answer)
        if link is not None and kept:
            link.put(key, answer)  # a store that is out keeps it for when it answers again
        if scopes.own is not None and (scopes.keeps_all or not kept or not (link and link.attached)):
            scopes.keep_own(key, answer)

    def _lost(self, answers: list[tuple[str, Answer]]) -> None:
        """Answers the store failed to keep: memory keeps them (a journal has them already)."""
        scopes = self.scopes
        if scopes.own is not None and not scopes.keeps_all:
            for key, answer in answers:
                scopes.keep_own(key, answer)

    async def take(self, key: str) -> Answer | bool:
        """At ``key``'s turn: its answer when kept (the store's when it may serve it: else the claim
        is taken without looking), True when this run now holds its claim (or no claims are kept),
        False when another run holds it."""
        if self.stored_claims:
            assert self.link is not None
            got = await self.link.take(key, self.trust.serves)
            if got is not None:
                if isinstance(got, Answer):
                    self.scopes.copy([(key, got)])
                return got
        own = self.scopes.own
        if not _claimer(own):
            return True  # no claims (none kept, or the store is out): it sends
        won = bool(own.claim(key))  # type: ignore[union-attr]
        if won and (known := self.known([key]).get(key)) is not None:  # its own scope's: a worker of its job's
            own.release(key)  # type: ignore[union-attr]
            return known
        return won

    async def look(self, keys: list[str]) -> tuple[dict[str, Answer], set[str]]:
        """For texts set aside, one read: the answers kept now (the store's when it may serve them: a
        text answered there is no longer held, and this run then takes a turn for it), and which
        others another run holds."""
        if self.stored_claims:
            assert self.link is not None
            got = await self.link.look(keys)
            if got is not None:
                stored, elsewhere = got if self.trust.serves else ({}, got[1])
                self.scopes.copy(stored.items())
                return stored, elsewhere
        found = self.known(keys)
        own = self.scopes.own
        if not _claimer(own):
            return found, set()
        held: set[str] = own.held_elsewhere([k for k in keys if k not in found])  # type: ignore[union-attr]
        return found, held

    def release(self, key: str) -> None:
        if self.stored_claims:
            assert self.link is not None
            self.link.release(key)
        own = self.scopes.own
        if _claimer(own):
            own.release(key)  # type: ignore[union-attr]

    async def renew(self, keys: Collection[str]) -> None:
        """This run's claims renewed: one call of the store, one of its own scope's claims."""
        if self.stored_claims and self.link is not None and self.link.attached:
            await self.link.renew(keys)
        own = self.scopes.own
        if _claimer(own):
            own.renew(keys)  # type: ignore[union-attr]

    async def wait_changed(self, timeout: float, wanted: Collection[str]) -> bool:
        """Until the store says something changed for ``wanted``, or ``timeout`` seconds (True: look)."""
        if self.stored_claims and self.link is not None and self.link.attached:
            return await self.link.wait_changed(timeout, wanted)
        await asyncio.sleep(timeout)
        return True

    async def aclose(self) -> None:
        if self.link is not None:
            await self.link.aclose()
