"""``batchsum.monitor()`` without a browser (a real budget file, read as a person would watch it), the
arithmetic of its chart, and the run app's line on the other runs on its key. (In Chromium:
test_monitor_browser.py.)"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pandas as pd
import pytest

pytest.importorskip("ipywidgets")

import batchsum
from batchsum.app.monitor import BUCKET, KeyHistory, KeyMonitor
from batchsum.pacing.budgets.budget import Report, SQLiteBudget
from batchsum.pacing.budgets.exchange import Member
from batchsum.pacing.look.view import KeyView, RunView
from batchsum.service.settings import key_hash
from tests.support import KEY, article, wait_for

SERVICE = "http://127.0.0.1:9"


def run_view(run_id: str, sent: int) -> RunView:
    return RunView(run_id, "here", 1, 1, "cli", None, 600.0, "configured", 1.0, sent, 0, 0, 10, 0, None, None)


def key_view(now: float, runs, history, *, limit=600.0, paused_until=None) -> KeyView:
    return KeyView(
        key="abc",
        service=SERVICE,
        now=now,
        limit=limit,
        limit_source="configured",
        limits=(),
        rate_1m=0,
        starts_10s=0,
        rate_limited_1m=0,
        paused_until=paused_until,
        pause_reason=None,
        pace=None,
        quotas=(),
        counted={},
        search=None,
        runs=tuple(runs),
        history=tuple(history),
    )


def test_the_chart_stacks_each_runs_starts_per_10_s_and_keeps_what_no_run_accounts_for():
    history = KeyHistory()
    t = 1_000_000.0  # a bucket's start
    # The first look: 3 minutes of ledger, before the monitor saw any run: all of it "earlier".
    history.add(key_view(t + 1, [run_view("a", 100), run_view("b", 7)], [(t - 20, 40, 0), (t - 10, 50, 2)]), 180)
    # A second later: a grew by 9, b by 1; the ledger's bucket now holds 10 starts.
    history.add(key_view(t + 2, [run_view("a", 109), run_view("b", 8)], [(t - 10, 50, 2), (t, 10, 0)]), 70)
    # The key paused; the bucket read again (it only grows).
    history.add(key_view(t + 3, [run_view("a", 110), run_view("b", 8)], [(t, 12, 1)], paused_until=t + 30), 70)
    data = history.series()
    x = data["x"]
    assert len(x) == 91 and x[-1] == pytest.approx((t + BUCKET / 2 - (t + 3)) / 60)  # 15 minutes and the one now
    stacks = data["stacks"]
    assert list(stacks) == ["a", "b", "earlier"]
    assert (stacks["a"][-1], stacks["b"][-1], stacks["earlier"][-1]) == (10, 1, 1)  # 12 started: 10 + 1 + 1
    assert (stacks["earlier"][-2], stacks["earlier"][-3]) == (50, 40)
    assert data["limit"][-1] == 100  # 600/min is 100 a 10 s
    assert data["refused"] == [2, 1] and data["refused_y"] == [50, 12]
    assert data["pauses"] == [(0.0, 0.0)]  # from now, until now at the latest (the rest is ahead)
    # Sixteen minutes later, the old buckets are gone.
    history.add(key_view(t + 963, [run_view("a", 110)], []), 70)
    assert sum(history.series()["total"]) == 0


@pytest.mark.slow
def test_the_monitor_shows_the_key_and_its_runs_updates_and_stops_when_closed(tmp_path):
    path = tmp_path / "budget.sqlite"
    budget = SQLiteBudget(path, uuid.uuid4().hex)

    async def publish(sent: int) -> None:
        await budget.check()
        await budget.recall(key_hash(KEY), SERVICE)
        for _ in range(5):
            await budget.reserve(0.0)
        for run_id, share in (("nightly", 1.0), ("notebook", 0.5)):
            entry = {"host": "h", "pid": 1, "door": "cli", "rpm": 600, "source": "configured", "share": share}
            entry.update(sent=sent, rows_left=100 - sent, rate_1m=sent)
            await budget.reserve(0.0, Report(run=Member(run_id, run_id), entry=json.dumps(entry)), start=False)

    asyncio.run(publish(10))
    monitor = batchsum.monitor(f"sqlite://{path}")
    assert isinstance(monitor, KeyMonitor)
    assert "application/vnd.jupyter.widget-view+json" in monitor._repr_mimebundle_()  # a notebook shows the widget
    try:
        wait_for(lambda: monitor.polls >= 1 and "nightly" in monitor.table.value, what="a first look")
        assert key_hash(KEY) in monitor.state.value and "limit 600/min (configured)" in monitor.state.value
        assert "5 started in 10 s, 5 in 60 s of 600" in monitor.state.value
        assert monitor.table.value.count("<tr>") == 3  # the head and two runs
        asyncio.run(publish(25))  # the runs went on
        wait_for(lambda: ">25<" in monitor.table.value, what="the runs' new figures")
        wait_for(lambda: sum(monitor.chart.bars.y[0]) > 0, what="a run's part on the chart")
        assert len(monitor.chart.bars.y) == 3  # nightly, notebook, and what no run accounts for
    finally:
        monitor.close()
    stopped = monitor.polls
    time.sleep(2.5)  # several polls' worth: none comes
    assert monitor.polls == stopped and monitor.box.comm is None
    asyncio.run(budget.aclose())


@pytest.mark.slow
def test_the_run_app_says_how_much_of_the_key_the_other_runs_use(svc, tmp_path):
    budget_path = tmp_path / "budget.sqlite"
    frame = pd.DataFrame({"text": [article(25, seed=300 + i) for i in range(40)]})
    app = batchsum.widget(frame, api_key=KEY, base_url=svc.url, rpm=600, budget=f"sqlite://{budget_path}")
    app.run_button.click()
    wait_for(lambda: app._current is not None, what="the run")
    run = app._current
    other = SQLiteBudget(budget_path, run.client.identity)  # the key's budget, as another run opens it
    entry = {"host": "etl", "pid": 2, "door": "cli", "rpm": 600, "source": "configured", "share": 1.0, "rate_1m": 240}
    asyncio.run(other.reserve(0.0, Report(run=Member("nightly", "etl/2/x"), entry=json.dumps(entry)), start=False))
    wait_for(lambda: "other run" in app.view.others.value, what="the line on the other runs")
    app.wait()
    assert "The key is shared: 1 other run started 240 requests in the last minute" in app.view.others.value
    assert "of its 600/min" in app.view.others.value
    asyncio.run(other.aclose())
