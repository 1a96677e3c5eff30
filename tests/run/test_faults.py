"""Faults and hostile inputs, tried as an attacker would: never pay twice, never lose what was paid
for, never leak the key, never sink a batch for one row, always a one-line error. Counted at the
service where a real one can produce the fault; mock transports only for answers no server of ours
gives on demand (a 200 without a result, a 50 MB answer, an echoed key)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import httpx
import pandas as pd
import pytest

import batchsum
from batchsum.cli import main
from batchsum.data.journal import Journal
from batchsum.data.stores import MemoryStore
from batchsum.engine import summarize_stream
from batchsum.errors import APIResponseValidationError, APITimeoutError, ConfigurationError, InvalidParameterError
from batchsum.local import Faults, LocalService
from tests.support import KEY, article, stderr_until, summarize_argv, wait_for

SECRET = "sk-live-THE-SECRET-KEY-0123456789"


def rows(n, start=0):
    return [article(15, seed=i) + f" Row {i}." for i in range(start, start + n)]


def parquet(tmp_path, n=40, name="in.parquet"):
    path = tmp_path / name
    pd.DataFrame({"n": range(n), "text": rows(n)}).to_parquet(path)
    return str(path)


def run(*argv):
    return main(["summarize", *argv, "--quiet"])


def one_line_error(capsys, *words):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for word in words:
        assert word in err, err
    return err


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


# -- paying twice, losing paid answers ----------------------------------------------------------


@pytest.mark.slow
def test_two_runs_on_one_output_the_second_is_refused_naming_the_first_or_waits(env, tmp_path):
    src = parquet(tmp_path, 30)
    out = str(tmp_path / "out.parquet")
    # The service answers the first run's first two requests and holds the rest until the waiting run
    # says it waits: the first run is still going when the second and the third start, however long a
    # busy machine takes to start them.
    env.faults = Faults(latency=0.05, hold_after=2)
    argv = summarize_argv(src, out, "--rpm", "0", "--concurrency", "2", "--quiet")
    environ = {**os.environ, "BATCHSUM_API_KEY": KEY, "BATCHSUM_BASE_URL": env.url}
    first = subprocess.Popen(argv, env=environ, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: env.stats()["requests"] >= 2, what="the first run's two requests", alive=first)
    second = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2
    assert f"in use by another batchsum run (pid {first.pid}" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    waiting = subprocess.Popen(argv + ["--wait"], env=environ, stderr=subprocess.PIPE, text=True)
    try:
        said = stderr_until(waiting, "waiting for the other run")
        assert "waiting for the other run" in said[0], said  # the first thing it says
    finally:
        env.faults.release()  # never left held: the runs end whatever the assertions found
    err = "".join(said) + waiting.communicate(timeout=120)[1]
    assert first.wait(120) == 0 and waiting.returncode == 0, err
    assert "30 reused" in err
    assert env.stats()["answered_twice"] == 0 and env.stats()["answered_unique"] == 30


def test_a_journal_that_cannot_be_written_stops_sending_and_the_output_keeps_every_paid_answer(
    env, tmp_path, capsys, monkeypatch
):
    src = parquet(tmp_path, 60)
    out = tmp_path / "out.parquet"
    real_put, writes = Journal.put, []

    def full_disk(self, key, answer):
        if len(writes) >= 10:
            raise batchsum.errors.JournalError(f"the journal {self.path}: database or disk is full")
        writes.append(key)
        real_put(self, key, answer)

    monkeypatch.setattr(Journal, "put", full_disk)
    env.faults = Faults(latency=0.05)
    assert run(src, "-o", str(out), "--column", "text", "--rpm", "0", "--concurrency", "4") == 1
    err = one_line_error(capsys, "cannot write the journal", "database or disk is full", "run the same command again")
    paid = env.stats()["answered"]
    assert paid <= 10 + 1 + 4  # nothing new started after the failed write: only what was on the wire
    done = pd.read_parquet(out)
    assert (done["summary_status"] == "ok").sum() == paid  # every answer paid for is in the output
    assert list(done["n"]) == list(range(len(done))) and f"holds the {len(done)} rows" in err


def test_a_200_without_a_result_is_a_permanent_bad_response_paid_once(tmp_path):
    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(200, json={"summary": "not the contract"})

    async def go():
        store = MemoryStore()
        for _ in range(2):  # a rerun on the same store
            async with batchsum.AsyncClient(KEY, "http://127.0.0.1:9", transport=httpx.MockTransport(handler)) as c:
                out = [r async for r in summarize_stream(rows(3), c, store=store)]
        return out

    out = asyncio.run(go())
    assert [(r.status, r.error, r.attempts) for r in out] == [("failed", "bad_response", 1)] * 3
    assert len(calls) == 3


def test_a_zero_or_past_retry_after_backs_off_instead_of_retrying_at_once(svc):
    svc.faults = Faults(script=["429", "429", "429"], retry_after=0)
    waits = []
    with batchsum.Client(KEY, svc.url, sleep=waits.append) as client:
        assert client.summarize(article(20))
    assert len(waits) == 3 and min(waits) >= 0.375 and waits == sorted(waits)


# -- bounded time and memory ---------------------------------------------------------------------


def test_a_huge_answer_fails_the_row_without_reading_it_whole():
    produced = []

    def endless():
        while True:
            chunk = b"x" * 65536
            produced.append(len(chunk))
            yield chunk

    def handler(request):
        return httpx.Response(200, headers={"content-type": "application/json"}, stream=_Stream(endless()))

    with batchsum.Client(KEY, "http://127.0.0.1:9", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(APIResponseValidationError, match="more than 2 MiB") as caught:
            client.summarize(article(20))
    assert caught.value.attempts == 1 and not caught.value.transient
    assert sum(produced) < 3 * 1024 * 1024


class _Stream(httpx.SyncByteStream):
    def __init__(self, chunks):
        self._chunks = chunks

    def __iter__(self):
        yield from self._chunks


@pytest.fixture
def dripping_server():
    """A real loopback server that answers 200 and then drips its body one byte every 0.2 s."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    stop = threading.Event()

    def serve():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    def drip(conn):
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n")
            while not stop.is_set():
                conn.sendall(b" ")
                time.sleep(0.2)
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    sock.close()


