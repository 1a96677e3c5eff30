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
the requests it would send, the rows already answered (by the answer store, as the keys would be
served it, or the journal), of those by the store, the duplicates, the rows it would skip, the least
seconds it takes at what the keys can do now (the run's ``share`` of each; a key whose quota is spent
adds nothing until its reset; a wait for a reset within ``max_wait`` included), and the requests it
sends before a quota stops it (NULL: none does), as a dry run says them (``run.preview``: the keys
read once, ``read_keys``; ``estimate``, ``forecast``).

A cancel stops the spending. DuckDB gives the function no way to learn that its query was
interrupted, and a chunk handed to it (2048 rows) runs to its end: so ``interrupt(con)`` stops the
runs on the connection first (nothing new starts, the answers on the wire are awaited and kept),
then calls ``con.interrupt()``. SIGINT (Ctrl-C, a notebook's stop) is heard while the main thread is
inside the query (``run.interrupts``: the process's wakeup fd, chained) and does the same for every
connection, once the main thread has heard it (``main_first``): the query raises one exception,
DuckDB's own, whichever it meets first (its wait's ``RuntimeError("Query interrupted")``, made of the
``KeyboardInterrupt``, or the function's ``InvalidInputException`` naming ``RunInterrupted``). A
query the stop ended before the main thread heard the signal raised DuckDB's
``InterruptException``, then Python's handler a ``KeyboardInterrupt`` into the caller's ``except``
block. With ``SET threads = 1`` DuckDB runs the function on the main thread, which gets the
``KeyboardInterrupt`` in it (an ``InvalidInputException`` naming it). No exception raised while a
query runs leaves DuckDB as a ``KeyboardInterrupt``.
"""

from __future__ import annotations

import atexit
import contextlib
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
from .run.batches import STOP_WAIT, OpenRun, RunEnded
from .run.interrupts import Hearing, listen, on_interrupt
from .run.preview import estimate, forecast, read_keys
from .run.spec import RunSpec, document_options
from .service import contract
from .service.errors import InvalidParameterError, RunCancelled, RunInterrupted
from .service.retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from .service.settings import DEFAULT_BUDGET_WAIT, DEFAULT_MAX_WAIT, check_name

__all__ = ["register", "interrupt", "Registration", "IDLE_SECONDS", "ESTIMATE_FIELDS"]

IDLE_SECONDS = 60.0  # a registration's run is closed after this long without a call
ESTIMATE_FIELDS = (
    "rows", "would_send", "already_answered", "from_store", "duplicates", "skipped", "least_seconds", "quota_stops_after",
)  # fmt: skip
_RUN_THREAD = "batchsum-run"  # the name of ``OpenRun``'s thread: a close asked there goes to another
_KEPT = "nothing new was sent, the answers on the wire were awaited and kept; the same query again sends only the rest"
_open: weakref.WeakSet[Registration] = weakref.WeakSet()
_hearing: list[Hearing] = []  # SIGINT heard stops the runs in a query (set up at the first registration)
_hearing_lock = threading.Lock()


class Registration:
    """One registration's run on one connection: opened at the first call, closed by ``close()``
    (the connection closed, ``IDLE_SECONDS`` without a call, Python exiting). Safe to call from
    DuckDB's threads at once; ``summarize`` is what the SQL function calls. ``stop(error)``: the
    run stopped now, every call in it raising ``error``, and no run opened until ``release()``."""

    def __init__(self, spec: RunSpec, name: str, connection: duckdb.DuckDBPyConnection | None = None) -> None:
        self.spec = spec
        self.name = name
        self.runs = 0  # runs opened so far (one per connection while calls keep coming)
        self._lock = threading.Lock()
        self._run: OpenRun | None = None
        self._calls = 0
        self._last = time.monotonic()
        self._idle = threading.Event()
        self._holds: list[RunCancelled] = []  # stops under way: a call now raises the first
        self._connection = weakref.ref(connection) if connection is not None else None
        _open.add(self)

    @property
    def connection(self) -> duckdb.DuckDBPyConnection | None:
        """The connection it is registered on, while it lives (the registration never keeps it)."""
        return self._connection() if self._connection is not None else None

    def summarize(self, texts: list[Any]) -> list[RowResult]:
        """One result per text, in order, through the registration's run (opened here if none is, or
        if the one there is ending: a quota spent, a stop). While a stop is under way, a call sends
        nothing and raises it."""
        if threading.current_thread() is threading.main_thread():
            listen()  # DuckDB calls the function on the main thread too: SIGINT heard from here on
        while True:
            with self._lock:
                if self._holds:
                    raise self._holds[0].again()
                if self._run is None or self._run.ending:
                    self._run = OpenRun(self.spec, shared=False)
                    self.runs += 1
                    self._idle = threading.Event()
                    threading.Thread(target=self._close_when_idle, args=(self._run, self._idle), daemon=True).start()
                run = self._run
                self._calls += 1
            try:
                return run.summarize(texts)
            except RunEnded:  # it ended between the look and the call: the next run (unless stopped)
                continue
            finally:
                with self._lock:
                    self._calls -= 1
                    self._last = time.monotonic()

    def stop(self, error: RunCancelled, *, busy: bool = False) -> OpenRun | None:
        """Stop the run now: nothing new starts in it, each call in it raises ``error`` once its
        answers on the wire are in (``OpenRun.stop``), and a call meanwhile raises it too, without
        opening a run, until ``release()``. ``busy``: only a run with a call in it (a run between
        queries stays open). The run stopped (``wait()`` for its end), if any."""
        with self._lock:
            self._holds.append(error)
            run = self._run if self._calls or not busy else None
        if run is not None:
            run.stop(error)
        return run

    def release(self) -> None:
        """A ``stop`` is over: the next call opens a new run."""
        with self._lock:
            if self._holds:
                self._holds.pop(0)

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
        run = self._run
        return f"Registration({self.name}, {'open' if run is not None and not run.closed else 'closed'})"


@atexit.register
def _close_all() -> None:
    for registration in list(_open):
        registration.close()


def _stop(registrations: list[Registration], error: RunCancelled, *, busy: bool = False) -> int:
    """Stop the runs of ``registrations`` (``busy``: those with a call in them), then interrupt their
    connections' queries (DuckDB starts no other chunk), and wait for the runs' ends (their answers
    on the wire in); calls during all that raise ``error``. How many runs were stopped."""
    runs = [registration.stop(error, busy=busy) for registration in registrations]
    try:
        for connection in {id(c): c for c in (r.connection for r in registrations) if c is not None}.values():
            with contextlib.suppress(duckdb.Error):  # closed already: no query to interrupt
                connection.interrupt()
        for run in runs:
            if run is not None:
                run.wait(STOP_WAIT)
    finally:
        for registration in registrations:
            registration.release()
    return sum(run is not None for run in runs)


def interrupt(con: duckdb.DuckDBPyConnection) -> int:
    """Stop the batchsum runs on ``con`` now, then interrupt its query (``con.interrupt()``): nothing
    new is sent from here on; the answers on the wire are awaited and kept (in the answer store and
    the journal), so the same query again sends only the rest; the query fails with
    ``RunCancelled`` (or DuckDB's "Interrupted!"). Returns once the runs have ended (their reports
    written), with how many there were. A bare ``con.interrupt()`` cannot reach the function:
    the chunks already handed to it (2048 rows each, one per DuckDB thread) run to their end. Safe
    from any thread (a notebook's stop button, a timer)."""
    registrations = [registration for registration in list(_open) if registration.connection is con]
    if not registrations:
        con.interrupt()
        return 0
    return _stop(registrations, RunCancelled("the query was cancelled (batchsum.duckdb.interrupt); " + _KEPT))


def _interrupted(error: RunInterrupted) -> None:
    """SIGINT heard while the main thread may be inside a query (``run.interrupts``): the runs with a
    call in them stop, and every registration's connection is interrupted (a query between two
    calls starts no other; a connection with none is left as it was)."""
    _stop(list(_open), error, busy=True)


def _hear_interrupts() -> None:
    """From the first registration on: SIGINT heard on the main thread's behalf (``listen``, when
    registered there) stops the runs in a query."""
    with _hearing_lock:
        if not _hearing:
            _hearing.append(on_interrupt(_interrupted, main_first=True))
    listen()


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
        keys = read_keys(spec)  # each key read once: what the store serves it, what it can do now
        plans = [estimate(spec, texts or [], keys) for texts in lists.to_pylist()]
        values = [
            [p.rows for p in plans],
            [p.to_send for p in plans],
            [p.known for p in plans],
            [p.known_store for p in plans],
            [p.duplicates for p in plans],
            [sum(p.skipped_by_reason.values()) for p in plans],
        ]
        arrays = [pa.array(v, pa.int64()) for v in values]
        projections = forecast(spec, plans, keys).projections  # seconds None: a limit not known yet
        arrays.append(pa.array([p.seconds for p in projections], pa.float64()))
        arrays.append(pa.array([p.sent if p.stops else None for p in projections], pa.int64()))
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
    store_scope: str = "service",
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
    spec = RunSpec.from_options(locals()).replace(door="duckdb")
    check_name("name", name)
    for option, value in (("max_requests", spec.max_requests), ("sample", spec.sample)):
        if value is not None:
            raise InvalidParameterError(
                f"invalid {option} on DuckDB: the function sees rows a chunk at a time, so it cannot hold a query's "
                f"{option}; use the CLI or pandas for a capped or sampled run"
            )
    if spec.store.none:  # DuckDB's threads share the run: its answers need claims, on disk as Polars'
        spec = spec.replace(store=scratch_store())
    registration = Registration(spec, name, con)
    _hear_interrupts()
    token = _Token()
    summarize, estimated = _functions(registration, token)
    weakref.finalize(token, registration.close)
    result = con.struct_type(
        {spec.output_column: "VARCHAR", "status": "VARCHAR", "error": "VARCHAR", "message": "VARCHAR"}
    )
    create: Any = con.create_function  # the UDF kinds by name: the same in every DuckDB since 1.1
    _remove_earlier(con, name)
    create(name, summarize, ["VARCHAR"], result, type="arrow", null_handling="special", side_effects=True)
    fields = {field: "DOUBLE" if field == "least_seconds" else "BIGINT" for field in ESTIMATE_FIELDS}
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
