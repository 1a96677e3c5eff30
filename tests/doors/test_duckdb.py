"""DuckDB: ``batchsum_summarize(text)`` on a real connection, called from DuckDB's threads at once, one
run per connection (opened at the first call, closed with the connection or when idle), through the
answer store (a query run again pays nothing), a struct per row (no silent NULL), and the estimate."""

from __future__ import annotations

import gc
import json
import threading
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

duckdb = pytest.importorskip("duckdb")

import batchsum.duckdb  # noqa: E402
from batchsum.data.stores import clear_process_caches  # noqa: E402
from batchsum.errors import InvalidParameterError  # noqa: E402
from batchsum.local import Faults  # noqa: E402
from tests.support import EXPIRED_KEY, KEY, article, wait_for, wait_for_count  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_process_answers():
    """Each test starts without the answers earlier tests left in this process's memory."""
    clear_process_caches()


@pytest.fixture
def con():
    connection = duckdb.connect()
    yield connection
    connection.close()


def register(con, svc, **options):
    return batchsum.duckdb.register(con, api_key=KEY, base_url=svc.url, rpm=0, progress=False, **options)


def table(con, rows: list[str | None], name: str = "tickets") -> None:
    con.register("source", pa.table({"id": list(range(len(rows))), "text": rows}))
    con.execute(f"CREATE TABLE {name} AS SELECT * FROM source")
    con.unregister("source")


def test_a_query_summarizes_every_row_into_a_struct_and_a_second_run_pays_nothing(con, svc, tmp_path):
    texts = [article(25, seed=i) for i in range(30)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "in.parquet")
    registration = register(con, svc, report=str(tmp_path / "run.json"))
    query = f"SELECT s.summary, s.status, s.error, s.message FROM (SELECT batchsum_summarize(text) AS s FROM '{tmp_path}/in.parquet')"
    rows = con.execute(query).fetchall()
    assert len(rows) == 30 and all(status == "ok" and summary for summary, status, _, _ in rows)
    assert svc.stats()["requests"] == 30
    assert con.execute(query).fetchall() == rows  # the same query again: the answers are kept
    assert svc.stats()["requests"] == 30 and registration.runs == 1  # one run for the connection
    kinds = con.execute("SELECT typeof(batchsum_summarize('x'))").fetchone()[0]
    assert kinds == 'STRUCT(summary VARCHAR, status VARCHAR, "error" VARCHAR, message VARCHAR)'
    con.close()  # the connection closed: the run ends, its report written
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["rows"]["ok"] == 60 and report["requests"]["from_store"] == 30


def test_no_failure_is_a_silent_null(con, svc):
    register(con, svc)
    svc.faults = Faults(script=["422"])
    table(con, [None, "too short", article(20, seed=1)])
    rows = con.execute("SELECT s.status, s.error FROM (SELECT batchsum_summarize(text) AS s FROM tickets ORDER BY id)")
    assert rows.fetchall() == [("skipped", "empty"), ("skipped", "too_short"), ("failed", "unprocessable")]


def test_a_refused_key_fails_the_query_with_the_services_message(con, svc):
    batchsum.duckdb.register(con, api_key=EXPIRED_KEY, base_url=svc.url, rpm=0, progress=False)
    table(con, [article(20, seed=i) for i in range(5)])
    with pytest.raises(duckdb.Error, match="expired|not premium|401"):
        con.execute("SELECT batchsum_summarize(text) FROM tickets").fetchall()
    assert svc.stats()["requests"] == 1  # a new key's first request goes alone


@pytest.mark.slow
def test_duckdbs_threads_call_it_at_once_and_each_text_is_paid_once(con, svc):
    con.execute("SET threads = 4")
    svc.faults = Faults(latency=0.01)
    distinct = [article(12, seed=i) for i in range(1500)]
    table(con, [distinct[i % 1500] for i in range(9000)])  # every text six times, spread over the chunks
    calls: list[int] = []
    registration = register(con, svc)
    original = registration.summarize

    def counted(texts):
        calls.append(len(texts))
        return original(texts)

    registration.summarize = counted
    rows = con.execute("SELECT s.status FROM (SELECT batchsum_summarize(text) AS s FROM tickets)").fetchall()
    assert len(rows) == 9000 and {status for (status,) in rows} == {"ok"}
    assert len(calls) > 2  # chunks, from DuckDB's threads
    assert svc.stats()["requests"] == 1500 and svc.stats()["answered_twice"] == 0
    assert registration.runs == 1


