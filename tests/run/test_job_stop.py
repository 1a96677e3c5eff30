"""A distributed job's stop (``run.job_stop``): posted by its driver on the key's budget, heard by each of
its workers' runs on their next budget call, which stop as any stop does (``JobStopped``: nothing new
starts, the answers on the wire are kept); a stop posted before a run first called is an earlier
computation's, and does not stop it."""

from __future__ import annotations

import threading

import pytest

from batchsum.data.results import RowResult
from batchsum.errors import JobStopped
from batchsum.local import Faults
from batchsum.run import job_stop
from batchsum.run.background import run_in_worker
from batchsum.run.run import prepare_shared, run_texts
from batchsum.run.spec import RunSpec
from tests.support import KEY, article, wait_for_count


def job(svc, **options) -> RunSpec:
    """A job's spec as its driver prepares it (one run id for all its workers)."""
    spec = RunSpec.from_kwargs(api_key=KEY, base_url=svc.url, rpm=600, progress=False, **options)
    return prepare_shared(spec)


def worker_run(spec: RunSpec, texts: list[str], out: dict) -> threading.Thread:
    """One worker's run of the job, on a thread: its results or what stopped it."""

    def run() -> None:
        try:
            out["results"] = run_in_worker(lambda: run_texts(spec, texts, shared=True))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_a_posted_stop_stops_every_run_of_the_job_and_keeps_what_was_on_the_wire(svc):
    svc.faults = Faults(latency=0.2)  # answers spend a while on the wire
    spec = job(svc)
    outs: list[dict] = [{}, {}]
    threads = [worker_run(spec, [article(20, seed=52000 + 500 * n + i) for i in range(300)], outs[n]) for n in (0, 1)]
    at = wait_for_count(svc, 20)
    job_stop.post(spec, job_stop.cause("the job was cancelled"))
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive(), "a run went on"
    assert all(isinstance(out.get("error"), JobStopped) for out in outs), outs
    assert "the job was cancelled" in str(outs[0]["error"])
    assert svc.stats()["requests"] - at <= 25
    assert svc.stats()["answered"] == svc.stats()["requests"]  # every answer on the wire came back: awaited


@pytest.mark.slow
def test_a_stop_posted_before_a_run_first_called_is_an_earlier_computations(svc):
    """A lazy plan computed again runs with the same run id: the stop its first computation was
    given (kept a day) must not stop it; a stop posted while it runs does."""
    spec = job(svc)
    job_stop.post(spec, job_stop.cause("the first computation was cancelled"))
    results: list[RowResult] = run_in_worker(
        lambda: run_texts(spec, [article(20, seed=53000 + i) for i in range(15)], shared=True)
    )
    assert [r.status for r in results] == ["ok"] * 15
    out: dict = {}
    thread = worker_run(spec, [article(20, seed=53100 + i) for i in range(300)], out)
    wait_for_count(svc, 25)
    job_stop.post(spec, job_stop.cause("the first computation was cancelled"))  # the same words, a stop of its own
    thread.join(120)
    assert isinstance(out.get("error"), JobStopped)


def test_the_causes_of_two_stops_never_read_the_same():
    assert job_stop.cause("cancelled") != job_stop.cause("cancelled")


@pytest.mark.slow
def test_a_stop_reaches_the_runs_of_this_process_on_a_process_budget(svc):
    """With ``budget="none"`` (Dask's local scheduler: the partitions run in the driver's threads)
    the stop is posted on the process's budget for the key, which those runs share."""
    spec = job(svc, budget="none")
    out: dict = {}
    thread = worker_run(spec, [article(20, seed=54000 + i) for i in range(300)], out)
    wait_for_count(svc, 10)
    job_stop.post(spec, job_stop.cause("interrupted"))
    thread.join(120)
    assert isinstance(out.get("error"), JobStopped)


def test_a_stop_that_cannot_be_posted_is_one_line_and_the_others_are_posted(svc, caplog, tmp_path):
    """Stops posted together (SIGINT heard for every job of the process): a budget out of reach is
    said in one line for its job, and keeps no other job from its stop."""
    import dataclasses
    import sqlite3

    # A job prepared while its budget answered, whose Redis is gone since (nothing listens on port 9).
    gone = dataclasses.replace(job(svc, budget="none"), budget="redis://127.0.0.1:9/0")
    here = job(svc, budget=f"sqlite:///{tmp_path / 'budget.sqlite'}")
    with caplog.at_level("WARNING", logger="batchsum"):
        job_stop.post_specs([gone, here], job_stop.cause("interrupted"))
    said = [r.getMessage() for r in caplog.records if "could not post the stop" in r.getMessage()]
    assert len(said) == 1 and gone.run_id in said[0] and "\n" not in said[0]
    with sqlite3.connect(tmp_path / "budget.sqlite") as db:  # the stop the other job was given, on its budget
        causes = [cause for (cause,) in db.execute("SELECT cause FROM stops WHERE run_id=?", (here.run_id,))]
    assert len(causes) == 1 and "interrupted" in causes[0]


def test_stops_posted_for_running_jobs_only_leave_a_finished_job_be(svc, tmp_path):
    """A driver that cannot tell which of its jobs a cancel was for (Spark's watch) posts for those
    with a run on their key now: the running job stops, the finished one is given no stop."""
    import sqlite3

    where = f"sqlite:///{tmp_path / 'budget.sqlite'}"
    finished, running = job(svc, budget=where), job(svc, budget=where)
    run_in_worker(lambda: run_texts(finished, [article(20, seed=55000 + i) for i in range(5)], shared=True))
    out: dict = {}
    thread = worker_run(running, [article(20, seed=55100 + i) for i in range(300)], out)
    wait_for_count(svc, 15)
    job_stop.post_specs([finished, running], job_stop.cause("the Spark job was cancelled"), running_only=True)
    thread.join(120)
    assert isinstance(out.get("error"), JobStopped)
    with sqlite3.connect(tmp_path / "budget.sqlite") as db:
        stopped = {run_id for (run_id,) in db.execute("SELECT run_id FROM stops")}
    assert stopped == {running.run_id}
