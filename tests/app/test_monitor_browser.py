"""``batchsum.monitor()`` in a real browser: voila serves tests/app/notebooks/monitor.ipynb on loopback, in the
light and the dark theme, while two ``batchsum summarize`` runs share a key's budget against the local
service's limit of 600/min; headless Chromium sees the chart drawn (each run's part stacked) and the
runs in the table, sees it update, and closes it: the widget goes and its polling stops. Screenshots go
to the test's temporary folder, and to docs/ (docs/python.md's pictures) when BATCHSUM_UPDATE_SCREENSHOTS=1."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.app.test_browser import CHROMIUM, ROOT, keep, page_at, serve, widest_overflow
from tests.doors.test_top import start_run, stop_runs
from tests.support import KEY, wait_for

NOTEBOOK = ROOT / "tests" / "app" / "notebooks" / "monitor.ipynb"

pytestmark = [
    pytest.mark.slow,  # voila, Chromium and two runs
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed: `apt-get install chromium`"),
]


@pytest.fixture(params=["light", "dark"])
def watched(request, svc, tmp_path, monkeypatch):
    """Two runs on one key's budget file, and voila serving the monitor of that budget."""
    svc.state.rpm = 600
    budget = f"sqlite://{tmp_path / 'budget.sqlite'}"
    polls = tmp_path / "polls.txt"
    monkeypatch.setenv("BATCHSUM_TEST_BUDGET", budget)
    monkeypatch.setenv("BATCHSUM_TEST_POLLS", str(polls))
    env = {**os.environ, "BATCHSUM_API_KEY": KEY, "BATCHSUM_BASE_URL": svc.url, "BATCHSUM_BUDGET": budget}
    env["PYTHONPATH"] = str(ROOT)
    runs = [start_run(tmp_path, "nightly", 1, env), start_run(tmp_path, "notebook", 2, env, "--share", "0.5")]
    request.node.theme = request.param
    try:
        for url in serve(NOTEBOOK, request.param, tmp_path):
            yield url, polls
    finally:
        stop_runs(*(process for process, _ in runs))


def polls_of(base: Path) -> dict[str, tuple[int, bool]]:
    """Each kernel's monitor (its file ``BASE-PID``): the polls it made, and whether it was closed."""
    found = {}
    for path in base.parent.glob(base.name + "-*"):
        try:
            count, closed = path.read_text().split()
        except (OSError, ValueError):  # being written
            continue
        found[path.name] = (int(count), closed == "True")
    return found


def closed_one(base: Path) -> tuple[str, int] | None:
    """The monitor that was closed, and its polls."""
    return next(((name, count) for name, (count, closed) in polls_of(base).items() if closed), None)


def test_the_monitor_draws_the_key_updates_live_and_stops_when_closed(watched, tmp_path, request):
    url, polls = watched
    theme = request.node.theme
    with page_at(url, ".batchsum-monitor") as (page, monitor):
        table = monitor.locator(".batchsum-runs")
        page.wait_for_function(
            "() => document.querySelectorAll('.batchsum-runs tr').length === 3", timeout=120_000
        )  # the head and the two runs
        state = monitor.locator(".batchsum-monitor-state")
        first = state.inner_text()
        bars = lambda: page.evaluate(  # noqa: E731  (the bars drawn taller than nothing)
            "() => [...document.querySelectorAll('.batchsum-monitor-chart rect.bar')]"
            ".filter(r => parseFloat(r.getAttribute('height') || '0') > 0.5).length"
        )
        page.wait_for_function(
            "(before) => { const s = document.querySelector('.batchsum-monitor-state');"
            " return s && s.innerText !== before; }",
            arg=first,
            timeout=60_000,
        )  # the figures moved: it reads the budget as the runs go
        second = state.inner_text()
        drawn = bars()
        runs_text = table.inner_text()
        page.wait_for_function(  # a 10 s bar further, the chart has more to draw (a guard, not a timing)
            "(before) => [...document.querySelectorAll('.batchsum-monitor-chart rect.bar')]"
            ".filter(r => parseFloat(r.getAttribute('height') || '0') > 0.5).length > before",
            arg=drawn,
            timeout=120_000,
        )
        later = bars()
        clipped = widest_overflow(page, ".batchsum-monitor")
        shot = tmp_path / f"monitor-{theme}.png"
        monitor.evaluate("element => element.scrollIntoView({block: 'start'})")
        page.screenshot(path=str(shot))
        monitor.locator("button", has_text="Close").click()
        page.wait_for_function(
            "() => !document.querySelector('.batchsum-monitor')", timeout=30_000
        )  # the widget is gone
    name, stopped = wait_for(lambda: closed_one(polls), what="the monitor to say it was closed", every=0.2)
    time.sleep(3)  # three polls' worth: none comes
    assert polls_of(polls)[name] == (stopped, True) and stopped > 0
    assert first != second and "started in 10 s" in second and "limit 600/min (configured)" in second
    assert runs_text.count("cli") == 2 and "0.5" in runs_text
    assert drawn > 0 and later > drawn
    assert clipped == []
    assert KEY not in first + second + runs_text
    keep(shot, shot.name)
