"""DuckDB: ``batchsum.duckdb.register(con, ...)`` registers the SQL functions ``batchsum_summarize(text)``
and ``batchsum_estimate(list(text))`` on a connection (extra ``duckdb``).

``batchsum_summarize(text)`` returns a struct ``(summary, status, error, message)`` for each row, so
that no failure is a silent NULL: ``status`` is ``ok``, ``skipped`` or ``failed``, ``error`` its code
and ``message`` the service's words (or ours). The options are fixed when it is registered (another
name, or a second registration, for other parameters; a second registration under a name replaces
the first). It is an Arrow-vectorized function registered
with side effects (never folded into a constant when the query is planned), and DuckDB may call it
from several of its threads at once: every call goes to the registration's one run on this
connection (``run.Run`` on a thread of its own, ``batches.OpenRun``), opened at the first call and
closed when the connection is closed (or the function is let go), after ``IDLE_SECONDS`` without a
call, or when Python exits; its report (``report=``) is written then. The run goes through the key's
budget and the answer store, like every run: a query run again pays for nothing, and the same texts
in two threads' chunks are claimed, not paid twice (with ``store="none"``, the run's answers go to a
store on disk of this process's own, removed at exit, whose claims do the same: ``scratch_store``).

``batchsum_estimate(list(text))`` says what a query would send, sending nothing: a struct of the rows,
the requests it would send, the rows already answered (by the answer store or the journal), of those
by the store, the duplicates, the rows it would skip, and the least seconds it takes at the pace.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from typing import Any

try:
    import duckdb
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("batchsum.duckdb needs DuckDB: pip install 'batchsum[duckdb]'") from exc

import pyarrow as pa

from .data.results import RowResult
from .data.stores import scratch_store
from .run.batches import OpenRun, RunEnded
from .run.preview import estimate, summed_rate
from .run.spec import RunSpec, document_options
from .service import contract
from .service.errors import InvalidParameterError
from .service.retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from .service.settings import DEFAULT_BUDGET_WAIT, DEFAULT_MAX_WAIT, check_name

__all__ = ["register", "Registration", "IDLE_SECONDS", "ESTIMATE_FIELDS"]

IDLE_SECONDS = 60.0  # a registration's run is closed after this long without a call
ESTIMATE_FIELDS = ("rows", "would_send", "already_answered", "from_store", "duplicates", "skipped", "least_seconds")
_RUN_THREAD = "batchsum-run"  # the name of ``OpenRun``'s thread: a close asked there goes to another
_open: weakref.WeakSet[Registration] = weakref.WeakSet()


class Registration:
    """One registration's run on one connection: opened at the first call, closed by ``close()``
    (the connection closed, ``IDLE_SECONDS`` without a call, Python exiting). Safe to call from
    DuckDB's threads at once; ``summarize`` is what the SQL function calls."""

    def __init__(self, spec: RunSpec, name: str) -> None:
        self.spec = spec
        self.name = name
        self.runs = 0  # runs opened so far (one per connection while calls keep coming)
        self._lock = threading.Lock()
        self._run: OpenRun | None = None
        self._calls = 0
        self._last = time.monotonic()
        self._idle = threading.Event()
        _open.add(self)

    def summarize(self, texts: list[Any]) -> list[RowResult]:
        """One result per text, in order, through the registration's run (opened here if none is, or
        if the one there is ending: a quota spent, a stop)."""
        while True:
            with self._lock:
                if self._run is None or self._run.ending:
                    self._run = OpenRun(self.spec, shared=False)
                    self.runs += 1
                    self._idle = threading.Event()
                    threading.Thread(target=self._close_when_idle, args=(self._run, self._idle), daemon=True).start()
                run = self._run
                self._calls += 1
            try:
                return run.summarize(texts)
            except RunEnded:  # it ended between the look and the call: the next run
                continue
            finally:
                with self._lock:
                    self._calls -= 1
                    self._last = time.monotonic()

    def _close_when_idle(self, run: OpenRun, stop: threading.Event) -> None:
        while not stop.wait(min(1.0, IDLE_SECONDS / 4)):
            with self._lock:
                idle = self._run is run and not self._calls and time.monotonic() - self._last >= IDLE_SECONDS
                if idle:
                    self._run = None
            if idle:
                run.close()
                return

    def close(self) -> None:
        """End the run (its report written, its claims released); the next call opens another."""
        with self._lock:
            run, self._run = self._run, None
            self._idle.set()
        if run is None:
            return
        if threading.current_thread().name == _RUN_THREAD:  # let go on the run's own thread: close from another
            threading.Thread(target=run.close, name="batchsum-close").start()
        else:
            run.close()

    def __repr__(self) -> str:
        return f"Registration({self.name}, {'open' if self._run is not None else 'closed'})"


@atexit.register
def _close_all() -> None:
    for registration in list(_open):
        registration.close()


def _struct(results: list[RowResult], summary: str) -> pa.StructArray:
    columns = list(zip(*results)) if results else [(), (), (), ()]
    return pa.StructArray.from_arrays(
        [pa.array(columns[i], pa.string()) for i in range(4)], names=[summary, "status", "error", "message"]
    )


def _estimate_name(name: str) -> str:
    return name.removesuffix("_summarize") + "_estimate" if name.endswith("_summarize") else f"{name}_estimate"


