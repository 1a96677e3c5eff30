"""Spark on a real ``local[2,4]`` session (two cores, a failed task tried up to three times more) with a real
redis-server, against the local service's strict per-key window (100 in any 10 s: 600/min): every
row ok, order and columns kept, each distinct text paid once, 0 429s; a task that fails after its
answers arrived pays nothing twice when Spark runs it again; the SQL function gives the same
answers; no plan shows the key. Marked ``spark``: ``pytest -m "not spark"`` leaves them out."""

from __future__ import annotations

import os
import shutil
import sys

import pandas as pd
import pytest

pyspark = pytest.importorskip("pyspark")

from batchsum.data.results import result_columns  # noqa: E402
from batchsum.errors import InputError, InvalidParameterError  # noqa: E402
from batchsum.local import LocalService  # noqa: E402
from batchsum.pacing import max_starts  # noqa: E402
from tests.support import article, budget_ledger, merged_report, need, ticks_before, wait_for, wait_for_count  # noqa: E402

pytestmark = pytest.mark.spark
KEY = "bs-spark-test-key-0123456789"


@pytest.fixture(scope="module")
def spark():
    if shutil.which("java") is None:
        need("Java for Spark", "apt-get install openjdk-17-jre-headless (Debian's package)")
    # Spark's Python workers run `python3` from the PATH unless told: this interpreter has batchsum.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("batchsum-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.adaptive.enabled", "false")
        # A cancelled task's Python worker is killed after this (Spark's default: 2 s). On a machine
        # this busy a task's run may need longer to hear its job's stop: the cancel test checks that
        # it stops on its own, not how fast a loaded machine lets it (docs/frames.md says the same).
        .config("spark.python.task.killTimeout", "20s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def limited():
    with LocalService([KEY], rpm=100, window=10) as service:
        yield service


def tickets(spark, rows: int = 240, distinct: int = 160):
    data = pd.DataFrame({"id": list(range(rows)), "text": [article(25, seed=700 + i % distinct) for i in range(rows)]})
    return spark.createDataFrame(data).repartition(4, "id").sortWithinPartitions("id"), data


def test_240_rows_over_4_partitions_hold_the_plan_and_pay_each_text_once(spark, limited, redis_url):
    import batchsum.spark

    sdf, data = tickets(spark)
    out = batchsum.spark.summarize(sdf, "text", rpm=600, api_key=KEY, base_url=limited.url, budget=redis_url)
    assert out.columns == ["id", "text", *result_columns()]  # lazy: nothing sent yet
    assert limited.state.stats()["requests"] == 0
    assert dict(out.dtypes)["summary_attempts"] == "int" and dict(out.dtypes)["summary"] == "string"
    plan = out._jdf.queryExecution().toString()
    assert KEY not in plan and KEY[:10] not in plan and "batchsum_summarize" in plan

    rows = out.collect()
    assert out.rdd.getNumPartitions() == 4 and len(rows) == 240
    assert all(row.summary_status == "ok" for row in rows)
    by_id = {row.id: row for row in rows}
    assert all(by_id[i].text == data.text[i] for i in range(240))  # every row with its own text
    per_partition = out.rdd.mapPartitions(lambda part: [[row.id for row in part]]).collect()
    assert all(ids == sorted(ids) for ids in per_partition)  # each partition's order kept
    stats = limited.state.stats()
    assert stats["by_status"] == {"200": 160}, stats  # 0 429s; each distinct text once
    # The key's starts as the shared budget spaced them, as in test_dask.py: the plan's count in any
    # window, where two workers pacing alone would show twice it (at the service a loaded machine
    # spreads the send delays: the promise there is proven on virtual time, test_pace_conformance.py).
    ledger = budget_ledger(redis_url, KEY, limited.url)
    for window in (1, 2, 5, 10):
        most = max(ledger.started(t, t + window) for t in ticks_before(ledger.now, 120))
        assert 0 < most <= max_starts(600, window) + 1, (window, most)


def test_a_task_that_fails_after_its_answers_arrived_pays_nothing_twice(spark, limited, redis_url):
    import batchsum.spark

    sdf, _ = tickets(spark, rows=80, distinct=80)
    out = batchsum.spark.summarize(sdf, "text", rpm=0, api_key=KEY, base_url=limited.url, budget=redis_url)

    def fail_first_attempt(batches):
        from pyspark import TaskContext

        context = TaskContext.get()
        kept = list(batches)  # the partition's answers have arrived (and are in the shared store)
        if context.partitionId() == 0 and context.attemptNumber() == 0:
            raise RuntimeError("a lost executor, after the answers arrived")
        yield from kept

    rows = out.mapInArrow(fail_first_attempt, out.schema).collect()
    assert len(rows) == 80 and all(row.summary_status == "ok" for row in rows)
    stats = limited.state.stats()
    assert stats["answered_twice"] == 0 and stats["answered_unique"] == 80, stats


def test_the_sql_function_gives_the_same_answers_as_the_dataframe_function(spark, limited, redis_url):
    import batchsum.spark

    sdf, _ = tickets(spark, rows=24, distinct=12)
    options = {"rpm": 0, "api_key": KEY, "base_url": limited.url, "budget": redis_url, "type": "best_line"}
    by_function = {row.id: row.summary for row in batchsum.spark.summarize(sdf, "text", **options).collect()}
    batchsum.spark.register(spark, **options)
    sdf.createOrReplaceTempView("tickets")
    by_sql = spark.sql(
        "SELECT id, s.summary AS summary, s.summary_status AS status "
        "FROM (SELECT id, batchsum_summarize(text) AS s FROM tickets)"
    ).collect()
    assert {row.id: row.summary for row in by_sql} == by_function
    assert {row.status for row in by_sql} == {"ok"}
    assert limited.state.stats()["answered_twice"] == 0


def test_bad_input_is_refused_before_anything_is_sent_and_a_wrong_key_stops_the_job(spark, limited, redis_url):
    import batchsum.spark

    sdf, _ = tickets(spark, rows=8, distinct=8)
    with pytest.raises(InputError, match="no column 'body'"):
        batchsum.spark.summarize(sdf, "body", api_key=KEY, base_url=limited.url, budget=redis_url)
    with pytest.raises(InputError, match="holds bigint, not text"):
        batchsum.spark.summarize(sdf, "id", api_key=KEY, base_url=limited.url, budget=redis_url)
    wrong = batchsum.spark.summarize(sdf, "text", rpm=0, api_key="not-the-key", base_url=limited.url, budget=redis_url)
    with pytest.raises(Exception, match="(?i)incorrect API key provided") as failed:
        wrong.collect()
    assert "not-the-key" not in str(failed.value)
    # Each task is a run whose first request goes alone: at most one 401 per task attempt (4 tasks, 4 tries).
    assert limited.state.stats()["by_status"] == {"401": limited.state.stats()["requests"]}
    assert limited.state.stats()["requests"] <= 16


def test_a_request_cap_is_divided_among_the_partitions_and_every_row_keeps_its_record(spark, limited, redis_url):
    import batchsum.spark

    sdf, _ = tickets(spark, rows=80, distinct=80)
    out = batchsum.spark.summarize(
        sdf, "text", rpm=0, api_key=KEY, base_url=limited.url, budget=redis_url, max_requests=20
    )
    rows = out.collect()
    assert len(rows) == 80
    statuses = [row.summary_status for row in rows]
    assert statuses.count("ok") == limited.state.stats()["answered"] <= 20  # the job's cap, not each task's
    assert {row.summary_error for row in rows if row.summary_status != "ok"} == {"not_sent"}
    with pytest.raises(InvalidParameterError, match="max_requests on the SQL function"):
        batchsum.spark.register(spark, api_key=KEY, base_url=limited.url, budget=redis_url, max_requests=5)


def _python_workers() -> list[int]:
    """Spark's Python workers: forked by the ``pyspark.daemon`` process, with its command line."""
    import psutil

    from tests.killing import cmdline_has, descendants

    daemon = cmdline_has("pyspark.daemon")
    return descendants(lambda process: daemon(process) and daemon(psutil.Process(process.ppid())))


@pytest.mark.heavy
def test_killed_python_workers_cost_seconds_and_pay_only_what_was_on_the_wire(spark, tmp_path):
    """The machine budget, a strict 1200/min window, 150 distinct texts, 0.3 s answers; every Python
    worker SIGKILLed once 40 requests reached the service. Spark runs the two tasks again; their
    claims' holders are gone, so the retries go on at once (before leases, they waited 600 s)."""

    import batchsum.spark
    from tests.killing import KillAfter, assert_the_kill_cost_only_the_wire, service_for_a_kill

    data = pd.DataFrame({"id": range(150), "text": [article(25, seed=9000 + i) for i in range(150)]})
    sdf = spark.createDataFrame(data).repartition(2, "id")
    with service_for_a_kill(KEY, tmp_path) as (service, options):
        out = batchsum.spark.summarize(sdf, "text", **options)
        with KillAfter(service, 40, _python_workers) as killer:
            rows = out.collect()
        stats = service.state.stats()
    assert killer.killed, "no Python worker was found to kill"
    assert len(rows) == 150 and all(row.summary_status == "ok" for row in rows)
    assert_the_kill_cost_only_the_wire(stats, 150)
    print(f"killed {len(killer.killed)} workers at {killer.at} requests; {killer.took:.1f} s; {stats}")


def test_a_budget_the_python_workers_cannot_share_is_refused_before_anything_is_sent(spark, limited):
    import batchsum.spark
    from batchsum.errors import BudgetError

    sdf, _ = tickets(spark, rows=4, distinct=4)
    with pytest.raises(BudgetError) as caught:
        batchsum.spark.summarize(sdf, "text", api_key=KEY, base_url=limited.url, budget="none")
    message = str(caught.value)
    assert "\n" not in message and "2 Python workers" in message and "budget='machine'" in message
    assert limited.state.stats()["requests"] == 0


def test_executors_whose_python_lacks_batchsum_are_refused_in_one_line(tmp_path):
    """A Spark application whose PYSPARK_PYTHON cannot import batchsum (an interpreter without it):
    ``summarize`` says so in one line before anything is sent, not a Py4J stack at the action."""
    import subprocess
    import textwrap

    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    script = textwrap.dedent(
        f"""
        import os
        os.environ["PYSPARK_PYTHON"] = {str(bare / "bin" / "python")!r}
        from pyspark.sql import SparkSession
        import batchsum.spark
        from batchsum.errors import ConfigurationError
        from batchsum.local import LocalService
        spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
        spark.sparkContext.setLogLevel("OFF")
        with LocalService() as service:
            sdf = spark.createDataFrame([("a text of a few words to summarize here",)], ["text"])
            try:
                batchsum.spark.summarize(sdf, "text", api_key=service.key, base_url=service.url)
            except ConfigurationError as exc:
                print("REFUSED", exc)
            print("REQUESTS", service.state.stats()["requests"])
        spark.stop()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("REFUSED", "REQUESTS"))]
    assert lines[-1] == "REQUESTS 0", done.stdout + done.stderr[-2000:]
    refused = lines[0]
    assert "cannot import batchsum" in refused and "PYSPARK_PYTHON" in refused and str(bare) in refused
    assert "No module named" in refused


def test_a_spark_jobs_executors_are_one_run_on_the_key_with_unknown_rows_left(spark, redis_url):
    """``batchsum top`` while the job runs: its tasks (each a run of the job's id, in Spark's Python
    workers) are one run, from the spark door, whose rows left no worker knows."""
    import asyncio
    import threading

    import redis

    import batchsum.spark
    from batchsum.pacing.look.view import UNKNOWN, read_view

    redis.Redis.from_url(redis_url).flushdb()
    with LocalService([KEY], rpm=600) as service:
        data = pd.DataFrame({"id": list(range(240)), "text": [article(25, seed=9100 + i) for i in range(240)]})
        sdf = spark.createDataFrame(data).repartition(4, "id")
        out = batchsum.spark.summarize(sdf, "text", rpm=600, api_key=KEY, base_url=service.url, budget=redis_url)
        done: list = []
        job = threading.Thread(target=lambda: done.append(out.collect()), daemon=True)
        job.start()
        seen = []

        def look() -> bool:
            """What the key's view shows now; whether the job has ended."""
            view = asyncio.run(read_view(redis_url, "here"))
            seen.extend(key.runs for key in view.keys if key.runs)
            return not job.is_alive()

        wait_for(look, 300, "the job's end", every=0.3)
        job.join(60)
    assert len(done[0]) == 240 and all(row.summary_status == "ok" for row in done[0])
    assert seen, "the job was never seen on its key"
    assert all(len(runs) == 1 for runs in seen)  # one run, however many tasks ran it
    runs = [runs[0] for runs in seen]
    assert {run.door for run in runs} == {"spark"} and {run.rows_left for run in runs} == {UNKNOWN}
    assert len({run.run_id for run in runs}) == 1 and max(run.processes for run in runs) >= 2


def test_cancelled_jobs_stop_every_tasks_run_before_spark_kills_it_and_the_next_action_pays_none_again(spark, tmp_path):
    """``sc.cancelAllJobs()`` (what PySpark's Ctrl-C handler calls): Spark kills the tasks' Python
    workers seconds later, losing what they had on the wire; the driver sees the job fail and posts
    its stop on the key's budget, and each task's run stops on its next budget call, keeping it."""
    import glob
    import threading

    import batchsum.spark

    data = pd.DataFrame({"id": range(120), "text": [article(25, seed=9400 + i) for i in range(120)]})
    sdf = spark.createDataFrame(data).repartition(2, "id")
    report = tmp_path / "run.json"
    with LocalService([KEY]) as service:
        out = batchsum.spark.summarize(
            sdf, "text", rpm=600, api_key=KEY, base_url=service.url, progress=False, report=str(report)
        )
        failed: list[BaseException] = []

        def action() -> None:
            try:
                out.collect()
            except Exception as exc:  # noqa: BLE001 - the cancelled job's error, handed to the test
                failed.append(exc)

        worker = threading.Thread(target=action, daemon=True)
        worker.start()
        at = wait_for_count(service, 20, seconds=300)
        spark.sparkContext.cancelAllJobs()
        worker.join(120)
        assert not worker.is_alive() and failed, "the job was not cancelled"
        parts = lambda: len(glob.glob(str(tmp_path / "run.part-*.json")))  # noqa: E731
        wait_for(lambda: parts() >= 2, what="each task's run to end and write its report (not its worker killed first)")
        # Stopped long before the rest of its rows (100 at the stop, 10 s at the plan): how soon is the
        # machine's pace and Spark's, measured by hand, not here.
        assert service.state.stats()["requests"] - at <= 60
        stopped = merged_report(report, 2)
        assert stopped["outcome"] == "stopped" and stopped["error"]["type"] == "JobStopped"
        assert stopped["requests"]["texts_sent"] == service.state.stats()["answered"]  # every answer paid, kept
        rows = out.collect()  # the same plan again: the earlier stop is not this action's
        stats = service.state.stats()
    assert len(rows) == 120 and all(row.summary_status == "ok" for row in rows)
    assert stats["answered_unique"] == 120 and stats["answered_twice"] == 0


def test_a_sort_after_summarizing_computes_the_plan_twice_and_each_way_the_docs_give_computes_it_once(
    spark, limited, redis_url
):
    """docs/frames.md: ``.orderBy(...).toPandas()`` on the result runs batchsum over every row twice
    (the sort's sampling job, then the sort), each pass reading the store for every row; sorting the
    input first, sorting in pandas, or keeping the result (``localCheckpoint``) runs it once. Counted
    by the store's look-ups in bulk (Redis ``MGET``: one per partition's block of rows)."""
    import redis

    import batchsum.spark

    sdf, _ = tickets(spark, rows=40, distinct=40)
    client = redis.Redis.from_url(redis_url)
    options = {"rpm": 0, "api_key": KEY, "base_url": limited.url, "budget": redis_url}

    def summarized(frame):
        return batchsum.spark.summarize(frame, "text", **options)

    def reads(action) -> int:
        calls = lambda: client.info("commandstats").get("cmdstat_mget", {}).get("calls", 0)  # noqa: E731
        before = calls()
        assert len(action()) == 40
        return calls() - before

    partitions = summarized(sdf).rdd.getNumPartitions()
    assert reads(lambda: summarized(sdf).toPandas()) == partitions  # one pass: each partition's block once
    assert reads(lambda: summarized(sdf).orderBy("id").toPandas()) == 2 * partitions
    assert reads(lambda: summarized(sdf).toPandas().sort_values("id")) == partitions
    assert reads(lambda: summarized(sdf).localCheckpoint().orderBy("id").toPandas()) == partitions
    ordered = summarized(sdf.orderBy("id"))
    first = ordered.toPandas()
    assert list(first["id"]) == sorted(first["id"])  # the input sorted: the result keeps its order
    assert reads(lambda: ordered.toPandas()) == ordered.rdd.getNumPartitions()
    assert limited.state.stats()["by_status"] == {"200": 40}  # paid once, whatever the passes
    client.close()
