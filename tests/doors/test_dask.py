"""``ddf.batchsum`` on a real ``distributed.LocalCluster`` with 2 worker processes, against the local
service's strict per-key sliding window: one shared budget holds the limit for all workers (counted
at the service), identical texts in different partitions are paid once, and a rerun after the
cluster restarted pays for nothing already answered."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")

import batchsum.dask  # noqa: E402,F401  (registers ddf.batchsum)
from batchsum.errors import BudgetError, InputError  # noqa: E402
from batchsum.local import LocalService  # noqa: E402
from batchsum.pacing import max_starts  # noqa: E402
from tests.support import (  # noqa: E402
    article,
    budget_ledger,
    interrupt_after,
    merged_report,
    runs_on_the_key,
    ticks_before,
    wait_for,
    wait_for_count,
)

KEY = "bs-dask-test-key"


@pytest.fixture(scope="module")
def cluster():
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None, silence_logs=50
        ) as running,
        distributed.Client(running) as client,
    ):
        yield client


@pytest.fixture
def limited():
    """A service that admits at most 100 requests in any 10 s per key (600/min, strictly)."""
    with LocalService([KEY], rpm=100, window=10) as service:
        yield service


def frame(rows: int, unique: int) -> pd.DataFrame:
    """``rows`` texts, ``unique`` of them distinct, spread so duplicates land in other partitions."""
    return pd.DataFrame(
        {"id": [f"row-{i}" for i in range(rows)], "text": [article(25, seed=300 + i % unique) for i in range(rows)]},
        index=pd.Index(range(1000, 1000 + rows), name="n"),
    )


def test_a_series_on_the_local_scheduler_in_one_process(limited):
    """No distributed client yet (this test runs before the cluster's): partitions run in this
    process's threads, where budget "none" is enough."""
    data = frame(12, 6)
    out = dd.from_pandas(data, npartitions=3)["text"].batchsum.summarize(
        rpm=0, api_key=KEY, base_url=limited.url, budget="none"
    )
    result = out.compute(scheduler="threads")
    assert list(result.columns)[0] == "summary" and result.index.equals(data.index)
    assert (result["summary_status"] == "ok").all()
    assert limited.state.stats()["by_status"] == {"200": 6}


def begun(service: LocalService, partitions: int):
    """A condition: a job's ``partitions`` runs have each been on the key (one that ends leaves, so
    they are counted as they come; a job on the key before this is not this one)."""
    earlier = {run_id for run_id, _ in runs_on_the_key(service, KEY)}
    seen: set[tuple[str, str]] = set()

    def condition() -> bool:
        seen.update(run for run in runs_on_the_key(service, KEY) if run[0] not in earlier)
        return len(seen) >= partitions

    return condition


@pytest.mark.slow
def test_sigint_on_the_local_scheduler_stops_the_compute_it_interrupts_and_no_other(tmp_path):
    """Without a distributed client (this test runs before the cluster's) the partitions run in this
    process's threads, which the interrupt of ``compute`` leaves running: the compute given up ends
    them (Dask's local scheduler hook, ``_Compute``). A compute in another thread, beside it, is not
    the one interrupted: all its rows come back ok. Polars is imported, as in a notebook that uses
    both: its SIGINT handler has the main thread's untimed wait in ``compute`` go on through the
    signal (the KeyboardInterrupt comes when the compute ends), so the signal is heard for it."""
    import contextlib
    import glob
    import json
    import threading

    with contextlib.suppress(ImportError):
        import polars  # noqa: F401

    report = tmp_path / "run.json"
    with LocalService([KEY]) as service:
        options = dict(rpm=600, api_key=KEY, base_url=service.url, progress=False, budget="none")
        out = dd.from_pandas(frame(160, 160), npartitions=4).batchsum.summarize("text", report=str(report), **options)
        beside = dd.from_pandas(frame(40, 40).assign(text=lambda f: f.text + " beside"), npartitions=2)
        beside = beside.batchsum.summarize("text", **options)
        background: dict = {}
        thread = threading.Thread(target=lambda: background.update(rows=beside.compute(scheduler="threads")))
        thread.start()
        counted = interrupt_after(service, 30)
        with pytest.raises(KeyboardInterrupt):
            out.compute(scheduler="threads", num_workers=4)
        parts = lambda: len(glob.glob(str(tmp_path / "run.part-*.json")))  # noqa: E731
        wait_for(lambda: parts() >= 4, what="each partition's run to write its report")
        stopped_at = service.state.stats()["requests"]
        thread.join(120)
        assert not thread.is_alive() and (background["rows"]["summary_status"] == "ok").all()
        assert len(background["rows"]) == 40
    assert stopped_at - counted["at"] <= 25
    stopped = json.loads(report.read_text())
    assert stopped["outcome"] == "stopped" and stopped["error"]["type"] == "RunInterrupted"


@pytest.mark.slow
def test_two_workers_share_one_budget_and_pay_once_per_text(cluster, limited, redis_url):
    data = frame(80, 50)
    ddf = dd.from_pandas(data, npartitions=4)
    out = ddf.batchsum.summarize("text", rpm=600, api_key=KEY, base_url=limited.url, budget=redis_url)
    assert out.npartitions == 4 and list(out.columns)[:2] == ["id", "text"]
    result = out.compute()
    assert len({w for w in cluster.scheduler_info()["workers"]}) == 2
    stats = limited.state.stats()
    assert stats["by_status"] == {"200": 50}, stats  # 0 429s; each distinct text once
    assert stats["answered_twice"] == 0
    # The key's starts as the shared budget spaced them (its ledger, by the tenth of a second): the
    # plan's count in any window, where two workers pacing alone would show twice it. At the service
    # the arrivals add each process's send delay, which a loaded machine spreads (docs/pacing.md,
    # "What the pace promises, where"); that promise is proven on virtual time (test_pace_conformance.py).
    ledger = budget_ledger(redis_url, KEY, limited.url)
    for window in [1, 2, 5, 10]:
        most = max(ledger.started(t, t + window) for t in ticks_before(ledger.now, 120))
        assert 0 < most <= max_starts(600, window) + 1, (window, most)
    assert result.index.equals(data.index) and result["id"].tolist() == data["id"].tolist()
    assert (result["summary_status"] == "ok").all() and result["summary"].str.len().gt(0).all()
    assert str(result["summary_http_status"].dtype) == "Int32" and result["summary_attempts"].dtype == "int32"

    cluster.restart()  # every worker process killed and started again: the answers are in Redis
    limited.state.reset_stats()
    again = out.compute()
    assert limited.state.stats()["requests"] == 0
    assert again["summary"].tolist() == result["summary"].tolist()


@pytest.mark.slow
def test_the_machine_budget_is_the_default_and_to_parquet_writes_the_results(cluster, limited, tmp_path):
    data = frame(24, 20)
    out = dd.from_pandas(data, npartitions=3).batchsum.summarize(
        "text", rpm=600, api_key=KEY, base_url=limited.url, journal=tmp_path / "answers.sqlite"
    )
    out.to_parquet(tmp_path / "out")
    back = pd.read_parquet(tmp_path / "out")
    assert len(back) == 24 and (back["summary_status"] == "ok").all()
    assert limited.state.stats()["by_status"] == {"200": 20}
    assert (Path(os.environ["XDG_CACHE_HOME"]) / "batchsum" / "budget.sqlite").exists()


@pytest.mark.slow
def test_a_budget_the_workers_cannot_share_is_refused_before_anything_is_sent(cluster, limited):
    ddf = dd.from_pandas(frame(8, 8), npartitions=2)
    with pytest.raises(BudgetError) as caught:
        ddf.batchsum.summarize("text", rpm=600, api_key=KEY, base_url=limited.url, budget="none")
    message = str(caught.value)
    assert "\n" not in message and "2 worker processes" in message and "redis://" in message
    assert limited.state.stats()["requests"] == 0


@pytest.mark.slow
def test_bad_input_is_refused_when_summarize_is_called(cluster, limited):
    ddf = dd.from_pandas(frame(4, 4), npartitions=1)
    with pytest.raises(InputError, match="no column 'body'"):
        ddf.batchsum.summarize("body", api_key=KEY, base_url=limited.url)
    with pytest.raises(BudgetError, match="unknown budget"):
        ddf.batchsum.summarize("text", api_key=KEY, base_url=limited.url, budget="memcached://x")
    with pytest.raises(ValueError, match="percentage"):
        ddf.batchsum.summarize("text", percentage=9, api_key=KEY, base_url=limited.url)
    assert limited.state.stats()["requests"] == 0


@pytest.mark.slow
@pytest.mark.heavy
def test_a_killed_worker_costs_seconds_and_pays_only_what_was_on_the_wire(cluster, tmp_path):
    """The machine budget, a strict 1200/min window, 150 distinct texts, 0.3 s answers; one worker
    process SIGKILLed once 40 requests reached the service. Its nanny starts it again and Dask runs
    its partitions again; their claims' holder is gone, so the retries go on at once."""

    from tests.killing import KillAfter, assert_the_kill_cost_only_the_wire, service_for_a_kill

    data = frame(150, 150)
    pids = sorted(cluster.run(os.getpid).values())
    with service_for_a_kill(KEY, tmp_path) as (service, options):
        out = dd.from_pandas(data, npartitions=4).batchsum.summarize("text", **options)
        with KillAfter(service, 40, lambda: pids[:1]) as killer:
            result = out.compute()
        stats = service.state.stats()
    assert killer.killed == pids[:1]
    assert len(result) == 150 and (result["summary_status"] == "ok").all()
    assert_the_kill_cost_only_the_wire(stats, 150)
    print(f"killed a worker at {killer.at} requests; {killer.took:.1f} s; {stats}")


@pytest.mark.slow
def test_a_cancelled_compute_stops_every_partitions_run_and_the_next_pays_for_none_of_it(cluster, tmp_path):
    """Dask cannot interrupt a running task: the scheduler marks it cancelled on its worker, and the
    partition's run stops on that (nothing new starts; the answers on the wire are awaited and kept).
    The same frame computed again pays only for the rest."""
    import glob

    data = frame(160, 160)
    report = tmp_path / "run.json"
    with LocalService([KEY]) as service:
        out = dd.from_pandas(data, npartitions=4).batchsum.summarize(
            "text", rpm=600, api_key=KEY, base_url=service.url, progress=False, report=str(report)
        )
        started = begun(service, 4)
        future = cluster.compute(out)
        # Every partition's run begun (a worker slow to start its tasks, as a loaded machine has, would
        # have the cancel find a partition not begun: it never runs, and writes no report).
        wait_for(started, what="the four partitions' runs")
        at = wait_for_count(service, 20)
        cluster.cancel(future)
        parts = lambda: len(glob.glob(str(tmp_path / "run.part-*.json")))  # noqa: E731
        wait_for(lambda: parts() >= 4, what="each partition's run to write its report")
        # Stopped long before the rest of its rows (140 at the stop, 14 s at the plan): how soon is the
        # machine's pace, measured in benchmarks/, not here.
        assert service.state.stats()["requests"] - at <= 60
        stopped = merged_report(report, 4)
        assert stopped["outcome"] == "stopped" and stopped["error"]["type"] == "JobStopped"
        assert stopped["requests"]["texts_sent"] == service.state.stats()["answered"]
        again = out.compute()
        stats = service.state.stats()
    assert (again["summary_status"] == "ok").all() and len(again) == 160
    assert stats["answered_unique"] == 160 and stats["answered_twice"] == 0


CHILD_DRIVER = """
import sys
import time

import distributed
import dask.dataframe as dd
import pandas as pd

import batchsum.dask
from tests.support import article

url, report = sys.argv[1], sys.argv[2]


def summarized(seed, **options):
    texts = pd.DataFrame({"text": [article(25, seed=seed + i) for i in range(160)]})
    return dd.from_pandas(texts, npartitions=4).batchsum.summarize(
        "text", rpm=600, base_url=url, progress=False, **options
    )


with distributed.LocalCluster(
    n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None, silence_logs=50
) as cluster, distributed.Client(cluster) as client:
    background, mine = summarized(61000), summarized(62000, report=report)
    future = client.compute(background)  # a job of its own, in the background
    print("sleeping", flush=True)
    try:
        time.sleep(600)  # the main thread busy with something else, which the signal interrupts
    except KeyboardInterrupt:
        print("sleep interrupted", flush=True)
    done = future.result()
    print("background", int((done["summary_status"] == "ok").sum()), len(done), flush=True)
    try:
        mine.compute()
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("compute interrupted", flush=True)
    sys.stdin.readline()  # the cluster kept until the test has counted (its end would kill the workers)
"""


@pytest.mark.heavy
def test_an_interrupt_in_the_driver_stops_the_compute_it_interrupts_and_no_other(tmp_path):
    """A real driver in a subprocess with its own ``LocalCluster``, a real SIGINT: one that lands in
    the main thread's unrelated sleep leaves a job computing in the background (``client.compute``)
    alone, every row ok; one that lands in ``compute()`` raises ``KeyboardInterrupt`` there, and its
    partitions' runs stop (the released futures: Dask marks the tasks cancelled), at most 25 requests
    after the signal."""
    import glob
    import os
    import signal
    import subprocess
    import sys

    report = tmp_path / "run.json"
    with LocalService([KEY]) as service:
        env = dict(os.environ, BATCHSUM_API_KEY=KEY, PYTHONPATH=os.getcwd())
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD_DRIVER, service.url, str(report)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout.readline().strip() == "sleeping", child.stderr.read()
            wait_for_count(service, 20, seconds=120)
            child.send_signal(signal.SIGINT)
            started = begun(service, 4)  # the runs of the compute to come (the background job's are on the key)
            assert child.stdout.readline().strip() == "sleep interrupted"
            assert child.stdout.readline().split() == ["background", "160", "160"]  # every row ok
            wait_for(started, what="the four partitions' runs of its own compute")
            at = wait_for_count(service, 180)
            child.send_signal(signal.SIGINT)
            assert child.stdout.readline().strip() == "compute interrupted"
            wait_for(lambda: len(glob.glob(str(tmp_path / "run.part-*.json"))) == 4, what="the partitions' runs to end")
            after = service.state.stats()["requests"] - at
            stopped = merged_report(report, 4)
        finally:
            child.stdin.close()
            child.wait(120)
    assert after <= 25, after
    assert stopped["outcome"] == "stopped" and stopped["error"]["type"] == "JobStopped"
    print(f"requests after the signal in compute(): {after}")
