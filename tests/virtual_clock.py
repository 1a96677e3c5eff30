"""A virtual clock for asyncio code that takes ``clock`` and ``sleep``: time moves only when every
task is waiting, straight to the next wake-up. Deterministic and instant."""

from __future__ import annotations

import asyncio
import heapq
import itertools


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + seconds, next(self._order), future))
        await future

    async def run(self, main):
        """Run ``main`` (a coroutine), advancing time whenever nothing else can run."""
        task = asyncio.ensure_future(main)
        while not task.done():
            for _ in range(20):  # let every runnable task reach its next wait
                await asyncio.sleep(0)
            if task.done():
                break
            while self._sleepers and self._sleepers[0][2].cancelled():
                heapq.heappop(self._sleepers)
            if not self._sleepers:
                continue
            wake, _, future = heapq.heappop(self._sleepers)
            self.now = max(self.now, wake)
            future.set_result(None)
        return task.result()
