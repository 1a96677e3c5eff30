"""Fixtures of the pacing tests."""

from __future__ import annotations

import uuid

import pytest

from batchsum.pacing.budget import ProcessBudget, RedisBudget, SQLiteBudget


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
