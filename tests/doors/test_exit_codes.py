"""Every way the command stops, with the exit code docs/cli.md states for it: one table, each path
driven for real (a refused key at the service, a journal on a full quota, a Parquet file broken
midway, the request cap, a Redis budget that goes away mid-run, an output folder that refuses the
final rename, a signal in the command's own process), and each row's words on the docs' row of
its code, so the page and the code cannot part ways."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchsum.cli import main
from batchsum.local import Faults, LocalService
from tests.run.test_stops import corrupt_last_row_group
from tests.support import EXPIRED_KEY, KEY, RedisServer, article, free_port, refuse_the_final_rename, wait_for_count

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def docs_rows() -> dict[int, str]:
    """docs/cli.md's exit-code table: code -> its meaning."""
    text = DOCS.read_text(encoding="utf-8").split("### Exit codes", 1)[1]
    return {int(code): meaning for code, meaning in re.findall(r"^\| (\d+) \| (.+) \|$", text, re.MULTILINE)}


@dataclass
class Case:
    """One way to stop: ``drive(service, tmp_path)`` runs the command and returns its exit code and
    what it said; ``code`` is what the docs promise; ``docs`` are words of that code's row; ``slow``:
    it starts a process or waits on the wall clock (left out of the fast lane)."""

    name: str
    drive: Callable[[LocalService, Path], tuple[int, str]]
    code: int
    docs: str
    slow: bool = False


def texts(n: int, seed: int = 0) -> list[str]:
    return [article(20, seed=seed + i) + f" Row {seed + i}." for i in range(n)]


def source(tmp_path: Path, n: int = 30, seed: int = 0) -> str:
    path = tmp_path / "in.parquet"
    pd.DataFrame({"n": range(n), "text": texts(n, seed)}).to_parquet(path)
    return str(path)


def summarize(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["summarize", *argv, "--column", "text", "--rpm", "0", "--quiet"])
    return code, capsys.readouterr().err


def command(service: LocalService, *argv: str) -> list[str]:
    return [sys.executable, "-m", "batchsum", "summarize", *argv, "--column", "text", "--rpm", "0", "--quiet"]


def environment(service: LocalService, key: str = KEY) -> dict[str, str]:
    return {**os.environ, "BATCHSUM_API_KEY": key, "BATCHSUM_BASE_URL": service.url}


def when_answered(service: LocalService, count: int, then: Callable[[], None]) -> threading.Thread:
    """``then()`` once the service has answered ``count`` requests. Every request after those is held
    at the service until ``then()`` has run: the run cannot end first, however late a busy machine
    lets this thread run (the wait's minute is a guard against a hang, not a timing)."""
    faults = service.faults = replace(service.faults, hold_after=count)

    def watch() -> None:
        try:
            wait_for_count(service, count, "answered")
            then()
        finally:
            faults.release()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


# -- the paths ------------------------------------------------------------------------------------


def finished(service, tmp_path, capsys, monkeypatch):
    return summarize(source(tmp_path), "-o", str(tmp_path / "out.parquet"), capsys=capsys)


def finished_with_failed_rows(service, tmp_path, capsys, monkeypatch):
    service.faults = Faults(script=["ok", "422"])
    code, err = summarize(source(tmp_path), "-o", str(tmp_path / "out.parquet"), capsys=capsys)
    assert (pd.read_parquet(tmp_path / "out.parquet")["summary_status"] == "failed").sum() == 1
    return code, err


