"""A run's answers in their two scopes (``Scopes``): its own (the output's journal, or this process's
memory when it has none) and the answer store shared beyond it (the machine's, the cluster's), which
``open_store`` opens from what ``store=`` names."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from ..service.settings import store_kind
from .results import OK, Answer
from .stores import AnswerStore, StoreError

__all__ = ["Scopes", "open_store", "look_at_store", "store_path"]

log = logging.getLogger("batchsum")


def open_store(where: str, service: str, identity: str | None = None, job: str | None = None) -> Any:
    """The answer store ``where`` names (``service.settings.store_spec``) for ``service``'s answers:
    ``machine`` (the user's cache folder), ``sqlite:///PATH``, a Redis URL (the cluster's; the old
    answers of the key ``identity`` are taken in the first time), or None for ``none``. ``job``: a
    job whose only scope the store is (a shared run with no journal): its refusals are kept there
    too, for itself and for a day. ``StoreError`` when it cannot be opened."""
    kind = store_kind(where)
    if kind == "none":
        return None
    if kind == "redis":
        from .redis_store import RedisStore

        cluster = RedisStore(where, service, job=job)
        try:
            if identity is not None:
                cluster.take_in_old(identity)
        except StoreError:
            cluster.close()
            raise
        return cluster
    from .machine_store import MachineStore
    from .store_upkeep import keep_up

    path = store_path(where)
    store = MachineStore(path, service, job=job)
    try:
        keep_up(path, store.connection)  # the old stores taken in before anything is looked up; pruning when due
    except BaseException:
        store.close()
        raise
    return store


def store_path(where: str) -> Path:
    """The file of a machine's store ``where`` names (``machine``, ``sqlite:///PATH``)."""
    from .machine_store import default_store_path

    return default_store_path() if where == "machine" else Path(where[len("sqlite://") :])


def look_at_store(where: str, service: str) -> Any:
    """The answer store ``where`` names, to look only (a dry run): nothing is made or written; None
    when it is ``none`` or not made yet. ``StoreError`` when it cannot be read."""
    kind = store_kind(where)
    if kind == "none":
        return None
    if kind == "redis":
        from .redis_store import RedisStore

        return RedisStore(where, service)
    from .machine_store import MachineStore

    path = store_path(where)
    return MachineStore(path, service, readonly=True) if path.exists() else None


class Scopes:
    """A run's answers: its own (``own``: the output's journal, or this process's memory for a run with
    none; ``keeps_all``: a journal keeps every answer, memory only what no store on disk keeps) and
    the store shared beyond it (``store``: None for none). Looked up in that order, the store's
    answers copied into a journal; a summary goes to both, a refusal to its own scope only (with no
    own scope, a shared run's, to the store, which keeps it for the job alone and a day). Claims
    are the store's when it has some, else its own's (a shared journal). ``refresh``: nothing written
    before ``started`` (the run's start, or its job's; default: now) is looked up, so every request
    is sent again and its answer replaces the stored one; what was written since (this run's own
    answers, another's while it ran) answers as always, so a text is paid for once in the run.

    A store that fails (a full disk, Redis gone) is said once and left: the run goes on with its own
    scope. Its own scope's failures are the run's (``JournalError``: the run stops)."""

    def __init__(
        self,
        own: AnswerStore | None,
        store: Any = None,
        *,
        keeps_all: bool = True,
        refresh: bool = False,
        started: float | None = None,
    ) -> None:
        self.own = own
        self.store = store
        self.keeps_all = keeps_all
        self.refresh = refresh
        # Under refresh, answers written before this (``time.time()``) are not looked up.
        self.since = (time.time() if started is None else started) if refresh else None
        self.where = getattr(store, "where", None)

    @property
    def claims(self) -> bool:
        return self._claimer is not None

    @property
    def _claimer(self) -> Any:
        for scope in (self.store, self.own):
            if scope is not None and getattr(scope, "claims", callable(getattr(scope, "claim", None))):
                return scope
        return None

    def _failed(self, exc: BaseException) -> None:
        """The store is left for the rest of the run, said once."""
        if self.store is None:
            return
        log.warning(
            "batchsum: the answer store %s failed (%s): this run goes on with its own answers alone",
            self.where,
            exc,
            extra={"event": "store", "fields": {"where": self.where}},
        )
        store, self.store = self.store, None
        try:
            store.close()
        except Exception:  # noqa: BLE001 - it failed already
            pass

    def lookup(self, keys: list[str]) -> tuple[dict[str, Answer], set[str]]:
        """The answers known for ``keys``, and which of them the store gave (not its own scope)."""
        since = self.since
        found: dict[str, Answer] = {}
        if self.own is not None:
            many = getattr(self.own, "get_many", None)
            if many is not None:
                found = many(keys) if since is None else many(keys, since)
            elif since is None:  # a store that cannot say when it kept an answer: nothing of it under refresh
                found = {k: a for k in keys if (a := self.own.get(k)) is not None}
        missing = [key for key in keys if key not in found] if found else keys
        if self.store is None or not missing:
            return found, set()
        try:
            stored: dict[str, Answer] = self.store.get_many(missing, since)
        except Exception as exc:  # noqa: BLE001 - a store is a help, never a stop
            self._failed(exc)
            return found, set()
        if stored and self.keeps_all and self.own is not None:
            self._copy(stored.items())
        found.update(stored)
        return found, set(stored)

    def _copy(self, answers: Iterable[tuple[str, Answer]]) -> None:
        """The store's answers into the journal, which then holds every answer of its output."""
        put_many = getattr(self.own, "put_many", None)
        if put_many is not None:
            put_many(list(answers))
        else:
            for key, answer in answers:
                self.own.put(key, answer)  # type: ignore[union-attr]

    def get_many(self, keys: list[str]) -> dict[str, Answer]:
        return self.lookup(keys)[0]

    def get(self, key: str) -> Answer | None:
        return self.lookup([key])[0].get(key)

    def put(self, key: str, answer: Answer) -> None:
        """``answer`` kept: in the run's own scope (memory: only when no store keeps it) and, a
        summary, in the store; a refusal goes to the store only when the run has no own scope."""
        kept = False
        if self.store is not None and (answer.status == OK or self.own is None):
            try:
                self.store.put(key, answer)
                kept = True
            except Exception as exc:  # noqa: BLE001 - a store is a help, never a stop
                self._failed(exc)
        if self.own is not None and (self.keeps_all or not kept):
            self.own.put(key, answer)

    def claim(self, key: str) -> bool:
        """Claimed by this run in the store's claims, else its own scope's; no claims: True (it sends)."""
        won = self._on_claimer(lambda claimer: claimer.claim(key), again=True)
        return True if won is None else bool(won)

    def release(self, key: str) -> None:
        self._on_claimer(lambda claimer: claimer.release(key))

    def renew(self, keys: Collection[str]) -> None:
        self._on_claimer(lambda claimer: claimer.renew(keys))

    def _on_claimer(self, call: Callable[[Any], Any], *, again: bool = False) -> Any:
        """``call`` on who holds the claims, and what it gave (None: no one does); a store that fails
        is left (``again``: ``call`` then goes to its own scope's claims, if any). Its own scope's
        failures are the run's."""
        while (claimer := self._claimer) is not None:
            try:
                return call(claimer)
            except Exception as exc:
                if claimer is not self.store:
                    raise
                self._failed(exc)
                if not again:
                    return None
        return None

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
