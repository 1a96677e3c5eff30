"""A run killed mid-way (SIGKILL, Ctrl-C) and started again with the same command finishes
without sending any answered request twice. Counted at the service."""

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pandas as pd
import pytest

from batchsum.local import Faults, LocalService
from tests.conftest import KEY, article

ROWS = 300


@pytest.fixture
def setup(tmp_path):
    with LocalService([KEY], faults=Faults(latency=0.01)) as service:
        texts = [article(15, seed=i) + f" Row {i}." for i in range(ROWS)]
        pd.DataFrame({"n": range(ROWS), "text": texts}).to_parquet(tmp_path / "in.parquet")
        env = {**os.environ, "BATCHSUM_API_KEY": KEY, "BATCHSUM_BASE_URL": service.url}
        argv = [
            sys.executable,
            "-m",
            "batchsum.cli",
            "summarize",
            str(tmp_path / "in.parquet"),
            "-o",
            str(tmp_path / "out.parquet"),
            "--column",
            "text",
            "--rpm",
            "0",
            "--concurrency",
            "4",
            "--quiet",
        ]
        yield service, argv, env, tmp_path


def wait_for_answers(service, count, proc):
    deadline = time.monotonic() + 60
    while service.stats()["answered"] < count:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)


def quiesce(service):
    """Stop answering (every request now gets a 500 and is retried later), so that each answer the
    service gave has reached the client before the kill: what a kill loses is then only what the
    journal lost."""
    service.faults = Faults(rates={"500": 1.0})
    time.sleep(0.5)


def finish(service, argv, env, tmp_path):
    service.faults = Faults()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stats = service.stats()
    assert stats["answered_unique"] == ROWS and stats["answered_twice"] == 0
    out = pd.read_parquet(tmp_path / "out.parquet")
    assert list(out["n"]) == list(range(ROWS)) and (out["summary_status"] == "ok").all()
    return done


def test_sigkill_mid_run_then_the_same_command_sends_no_answered_request_twice(setup):
    service, argv, env, tmp_path = setup
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_answers(service, 60, proc)
    quiesce(service)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    answered_before = service.stats()["answered"]
    assert 60 <= answered_before < ROWS
    assert not (tmp_path / "out.parquet").exists()
    done = finish(service, argv, env, tmp_path)
    assert f"{ROWS - answered_before} sent, {answered_before} reused" in done.stderr


def journal_rows(tmp_path):
    with sqlite3.connect(tmp_path / "out.parquet.journal.sqlite") as db:
        return db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]


@pytest.mark.parametrize(
    "signum, code, words", [(signal.SIGINT, 130, "interrupted: "), (signal.SIGTERM, 143, "terminated (SIGTERM): ")]
)
def test_sigint_and_sigterm_stop_alike_and_keep_every_answer_on_the_wire(setup, signum, code, words):
    service, argv, env, tmp_path = setup
    service.faults = Faults(latency=0.4)  # requests spend a while on the wire
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_answers(service, 20, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert words in err and "run the same command again to resume" in err
    assert "waiting for answers on the wire" in err
    # Every answer the service gave (those on the wire at the signal included) is in the journal.
    assert service.stats()["answered"] == journal_rows(tmp_path)
    assert not (tmp_path / "out.parquet").exists() and not list(tmp_path.glob(".*.partial"))
    finish(service, argv, env, tmp_path)


def test_a_second_signal_aborts_at_once(setup):
    service, argv, env, tmp_path = setup
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_answers(service, 20, proc)
    service.faults = Faults(latency=100)  # what is on the wire now would keep a drain waiting
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=12)  # well before the 15 s a drain may take
    assert proc.returncode == 143, err
    service.faults = Faults()
    finish(service, argv, env, tmp_path)
