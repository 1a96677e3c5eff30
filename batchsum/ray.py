"""Ray Data: ``batchsum.ray.summarize(ds, "text", ...)`` (extra ``ray``).

``summarize`` is a transformation like Ray Data's own: it returns a ``ray.data.Dataset`` (every input
column, then the result columns) and sends nothing until the dataset is consumed. It is built on
``map_batches`` over Arrow batches with a pool of long-lived workers (actors, ``workers`` of them):
each actor keeps one run (``run.Run``, shared) open across the batches it is handed, against the
key's budget, so every worker together holds the plan's rate, not each worker alone as a per-worker
``qps`` would.
The rows come back in input order (batchsum asks Ray Data to keep it, on this dataset only).

The actors hold no CPU (``num_cpus=0``). They wait on the network: one actor's run keeps as many
requests in flight as the pace needs (rate x latency), whatever CPUs it was given, and a whole CPU
each held while waiting would starve the tasks that feed them: on ``ray.init(num_cpus=2)`` two actors
took both CPUs and a ``read_parquet`` task waited for one forever. With none held, the read (and
anything else in the pipeline) has every CPU of the cluster, however busy it is.

What is shared where, and what a dead worker costs. Answers go to the answer store every job shares:
with the machine budget (the default; a Ray on one machine), the machine's, in the user's cache
folder; with ``budget="redis://HOST:PORT/DB"`` (a Ray cluster), Redis. Each request is claimed before
it is sent, and a claim is a lease its run keeps alive: a worker that dies holds nothing for more
than ``stores.CLAIM_SECONDS`` (on its own machine, nothing at all), and the batch Ray retries in a
restarted actor reuses every answer that arrived, so a text is paid once across workers, batches,
retries and a dataset consumed twice. batchsum sets the actors' restarts and their tasks' retries
(``max_restarts``, ``max_task_retries``, unlimited) instead of relying on Ray's defaults.

The spec is checked and prepared once, on the driver, before anything is sent (the column, the
parameters, the budget: a machine or process budget is refused when the cluster has more than one
node); it travels to the actors pickled, with the key inside it as a ``Secret``, so no actor repr,
state-API record or log line holds the key. A row's failure is its record; a refused key or plan
(401) fails the job with the service's message. The run report (``report=``) is one file merged from
every actor's run (written when Ray shuts the actors down at the dataset's end), as on Dask: give a
path every worker can write (on one machine, any local path).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

try:
    import ray
    import ray.data
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("batchsum.ray needs Ray Data: pip install 'batchsum[ray]'") from exc
try:
    from ray.data._internal.execution.execution_callback import ExecutionCallback
except ImportError:  # pragma: no cover - a Ray Data that moved its hook: an actor's batch then runs to its end
    ExecutionCallback = object  # type: ignore[assignment,misc]

import pyarrow as pa

from .data.results import check_output_columns, with_results
from .run import job_stop
from .run.batches import OpenRun
from .run.logs import log
from .run.run import Workers, prepare_shared
from .run.spec import RunSpec, document_options
from .service import contract
from .service.errors import BudgetError, InputError, InvalidParameterError, JobStopped
from .service.location import Location
from .service.retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from .service.settings import DEFAULT_BUDGET_WAIT, DEFAULT_MAX_WAIT

__all__ = ["summarize", "DEFAULT_WORKERS", "DEFAULT_BATCH_ROWS"]

DEFAULT_WORKERS = 2
DEFAULT_BATCH_ROWS = 256


class _Summarize:
    """One actor of the map stage, long-lived: it keeps one shared run open (``batches.OpenRun``)
    and streams every Arrow batch it is handed through it, one batch at a time; the batch comes back
    with the result columns. One run per actor, whatever the calls in flight: the lock makes the run
    once and lets one batch through it at a time (Ray hands an actor more than one call at once). The
    run ends (its report written, to be merged) when Ray shuts the actor down, or when a stop (a
    refused key) ends it; a later batch then opens the next. Its repr (Ray's logs, the state API,
    the dashboard) is its name."""

    __name__ = "batchsum_summarize"

    def __init__(self, spec: RunSpec, column: str) -> None:
        self.spec = spec
        self.column = column
        self._run: OpenRun | None = None
        self._lock = threading.Lock()
        self._stopped: JobStopped | None = None  # the job's stop, once a run here heard it

    def __repr__(self) -> str:
        return self.__name__

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = batch.column(self.column).to_pylist()
        with self._lock:
            if self._stopped is not None:  # a batch that waited its turn here: an actor lives for one computation
                raise self._stopped.again()
            if self._run is None or self._run.ending:
                self._run = OpenRun(self.spec)
            try:
                results = self._run.summarize(texts, stop_when=_cancelled)
            except JobStopped as exc:
                self._stopped = exc
                raise
        return with_results(batch, results, self.spec.output_column)

    def close(self) -> None:
        """End the actor's run (its report written); what Ray Data does when it shuts the actor down."""
        with self._lock:
            if self._run is not None:
                self._run.close()

    def __del__(self) -> None:  # Ray Data deletes the UDF when it shuts the actor down gracefully
        self.close()