def test_with_store_none_two_threads_chunks_claim_their_texts(con, svc):
    """``store="none"``: the run's answers in a store on disk of this process's own, with claims (as a
    lazy Polars frame's), so two of DuckDB's threads with the same texts pay once."""
    import threading

    registration = register(con, svc, store="none")
    registration.summarize([article(30, seed=99)])  # the key's first request, alone
    svc.state.reset_stats()
    svc.faults = Faults(latency=0.3)
    texts = [article(30, seed=9100 + i) for i in range(10)]  # the scratch store is the process's: texts of its own
    results: list[list[str]] = []
    threads = [
        threading.Thread(target=lambda: results.append([r.status for r in registration.summarize(texts)]))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [["ok"] * 10] * 2
    assert svc.stats()["requests"] == 10 and svc.stats()["answered_twice"] == 0


@pytest.mark.slow
def test_a_run_that_cannot_open_fails_each_query_in_one_line_and_leaves_no_thread(con, svc):
    import threading

    from tests.support import free_port

    register(con, svc, budget=f"redis://127.0.0.1:{free_port()}/0")  # no Redis there

    def ours() -> list[str]:
        return sorted(thread.name for thread in threading.enumerate() if thread.name.startswith("batchsum-"))

    before = ours()
    for seed in range(3):
        with pytest.raises(duckdb.Error, match="cannot reach the rate budget"):
            con.execute(f"SELECT batchsum_summarize('{article(20, seed=seed)}')").fetchall()
    assert ours() == before and "batchsum-run" not in before  # no run's loop thread left behind
    assert svc.stats()["requests"] == 0


def test_it_is_never_folded_when_the_query_is_planned(con, svc):
    register(con, svc)
    text = article(20, seed=7)
    con.execute(f"EXPLAIN SELECT batchsum_summarize('{text}') FROM range(3)").fetchall()
    assert svc.stats()["requests"] == 0  # planning sends nothing
    assert len(con.execute(f"SELECT batchsum_summarize('{text}') FROM range(3)").fetchall()) == 3
    assert svc.stats()["requests"] == 1


def test_the_run_closes_after_a_minute_idle_and_the_next_call_opens_another(con, svc, monkeypatch, tmp_path):
    monkeypatch.setattr(batchsum.duckdb, "IDLE_SECONDS", 0.3)
    registration = register(con, svc, report=str(tmp_path / "run.json"))
    con.execute(f"SELECT batchsum_summarize('{article(20)}')").fetchall()
    wait_for((tmp_path / "run.json").exists, what="the run's report, written as it closes")
    assert repr(registration).endswith("closed)")
    con.execute(f"SELECT batchsum_summarize('{article(21)}')").fetchall()
    assert registration.runs == 2


@pytest.mark.slow
def test_the_run_ends_when_the_connection_is_let_go(svc, tmp_path):
    con = duckdb.connect()
    register(con, svc, report=str(tmp_path / "run.json"))
    con.execute(f"SELECT batchsum_summarize('{article(20)}')").fetchall()
    del con
    gc.collect()
    assert json.loads((tmp_path / "run.json").read_text())["rows"]["ok"] == 1


def test_the_estimate_says_what_a_query_would_send(con, svc):
    register(con, svc)
    texts = [article(20, seed=i) for i in range(8)] + [article(20, seed=0), "too short", None]
    table(con, texts)
    estimate = "SELECT batchsum_estimate(list(text)) FROM tickets"
    (before,) = con.execute(estimate).fetchone()
    assert before == {
        "rows": 11,
        "would_send": 8,
        "already_answered": 0,
        "from_store": 0,
        "duplicates": 1,
        "skipped": 2,
        "least_seconds": 0.0,
        "quota_stops_after": None,
    }
    con.execute("SELECT batchsum_summarize(text) FROM tickets WHERE id < 4").fetchall()
    (after,) = con.execute(estimate).fetchone()
    assert (after["would_send"], after["already_answered"], after["from_store"]) == (4, 4, 4)
    assert svc.stats()["requests"] == 4


def test_the_estimates_time_is_at_the_keys_summed_limits(con, svc):
    """Two keys at 120/min: 8 requests take (8 - 2) / 240 min, each key's first going at once."""
    batchsum.duckdb.register(con, api_key=[KEY, "team-key-two-0123456789"], base_url=svc.url, rpm=120, progress=False)
    table(con, [article(20, seed=i) for i in range(8)])
    (plan,) = con.execute("SELECT batchsum_estimate(list(text)) FROM tickets").fetchone()
    assert plan["would_send"] == 8 and plan["least_seconds"] == pytest.approx(1.5)
    assert svc.stats()["requests"] == 0


@pytest.mark.slow
def test_the_estimate_leaves_a_spent_keys_rate_out_and_says_where_a_quota_stops_the_query(con, svc, tmp_path):
    """Key one's daily quota of 3 is spent by a query: the estimate over both keys (120/min each)
    times 8 requests at the other key's 120/min, not their summed 240; a registration on the spent
    key alone says its query stops at once (a reset further than ``max_wait``), sending none."""
    import datetime as _dt
    import os

    two = "team-key-two-0123456789"  # never sent on: an estimate sends nothing
    path = tmp_path / "keys.txt"
    path.write_text(f"{KEY} 120 quota=3/day\n{two} 120\n")
    os.chmod(path, 0o600)
    spender = duckdb.connect()
    batchsum.duckdb.register(spender, api_key=KEY, base_url=svc.url, rpm=120, quota="3/day", progress=False)
    table(spender, [article(20, seed=100 + i) for i in range(3)])
    spender.execute("SELECT batchsum_summarize(text) FROM tickets").fetchall()
    spender.close()
    assert svc.stats()["requests"] == 3
    batchsum.duckdb.register(con, keys=path, base_url=svc.url, progress=False)
    batchsum.duckdb.register(
        con, name="alone_summarize", api_key=KEY, base_url=svc.url, rpm=120, quota="3/day", max_wait=60, progress=False
    )
    table(con, [article(20, seed=i) for i in range(8)])
    (plan,) = con.execute("SELECT batchsum_estimate(list(text)) FROM tickets").fetchone()
    assert plan["would_send"] == 8 and plan["least_seconds"] == pytest.approx(3.5)  # (8 - 1) / 120 min
    assert plan["quota_stops_after"] is None
    (alone,) = con.execute("SELECT alone_estimate(list(text)) FROM tickets").fetchone()
    now = _dt.datetime.now(_dt.timezone.utc)
    midnight = (now + _dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    expected = 0 if (midnight - now).total_seconds() > 60 else None  # the rule: a reset within max_wait is waited for
    assert alone["quota_stops_after"] == expected
    assert svc.stats()["requests"] == 3


def test_a_second_registration_carries_other_parameters(con, svc):
    register(con, svc)
    register(con, svc, name="short_summary", percentage=1, output_column="short")
    text = article(600, seed=3)
    row = con.execute(f"SELECT batchsum_summarize('{text}').summary, short_summary('{text}').short").fetchone()
    assert len(row[1]) < len(row[0]) and svc.stats()["requests"] == 2
    assert con.execute("SELECT short_summary_estimate(['x'])").fetchone()[0]["skipped"] == 1


def test_a_name_registered_again_takes_the_new_parameters_and_ends_the_earlier_run(con, svc):
    text = article(600, seed=4)
    first = register(con, svc)
    [(long,)] = con.execute(f"SELECT batchsum_summarize('{text}').summary").fetchall()
    second = register(con, svc, percentage=1, output_column="short")
    [(short,)] = con.execute(f"SELECT batchsum_summarize('{text}').short").fetchall()
    assert len(short) < len(long) and svc.stats()["requests"] == 2
    assert con.execute("SELECT batchsum_estimate(['x'])").fetchall()[0][0]["skipped"] == 1
    gc.collect()  # DuckDB let the earlier functions go: their run ended with them
    assert repr(first) == "Registration(batchsum_summarize, closed)"
    assert repr(second) == "Registration(batchsum_summarize, open)"


def test_a_quota_spent_gives_every_row_back_with_a_warning_and_the_next_query_sends_nothing(con, svc):
    """As from every frame front-end: the rows the quota left unsent are ``not_sent`` rows, the
    query finishes, and a warning says why; the query again pays nothing more."""
    register(con, svc, quota="3/day")
    table(con, [article(20, seed=i) for i in range(8)])
    query = "SELECT s.status, s.error FROM (SELECT id, batchsum_summarize(text) AS s FROM tickets) ORDER BY id"
    with pytest.warns(RuntimeWarning, match="daily quota of 3 .configured."):
        rows = con.execute(query).fetchall()
    assert [status for status, _ in rows].count("ok") == 3
    assert [error for status, error in rows if status != "ok"] == ["not_sent"] * 5
    with pytest.warns(RuntimeWarning, match="daily quota of 3"):
        again = con.execute(query).fetchall()
    assert again == rows and svc.stats()["requests"] == 3


@pytest.mark.slow
def test_a_quota_spent_while_duckdbs_threads_call_at_once_ends_the_query_with_every_row(svc, tmp_path):
    """Four DuckDB threads in one run, each with its own chunks: the quota spent in one thread's
    batch ends the others' too (they looked only at their own answers, and waited forever), and a
    run closed by one call never strands another's on its stopped loop; the quota is spent whole (a
    thread's batch refused while another's claims were still pending never gave those back)."""
    pq.write_table(
        pa.table({"text": [article(12, seed=i) for i in range(2048)]}), tmp_path / "in.parquet", row_group_size=512
    )
    connection = duckdb.connect()
    connection.execute("SET threads = 4")
    register(connection, svc, quota="30/day")
    svc.faults = Faults(latency=0.2)
    got: dict = {}

    def query() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one warning per chunk: the quota spent
            got["rows"] = connection.execute(
                f"SELECT batchsum_summarize(text).status FROM '{tmp_path}/in.parquet'"
            ).fetchall()

    worker = threading.Thread(target=query, daemon=True)
    worker.start()
    worker.join(120)  # a guard against a hang, not a timing: it ends in seconds
    assert not worker.is_alive(), "the query hung"
    statuses = [status for (status,) in got["rows"]]
    assert len(statuses) == 2048 and statuses.count("ok") == 30 == svc.stats()["requests"]
    connection.close()


@pytest.mark.slow
@pytest.mark.parametrize("rpm", [600, 0])
def test_duckdbs_threads_on_a_paced_key_spend_a_configured_quota_whole(svc, tmp_path, rpm):
    """Issue 52: ``threads = 4``, 60 texts in four row groups, a daily quota of 30 on a fresh budget:
    the service admits 30. A batch whose claim the quota refused judged the key spent while the other
    threads' batches held claims waiting for their turns, and those were given back unsent (3 of 30
    at 60/min). A claim refused is a spent key only when none of the run's may still come back."""
    path = tmp_path / "four.parquet"
    pq.write_table(pa.table({"text": [article(12, seed=500 + i) for i in range(60)]}), path, row_group_size=15)
    connection = duckdb.connect()
    connection.execute("SET threads = 4")
    batchsum.duckdb.register(connection, api_key=KEY, base_url=svc.url, rpm=rpm, quota="30/day", progress=False)
    with pytest.warns(RuntimeWarning, match="daily quota of 30 .configured."):
        rows = connection.execute(f"SELECT s.status, s.error FROM (SELECT batchsum_summarize(text) AS s FROM '{path}')")
        statuses = rows.fetchall()
    connection.close()
    assert [status for status, _ in statuses].count("ok") == 30 == svc.stats()["requests"]
    assert sorted(error for status, error in statuses if status != "ok") == ["not_sent"] * 30


def test_a_cap_and_a_sample_are_refused(con, svc):
    for option in ({"max_requests": 5}, {"sample": 3}):
        with pytest.raises(InvalidParameterError, match="a chunk at a time"):
            register(con, svc, **option)
    assert svc.stats()["requests"] == 0


# A cancel stops the spending. The service counts what reaches it: "after the stop" is what it
# admitted from the moment the stop was asked, answers on the wire at that moment included.
AFTER_STOP = 25  # at most this many requests admitted after a stop (at 600/min: the turns already due, the wire)


def texts_file(tmp_path, rows: int, seed: int) -> str:
    """Distinct texts in row groups of 100, so that each of DuckDB's threads has chunks of its own."""
    path = tmp_path / "texts.parquet"
    pq.write_table(pa.table({"text": [article(20, seed=seed + i) for i in range(rows)]}), path, row_group_size=100)
    return str(path)


def query_again_pays_none_twice(svc, path: str, rows: int) -> None:
    """The same query on a connection of this process, unpaced: every row ok, and no text the
    stopped query was answered is paid again."""
    connection = duckdb.connect()
    register(connection, svc)
    statuses = connection.execute(
        f"SELECT s.status FROM (SELECT batchsum_summarize(text) AS s FROM '{path}')"
    ).fetchall()
    connection.close()
    assert statuses == [("ok",)] * rows
    assert svc.stats()["answered_unique"] == rows and svc.stats()["answered_twice"] == 0


@pytest.mark.slow
def test_interrupt_stops_the_runs_on_the_connection_then_its_query_and_keeps_every_answer(svc, tmp_path):
    path = texts_file(tmp_path, 800, seed=31000)
    connection = duckdb.connect()
    connection.execute("SET threads = 4")
    registration = batchsum.duckdb.register(
        connection, api_key=KEY, base_url=svc.url, rpm=600, progress=False, report=str(tmp_path / "run.json")
    )
    ended: dict = {}

    def query() -> None:
        try:
            connection.execute(f"SELECT s.status FROM (SELECT batchsum_summarize(text) AS s FROM '{path}')").fetchall()
        except duckdb.Error as exc:
            ended["error"] = str(exc)

    worker = threading.Thread(target=query, daemon=True)
    worker.start()
    at = wait_for_count(svc, 30)
    assert batchsum.duckdb.interrupt(connection) == 1  # returns once the answers on the wire are in
    worker.join(120)  # a guard against a hang, not a timing
    assert not worker.is_alive(), "the query went on"
    assert "RunCancelled" in ended["error"] or "Interrupted" in ended["error"]
    assert svc.stats()["requests"] - at <= AFTER_STOP
    # The run is closed (nothing more can be sent: the chunks DuckDB had handed over are not run out),
    # and its report says why.
    assert repr(registration).endswith("closed)")
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["outcome"] == "stopped" and report["error"]["type"] == "RunCancelled"
    assert report["requests"]["texts_sent"] == svc.stats()["answered"]  # every answer paid is the run's, kept
    connection.close()
    query_again_pays_none_twice(svc, path, 800)


CHILD_QUERY = """
import os, sys, time
import duckdb
import batchsum.duckdb
path, settings, report = sys.argv[1], sys.argv[2], sys.argv[3]
con = duckdb.connect()
con.execute(settings)
con.execute("SET enable_progress_bar = false")
batchsum.duckdb.register(con, base_url=os.environ["BATCHSUM_BASE_URL"], rpm=600, progress=False, report=report)
try:
    try:
        con.execute(f"SELECT s.status FROM (SELECT batchsum_summarize(text) AS s FROM '{path}')").fetchall()
        print("finished")
    except BaseException as exc:  # DuckDB's one exception for the signal
        print(type(exc).__name__, str(exc).replace(chr(10), " "), flush=True)
        for _ in range(10):  # a clean-up that takes a while: a second exception would cut it short
            time.sleep(0.02)
        print("cleaned up")
except KeyboardInterrupt:  # a second exception, into the handler of the first
    print("interrupted again")
"""


# DuckDB's own errors for a query a signal ended: its wait's, or the function's, whichever it met first
RAISED = ("RuntimeError Query interrupted", "InvalidInputException")
NAMED = ("Query interrupted", "RunInterrupted: interrupted (SIGINT)", "KeyboardInterrupt")


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [
        "SET threads = 4; SET external_threads = 0",  # the function runs mostly on DuckDB's own threads
        "SET threads = 1",  # the function runs on the main thread, which gets the KeyboardInterrupt in it
    ],
)
def test_sigint_stops_a_query_in_another_process_with_one_exception_and_keeps_every_answer(svc, tmp_path, settings):
    """SIGINT while the main thread is inside DuckDB: the signal is heard on the main thread's
    behalf (the wakeup fd), and the runs stop once the main thread has heard it, so the query
    raises one exception, DuckDB's own (DuckDB turns a KeyboardInterrupt raised while it runs, in
    its wait or in the function, into an error of its own: no query raises one), whose handler runs
    to its end. A stop that ended the query before the main thread heard the signal had DuckDB raise
    ``InterruptException``, and Python's handler a ``KeyboardInterrupt`` into that handler. The run
    stops, keeps every answer, and the process ends."""
    import os
    import signal
    import subprocess
    import sys

    path = texts_file(tmp_path, 800, seed=32000 + len(settings) * 100)
    env = dict(os.environ, BATCHSUM_API_KEY=KEY, BATCHSUM_BASE_URL=svc.url, PYTHONPATH=os.getcwd())
    report = tmp_path / "run.json"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_QUERY, path, settings, str(report)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    at = wait_for_count(svc, 30, alive=child)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)  # a guard against a hang, not a timing
    assert child.returncode == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 and lines[1] == "cleaned up", out  # one exception, its handler whole
    assert lines[0].startswith(RAISED) and any(name in lines[0] for name in NAMED), out
    after = svc.stats()["requests"] - at
    print(f"{settings}: requests after the signal: {after}")
    assert after <= AFTER_STOP
    stopped = json.loads(report.read_text())
    assert stopped["outcome"] == "stopped" and stopped["error"]["type"] == "RunInterrupted"
    assert stopped["requests"]["texts_sent"] == svc.stats()["answered"]
    query_again_pays_none_twice(svc, path, 800)