@pytest.mark.slow
def test_the_timeout_bounds_the_whole_answer_not_each_read_sync(dripping_server):
    with batchsum.Client(KEY, dripping_server, timeout=1.0, max_retries=0) as client:
        with pytest.raises(APITimeoutError, match="no whole answer within the timeout of 1 s"):
            client.summarize(article(20))


@pytest.mark.slow
async def test_the_timeout_bounds_the_whole_answer_not_each_read_async(dripping_server):
    async with batchsum.AsyncClient(KEY, dripping_server, timeout=1.0, max_retries=0) as client:
        with pytest.raises(APITimeoutError, match="no whole answer within the timeout of 1 s"):
            await client.summarize(article(20))


# -- the key -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        SECRET[:9] + "\n" + SECRET[9:],
        SECRET[:5] + "\r\nX-Evil: 1",
        SECRET + "\x00",
        "clé-" + SECRET,
        SECRET[:6] + " " + SECRET[6:],
    ],
)
def test_a_key_with_a_control_space_or_non_ascii_character_is_refused_without_echoing_it(key):
    with pytest.raises(ConfigurationError) as caught:
        batchsum.Client(key, "http://127.0.0.1:9")
    assert SECRET[:8] not in str(caught.value) and "position" in str(caught.value)


def test_the_cli_refuses_a_bad_key_in_one_line_and_writes_nothing(svc, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BATCHSUM_API_KEY", SECRET[:9] + "\n" + SECRET[9:])
    monkeypatch.setenv("BATCHSUM_BASE_URL", svc.url)
    assert run(parquet(tmp_path), "-o", str(tmp_path / "out.parquet"), "--column", "text") == 2
    err = one_line_error(capsys, "control character")
    assert SECRET not in err and sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]
    assert svc.stats()["requests"] == 0


async def test_a_service_echoing_the_key_never_gets_it_into_results_or_logs(caplog):
    def handler(request):
        echoed = request.headers["authorization"]
        if b"Row 0" in request.content:
            return httpx.Response(500, json={"error": f"boom for {echoed}"})
        if b"Row 1" in request.content:
            return httpx.Response(422, json={"type": "invalid_request", "message": f"bad request from {echoed}"})
        return httpx.Response(200, json={"result": f"summary; your header was {echoed}"})

    caplog.set_level("DEBUG", logger="batchsum")
    async with batchsum.AsyncClient(
        SECRET, "https://service.example", transport=httpx.MockTransport(handler), max_retries=1
    ) as client:
        out = [r async for r in summarize_stream(rows(3), client, rpm=0)]
    assert [r.status for r in out] == ["failed", "failed", "ok"]
    assert SECRET not in json.dumps(out) and SECRET not in caplog.text
    assert "[redacted]" in out[0].message and "[redacted]" in out[2].summary