def _cancelled() -> JobStopped | None:
    """A stop when Ray cancelled the task this call runs in (``ray.cancel``; Ray Data cancels the
    tasks in flight when the dataset's consumption is interrupted or ends early): Ray cannot
    interrupt a threaded actor's task, it marks it cancelled, and the actor's run stops on it."""
    try:
        cancelled = ray.get_runtime_context().is_canceled()
    except RuntimeError:  # not in a task (a test calling the UDF itself)
        return None
    if not cancelled:
        return None
    return JobStopped(
        "the Ray task was cancelled (its job stopped: the dataset's consumption interrupted or cancelled); "
        "nothing new was sent, the answers on the wire were awaited and kept; the same job again sends only the rest"
    )


class _StopWhenFailed(ExecutionCallback):
    """Ray Data's hook on each execution of a dataset made from a batchsum one (it shares its
    context): when the execution fails (its consumer interrupted, Ctrl-C in ``take_all``, or an error),
    the driver posts the stop of the batchsum jobs in it, whose actors' batches Ray lets run to their
    end. An execution that succeeds, or one without a batchsum stage, posts nothing."""

    def after_execution_fails(self, executor: Any, error: Exception) -> None:
        specs = _jobs_in(executor)
        if specs:
            interrupted = isinstance(error, KeyboardInterrupt)
            why = (
                job_stop.INTERRUPTED if interrupted else f"the Ray dataset's execution failed ({type(error).__name__})"
            )
            job_stop.post_specs(specs, job_stop.cause(why))


def _jobs_in(executor: Any) -> list[RunSpec]:
    """The batchsum jobs among the execution's operators (each once), read from the logical operators
    Ray Data keeps on them; none when Ray Data keeps them elsewhere (then each actor's batch runs to
    its end, as Ray runs any)."""
    jobs: dict[str, RunSpec] = {}
    try:
        for operator in executor._topology:
            for logical in operator._logical_operators:
                args = getattr(logical, "fn_constructor_args", None) or ()
                if getattr(logical, "fn", None) is _Summarize and args and isinstance(args[0], RunSpec):
                    jobs[args[0].run_id or ""] = args[0]
    except (AttributeError, TypeError) as exc:  # Ray Data's internals moved: say so, stop nothing
        log.debug("batchsum: cannot read the jobs of a Ray execution: %s", exc)
    return list(jobs.values())


def _restarts() -> dict[str, Any]:
    """What batchsum relies on when a worker dies: the actor is restarted and its batch retried
    there (the batch's answers that arrived are reused), however often that happens."""
    return {"max_restarts": -1, "max_task_retries": -1}


