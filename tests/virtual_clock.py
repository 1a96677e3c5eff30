"""An asyncio event loop on virtual time: ``loop.time()`` moves only when every task waits, straight
to the next timer. Everything that reads the loop's clock (``asyncio.sleep``, ``wait_for``, call_later,
aiolimiter) runs deterministically and at once. No real I/O may be awaited on it."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _VirtualSelector(selectors.DefaultSelector):
    """Polls real file descriptors without blocking; a wait turns into a jump of the virtual clock."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or self.loop is None:
            return events
        if timeout is None:
            raise RuntimeError("deadlock on virtual time: every task waits and no timer is set")
        if not self.loop._ready:
            # Nothing runnable: time passes, at least a nanosecond, as a real clock's would (a timer
            # set an ulp ahead, as aiolimiter's float arithmetic can, must still come due).
            self.loop.now += max(timeout, 1e-9)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self.now = 0.0

    def time(self) -> float:
        return self.now


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on virtual time."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
