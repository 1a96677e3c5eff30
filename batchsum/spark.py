"""Spark: ``batchsum.spark.summarize(sdf, "text", ...)`` and a SQL function, ``batchsum.spark.register(spark)``
(extra ``spark``; Spark needs Java 17).

``summarize`` is a transformation like any other: it returns a Spark DataFrame (every input column,
then the result columns as ``string`` / ``int``) and sends nothing until an action runs. It is built on
Arrow (``mapInArrow``): each partition is one run (``run.Run``, shared) on the executor that computes
it, against the key's budget, so every executor together holds the plan's rate. The spec is checked
and prepared once, on the driver, before anything is sent; it travels to the executors pickled, with
the key inside it as a ``Secret``: no query plan, task description, log or error shows the key.

What is shared where. Answers go to the answer store every job shares: with the machine budget (the
default; local mode, or every executor on one machine), the machine's, in the user's cache folder;
with ``budget="redis://HOST:PORT/DB"`` (a cluster), Redis. A request is claimed before it is sent, and
another task asking for it waits for the answer instead of paying for it; so a task Spark runs again
(a failure, speculation, a lost executor) pays nothing for what the first attempt was answered.

A row's failure is its record; a refused key or plan (401) fails the job with the service's message.
Spark starts its Python workers with ``python3`` from the PATH unless ``PYSPARK_PYTHON`` names an
interpreter: set it to the one batchsum is installed in (its pyarrow is needed there too).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "batchsum.spark needs PySpark: pip install 'batchsum[spark]' (and Java 17: apt-get install openjdk-17-jre-headless)"
    ) from exc

import pandas as pd
import pyarrow as pa

from .data.results import RowResult, check_output_columns, result_columns, results_frame
from .run import job_stop
from .run.background import run_in_worker
from .run.batches import BatchStream
from .run.run import Workers, prepare_shared, run_texts
from .run.spec import RunSpec, document_options
from .service import contract
from .service.errors import BudgetError, ConfigurationError, InputError, InvalidParameterError
from .service.location import Location
from .service.retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from .service.settings import DEFAULT_BUDGET_WAIT, DEFAULT_MAX_WAIT

__all__ = ["summarize", "register", "result_schema"]

_TYPES = [T.StringType()] * 4 + [T.IntegerType()] * 3
WATCH_SECONDS = 0.5  # how often the driver asks Spark which jobs run (a cancelled one posts its stop)


def result_schema(output_column: str = "summary") -> T.StructType:
    """The result columns as Spark types: string x4, int x3."""
    return T.StructType([T.StructField(name, t, True) for name, t in zip(result_columns(output_column), _TYPES)])


def _worker_spec(spec: RunSpec, spark: SparkSession) -> RunSpec:
    """The spec every task opens, checked and prepared once, on the driver (the executors' Python
    too: it must import batchsum); the job kept by the context's ``_Watch``, for its stop."""
    if spec.limiter is not None:
        raise InvalidParameterError(
            "invalid limiter on Spark: an object in this process cannot travel to the executors; "
            "the key's budget paces them all (budget='machine' or 'redis://...')"
        )
    if not isinstance(spec.budget, Location):
        raise BudgetError(f"invalid budget {spec.budget!r}: on Spark, pass a string: 'machine', 'redis://HOST:PORT/DB'")
    _check_executors(spark)
    spec = prepare_shared(spec, _workers(spark))
    _Watch.of(spark.sparkContext).jobs[spec.run_id or ""] = spec
    return spec


