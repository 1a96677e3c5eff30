"""Fixtures of the pacing tests."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from batchsum.pacing.budgets.budget import ProcessBudget, RedisBudget, SQLiteBudget

ROOT = Path(__file__).resolve().parents[2]
FAR_SECONDS = 0.02  # a Redis a zone away: each round trip this much longer


@pytest.fixture(params=["process", "sqlite", "redis"])
def users(request, tmp_path):
    """A factory of users of one budget: each call is another connection (as another process has)."""
    identity = uuid.uuid4().hex
    if request.param == "process":
        budget = ProcessBudget(shared=True)
        return lambda: budget
    if request.param == "sqlite":
        return lambda: SQLiteBudget(tmp_path / "budget.sqlite", identity)
    url = request.getfixturevalue("redis_url")
    return lambda: RedisBudget(url, identity)


@pytest.fixture(scope="session")
def far_redis_url(redis_url):
    """The session's redis-server a zone away: behind the proxy that adds 20 ms to every round trip
    (``benchmarks/delay_proxy.py``, in a process of its own)."""
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    argv = [sys.executable, str(ROOT / "benchmarks" / "delay_proxy.py"), "--to", f"127.0.0.1:{port}"]
    proxy = subprocess.Popen([*argv, "--delay", str(FAR_SECONDS)], stdout=subprocess.PIPE, text=True)
    try:
        assert proxy.stdout is not None
        yield f"redis://127.0.0.1:{int(proxy.stdout.readline())}/0"
    finally:
        proxy.terminate()
        proxy.wait(10)


@pytest.fixture(params=["machine", "redis", "redis 20 ms away"])
def budget_at(request) -> str:
    """Where a real run's budget lives (``--budget``): the machine's, a Redis beside it, or one a zone away."""
    if request.param == "machine":
        return "machine"
    return request.getfixturevalue("redis_url" if request.param == "redis" else "far_redis_url")
