"""The rows between reading and yielding, in input order (``Window``), bounded in rows and bytes; what
each holds (``Pending``: a result, a known answer or its task; ``Known``: rows needing no request)."""

from __future__ import annotations

import asyncio
from collections import deque

from ..data.results import Answer, RowResult

__all__ = ["Known", "Pending", "Window", "as_row"]

# A row in the window: its result, a known answer, or the task that gives either.
Pending = RowResult | Answer | asyncio.Task[Answer] | asyncio.Task[RowResult]
# Rows that needed no request (known or skipped), held and yielded together.
Known = list[RowResult]


def as_row(value: RowResult | Answer) -> RowResult:
    """A row's result, from a known answer or as it is."""
    return value.row() if isinstance(value, Answer) else value


class Window:
    """The rows between reading and yielding, in input order, and the bytes they hold: reading waits
    while either is at its bound (one item always fits, however large)."""

    __slots__ = ("items", "_sizes", "rows", "nbytes", "max_rows", "max_bytes")

    def __init__(self, max_rows: int, max_bytes: int) -> None:
        self.items: deque[Pending | Known] = deque()
        self._sizes: deque[tuple[int, int]] = deque()
        self.rows = self.nbytes = 0
        self.max_rows, self.max_bytes = max_rows, max_bytes

    def has_room(self) -> bool:
        return not self.items or (self.rows < self.max_rows and self.nbytes < self.max_bytes)

    def add(self, item: Pending | Known, rows: int, nbytes: int) -> None:
        self.items.append(item)
        self._sizes.append((rows, nbytes))
        self.rows += rows
        self.nbytes += nbytes

    def pop(self) -> Pending | Known:
        rows, nbytes = self._sizes.popleft()
        self.rows -= rows
        self.nbytes -= nbytes
        return self.items.popleft()