class _Watch:
    """The driver's side of a job's stop on Spark, one per application: a thread asks the status
    tracker every ``WATCH_SECONDS`` which Spark jobs run. When one ends failed (cancelled:
    ``sc.cancelAllJobs()``, a job group cancelled, Ctrl-C, whose handler PySpark installs to cancel
    every job, the UI's kill; or failed) and no other runs, it posts the stop of the batchsum jobs
    prepared on this context that have runs on their keys now (``job_stop.post_specs``; one finished is
    left be): their tasks' runs stop on their next budget call, before Spark kills their Python workers
    (2-4 s after the cancel), and keep what is on the wire. With another Spark job running it cannot
    tell whose tasks were cancelled, and posts nothing: Spark's kill stops the spending then, losing
    what the killed workers had on the wire."""

    _watches: dict[str, _Watch] = {}
    _made = threading.Lock()

    def __init__(self, context: Any) -> None:
        self.jobs: dict[str, RunSpec] = {}  # run id -> the spec of each batchsum job prepared on this context
        self._tracker = context.statusTracker()
        threading.Thread(target=self._watch, name="batchsum-spark-watch", daemon=True).start()

    @classmethod
    def of(cls, context: Any) -> _Watch:
        with cls._made:
            watch = cls._watches.get(context.applicationId)
            if watch is None:
                watch = cls._watches[context.applicationId] = cls(context)
            return watch

    def _watch(self) -> None:
        running: set[int] = set()
        while True:
            time.sleep(WATCH_SECONDS)
            try:
                now = set(self._tracker.getActiveJobsIds())
                ended = [self._tracker.getJobInfo(job) for job in running - now]
            except Exception:  # noqa: BLE001 - the context stopped: nothing left to watch
                return
            if not now and any(info is not None and info.status == "FAILED" for info in ended):
                why = job_stop.cause("the Spark job was cancelled or failed")
                job_stop.post_specs(list(self.jobs.values()), why, running_only=True)
            running = now


def _results(spec: RunSpec, texts: list[Any]) -> list[RowResult]:
    return run_in_worker(lambda: run_texts(spec, texts, shared=True, warn_at_cap=True))


class _Partition:
    """What runs on an executor for one partition (``mapInArrow``): one shared run over the texts of
    its batches, each batch handed back with the result columns as soon as its rows are done
    (``batches.BatchStream``: a Python worker's memory is bounded however large the partition).
    Its repr (query plans, the SQL tab, stage descriptions) names the run, never the key."""

    __name__ = "batchsum_summarize"

    def __init__(self, spec: RunSpec, column: str, partitions: int) -> None:
        self.spec = spec
        self.column = column
        self.partitions = partitions

    def __repr__(self) -> str:
        return f"{self.__name__}({self.column}, {_pace(self.spec)})"

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        number = context.partitionId() if context is not None else 0
        yield from BatchStream(self.spec.portion(self.partitions, number), batches, self.column)


def _pace(spec: RunSpec) -> str:
    if spec.auto:
        return f"rpm auto up to {spec.rpm:g}/min"
    return f"{spec.rpm:g}/min" if spec.rpm else "no pacing"


_IMPORT_CHECKED: set[str] = set()


def _check_executors(spark: SparkSession) -> None:
    """Can the executors' Python import batchsum? Asked once per Spark application, by a one-row job,
    before anything is sent; refused in one line instead of a Py4J stack at the first action."""
    context = spark.sparkContext
    if context.applicationId in _IMPORT_CHECKED:
        return
    context.setJobDescription("batchsum: can the executors' Python import batchsum?")
    try:
        context.parallelize([0], 1).map(_import_batchsum).collect()
    except Exception as exc:  # noqa: BLE001 - a Py4J error wrapping the worker's: said in one line
        python = context.pythonExec or "python3"  # PYSPARK_PYTHON, as the context read it
        why = str(exc).strip().splitlines()
        reason = next((line.strip() for line in reversed(why) if "Error" in line), why[-1] if why else repr(exc))
        raise ConfigurationError(
            f"the Spark executors' Python ({python}) cannot import batchsum ({reason[:200]}): install batchsum "
            "there (pip install 'batchsum[spark]') or set PYSPARK_PYTHON to an interpreter that has it"
        ) from None
    finally:
        context.setJobDescription(None)  # type: ignore[arg-type]
    _IMPORT_CHECKED.add(context.applicationId)


