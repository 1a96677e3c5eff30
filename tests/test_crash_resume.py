"""A run killed mid-way (SIGKILL, Ctrl-C) and started again with the same command finishes
without sending any answered request twice. Counted at the service."""

import os
import signal
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
        argv = [sys.executable, "-m", "batchsum.cli", "summarize", str(tmp_path / "in.parquet"),
                "-o", str(tmp_path / "out.parquet"), "--column", "text", "--rpm", "0", "--concurrency", "4",
                "--quiet"]
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


def test_ctrl_c_exits_130_says_how_to_resume_and_loses_nothing(setup):
    service, argv, env, tmp_path = setup
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_answers(service, 40, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted after" in err and "run the same command again to resume" in err
    assert not (tmp_path / "out.parquet").exists() and not list(tmp_path.glob(".*.partial"))
    finish(service, argv, env, tmp_path)