@pytest.mark.parametrize(
    "url", ["http://evil.localhost:8000", "http://localhost.evil.example", "http://127.0.0.1.nip.io"]
)
def test_only_literal_loopback_addresses_and_localhost_get_the_key_over_plain_http(url):
    with pytest.raises(ConfigurationError, match="plain http"):
        batchsum.Client(KEY, url)


# -- inputs and files ----------------------------------------------------------------------------


async def test_a_lone_surrogate_gets_its_own_record_and_the_batch_goes_on(svc):
    texts = rows(2) + ["\ud800 " + rows(1, 5)[0], rows(1, 9)[0] + "\udfff"]
    async with batchsum.AsyncClient(KEY, svc.url) as client:
        out = [r async for r in summarize_stream(texts, client)]
    assert [r.status for r in out] == ["ok", "ok", "skipped", "skipped"]
    assert out[2].error == "invalid_text" and "U+D800 at character 1" in out[2].message
    assert svc.stats()["requests"] == 2


def test_a_symlink_planted_at_a_temporary_name_is_never_followed(env, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name in (".out.parquet.partial", ".out.parquet.tmp"):
        (tmp_path / name).symlink_to(victim)
    assert run(parquet(tmp_path), "-o", str(tmp_path / "out.parquet"), "--column", "text", "--rpm", "0") == 0
    assert victim.read_text() == "precious"
    assert len(pd.read_parquet(tmp_path / "out.parquet")) == 40


def test_a_symlink_planted_at_the_journal_name_is_refused_and_its_target_untouched(env, tmp_path, capsys):
    victim = tmp_path / "victim.db"
    victim.write_bytes(b"not yours")
    (tmp_path / "out.parquet.journal.sqlite").symlink_to(victim)
    assert run(parquet(tmp_path), "-o", str(tmp_path / "out.parquet"), "--column", "text") == 2
    one_line_error(capsys, "is not a batchsum journal", "left as it is")
    assert victim.read_bytes() == b"not yours" and env.stats()["requests"] == 0


@pytest.mark.parametrize(
    "schema", ["CREATE TABLE users (name TEXT)", "CREATE TABLE answers (x INTEGER); CREATE TABLE other (y TEXT)", None]
)
def test_another_programs_file_as_journal_is_refused_unchanged(env, tmp_path, capsys, schema):
    theirs = tmp_path / "theirs.db"
    if schema is None:
        theirs.write_bytes(b"plain text, not a database at all\n" * 20)
    else:
        with sqlite3.connect(theirs) as db:
            db.executescript(schema)
    before = digest(theirs)
    assert (
        run(parquet(tmp_path), "-o", str(tmp_path / "out.parquet"), "--column", "text", "--journal", str(theirs)) == 2
    )
    one_line_error(capsys, "is not a batchsum journal")
    assert digest(theirs) == before and not list(tmp_path.glob("theirs.db-*"))
    assert not (tmp_path / "out.parquet").exists() and not list(tmp_path.glob(".out.parquet*.partial"))
    assert env.stats()["requests"] == 0


def test_the_journal_may_not_be_the_output(env, tmp_path, capsys):
    out = str(tmp_path / "out.parquet")
    assert run(parquet(tmp_path), "-o", out, "--column", "text", "--journal", out) == 2
    one_line_error(capsys, "is the output file")


@pytest.mark.slow
def test_a_journal_with_a_damaged_page_is_a_one_line_error(env, tmp_path, capsys):
    src = parquet(tmp_path, 200)
    out = str(tmp_path / "out.parquet")
    assert run(src, "-o", out, "--column", "text", "--rpm", "0") == 0
    capsys.readouterr()
    journal = tmp_path / "out.parquet.journal.sqlite"
    with sqlite3.connect(journal) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(journal.read_bytes())
    assert len(data) > 4 * 4096
    data[2 * 4096 + 8 : 2 * 4096 + 400] = os.urandom(392)
    journal.write_bytes(bytes(data))
    assert run(src, "-o", out, "--column", "text", "--rpm", "0") == 2
    one_line_error(capsys, "is damaged")


def test_a_read_only_output_folder_is_one_line_and_leaves_nothing(env, tmp_path, capsys, monkeypatch):
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert run(parquet(tmp_path), "-o", str(tmp_path / "out.parquet"), "--column", "text") == 2
    one_line_error(capsys, "Permission denied")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--rpm", "inf"], "finite"),
        (["--rpm", "nan"], "finite"),
        (["--timeout", "inf"], "finite"),
        (["--dry-run"], "would send"),
    ],
)
def test_refused_runs_and_dry_runs_create_no_file(env, tmp_path, capsys, argv, words):
    code = run(parquet(tmp_path), "-o", str(tmp_path / "out.parquet"), "--column", "text", *argv)
    captured = capsys.readouterr()
    assert words in captured.err + captured.out and "Traceback" not in captured.err
    assert code == (0 if "--dry-run" in argv else 2)
    if code == 2:
        assert captured.err.splitlines()[1] == "batchsum: see 'batchsum summarize --help'"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 0, -1, "5", True])