def _import_batchsum(_: Any) -> str:
    import batchsum

    return batchsum.__version__


def _workers(spark: SparkSession) -> Callable[[], Workers]:
    """The Python workers that run tasks at once, and their hosts: one host in local mode; else the
    executors' hosts (the driver's aside)."""

    def workers() -> Workers:
        context = spark.sparkContext
        hosts = 1
        if not (context.master or "local").startswith("local"):
            status = context._jsc.sc().getExecutorMemoryStatus()
            driver = context.getConf().get("spark.driver.host")
            names = {str(entry).rsplit(":", 1)[0] for entry in status.keySet().toArray()}
            hosts = max(1, len(names - {driver}) or len(names))
        parallel = context.defaultParallelism
        return Workers(parallel, hosts, f"Spark runs tasks in {parallel} Python workers at once")

    return workers


@document_options
def summarize(
    sdf: DataFrame,
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
) -> DataFrame:
    """A Spark DataFrame: every column of ``sdf``, then the result columns (``summary``,
    ``summary_status``, ``summary_error``, ``summary_message``, ``summary_http_status``,
    ``summary_attempts``, ``summary_requests``) as string and int, rows in each partition's order.
    Lazy: nothing is sent until an action runs. Raises, before anything is sent: ``InputError``
    (the column), ``InvalidParameterError``, ``ConfigurationError``, ``BudgetError``. ``progress``:
    a bar per partition, where the executor runs it; ``limiter`` is refused (it cannot travel); a
    request cap and a sample are divided among the partitions (the parts add up to the job's)."""
    spec = RunSpec.from_options(locals()).replace(door="spark")
    if column not in sdf.columns:
        raise InputError(f"no column {column!r} in the DataFrame; its columns are: {', '.join(sdf.columns)}")
    if not isinstance(sdf.schema[column].dataType, T.StringType):
        raise InputError(f"column {column!r} holds {sdf.schema[column].dataType.simpleString()}, not text")
    check_output_columns(sdf.columns, spec.output_column)
    spec = _worker_spec(spec, sdf.sparkSession)
    schema = T.StructType(sdf.schema.fields + result_schema(spec.output_column).fields)
    return sdf.mapInArrow(_Partition(spec, column, sdf.rdd.getNumPartitions()), schema)


@document_options
def register(
    spark: SparkSession,
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
) -> Any:
    """Register a SQL function ``name(text)`` with the options fixed here:
    ``SELECT id, batchsum_summarize(text).summary AS summary FROM tickets``. It returns a struct of
    the result columns (so a row's status and error stay visible in SQL); ``.summary`` is the text.
    A pandas UDF over Arrow: each batch Spark hands it is one shared run. Returns the function, for
    the DataFrame API too (``df.select(f("text"))``). ``max_requests`` and ``sample`` are refused
    here: the function sees the rows a batch at a time and cannot divide them; cap or sample with
    ``summarize``."""
    spec = _worker_spec(RunSpec.from_options(locals()).replace(door="spark"), spark)
    for option, value in (("max_requests", spec.max_requests), ("sample", spec.sample)):
        if value is not None:
            raise InvalidParameterError(
                f"invalid {option} on the SQL function: it sees rows a batch at a time, so it cannot hold a "
                f"job's {option}; pass it to batchsum.spark.summarize instead"
            )
    schema = result_schema(spec.output_column)

    @F.pandas_udf(schema)  # type: ignore[attr-defined]  # defined lazily in pyspark.sql.functions
    def batchsum_summarize(texts: pd.Series) -> pd.DataFrame:
        results = _results(spec, texts.tolist())
        frame = results_frame(results, texts.index, spec.output_column)
        return frame.astype(object).where(frame.notna(), None)

    return spark.udf.register(name, batchsum_summarize)
