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


# The CLI in a process of its own (main() without argv, as the `batchsum` command runs), with a second
# signal injected at once after one of the steps that follow a run's end: its loop, the command, main.
SECOND_SIGNAL = """
import asyncio, os, signal, sys
import batchsum.cli
where, second = sys.argv[1], getattr(signal, sys.argv[2])
sys.argv = ["batchsum", *sys.argv[3:]]
def then_signal(step):
    def wrapped(*args, **kwargs):
        try:
            return step(*args, **kwargs)
        finally:
            os.kill(os.getpid(), second)
    return wrapped
if where == "loop":
    asyncio.run = then_signal(asyncio.run)
elif where == "command":
    batchsum.cli.summarize_command = then_signal(batchsum.cli.summarize_command)
code = then_signal(batchsum.cli.main)() if where == "main" else batchsum.cli.main()
sys.exit(code)
"""


@pytest.mark.parametrize(
    "where, first, second, code",
    [("main", signal.SIGINT, "SIGINT", 130)]  # the Ctrl-C twice of issue 41: a raw -2 before
    + [(where, signal.SIGINT, "SIGTERM", 143) for where in ("loop", "command", "main")]
    + [(where, signal.SIGTERM, "SIGINT", 130) for where in ("loop", "command", "main")],
)
def test_a_second_signal_right_after_the_run_returns_leaves_with_its_code_never_a_raw_signal(
    setup, where, first, second, code
):
    service, argv, env, tmp_path = setup
    service.faults = Faults(latency=0.2)
    script = [sys.executable, "-c", SECOND_SIGNAL, where, second, *argv[3:]]  # argv[:3]: python -m batchsum.cli
    proc = subprocess.Popen(script, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_answers(service, 20, proc)
    proc.send_signal(first)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err  # the last signal's code: never -2 or -15
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"batchsum: {second}") and "leaving at once" in last and "kept" in last, err
    if where != "loop":  # the run's own stop line came first
        assert "run the same command again to resume" in err
    assert service.stats()["answered"] == journal_rows(tmp_path)  # every answer the service gave is kept