class _Token:
    """Held only by the registered functions: when DuckDB lets them go (the connection closed, the
    function removed), the run closes."""


def _functions(registration: Registration, token: _Token) -> tuple[Any, Any]:
    """The SQL functions' bodies, over Arrow arrays; they hold ``token`` and never the connection."""
    spec = registration.spec

    def summarize(texts: pa.Array | pa.ChunkedArray) -> pa.StructArray:
        assert token is not None
        return _struct(registration.summarize(texts.to_pylist()), spec.output_column)

    def estimated(lists: pa.Array | pa.ChunkedArray) -> pa.StructArray:
        assert token is not None
        plans = [estimate(spec, texts or []) for texts in lists.to_pylist()]
        values = [
            [p.rows for p in plans],
            [p.to_send for p in plans],
            [p.known for p in plans],
            [p.known_store for p in plans],
            [p.duplicates for p in plans],
            [sum(p.skipped_by_reason.values()) for p in plans],
        ]
        arrays = [pa.array(v, pa.int64()) for v in values]
        rate, first = summed_rate(spec), max(1, len(spec.keys))  # None under auto: not known yet
        least = [None if rate is None else p.minimum_seconds(rate, first) for p in plans]
        arrays.append(pa.array(least, pa.float64()))
        return pa.StructArray.from_arrays(arrays, names=list(ESTIMATE_FIELDS))

    return summarize, estimated


def _remove_earlier(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """A second registration under a name replaces the first (DuckDB holds one function a name):
    the earlier functions are removed, and their run closes once DuckDB lets them go."""
    for function in (name, _estimate_name(name)):
        try:
            con.remove_function(function)
        except duckdb.InvalidInputException:  # none by that name yet
            pass


@document_options
def register(
    con: duckdb.DuckDBPyConnection,
    name: str = "batchsum_summarize",
    mode: Any = 1,
    percentage: Any = contract.PERCENTAGE_DEFAULT,
    type: Any = None,
    *,
    output_column: str = "summary",
    api_key: str | list[str] | None = None,
    base_url: str | None = None,
    local: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    max_retries: int = DEFAULT_MAX_RETRIES,
    encoding: str = "json",
    rpm: float | None = None,
    concurrency: int | None = None,
    limiter: Any = None,
    budget: Any = None,
    journal: str | os.PathLike[str] | None = None,
    store: str | None = None,
    refresh: bool = False,
    progress: bool = True,
    long_texts: str = "skip",
    max_wait: float = DEFAULT_MAX_WAIT,
    budget_wait: float = DEFAULT_BUDGET_WAIT,
    max_requests: int | None = None,
    sample: int | None = None,
    share: float = 1.0,
    report: str | os.PathLike[str] | None = None,
    keys: str | os.PathLike[str] | None = None,
    quota: str | None = None,
) -> Registration:
    """Register ``name(text)`` on ``con`` with the options fixed here, and its estimate
    (``batchsum_estimate`` for the default name, else ``NAME_estimate``):
    ``SELECT id, s.summary, s.status FROM (SELECT id, batchsum_summarize(text) AS s FROM tickets)``
    (a subquery calls it once per row; ``batchsum_summarize(text).summary`` beside
    ``batchsum_summarize(text).status`` calls it twice, the second answered by the store). The struct
    is ``(summary, status, error, message)``, the first field named by ``output_column``. A refused
    key or plan (401) fails the query with the service's message; other failures are rows. Raises,
    before anything is sent: ``InvalidParameterError``, ``ConfigurationError``, ``BudgetError``.
    ``max_requests`` and ``sample`` are refused: DuckDB hands the function its rows a chunk at a
    time, so it cannot hold a query's cap or spread a sample. Registering a name again replaces its
    functions (and ends the earlier run). Returns the ``Registration`` (its run: ``close()`` ends it
    before the connection does)."""
    spec = RunSpec.from_options(locals())
    check_name("name", name)
    for option, value in (("max_requests", spec.max_requests), ("sample", spec.sample)):
        if value is not None:
            raise InvalidParameterError(
                f"invalid {option} on DuckDB: the function sees rows a chunk at a time, so it cannot hold a query's "
                f"{option}; use the CLI or pandas for a capped or sampled run"
            )
    if spec.store == "none":  # DuckDB's threads share the run: its answers need claims, on disk as Polars'
        spec = spec.replace(store=scratch_store())
    registration = Registration(spec, name)
    token = _Token()
    summarize, estimated = _functions(registration, token)
    weakref.finalize(token, registration.close)
    result = con.struct_type(
        {spec.output_column: "VARCHAR", "status": "VARCHAR", "error": "VARCHAR", "message": "VARCHAR"}
    )
    create: Any = con.create_function  # the UDF kinds by name: the same in every DuckDB since 1.1
    _remove_earlier(con, name)
    create(name, summarize, ["VARCHAR"], result, type="arrow", null_handling="special", side_effects=True)
    fields = {field: "BIGINT" for field in ESTIMATE_FIELDS[:-1]} | {ESTIMATE_FIELDS[-1]: "DOUBLE"}
    create(
        _estimate_name(name),
        estimated,
        [con.list_type("VARCHAR")],
        con.struct_type(fields),
        type="arrow",
        null_handling="special",
        side_effects=True,
    )
    return registration