def refused_key(service, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BATCHSUM_API_KEY", "test-key-wrong-0123456789")
    return summarize(source(tmp_path), "-o", str(tmp_path / "out.parquet"), capsys=capsys)


def expired_plan(service, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BATCHSUM_API_KEY", EXPIRED_KEY)
    return summarize(source(tmp_path), "-o", str(tmp_path / "out.parquet"), capsys=capsys)


def journal_not_written(service, tmp_path, capsys, monkeypatch):
    """The journal's writes fail once its file reaches a size limit (a full quota), in a process of
    its own."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    service.faults = Faults(latency=0.01)
    argv = command(service, source(tmp_path, 200), "-o", str(tmp_path / "out.parquet"), "--budget", "none")
    done = subprocess.run(argv, env=environment(service), capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert "cannot write the journal" in done.stderr
    return done.returncode, done.stderr


def input_breaks_midway(service, tmp_path, capsys, monkeypatch):
    rows = texts(50)
    table = pa.table({"n": list(range(5000)), "text": [rows[i % 50] for i in range(5000)]})
    src = tmp_path / "in.parquet"
    pq.write_table(table, src, row_group_size=1000, compression="none", use_dictionary=False)
    corrupt_last_row_group(src)
    code, err = summarize(str(src), "-o", str(tmp_path / "out.csv"), capsys=capsys)
    assert "cannot be read as Parquet" in err
    return code, err


def request_cap(service, tmp_path, capsys, monkeypatch):
    return summarize(source(tmp_path), "-o", str(tmp_path / "out.parquet"), "--max-requests", "5", capsys=capsys)


def budget_lost(service, tmp_path, capsys, monkeypatch):
    """A Redis budget whose server goes away mid-run for longer than --budget-wait."""
    redis = RedisServer(tmp_path).start()
    url = redis.url
    try:
        service.faults = Faults(latency=0.05)
        when_answered(service, 10, redis.stop)
        argv = ["-o", str(tmp_path / "out.parquet"), "--budget", url, "--concurrency", "2", "--budget-wait", "2"]
        code, err = summarize(source(tmp_path, 200), *argv, capsys=capsys)
    finally:
        redis.stop()
    assert f"waiting for the rate budget at {url}, unreachable since" in err
    assert "longer than --budget-wait (2 s" in err and "the same command continues: batchsum summarize" in err
    return code, err


def budget_back(service, tmp_path, capsys, monkeypatch):
    """A Redis budget whose server goes away mid-run and comes back empty within --budget-wait: a pause."""
    redis = RedisServer(tmp_path).start()
    url = redis.url

    def start_later() -> None:
        time.sleep(3.0)  # the outage the run waits out (nothing starts meanwhile: the run cannot end first)
        redis.start()

    later = threading.Thread(target=start_later, daemon=True)

    def stop() -> None:  # the requests after the 10th are held until Redis is down, then go on
        redis.stop()
        later.start()

    try:
        service.faults = Faults(latency=0.05)
        when_answered(service, 10, stop)
        argv = ["-o", str(tmp_path / "out.parquet"), "--budget", url, "--concurrency", "2"]
        code, err = summarize(source(tmp_path, 100), *argv, capsys=capsys)
    finally:
        if later.is_alive():
            later.join(30)
        redis.stop()
    assert f"waiting for the rate budget at {url}" in err and "answers again" in err
    assert (pd.read_parquet(tmp_path / "out.parquet")["summary_status"] == "ok").all()
    return code, err


def output_refused_at_the_end(service, tmp_path, capsys, monkeypatch):
    refuse_the_final_rename(monkeypatch)
    code, err = summarize(source(tmp_path), "-o", str(tmp_path / "out.parquet"), capsys=capsys)
    assert "cannot write" in err and "every answer is in the journal" in err and service.stats()["answered"] == 30
    return code, err


def bad_usage(service, tmp_path, capsys, monkeypatch):
    return summarize(source(tmp_path), "-o", str(tmp_path / "out.parquet"), "--no-such-flag", capsys=capsys)


def bad_input(service, tmp_path, capsys, monkeypatch):
    code, err = summarize(source(tmp_path), "-o", str(tmp_path / "out.txt"), capsys=capsys)
    assert service.stats()["requests"] == 0 and not list(tmp_path.glob("out*"))
    return code, err


PASSWORD = "pw-in-the-url-4242"


def store_url_malformed(service, tmp_path, capsys, monkeypatch):
    argv = ["-o", str(tmp_path / "out.parquet"), "--store", f"redis://:{PASSWORD}@localhost:abc/0"]
    for dry in ([], ["--dry-run"]):
        code, err = summarize(source(tmp_path), *argv, *dry, capsys=capsys)
        assert code == 2 and "invalid store 'redis://***@localhost:abc/0' (--store, store=)" in err, err
    assert service.stats()["requests"] == 0 and not list(tmp_path.glob("out*"))
    assert PASSWORD not in err
    return code, err


def budget_url_malformed(service, tmp_path, capsys, monkeypatch):
    """A budget that cannot be read, or names no kind of budget: the run and its dry run alike."""
    argv = [source(tmp_path), "-o", str(tmp_path / "out.parquet")]
    for dry in ([], ["--dry-run"]):
        code, err = summarize(*argv, "--budget", f"redis:/:{PASSWORD}@h/0", *dry, capsys=capsys)
        assert code == 2 and "unknown budget 'redis:/***@h/0' (--budget, budget=)" in err and PASSWORD not in err, err
        code, err = summarize(*argv, "--budget", f"redis://:{PASSWORD}@h:x/0", *dry, capsys=capsys)
        assert "invalid budget 'redis://***@h:x/0'" in err and PASSWORD not in err and not list(tmp_path.glob("out*"))
    return code, err


def output_column_taken(service, tmp_path, capsys, monkeypatch):
    """Result columns whose names the input has already: the run and its dry run alike."""
    for dry in ([], ["--dry-run"]):
        code, err = summarize(
            source(tmp_path), "-o", str(tmp_path / "out.parquet"), "--output-column", "n", *dry, capsys=capsys
        )
        assert code == 2 and "the input already has column 'n'" in err, err
    assert service.stats()["requests"] == 0 and not list(tmp_path.glob("out*"))
    return code, err


def store_out_of_reach(service, tmp_path, capsys, monkeypatch):
    code = main(["store", "--store", f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0", "--retention", "30d"])
    err = capsys.readouterr().err
    assert "the answer store at Redis (redis://***@127.0.0.1:" in err and PASSWORD not in err
    return code, err


def store_damaged(service, tmp_path, capsys, monkeypatch):
    """A store file whose table lost a column: what ``batchsum store`` asks of it fails in SQLite."""
    import sqlite3

    from batchsum.data.machine_store import FORMAT, default_store_path

    default_store_path().parent.mkdir(parents=True)
    db = sqlite3.connect(default_store_path())
    db.executescript(
        f"CREATE TABLE answers (service TEXT, fingerprint TEXT); CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT);"
        f"INSERT INTO meta VALUES ('format', '{FORMAT}');"
    )
    db.close()
    code = main(["store", "--remove", "--all"])
    err = capsys.readouterr().err
    assert "no such column" in err
    return code, err


def no_key(service, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("BATCHSUM_API_KEY")
    return summarize(source(tmp_path), "-o", str(tmp_path / "out.parquet"), capsys=capsys)


def unreachable_for_one_text(service, tmp_path, capsys, monkeypatch):
    code = main(["text", article(20), "--base-url", f"http://127.0.0.1:{free_port()}", "--max-retries", "0"])
    return code, capsys.readouterr().err


def signalled(signum: int) -> Callable[..., tuple[int, str]]:
    def drive(service, tmp_path, capsys, monkeypatch):
        service.faults = Faults(latency=0.2)
        argv = command(service, source(tmp_path, 200), "-o", str(tmp_path / "out.parquet"), "--concurrency", "4")
        proc = subprocess.Popen(argv, env=environment(service), stderr=subprocess.PIPE, text=True)
        when_answered(service, 10, lambda: proc.send_signal(signum)).join()
        _, err = proc.communicate(timeout=60)
        return proc.returncode, err

    return drive


CASES = [
    Case("finished", finished, 0, "finished"),
    Case("finished, a row failed", finished_with_failed_rows, 0, "per-row failures are in the output"),
    Case("a refused key", refused_key, 1, "wrong key"),
    Case("an expired plan", expired_plan, 1, "expired plan"),
    Case("a journal that cannot be written", journal_not_written, 1, "a journal that cannot be written", slow=True),
    Case("an input that breaks midway", input_breaks_midway, 1, "an input that breaks midway"),
    Case("the request cap", request_cap, 1, "the request cap"),
    Case("a budget back mid-run", budget_back, 0, "finished", slow=True),
    Case(
        "a budget lost mid-run",
        budget_lost,
        1,
        "a rate budget that could not be reached for longer than `--budget-wait`",
        slow=True,
    ),
    Case("an output refused at the end", output_refused_at_the_end, 1, "an output that cannot be written at the end"),
    Case("`batchsum text`, service unreachable", unreachable_for_one_text, 1, "service unreachable"),
    Case("an unknown flag", bad_usage, 2, "bad usage"),
    Case("an output format refused", bad_input, 2, "nothing sent, no file created"),
    Case("no key", no_key, 2, "bad usage or input"),
    Case("a store URL that cannot be read", store_url_malformed, 2, "nothing sent, no file created"),
    Case("a budget URL that cannot be read", budget_url_malformed, 2, "nothing sent, no file created"),
    Case("result columns the input has", output_column_taken, 2, "nothing sent, no file created"),
    Case("`batchsum store`, its Redis out of reach", store_out_of_reach, 2, "a one-line message"),
    Case("`batchsum store`, its file damaged", store_damaged, 2, "a one-line message"),
    Case("SIGINT", signalled(signal.SIGINT), 130, "interrupted (Ctrl-C, SIGINT)", slow=True),
    Case("SIGTERM", signalled(signal.SIGTERM), 143, "terminated (SIGTERM)", slow=True),
]


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=[pytest.mark.slow] * case.slow, id=case.name) for case in CASES]
)
def test_each_stop_exits_with_the_code_the_docs_state(case, env, tmp_path, capsys, monkeypatch):
    rows = docs_rows()
    assert case.docs in rows[case.code], f"docs/cli.md's row {case.code} does not say {case.docs!r}"
    code, err = case.drive(env, tmp_path, capsys, monkeypatch)
    assert code == case.code, err
    if code != 0:
        assert "Traceback" not in err
        assert err.strip().splitlines()[-1].startswith("batchsum: ")  # its reason, said in a line of its own


def test_an_output_put_refused_at_the_end_stops_with_how_to_resume(env, s3, tmp_path, capsys):
    """A remote output whose bucket went away mid-run: the put at the end fails; a stop (1) that says
    where the output is kept and how to resume, every answer journaled."""
    from pyarrow import fs

    s3.create_dir("going")
    deleting = fs.S3FileSystem(endpoint_override=os.environ["AWS_ENDPOINT_URL"], allow_bucket_deletion=True)
    env.faults = Faults(latency=0.05)
    when_answered(env, 5, lambda: deleting.delete_dir("going"))
    code, err = summarize(
        source(tmp_path), "-o", "s3://going/out.parquet", "--journal", str(tmp_path / "j.sqlite"), capsys=capsys
    )
    assert code == 1 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("batchsum: stopped: cannot put s3://going/out.parquet") and "the output is kept in" in line
    assert "30 new answers kept; run the same command again to resume" in line


def test_the_table_lists_every_code_the_command_leaves_with():
    from batchsum.cli import console

    codes = {value for name, value in vars(console).items() if name.startswith("EXIT_")}
    assert set(docs_rows()) == codes == {case.code for case in CASES}