def _workers(actors: int) -> Callable[[], Workers]:
    """The actors that send, and the live nodes of the Ray cluster (starting a local Ray, as Ray
    Data would, if none)."""

    def workers() -> Workers:
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=True)
        nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
        alive = sum(1 for node in nodes if node.get("Alive"))
        return Workers(actors, alive, f"this map stage runs {actors} worker processes")

    return workers


def _text_column(ds: ray.data.Dataset, column: str, output_column: str) -> None:
    schema = ds.schema()
    if schema is None:
        return  # an empty dataset: nothing to check, nothing will be sent
    names = list(schema.names)
    if column not in names:
        raise InputError(f"no column {column!r} in the dataset; its columns are: {', '.join(names)}")
    kind = schema.types[names.index(column)]
    if isinstance(kind, pa.DataType) and not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise InputError(f"column {column!r} holds {kind}, not text")
    check_output_columns(names, output_column)


@document_options
def summarize(
    ds: ray.data.Dataset,
    column: str,
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
    workers: int = DEFAULT_WORKERS,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> ray.data.Dataset:
    """A Ray Dataset: every column of ``ds``, then the result columns (``summary``,
    ``summary_status``, ``summary_error``, ``summary_message``, ``summary_http_status``,
    ``summary_attempts``, ``summary_requests``), rows in input order. Lazy: nothing is sent until the
    dataset is consumed (``take_all``, ``write_parquet``, ``iter_batches``...). ``workers``: how many
    actors send (all on the key's one budget; each holds no CPU and one run, across its batches);
    ``batch_rows``: rows per batch. Raises, before anything is sent: ``InputError`` (the column),
    ``InvalidParameterError``, ``ConfigurationError``, ``BudgetError``. ``limiter`` is refused (it
    cannot travel to a worker); ``max_requests`` and ``sample`` are refused (Ray hands rows out a
    batch at a time as workers free up, so a job's cap cannot be divided beforehand): cap or sample
    with the CLI or pandas. ``progress``: a bar per batch, in the worker's log."""
    spec = RunSpec.from_options(
        {name: value for name, value in locals().items() if name not in ("workers", "batch_rows")}
    ).replace(door="ray")
    for option, value in (("limiter", spec.limiter), ("max_requests", spec.max_requests), ("sample", spec.sample)):
        if value is not None:
            why = (
                "an object in this process cannot travel to the workers; the key's budget paces them all"
                if option == "limiter"
                else "Ray hands rows to the workers a batch at a time, so it cannot divide a job's "
                f"{option} beforehand; use the CLI or pandas for a capped or sampled run"
            )
            raise InvalidParameterError(f"invalid {option} on Ray: {why}")
    if not isinstance(spec.budget, Location):
        raise BudgetError(f"invalid budget {spec.budget!r}: on Ray, pass a string: 'machine', 'redis://HOST:PORT/DB'")
    for name, value in (("workers", workers), ("batch_rows", batch_rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidParameterError(f"invalid {name} {value!r}: a whole number of at least 1")
    _text_column(ds, column, spec.output_column)
    spec = prepare_shared(spec, _workers(workers))
    out = ds.map_batches(
        _Summarize,
        fn_constructor_args=(spec, column),
        batch_format="pyarrow",
        batch_size=batch_rows,
        zero_copy_batch=True,
        # Two calls at once in an actor: Ray prepares the next batch while one goes through the run.
        compute=ray.data.ActorPoolStrategy(size=workers, max_concurrent_calls_per_actor=2),
        ray_remote_args_fn=_restarts,
        num_cpus=0,  # waiting on the network holds no CPU: the read that feeds the actors has them all
    )
    # Rows in input order. Ray Data keeps the setting in the dataset's context, which a transformed
    # dataset shares with the one it came from: ``ds`` keeps its order from here on too.
    out.context.execution_options.preserve_order = True
    hooks = getattr(out.context, "custom_execution_callback_classes", None)
    if ExecutionCallback is not object and hooks is not None and _StopWhenFailed not in hooks:  # once a context
        hooks.append(_StopWhenFailed)
    return out
