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
import concurrent.futures
import contextlib
import queue
import threading
import warnings
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ..data.results import RowBlocks, RowResult, with_results
from ..service.errors import RequestCapReached, RunCancelled, RunInterrupted
from .background import BackgroundRun
from .run import Run
from .spec import RunSpec

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["BatchStream", "Frames", "ArrowFrames", "OpenRun", "RunEnded", "StopWhen", "AHEAD", "STOP_WAIT"]

AHEAD = 2  # finished batches that may wait for the caller
POLL_SECONDS = 0.1  # how often a call asks its ``stop_when`` while it waits
STOP_WAIT = 60.0  # at most this long for a stopped run's answers on the wire (the drain takes up to 15 s) and its close
_END = object()
B = TypeVar("B")
StopWhen = Callable[[], "RunCancelled | None"]  # a stop to make now (a task cancelled by its engine), or None


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
    stopped) cancels the run, which lets requests on the wire finish and keeps their answers.
    ``cancel(error)`` stops it from any thread the same way, and the stream raises ``error`` (its
    run report says so), also when its last rows came in meanwhile (a Polars collect's source cancels
    it when SIGINT is heard: ``interrupts``)."""

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
        self._cancelled: RunCancelled | None = None
        self._left = threading.Event()  # nobody takes what is handed back any more
        self._worker: BackgroundRun | None = None
        self._worker_cancelled = False  # once: a second cancel would cut the drain of the first short
        self._lock = threading.Lock()

    async def _texts(self) -> AsyncIterator[Any]:
        while True:
            batch = await asyncio.to_thread(next, self._batches, None)
            if batch is None:
                return
            texts = self._frames.texts(batch)
            self._waiting.append((batch, len(texts)))
            for text in texts:
                yield text

    def _put(self, item: Any) -> None:
        """Hand ``item`` to the caller, waiting for room while somebody still takes them (a thread
        blocked here for good would hold the run's loop open at its end)."""
        while not self._left.is_set():
            try:
                self._done.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    async def _hand_back(self, item: Any) -> None:
        await asyncio.to_thread(self._put, item)

    async def _hand_back_done(self, results: list[RowResult]) -> list[RowResult]:
        """Hand back, in order, every batch read whose rows all have their results (an empty batch
        keeps its place); the results not handed back yet."""
        while self._waiting and len(results) >= self._waiting[0][1]:
            batch, rows = self._waiting.popleft()
            done, results = results[:rows], results[rows:]
            await self._hand_back(self._frames.with_results(batch, done))
        return results

    async def _stream(self, run: Run) -> None:
        results: list[RowResult] = []
        try:
            async for result in run.stream(self._texts()):
                results.append(result)
                results = await self._hand_back_done(results)
            await self._hand_back_done(results)  # empty batches at the end
        except asyncio.CancelledError:
            if self._cancelled is None:
                raise
            task: Any = asyncio.current_task()
            if hasattr(
                task, "uncancel"
            ):  # Python 3.11+: the cancel is the stop's now, and the run closes as after any stop
                task.uncancel()
            raise self._cancelled.again() from None

    async def _run(self) -> None:
        try:
            async with Run(self.spec, shared=self.shared) as run:
                await self._stream(run)
        except RequestCapReached as exc:
            warnings.warn(f"{exc}; call it again to continue (answers are kept)", RuntimeWarning, stacklevel=2)
        await self._hand_back(_END)

    def cancel(self, error: RunCancelled) -> None:
        """Stop the run now, from any thread: nothing new starts, the answers on the wire are awaited
        and kept (this returns once they are, or after ``STOP_WAIT``), and the stream raises
        ``error``."""
        with self._lock:
            if self._cancelled is None:
                self._cancelled = error
        worker = self._cancel_worker()
        if worker is not None:
            worker.wait(STOP_WAIT)

    def _cancel_worker(self) -> BackgroundRun | None:
        """The run's worker, cancelled (once, whoever asks first), if it has started."""
        with self._lock:
            worker = self._worker
            if worker is None or self._worker_cancelled:
                return worker
            self._worker_cancelled = True
        worker.cancel()
        return worker

    def _raise_end(self, worker: BackgroundRun) -> None:
        """What ended the run, raised here: the stop that cancelled it (rather than ``CancelledError``),
        also when the run ended on its own as it was stopped."""
        with contextlib.suppress(asyncio.CancelledError) if self._cancelled else contextlib.nullcontext():
            worker.result()
        if self._cancelled is not None:
            raise self._cancelled.again() from None

    def __iter__(self) -> Iterator[B]:
        worker = BackgroundRun(self._run)
        with self._lock:
            self._worker = worker
            cancelled = self._cancelled is not None
        if cancelled:  # cancelled before it started: it starts nothing
            self._cancel_worker()
        try:
            while True:
                try:
                    item = self._done.get(timeout=0.1)
                except queue.Empty:
                    if worker.wait(0):
                        self._raise_end(worker)
                        return
                    continue
                if item is _END:
                    worker.wait()
                    self._raise_end(worker)
                    return
                yield item
        finally:
            self._left.set()
            if not worker.wait(0):
                self._cancel_worker()
                worker.wait()  # requests on the wire finish and are kept


class _LoopThread:
    """An event loop running on a thread of its own (named ``batchsum-run``), for coroutines
    submitted from any other thread; ``end()`` stops it, joins its thread and closes it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="batchsum-run", daemon=True)
        self.thread.start()

    def submit(self, coroutine: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call(self, coroutine: Any) -> Any:
        return self.submit(coroutine).result()

    def cancel(self, tasks: set[asyncio.Task[Any]]) -> None:
        """Cancel, on the loop, each task in ``tasks`` then (a set only the loop changes)."""
        self.loop.call_soon_threadsafe(lambda: [task.cancel() for task in list(tasks)])

    def end(self) -> None:
        """What is left on the loop (a claim's renewal whose cancel is still to be delivered)
        cancelled and awaited, as ``asyncio.run`` does; then the loop stopped and closed."""
        if not self.loop.is_closed() and self.thread.is_alive():
            self.call(_cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


async def _cancel_the_rest() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class RunEnded(RuntimeError):
    """A call came to an ``OpenRun`` that had ended already: open the next."""


class OpenRun:
    """One run kept open on its own event loop thread across calls: ``summarize(texts)`` streams a
    batch through it and returns its results, in order, from any number of threads at once;
    ``close()`` ends it (its report, claims, connections). The pace, the connections, the budget and
    the key's record stay with the run from one batch to the next. What stops the run (``stopped``)
    ends it once the last call in it returns: no call is left waiting on a closed loop. ``stop(error)``
    stops every call in it at once (each raises ``error`` once its answers on the wire are in), as an
    interrupt in a calling thread does. A run that cannot be opened (a budget out of reach) raises
    here, leaving no thread or event loop behind."""

    def __init__(self, spec: RunSpec, *, shared: bool = True, total: int | None = None) -> None:
        self._loop = _LoopThread()
        self._run = Run(spec, shared=shared, total=total)  # ``total``: all the rows it will get (a sample needs it)
        self._growing = total is None  # the total grows with each call's rows
        try:
            self._loop.call(self._run.__aenter__())  # a run that fails to open has closed what it opened
        except BaseException:
            self._loop.end()  # and leaves no thread or loop behind
            raise
        self.closed = False
        self.stopped: BaseException | None = None  # what ended the run: no call starts in it from then on
        self._calls = 0  # calls in the run now
        self._guard = threading.Lock()
        self._streams: set[asyncio.Task[Any]] = set()  # the calls' streams, on the loop
        self._ended = threading.Event()  # set once the run is closed

    @property
    def ending(self) -> bool:
        """Closed, or stopped and closing once its last call returns: the next call opens a new run."""
        return self.closed or self.stopped is not None

    async def _stream(self, texts: list[Any] | RowBlocks) -> tuple[list[RowResult], RequestCapReached | None]:
        if self.stopped is not None:  # stopped before this call reached the loop: it sends nothing
            raise asyncio.CancelledError
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        stats = self._run.stats
        if self._growing:
            stats.total = (stats.total or 0) + len(texts)  # the rows handed over so far (the bar's length)
        results: list[RowResult] = []
        try:
            async for result in self._run.stream(texts):
                results.append(result)
        except RequestCapReached as exc:  # every row has its record (the unsent ones ``not_sent``)
            return results, exc
        finally:
            self._streams.discard(task)
        return results, None

    def summarize(self, texts: list[Any] | RowBlocks, *, stop_when: StopWhen | None = None) -> list[RowResult]:
        """One result per text, in order. What stops the run (a refused key, a full disk, ``stop``)
        ends it (its report written, its bar closed) and is raised; a quota spent (or the request cap)
        ends it too, and the rows come back, the unsent ones ``not_sent``, with a ``RuntimeWarning``,
        as from every frame front-end (the next call opens the next run, which sends only if a quota
        reset since). ``stop_when``: asked before the call starts and every ``POLL_SECONDS`` while it
        waits; a stop it returns (the engine cancelled the task this call runs in) stops the run as
        ``stop`` does. ``RunEnded`` when the run had ended before the call."""
        with self._guard:
            if self.ending:
                raise RunEnded("the run has ended: open the next")
            self._calls += 1
        try:
            if stop_when is not None and (early := stop_when()) is not None:
                self.stop(early)  # this call starts nothing
            results: list[RowResult]
            stop: RequestCapReached | None
            results, stop = self._result(self._loop.submit(self._stream(texts)), stop_when)
        except BaseException as exc:
            self._leave(exc)
            raise
        self._leave(stop)
        if stop is not None:
            warnings.warn(f"{stop}; call it again to continue (answers are kept)", RuntimeWarning, stacklevel=2)
        return results

    def _result(self, future: concurrent.futures.Future[Any], stop_when: StopWhen | None) -> Any:
        """A call's outcome: a stop's cancel raised as the stop; an interrupt in this thread stops
        the whole run, waits for its answers on the wire (a second interrupt leaves at once), and
        is raised again."""
        try:
            while True:
                try:
                    return future.result(timeout=None if stop_when is None else POLL_SECONDS)
                except concurrent.futures.TimeoutError:
                    assert stop_when is not None
                    if (error := stop_when()) is not None:
                        self.stop(error)
                        stop_when = None  # from now on, wait for the stop's end
        except (concurrent.futures.CancelledError, asyncio.CancelledError):
            if isinstance(self.stopped, RunCancelled):
                raise self.stopped.again() from None
            raise
        except KeyboardInterrupt:
            self.stop(RunInterrupted())
            concurrent.futures.wait([future], STOP_WAIT)
            raise

    def stop(self, error: RunCancelled) -> None:
        """Stop the run now, from any thread but its own: nothing new starts in any call; each call
        raises ``error`` once its answers on the wire are in (kept in the journal and the store), and
        the last one closes the run (now, when none is in it). ``wait()`` for the end."""
        with self._guard:
            if self.closed:
                return
            if self.stopped is None:
                self.stopped = error
            idle = not self._calls
        if idle:
            self.close(self.stopped)
        else:
            self._loop.cancel(self._streams)

    def wait(self, timeout: float | None = None) -> bool:
        """True once the run is closed (after ``stop``: once its answers on the wire are in)."""
        return self._ended.wait(timeout)

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
        """End the run (``error``: what stopped it, for its report). A stopped run with calls still
        in it is closed by the last of them: this waits for that (up to ``STOP_WAIT``)."""
        with self._guard:
            stopping = self.stopped is not None and self._calls > 0
        if stopping and self._ended.wait(STOP_WAIT):
            return
        with self._guard:
            if self.closed:
                return
            self.closed = True
        try:
            self._loop.call(
                self._run.__aexit__(type(error) if error else None, error, error.__traceback__ if error else None)
            )
        except Exception:  # noqa: BLE001 - the stop that ended it was raised already
            pass
        finally:
            self._loop.end()
            self._ended.set()