def test_a_timeout_must_be_a_finite_number_of_seconds(timeout):
    with pytest.raises(InvalidParameterError, match="invalid timeout"):
        batchsum.Client(KEY, "http://127.0.0.1:9", timeout=timeout)


@pytest.mark.parametrize(
    "options", [{"rpm": "60"}, {"rpm": float("inf")}, {"concurrency": 0}, {"concurrency": "8"}, {"limiter": object()}]
)
def test_the_accessor_refuses_bad_run_options_before_sending(svc, options):
    df = pd.DataFrame({"text": rows(3)})
    with pytest.raises(InvalidParameterError, match="invalid"):
        df.batchsum.summarize("text", api_key=KEY, base_url=svc.url, progress=False, **options)
    assert svc.stats()["requests"] == 0


# -- batchsum serve ------------------------------------------------------------------------------


def test_the_test_controls_are_off_unless_enabled_and_then_need_the_admin_key():
    with LocalService([KEY], test_controls=False) as off:
        assert httpx.get(f"{off.url}/_local/stats").status_code == 404
        assert httpx.post(f"{off.url}/_local/faults", json={"latency": 1e308}).status_code == 404
    with LocalService([KEY]) as on:
        assert httpx.get(f"{on.url}/_local/stats").status_code == 401
        user = {"Authorization": f"Bearer {KEY}"}
        assert httpx.post(f"{on.url}/_local/faults", json={"latency": 1e308}, headers=user).status_code == 401
        admin = {"Authorization": f"Bearer {on.state.admin_key}"}
        assert httpx.get(f"{on.url}/_local/stats", headers=admin).json()["requests"] == 0
        assert httpx.post(f"{on.url}/_local/faults", json={"latency": 1e308}, headers=admin).status_code == 400


def test_serve_keeps_its_test_controls_off_by_default():
    proc = subprocess.Popen(
        [sys.executable, "-m", "batchsum.cli", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        assert not any("admin key" in line for line in lines)
        key_line = next(line for line in lines if "key (premium)" in line)
        assert not key_line.split(": ", 1)[1].strip().startswith("-")
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_huge_body_gets_413_and_the_service_keeps_answering(svc):
    headers = {"Authorization": f"Bearer {KEY}"}
    big = httpx.post(
        f"{svc.url}/api/user/summarize",
        headers=headers,
        content=b'{"mode": 1, "text": "' + b"word " * 2_000_000 + b'"}',
        timeout=30,
    )
    assert big.status_code == 413 and "error" in big.json()
    ok = httpx.post(f"{svc.url}/api/user/summarize", headers=headers, json={"text": article(20), "mode": 1})
    assert ok.status_code == 200


@pytest.mark.parametrize(
    "body, content_type",
    [
        (b"[" * 100_000 + b"]" * 100_000, "application/json"),
        (b'{"text": "x", "mode": ' + b"[" * 50_000, "application/json"),
        (b"--nope\r\ngarbage", "multipart/form-data; boundary=nope"),
    ],
)
def test_malformed_or_deeply_nested_bodies_get_the_interfaces_422(svc, body, content_type):
    response = httpx.post(
        f"{svc.url}/api/user/summarize",
        content=body,
        headers={"Authorization": f"Bearer {KEY}", "content-type": content_type},
    )
    assert response.status_code == 422 and "detail" in response.json()


def test_the_output_gets_ordinary_permissions_not_the_temporary_files(env, tmp_path):
    old = os.umask(0o022)
    try:
        assert run(parquet(tmp_path, 5), "-o", str(tmp_path / "out.parquet"), "--column", "text", "--rpm", "0") == 0
    finally:
        os.umask(old)
    assert (tmp_path / "out.parquet").stat().st_mode & 0o777 == 0o644
