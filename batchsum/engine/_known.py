"""Rows that need no request, by text (``KnownTexts``): skipped with a reason or answered by the store,
each distinct text checked, fingerprinted and looked up once, within a bound on the texts kept."""

from __future__ import annotations

from ..data.results import SKIPPED, RowResult

__all__ = ["KnownTexts", "KNOWN_TEXT_BYTES"]

KNOWN_TEXT_BYTES = 32 << 20  # texts remembered with the result they need no request for (``KnownTexts``)


class KnownTexts:
    """Rows that need no request, by text: skipped with a reason, or answered by the store. A text
    that repeats (200,000 rows may hold 20,000 texts) is checked, fingerprinted and looked up once.
    Bounded by the texts' characters (``KNOWN_TEXT_BYTES``): the oldest are forgotten first."""

    __slots__ = ("rows", "size", "limit", "skips", "stored")

    def __init__(self, limit: int = KNOWN_TEXT_BYTES) -> None:
        self.rows: dict[str, RowResult] = {}
        self.size = 0
        self.limit = limit
        self.skips = 0  # skipped rows among them (not answers: not counted as reused)
        self.stored: set[str] = set()  # those the answer store shared beyond the run answered

    def put(self, text: str, result: RowResult, *, stored: bool = False) -> None:
        if text in self.rows:
            return
        self.rows[text] = result
        self.size += len(text)
        self.skips += result.status == SKIPPED
        if stored:
            self.stored.add(text)
        while self.size > self.limit:
            self.size -= len(text := next(iter(self.rows)))
            self.skips -= self.rows.pop(text).status == SKIPPED
            self.stored.discard(text)
