"""``ddf.batchsum`` and ``dseries.batchsum``: summarize a text column of a Dask DataFrame, registered
with Dask's accessor API by ``import batchsum.dask`` (extra ``dask``).

``ddf.batchsum.summarize("text", ..., budget="redis://...")`` returns a lazy Dask DataFrame: every
column plus the result columns, same partitions, index and divisions. Each partition is one run
(``run.Run``, shared) on the worker that computes it, against the key's shared rate budget, so all
workers together hold the plan's rate. Answers are shared through the answer store every job shares
(Redis with a ``redis://`` budget, the machine's otherwise; ``store=`` names another): an identical
text in another partition is sent once (the first to claim it sends, the others wait for its
answer), and a rerun after a worker or the whole cluster died, or another job, pays for nothing
already answered.

Everything that can be refused is checked when ``summarize`` is called, before anything is sent:
parameters, the column, the budget (reachable, usable by every worker), the key.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
from collections.abc import Hashable
from typing import Any
from urllib.parse import urlsplit

try:
    import dask.dataframe as dd
    from dask.callbacks import Callback
    from dask.dataframe.extensions import register_dataframe_accessor, register_series_accessor
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("batchsum.dask needs Dask: pip install 'batchsum[dask]'") from exc

import pandas as pd

from ._frame_accessor import ColumnSummarize, ValuesSummarize
from .data.results import check_columns, column_blocks, join_results, results_frame
from .run.batches import OpenRun, StopWhen
from .run.interrupts import listen, on_interrupt
from .run.run import Workers, prepare_shared
from .run.spec import RunSpec
from .service.errors import BudgetError, InvalidParameterError, JobStopped, RunCancelled, RunInterrupted
from .service.location import Location

__all__ = ["DaskDataFrameAccessor", "DaskSeriesAccessor"]


def _partition(
    part: pd.DataFrame | pd.Series,
    spec: RunSpec,
    column: Hashable | None,
    partitions: int = 1,
    partition_info: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """One partition, on the worker: a shared run over its texts, the results joined back. The
    job's request cap and sample are divided among the partitions; a partition that reaches its
    part of the cap returns every row (the unsent ones ``failed`` with ``not_sent``), as the CLI's
    output does, and its run report says the run stopped. It stops when the compute that runs it is
    given up: on a worker, its task cancelled; on the local scheduler, the compute's wait left
    without its result (``_Compute``)."""
    texts = column_blocks(part if isinstance(part, pd.Series) else part[column])
    number = partition_info["number"] if partition_info else 0
    run = OpenRun(spec.portion(partitions, number), total=len(texts))
    cancelled = _cancelled()
    compute = _Compute.current.get() if cancelled is None else None
    try:
        with compute.hearing(run) if compute is not None else contextlib.nullcontext():
            results = run.summarize(texts, stop_when=cancelled or (compute.stop if compute is not None else None))
    finally:
        run.close()  # its report written (a stopped run is closed already)
    if isinstance(part, pd.Series):
        return results_frame(results, part.index, spec.output_column)
    return join_results(part, results, spec.output_column)


def _cancelled() -> StopWhen | None:
    """On a Dask worker, what tells the partition's run that the scheduler cancelled its task (its
    future cancelled or released: the compute interrupted, the client gone): the task goes on
    running (Dask cannot interrupt it), marked ``cancelled``. None elsewhere (the local scheduler)."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):  # not on a worker
        return None
    key = worker.get_current_task()

    def stop_when() -> JobStopped | None:
        task = worker.state.tasks.get(key)
        if task is not None and task.state not in ("cancelled", "released", "forgotten"):
            return None
        return JobStopped(
            "the Dask task was cancelled (its job stopped: the compute interrupted or cancelled, its client "
            "gone); nothing new was sent, the answers on the wire were awaited and kept; the same job again "
            "sends only the rest"
        )

    return stop_when


class _Compute:
    """A compute on Dask's local scheduler (threads, in this process), as the partitions it runs see
    it. Dask cannot stop the partitions a compute left running when its caller's wait ended without
    the result (Ctrl-C in ``compute``, a failed partition): ``ended`` then says why, and each of its
    partitions' runs stops on it. A compute is named to its partitions by a context variable, which
    Dask's local threads take from the thread that submits them (a compute in another thread, or in
    the background, is another compute: an interrupt of this one leaves it be). The main thread's
    compute also stops on SIGINT as soon as it is heard (``run.interrupts``): its wait may not hear it
    (Polars, once imported, has an untimed wait go on through a signal)."""

    current: contextvars.ContextVar[_Compute | None] = contextvars.ContextVar("batchsum_dask_compute", default=None)

    def __init__(self, main_waits: bool) -> None:
        self.main_waits = main_waits
        self.ended: RunCancelled | None = None

    def stop(self) -> RunCancelled | None:
        return self.ended

    def hearing(self, run: OpenRun) -> contextlib.AbstractContextManager[Any]:
        """While a partition's ``run`` runs: SIGINT heard stops it, for the main thread's compute."""
        return on_interrupt(run.stop) if self.main_waits else contextlib.nullcontext()


