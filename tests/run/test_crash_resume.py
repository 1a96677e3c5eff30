"""A run killed mid-way (SIGKILL, Ctrl-C) and started again with the same command finishes
without sending any answered request twice. Counted at the service."""

import os
import signal
import sqlite3
import subprocess
import sys

import pandas as pd
import pytest

from batchsum.local import Faults, LocalService
from tests.support import KEY, article, stderr_until, summarize_argv, wait_for, wait_for_count

ROWS = 300


@pytest.fixture
def setup(tmp_path):
    with LocalService([KEY], faults=Faults(latency=0.01)) as service:
        texts = [article(15, seed=i) + f" Row {i}." for i in range(ROWS)]
        pd.DataFrame({"n": range(ROWS), "text": texts}).to_parquet(tmp_path / "in.parquet")
        env = {**os.environ, "BATCHSUM_API_KEY": KEY, "BATCHSUM_BASE_URL": service.url}
        argv = summarize_argv(
            tmp_path / "in.parquet", tmp_path / "out.parquet", "--rpm", "0", "--concurrency", "4", "--quiet"
        )
        yield service, argv, env, tmp_path


def answered_then_refused(answers):
    """The service answers the first ``answers`` requests, then refuses every one with a 500 (retried
    later): the run answers no more, however long the test takes to act."""
    return Faults(latency=0.01, script=["ok"] * answers, rates={"500": 1.0})


def journaled(tmp_path, count):
    """Until the journal holds ``count`` answers: each answer the service gave reached the client and
    was kept, so what a kill loses is then only what the journal lost (a guard, not a timing)."""
    held = lambda: (tmp_path / "out.parquet.journal.sqlite").exists() and journal_rows(tmp_path) >= count  # noqa: E731
    wait_for(held, what=f"the journal to hold {count} answers")


def finish(service, argv, env, tmp_path):
    service.faults = Faults()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stats = service.stats()
    assert stats["answered_unique"] == ROWS and stats["answered_twice"] == 0
    out = pd.read_parquet(tmp_path / "out.parquet")
    assert list(out["n"]) == list(range(ROWS)) and (out["summary_status"] == "ok").all()
    return done


@pytest.mark.slow
def test_sigkill_mid_run_then_the_same_command_sends_no_answered_request_twice(setup):
    service, argv, env, tmp_path = setup
    service.faults = answered_then_refused(60)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_count(service, 60, "answered", alive=proc)
    journaled(tmp_path, 60)
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    answered_before = service.stats()["answered"]
    assert answered_before == 60
    assert not (tmp_path / "out.parquet").exists()
    done = finish(service, argv, env, tmp_path)
    assert f"{ROWS - answered_before} sent, {answered_before} reused" in done.stderr


def journal_rows(tmp_path):
    with sqlite3.connect(tmp_path / "out.parquet.journal.sqlite") as db:
        return db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, code, words", [(signal.SIGINT, 130, "interrupted: "), (signal.SIGTERM, 143, "terminated (SIGTERM): ")]
)
def test_sigint_and_sigterm_stop_alike_and_keep_every_answer_on_the_wire(setup, signum, code, words):
    service, argv, env, tmp_path = setup
    # Requests spend a while on the wire, and those after the 20th are held until the signal is sent:
    # the run cannot end first. The signal reaches the run's loop before the answers let go after it.
    service.faults = Faults(latency=0.4, hold_after=20)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_count(service, 20, "answered", alive=proc)
    proc.send_signal(signum)
    service.faults.release()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert words in err and "run the same command again to resume" in err
    assert "waiting for answers on the wire" in err
    # Every answer the service gave (those on the wire at the signal included) is in the journal.
    assert service.stats()["answered"] == journal_rows(tmp_path)
    assert not (tmp_path / "out.parquet").exists() and not list(tmp_path.glob(".*.partial"))
    finish(service, argv, env, tmp_path)


@pytest.mark.slow
def test_a_second_signal_aborts_at_once(setup):
    """The first SIGTERM waits for the answers on the wire (here: 100 s away); the second leaves at once,
    which the run says. The second is sent once the first was acted on (its line said), never before."""
    service, argv, env, tmp_path = setup
    service.faults = Faults(latency=100, latency_after=20)  # after the 20th, what is on the wire keeps a drain waiting
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_count(service, 20, "answered", alive=proc)
    journaled(tmp_path, 20)  # every answer given is kept: what the abort leaves is only what was never answered
    proc.send_signal(signal.SIGTERM)
    seen = stderr_until(proc, "SIGTERM: stopping; waiting for answers on the wire")  # what it did, it said
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=60)  # a guard against a hang: what the drain would take is 100 s
    err = "".join(seen) + rest
    assert proc.returncode == 143, err
    assert "SIGTERM again: aborting; the answers received so far are kept" in err
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


@pytest.mark.slow
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
    service.faults = Faults(latency=0.2, hold_after=20)  # the run cannot end before the first signal
    script = [sys.executable, "-c", SECOND_SIGNAL, where, second, *argv[3:]]  # argv[:3]: python -m batchsum.cli
    proc = subprocess.Popen(script, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_count(service, 20, "answered", alive=proc)
    proc.send_signal(first)
    service.faults.release()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err  # the last signal's code: never -2 or -15
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"batchsum: {second}") and "leaving at once" in last and "kept" in last, err
    if where != "loop":  # the run's own stop line came first
        assert "run the same command again to resume" in err
    assert service.stats()["answered"] == journal_rows(tmp_path)  # every answer the service gave is kept
