"""Answer stores: the protocol (``AnswerStore``, ``SharedAnswerStore`` with claims), answers in
this process's memory (``MemoryStore``; ``process_cache``, what a run without a journal keeps that no
store on disk keeps; ``shared_memory``, with claims, for the partitions of one process's job with
``store="none"``), and the scratch store of a streamed frame.

A ``SharedAnswerStore`` is used by several runs at once: at a request's turn on the pace, a run claims
it; another run that reaches it then sets it aside and waits for its answer instead of paying for it
again. A claim is a lease (``leases``): it lasts ``CLAIM_SECONDS`` and the run holding it renews it
every ``CLAIM_RENEW_SECONDS`` while it waits for the answer, so a run that died holds nothing for long.
An answer that arrives after its claim lapsed is still kept. The answer store every job shares is ``machine_store`` (SQLite, this machine)
or ``redis_store`` (the cluster); a run's scopes are ``scopes``; the output's journal is ``journal``.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Collection
from typing import Protocol

from ..service.errors import BatchsumError
from ..service.location import STORE, Location
from .leases import CLAIM_LOOK_FIRST as CLAIM_LOOK_FIRST
from .leases import CLAIM_LOOK_MOST as CLAIM_LOOK_MOST
from .leases import CLAIM_RENEW_SECONDS as CLAIM_RENEW_SECONDS
from .leases import CLAIM_SECONDS as CLAIM_SECONDS
from .leases import Leases as Leases
from .leases import claim_owner as claim_owner
from .leases import holder_is_gone as holder_is_gone
from .results import Answer

__all__ = [
    "AnswerStore",
    "SharedAnswerStore",
    "MemoryStore",
    "MemoryClaims",
    "process_cache",
    "shared_memory",
    "clear_process_caches",
    "scratch_store",
    "Leases",
    "claim_owner",
    "holder_is_gone",
    "CLAIM_SECONDS",
    "CLAIM_RENEW_SECONDS",
    "CLAIM_LOOK_FIRST",
    "CLAIM_LOOK_MOST",
    "LOOKUP_CHUNK",
    "REFUSAL_SECONDS",
    "StoreError",
]

log = logging.getLogger("batchsum")

LOOKUP_CHUNK = 500  # keys per query of a look-up in bulk (SQLite allows 999 parameters at the least)
# How long a job keeps its refusals in the answer store when it has no journal (a shared run's only
# scope): a refusal a retry could change (a 422 of a deployment) is asked again the next day.
REFUSAL_SECONDS = 86400


class StoreError(BatchsumError):
    """The answer store shared beyond a run's output (the machine's, the cluster's) cannot be opened
    or used: a run says so in one line and goes on with its own journal."""


class AnswerStore(Protocol):
    """Where finished answers are kept by fingerprint (``MemoryStore``, ``journal.Journal``)."""

    def get(self, key: str) -> Answer | None: ...

    def put(self, key: str, answer: Answer) -> None: ...


class SharedAnswerStore(AnswerStore, Protocol):
    """An answer store several runs use at once, with claims (see the module docstring)."""

    def claim(self, key: str) -> bool: ...

    def release(self, key: str) -> None: ...

    def renew(self, keys: Collection[str]) -> None:
        """Extend this run's claims on ``keys`` by ``CLAIM_SECONDS``."""

    def held_elsewhere(self, keys: Collection[str]) -> set[str]:
        """Which of ``keys`` another run holds now (a read)."""


class MemoryStore:
    """An in-process answer store (a dict), with when each answer was kept."""

    def __init__(self) -> None:
        self._answers: dict[str, Answer] = {}
        self._written: dict[str, float] = {}

    def get(self, key: str) -> Answer | None:
        return self._answers.get(key)

    def put(self, key: str, answer: Answer) -> None:
        self._answers[key] = answer
        self._written[key] = time.time()

    def get_many(self, keys: list[str], since: float | None = None) -> dict[str, Answer]:
        """The answers kept for ``keys``; ``since``: only those kept since then (``time.time()``)."""
        answers = self._answers
        if since is None:
            return {key: answers[key] for key in keys if key in answers}
        written = self._written
        return {key: answers[key] for key in keys if key in answers and written[key] >= since}

    def __len__(self) -> int:
        return len(self._answers)

    def items(self) -> list[tuple[str, Answer]]:
        return list(self._answers.items())

    def pop(self, key: str) -> Answer | None:
        self._written.pop(key, None)
        return self._answers.pop(key, None)


class MemoryClaims(MemoryStore):
    """Answers and claims in this process's memory, safe across threads (budget "none": one process,
    several partitions at once)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._claims: set[str] = set()

    def get(self, key: str) -> Answer | None:
        with self._lock:
            return super().get(key)

    def put(self, key: str, answer: Answer) -> None:
        with self._lock:
            super().put(key, answer)

    def get_many(self, keys: list[str], since: float | None = None) -> dict[str, Answer]:
        with self._lock:
            return super().get_many(keys, since)

    def claim(self, key: str) -> bool:
        with self._lock:
            if key in self._claims:
                return False
            self._claims.add(key)
            return True

    def release(self, key: str) -> None:
        with self._lock:
            self._claims.discard(key)

    def renew(self, keys: Collection[str]) -> None:
        """Nothing to renew: claims in memory die with their process."""

    def held_elsewhere(self, keys: Collection[str]) -> set[str]:
        """Which of ``keys`` a run holds (a run asks for texts it does not hold itself)."""
        with self._lock:
            return {key for key in keys if key in self._claims}


_lock = threading.Lock()
_caches: dict[str, MemoryStore] = {}  # by service, and store scope when a key's
_shared: dict[str, MemoryClaims] = {}


def process_cache(base_url: str, scope: str = "") -> MemoryStore:
    """The answers of every run in this process against ``base_url`` in the store scope ``scope``
    (``""``: every key's; a key's hash: that key's alone), as the store keeps them: calling the same
    thing again sends only what was not finished. Read by every run of the process, it is served as
    the store is (``scopes.Scopes``: ``shared_own``)."""
    with _lock:
        return _caches.setdefault(f"{scope}@{base_url}" if scope else base_url, MemoryStore())


def shared_memory(identity: str) -> MemoryClaims:
    """The answers and claims every run in this process with the key ``identity`` shares."""
    with _lock:
        return _shared.setdefault(identity, MemoryClaims())


_scratch: list[Location] = []


def scratch_store() -> Location:
    """An answer store for this process alone, on disk (``sqlite:///...``), removed when the process
    exits: what a streamed front-end (a Polars LazyFrame) keeps its answers in with ``store="none"``,
    so that memory stays bounded however many rows pass, frames collected together claim their
    texts, and a second collect pays for nothing again."""
    with _lock:
        if not _scratch:
            folder = tempfile.mkdtemp(prefix="batchsum-answers-")
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            _scratch.append(Location.at(os.path.join(folder, "answers.sqlite"), STORE))
        return _scratch[0]


def clear_process_caches() -> None:
    """Forget the answers kept in this process (journals on disk are untouched)."""
    with _lock:
        _caches.clear()
        _shared.clear()
