"""Arrow batches through one run, for a synchronous caller that hands them over one at a time and
wants them back as they finish (a Spark task, a Polars streaming sink): ``BatchStream``.

The run (``run.Run``) lives on its own event loop in a worker thread (``_background``); it reads the
caller's batches as its window has room, and hands each batch back with its results as soon as its
last row is done. At most ``AHEAD`` finished batches wait for the caller, and the engine's window
bounds the rows in between, so memory stays bounded however large the partition is.
"""

from __future__ import annotations

import asyncio
import queue
import warnings
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pyarrow as pa

from ._background import BackgroundRun
from .errors import RequestCapReached
from .options import RunSpec
from .results import RowResult, arrow_columns, result_columns
from .run import Run

__all__ = ["BatchStream", "AHEAD"]

AHEAD = 2  # finished batches that may wait for the caller
_END = object()


class BatchStream:
    """``for batch in BatchStream(spec, batches, column): ...``: each of ``batches`` (Arrow record
    batches) with the result columns appended, in order, from one shared run over their ``column``.
    At the request cap every row still has its record and a ``RuntimeWarning`` says so (as the frame
    front-ends do). Closing the stream early (the caller stopped) cancels the run, which lets
    requests on the wire finish and keeps their answers."""

    def __init__(self, spec: RunSpec, batches: Iterator[pa.RecordBatch], column: str, *, shared: bool = True) -> None:
        self.spec = spec
        self.column = column
        self.shared = shared
        self._batches = batches
        self._done: queue.Queue[Any] = queue.Queue(maxsize=AHEAD)
        self._waiting: deque[pa.RecordBatch] = deque()  # read, not yet handed back

    async def _texts(self) -> AsyncIterator[Any]:
        while True:
            batch = await asyncio.to_thread(next, self._batches, None)
            if batch is None:
                return
            self._waiting.append(batch)
            for text in batch.column(self.column).to_pylist():
                yield text

    async def _hand_back(self, item: Any) -> None:
        await asyncio.to_thread(self._done.put, item)

    async def _run(self) -> None:
        names = result_columns(self.spec.output_column)
        mine: list[RowResult] = []
        try:
            async with Run(self.spec, shared=self.shared) as run:
                async for result in run.stream(self._texts()):
                    mine.append(result)
                    while self._waiting and len(mine) >= self._waiting[0].num_rows:
                        batch = self._waiting.popleft()
                        done, mine = mine[: batch.num_rows], mine[batch.num_rows :]
                        arrays = batch.columns + arrow_columns(done)
                        await self._hand_back(pa.RecordBatch.from_arrays(arrays, names=batch.schema.names + names))
                while self._waiting and self._waiting[0].num_rows == 0:  # empty batches keep their place
                    batch = self._waiting.popleft()
                    arrays = batch.columns + arrow_columns([])
                    await self._hand_back(pa.RecordBatch.from_arrays(arrays, names=batch.schema.names + names))
        except RequestCapReached as exc:
            warnings.warn(f"{exc}; call it again to continue (answers are kept)", RuntimeWarning, stacklevel=2)
        await self._hand_back(_END)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        worker = BackgroundRun(self._run)
        try:
            while True:
                try:
                    item = self._done.get(timeout=0.1)
                except queue.Empty:
                    if worker.wait(0):
                        worker.result()  # raises what ended the run
                        return
                    continue
                if item is _END:
                    worker.wait()
                    worker.result()
                    return
                yield item
        finally:
            if not worker.wait(0):
                worker.cancel()
                while not worker.wait(0.1):  # requests on the wire finish and are kept
                    try:
                        self._done.get_nowait()  # let a hand-back waiting for room return
                    except queue.Empty:
                        pass