class _LocalComputes(Callback):
    """Dask's local schedulers' hook: each compute named to the partitions it runs (``_Compute``)
    from its start, and ended with its caller's wait. Both calls come on the caller's thread, the end
    from the scheduler's ``finally`` (the interrupt or the error in hand). Dask hands its global
    callbacks to the outermost compute and holds none meanwhile: a compute started then in another
    thread would run without this hook, and, ending last, would put back the empty set. So each start
    puts the hook back (``hook``), and every summarize does too."""

    def __init__(self) -> None:
        super().__init__()
        self._open = threading.local()  # this thread's computes under way, innermost last

    def hook(self) -> None:
        Callback.active.add(self._callback)

    def _start(self, dsk: Any) -> None:
        self.hook()
        compute = _Compute(main_waits=listen())  # True on the main thread, listening from now on
        stack = self._open.__dict__.setdefault("stack", [])
        stack.append((compute, _Compute.current.set(compute)))

    def _finish(self, dsk: Any, state: Any, failed: bool) -> None:
        compute, token = self._open.stack.pop()
        _Compute.current.reset(token)
        if failed:
            error = sys.exc_info()[1]
            compute.ended = (
                RunInterrupted()
                if isinstance(error, KeyboardInterrupt)
                else RunCancelled(
                    f"the Dask compute failed ({type(error).__name__}): nothing new was sent in this partition, the "
                    "answers on the wire were awaited and kept; the same compute again sends only the rest"
                )
            )


_LOCAL_COMPUTES = _LocalComputes()


def _workers() -> Workers | None:
    """The worker processes of the distributed client in use and their hosts; None without one
    (threads or processes of the local scheduler: partitions then run on this machine)."""
    try:
        from distributed import get_client
    except ImportError:
        return None
    try:
        client = get_client()
    except ValueError:
        return None
    addresses = list(client.scheduler_info(n_workers=-1)["workers"])
    hosts = {urlsplit(address).hostname for address in addresses}
    return Workers(
        len(addresses), len(hosts), f"this Dask cluster runs partitions in {len(addresses)} worker processes"
    )


class _Accessor:
    """A Dask DataFrame's or Series' texts in, a lazy frame out: every partition one shared run on
    the worker that computes it, against the key's budget. The spec is checked and prepared once,
    here on the client, before anything is sent: the budget must be one every worker shares
    ("machine" for workers on this machine, "redis://HOST:PORT/DB" for several machines, "none" for
    one worker process only), and answers are shared through its store (a journal beside the machine
    budget, Redis, memory) unless ``journal`` names one. ``progress``: a bar per partition, where the
    worker runs it. ``limiter`` is refused: an object in this process cannot travel to a worker."""

    door = "dask"

    def __init__(self, data: dd.DataFrame | dd.Series) -> None:
        self._data = data

    def _summarize(self, column: Hashable, spec: RunSpec) -> dd.DataFrame:
        data = self._data
        if column is not None:
            check_columns(data.columns, column, spec.output_column)
        if spec.limiter is not None:
            raise InvalidParameterError(
                "invalid limiter on Dask: an object in this process cannot travel to the workers; "
                "the key's budget paces them all (budget='machine' or 'redis://...')"
            )
        if not isinstance(spec.budget, Location):
            raise BudgetError(
                f"invalid budget {spec.budget!r}: on Dask, pass a string: 'machine', 'redis://HOST:PORT/DB'"
            )
        spec = prepare_shared(spec, _workers)
        _LOCAL_COMPUTES.hook()  # a compute given up on the local scheduler stops its partitions
        if column is None:
            meta = results_frame([], data._meta.index, spec.output_column)
        else:
            meta = join_results(data._meta, [], spec.output_column)
        return data.map_partitions(_partition, spec, column, data.npartitions, meta=meta, align_dataframes=False)


class DaskDataFrameAccessor(_Accessor, ColumnSummarize[dd.DataFrame]):
    """``ddf.batchsum.summarize("text", ...)``: a lazy Dask DataFrame, every column plus the result
    columns, same partitions, index and divisions. Nothing is sent until it is computed
    (``compute()``, ``to_parquet(...)``)."""


class DaskSeriesAccessor(_Accessor, ValuesSummarize[dd.DataFrame]):
    """``dseries.batchsum.summarize(...)``: the result columns as a lazy Dask DataFrame."""


register_dataframe_accessor("batchsum")(DaskDataFrameAccessor)
register_series_accessor("batchsum")(DaskSeriesAccessor)
