"""Batches through one run, for a synchronous caller: ``BatchStream`` (a caller that hands batches
over as an iterator and wants them back as they finish: a Spark task's Arrow batches, a Polars sink's
frames) and ``OpenRun`` (a caller that calls once per batch and keeps the run open between calls: a
Ray actor).

The run (``run.Run``) lives on its own event loop in a worker thread (``background``); it reads the
caller's batches as its window has room, and hands each batch back with its results as soon as its
last row is done. At most ``AHEAD`` finished batches wait for the caller, and the engine's window
bounds the rows in between, so memory stays bounded however large the partition is.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import warnings
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ..data.results import RowResult, with_results
from ..service.errors import RequestCapReached
from .background import BackgroundRun
from .run import Run
from .spec import RunSpec

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["BatchStream", "Frames", "ArrowFrames", "OpenRun", "AHEAD"]

AHEAD = 2  # finished batches that may wait for the caller
_END = object()
B = TypeVar("B")


class Frames(Protocol[B]):
    """What ``BatchStream`` asks of a caller's batches: the texts of its rows, in order, and the batch
    with its rows' results appended."""

    def texts(self, batch: B) -> list[Any]: ...

    def with_results(self, batch: B, results: list[RowResult]) -> B: ...


class ArrowFrames:
    """Arrow record batches (or tables): the texts of ``column``, the result columns appended."""

    def __init__(self, column: str, output_column: str) -> None:
        self.column, self.output_column = column, output_column

    def texts(self, batch: pa.RecordBatch) -> list[Any]:
        texts: list[Any] = batch.column(self.column).to_pylist()
        return texts

    def with_results(self, batch: pa.RecordBatch, results: list[RowResult]) -> pa.RecordBatch:
        return with_results(batch, results, self.output_column)


class BatchStream(Generic[B]):
    """``for batch in BatchStream(spec, batches, column): ...``: each of ``batches`` (Arrow record
    batches, or what ``frames`` reads) with the result columns appended, in order, from one shared
    run over their ``column``. At the request cap every row still has its record and a
    ``RuntimeWarning`` says so (as the frame front-ends do). Closing the stream early (the caller
    stopped) cancels the run, which lets requests on the wire finish and keeps their answers."""

    def __init__(
        self,
        spec: RunSpec,
        batches: Iterator[B],
        column: str,
        *,
        shared: bool = True,
        frames: Frames[B] | None = None,
    ) -> None:
        self.spec = spec
        self.column = column
        self.shared = shared
        self._frames: Frames[Any] = frames if frames is not None else ArrowFrames(column, spec.output_column)
        self._batches = batches
        self._done: queue.Queue[Any] = queue.Queue(maxsize=AHEAD)
        self._waiting: deque[tuple[B, int]] = deque()  # read, not yet handed back (with its rows)

    async def _texts(self) -> AsyncIterator[Any]:
        while True:
            batch = await asyncio.to_thread(next, self._batches, None)
            if batch is None:
                return
            texts = self._frames.texts(batch)
            self._waiting.append((batch, len(texts)))
            for text in texts:
                yield text

    async def _hand_back(self, item: Any) -> None:
        await asyncio.to_thread(self._done.put, item)

    async def _hand_back_done(self, results: list[RowResult]) -> list[RowResult]:
        """Hand back, in order, every batch read whose rows all have their results (an empty batch
        keeps its place); the results not handed back yet."""
        while self._waiting and len(results) >= self._waiting[0][1]:
            batch, rows = self._waiting.popleft()
            done, results = results[:rows], results[rows:]
            await self._hand_back(self._frames.with_results(batch, done))
        return results

    async def _run(self) -> None:
        results: list[RowResult] = []
        try:
            async with Run(self.spec, shared=self.shared) as run:
                async for result in run.stream(self._texts()):
                    results.append(result)
                    results = await self._hand_back_done(results)
                await self._hand_back_done(results)  # empty batches at the end
        except RequestCapReached as exc:
            warnings.warn(f"{exc}; call it again to continue (answers are kept)", RuntimeWarning, stacklevel=2)
        await self._hand_back(_END)

    def __iter__(self) -> Iterator[B]:
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


class RunEnded(RuntimeError):
    """A call came to an ``OpenRun`` that had ended already: open the next."""


class OpenRun:
    """One run kept open on its own event loop thread across calls: ``summarize(texts)`` streams a
    batch through it and returns its results, in order, from any number of threads at once;
    ``close()`` ends the run (its report, its claims, its connections). The pace, the client's
    connections, the budget and the key's record stay with the run from one batch to the next, as
    they would in one long run. What stops the run (``stopped``) ends it once the last call in it
    returns: a call on another thread is never left waiting on a closed loop. A run that cannot be
    opened (a budget out of reach) raises here, leaving no thread or event loop behind."""

    def __init__(self, spec: RunSpec, *, shared: bool = True) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="batchsum-run", daemon=True)
        self._thread.start()
        self._run = Run(spec, shared=shared)
        try:
            self._call(self._run.__aenter__())  # a run that fails to open has closed what it opened
        except BaseException:
            self._stop_loop()  # and leaves no thread or loop behind
            raise
        self.closed = False
        self.stopped: BaseException | None = None  # what ended the run: no call starts in it from then on
        self._calls = 0  # calls in the run now
        self._guard = threading.Lock()

    @property
    def ending(self) -> bool:
        """Closed, or stopped and closing once its last call returns: the next call opens a new run."""
        return self.closed or self.stopped is not None

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _stream(self, texts: list[Any]) -> tuple[list[RowResult], RequestCapReached | None]:
        stats = self._run.stats
        stats.total = (stats.total or 0) + len(texts)  # the rows handed over so far (the bar's length)
        results: list[RowResult] = []
        try:
            async for result in self._run.stream(texts):
                results.append(result)
        except RequestCapReached as exc:  # every row has its record (the unsent ones ``not_sent``)
            return results, exc
        return results, None

    def summarize(self, texts: list[Any]) -> list[RowResult]:
        """One result per text, in order. What stops the run (a refused key, a full disk) ends it
        (its report written, its bar closed) and is raised; a quota spent (or the request cap) ends
        it too, and the rows come back, the unsent ones ``not_sent``, with a ``RuntimeWarning``, as
        from every frame front-end (the next call opens the next run, which sends only if a quota
        reset since). ``RunEnded`` when the run had ended before the call."""
        with self._guard:
            if self.ending:
                raise RunEnded("the run has ended: open the next")
            self._calls += 1
        try:
            results: list[RowResult]
            stop: RequestCapReached | None
            results, stop = self._call(self._stream(texts))
        except BaseException as exc:
            self._leave(exc)
            raise
        self._leave(stop)
        if stop is not None:
            warnings.warn(f"{stop}; call it again to continue (answers are kept)", RuntimeWarning, stacklevel=2)
        return results

    def _leave(self, stop: BaseException | None) -> None:
        """A call returns (``stop``: what ended the run in it, if anything); the last call in a
        stopped run closes it."""
        with self._guard:
            self._calls -= 1
            if stop is not None and self.stopped is None:
                self.stopped = stop
            last = self.stopped is not None and not self._calls
        if last:
            self.close(self.stopped)

    def close(self, error: BaseException | None = None) -> None:
        """End the run (``error``: what stopped it, for its report)."""
        with self._guard:
            if self.closed:
                return
            self.closed = True
        try:
            self._call(
                self._run.__aexit__(type(error) if error else None, error, error.__traceback__ if error else None)
            )
        except Exception:  # noqa: BLE001 - the stop that ended it was raised already
            pass
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        """The run's loop stopped, its thread joined, the loop closed."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()
