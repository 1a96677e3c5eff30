"""Answer stores: where finished answers are kept by request fingerprint, and claims.

``MemoryStore`` keeps them in this process (``process_cache`` gives the one every notebook call
with the same service shares). A ``SharedAnswerStore`` is used by several runs at once (Dask
partitions on many workers): before sending, a run claims the request; the others wait for its
answer instead of paying for it again; a claim expires on its own (``CLAIM_SECONDS``), so a run that
died holds nothing for long. The SQLite journal and the Redis store are in ``journal.py``.
"""

from __future__ import annotations

import threading
from typing import Protocol

from .results import Answer

__all__ = [
    "AnswerStore",
    "SharedAnswerStore",
    "MemoryStore",
    "MemoryClaims",
    "process_cache",
    "shared_memory",
    "clear_process_caches",
    "CLAIM_SECONDS",
    "CLAIM_POLL_SECONDS",
]

CLAIM_SECONDS = 600.0  # longer than any request with its retries and pauses
CLAIM_POLL_SECONDS = 0.5


class AnswerStore(Protocol):
    """Where finished answers are kept by fingerprint (``MemoryStore``, ``journal.Journal``)."""

    def get(self, key: str) -> Answer | None: ...

    def put(self, key: str, answer: Answer) -> None: ...


class SharedAnswerStore(AnswerStore, Protocol):
    """An answer store several runs use at once, with claims (see the module docstring)."""

    def claim(self, key: str) -> bool: ...

    def release(self, key: str) -> None: ...


class MemoryStore:
    """An in-process answer store (a dict)."""

    def __init__(self) -> None:
        self._answers: dict[str, Answer] = {}

    def get(self, key: str) -> Answer | None:
        return self._answers.get(key)

    def put(self, key: str, answer: Answer) -> None:
        self._answers[key] = answer

    def get_many(self, keys: list[str]) -> dict[str, Answer]:
        answers = self._answers
        return {key: answers[key] for key in keys if key in answers}

    def __len__(self) -> int:
        return len(self._answers)

    def items(self) -> list[tuple[str, Answer]]:
        return list(self._answers.items())

    def pop(self, key: str) -> Answer | None:
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

    def get_many(self, keys: list[str]) -> dict[str, Answer]:
        with self._lock:
            return super().get_many(keys)

    def claim(self, key: str) -> bool:
        with self._lock:
            if key in self._claims:
                return False
            self._claims.add(key)
            return True

    def release(self, key: str) -> None:
        with self._lock:
            self._claims.discard(key)


_lock = threading.Lock()
_caches: dict[str, MemoryStore] = {}
_shared: dict[str, MemoryClaims] = {}


def process_cache(base_url: str) -> MemoryStore:
    """The answers of every run in this process against ``base_url`` (calling the same thing again
    sends only what was not finished)."""
    with _lock:
        return _caches.setdefault(base_url, MemoryStore())


def shared_memory(identity: str) -> MemoryClaims:
    """The answers and claims every run in this process with the key ``identity`` shares."""
    with _lock:
        return _shared.setdefault(identity, MemoryClaims())


def clear_process_caches() -> None:
    """Forget the answers kept in this process (journals on disk are untouched)."""
    with _lock:
        _caches.clear()
        _shared.clear()
