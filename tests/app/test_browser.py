"""A real browser: voila serves the apps on loopback, in the light and the dark theme, and headless
Chromium uses them as a person would. The text app: type, Summarize, read, copy. The DataFrame
app: a run against the local service with a per-key limit and 429 faults, where the chart updates,
the pause is explained, the table pages, filters and opens a summary. Every control must fit the
page (no clipping at 1000 px). Screenshots go to the test's temporary folder, and to docs/ (the
README's pictures) when BATCHSUM_UPDATE_SCREENSHOTS=1."""

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import free_port, wait_for

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "widget.ipynb"
FRAME_RUN = ROOT / "tests" / "app" / "notebooks" / "frame_run.ipynb"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]

pytestmark = [
    pytest.mark.slow,  # voila and Chromium
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Chromium is not installed: `apt-get install chromium` (Debian's package) to run the browser test",
    ),
]


def serve(notebook: Path, theme: str, tmp_path: Path):
    """voila on a free loopback port, once it listens (asked nothing: each page it answers runs a kernel)."""
    pytest.importorskip("voila")
    port = free_port()
    log = (tmp_path / "voila.log").open("w")
    command = [sys.executable, "-m", "voila", str(notebook), "--no-browser", f"--port={port}", f"--theme={theme}"]
    command += ["--Voila.ip=127.0.0.1", "--VoilaConfiguration.file_allowlist=[]"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=notebook.parent)
    try:

        def listens() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_for(
            listens, what=lambda: f"voila to listen: {(tmp_path / 'voila.log').read_text()}", every=0.2, alive=process
        )
        yield f"http://127.0.0.1:{port}/"
    finally:  # voila and its kernels go, whatever happened (a kernel outlives a voila killed outright)
        process.terminate()
        process.wait(20)


@pytest.fixture(params=["light", "dark"])
def voila(request, tmp_path):
    request.node.theme = request.param
    yield from serve(NOTEBOOK, request.param, tmp_path)


@pytest.fixture(params=["light", "dark"])
def frame_run(request, tmp_path):
    request.node.theme = request.param
    yield from serve(FRAME_RUN, request.param, tmp_path)


@contextlib.contextmanager
def page_at(url: str, selector: str):
    """Headless Chromium (1000 px wide, the clipboard allowed) at ``url``, once the first element of
    ``selector`` is drawn: the page and that element."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1000, "height": 900})
            context.grant_permissions(["clipboard-read", "clipboard-write"])
            page = context.new_page()
            page.goto(url, timeout=120_000)
            element = page.locator(selector).first
            element.wait_for(timeout=120_000)
            yield page, element
        finally:
            browser.close()


def widest_overflow(page, selector: str) -> list[str]:
    """Elements of the app that reach past the page's right edge (clipped in a 1000 px column)."""
    return page.evaluate(
        """(selector) => {
            const width = document.documentElement.clientWidth;
            const out = [];
            for (const root of document.querySelectorAll(selector)) {
                for (const el of [root, ...root.querySelectorAll('*')]) {
                    const box = el.getBoundingClientRect();
                    if (box.width > 0 && box.right > width + 1) out.push(el.className + ' ' + Math.round(box.right));
                }
            }
            return out;
        }""",
        selector,
    )


UPDATE_SCREENSHOTS = os.environ.get("BATCHSUM_UPDATE_SCREENSHOTS") == "1"  # read before the tests clean the env


def keep(path: Path, name: str) -> None:
    if UPDATE_SCREENSHOTS:
        (ROOT / "docs").mkdir(exist_ok=True)
        (ROOT / "docs" / name).write_bytes(path.read_bytes())


def test_a_person_types_a_text_clicks_summarize_and_reads_the_summary(voila, tmp_path, request):
    text = (
        "The museum will reopen on Saturday after a two-year renovation of its main hall. "
        "Visitors can see the restored ceiling paintings and a new gallery of local photography. "
        "Entry is free for the first weekend, and the café has moved to the ground floor. "
        "The director thanked the volunteers who helped move more than four thousand objects."
    )
    with page_at(voila, ".batchsum-text-app textarea") as (page, area):
        button = page.locator(".batchsum-text-app button", has_text="Summarize")
        area.fill("too short to summarize")
        page.locator(".batchsum-count").get_by_text("needs at least 10").wait_for(timeout=30_000)
        assert button.is_disabled()
        area.fill(text)
        page.get_by_text("words: within 10..5000").wait_for(timeout=30_000)
        button.click()
        summary = page.locator(".batchsum-summary").first
        summary.wait_for(timeout=60_000)
        shown = summary.inner_text()
        assert page.locator(".batchsum-result b", has_text="Summary").count() == 1
        page.locator(".batchsum-copy").click()
        page.get_by_text("Copied").wait_for(timeout=10_000)
        copied = page.evaluate("navigator.clipboard.readText()")
        clipped = widest_overflow(page, ".batchsum-text-app")
        shot = tmp_path / f"text-app-{request.node.theme}.png"
        page.screenshot(path=str(shot), full_page=True)
    from batchsum.local.summarizer import summarize as local_summary

    assert shown.strip() == local_summary(text, 1, 4, None) and copied == shown.strip()
    assert clipped == []
    assert shot.stat().st_size > 10_000
    keep(shot, shot.name)


CHART_AXES = """() => {
    // Each axis of the run chart: its label, and its ticks as [value, pixel] (x or y by the axis).
    const axes = {};
    for (const axis of document.querySelectorAll('.batchsum-chart g.axis')) {
        const ticks = [];
        let label = '';
        for (const text of axis.querySelectorAll('text')) {
            const tick = text.closest('g.tick');
            if (!tick) { label = text.textContent; continue; }
            const [x, y] = tick.getAttribute('transform').match(/-?[0-9][0-9.e-]*/g).map(Number);
            ticks.push([text.textContent, x, y]);
        }
        axes[label] = ticks;
    }
    return axes;
}"""


def path_points(d: str) -> list[tuple[float, float]]:
    """The vertices of an SVG line path (bqplot draws lines as M x,y L x,y ...)."""
    import re

    numbers = [float(n) for n in re.findall(r"-?[0-9.]+(?:e-?[0-9]+)?", d)]
    return list(zip(numbers[0::2], numbers[1::2], strict=True))


def to_data(ticks: list, which: int):
    """A pixel to data mapping from an axis's ticks (value, x pixel, y pixel); which: 1 = x, 2 = y."""
    (v0, *p0), (v1, *p1) = ticks[0], ticks[-1]
    a, b = p0[which - 1], p1[which - 1]
    return lambda pixel: float(v0) + (pixel - a) * (float(v1) - float(v0)) / (b - a)


def test_a_dataframe_run_shows_its_chart_the_pause_and_a_table_to_read(frame_run, tmp_path, request):
    """The README's example tickets at 120/min with 429s: a run of seconds, drawn in seconds on
    round ticks, whose rate line reads what was started per minute of the run so far; the table
    pages and filters, names rows by ticket, and an opened summary reads once."""
    import pandas as pd

    from batchsum.local.summarizer import summarize as local_summary

    tickets = pd.read_parquet(ROOT / "examples" / "tickets.parquet")
    unique_ok = tickets["text"].dropna().map(str.strip).loc[lambda t: t.str.split().str.len() >= 10].nunique()
    theme = request.node.theme
    with page_at(frame_run, ".batchsum-frame-app") as (page, app):
        rate_line = page.locator(".batchsum-chart path.line").nth(2)
        before = rate_line.get_attribute("d")
        app.locator("button", has_text="Run").click()
        page.get_by_text("the service answered 429 (Retry-After 1)").first.wait_for(timeout=60_000)
        during = rate_line.get_attribute("d")
        status = page.get_by_text(f"{len(tickets)}/{len(tickets)} rows").first
        status.wait_for(timeout=120_000)
        table = page.locator(".batchsum-results")
        table.get_by_text("page 1 of 2 · 16 rows").wait_for(timeout=30_000)  # drawn after the chart
        refused_429s = int(status.inner_text().split("429s ")[1].split()[0])
        after = rate_line.get_attribute("d")
        axes = page.evaluate(CHART_AXES)
        refused = page.locator(".batchsum-chart .dot").count()
        table.locator("button", has_text="Next").click()
        table.get_by_text("page 2 of 2 · 16 rows").wait_for(timeout=30_000)
        table.locator("button", has_text="Skipped").click()
        table.get_by_text("page 1 of 1 · 3 rows").wait_for(timeout=30_000)
        skipped = table.locator(".batchsum-badge.skipped").count()
        table.locator("button", has_text="OK").click()
        table.get_by_text("page 1 of 1 · 13 rows").wait_for(timeout=30_000)
        table.locator("select").select_option(label="ticket_id")
        first_row = table.locator("tr.batchsum-row").first
        first_row.get_by_text("T-1001").wait_for(timeout=30_000)
        opened = first_row.locator("details")
        closed_text = opened.inner_text()
        opened.locator("summary").click()
        opened.locator(".batchsum-hide").wait_for(timeout=10_000)
        opened_text = opened.inner_text()
        whole = opened.locator(".batchsum-summary").inner_text()
        clipped = widest_overflow(page, ".batchsum-frame-app")
        shot = tmp_path / f"frame-app-{theme}.png"
        page.set_viewport_size({"width": 1000, "height": 1700})  # voila scrolls inside: show it all
        app.evaluate("element => element.scrollIntoView({block: 'start'})")
        page.screenshot(path=str(shot))
    assert before != during != after  # the chart is redrawn in place as the run goes
    assert refused >= 1 and refused_429s >= 1  # 429s marked

    # A run of seconds is drawn in seconds, on round ticks (not in hundredths of a minute).
    time_ticks = [float(value) for value, *_ in axes["seconds since the start"]]
    steps = {b - a for a, b in zip(time_ticks, time_ticks[1:], strict=False)}
    assert time_ticks[0] == 0 and len(steps) == 1 and steps.pop() in {1, 2, 5, 10, 15, 20, 30}
    # The rate line's last point is the requests started in the run so far (shorter than a minute),
    # per minute: times the run's length it gives back every attempt (each text once, and the 429s).
    seconds, per_minute = to_data(axes["seconds since the start"], 1), to_data(axes["requests per minute"], 2)
    x, y = path_points(after)[-1]
    length, rate = seconds(x), per_minute(y)
    assert length < 60
    assert rate * length / 60 == pytest.approx(unique_ok + refused_429s, abs=0.5)

    # The table: the skipped rows, the id column, and an opened summary read once.
    assert skipped == 3
    first_text = tickets["text"].iloc[0]
    assert whole == local_summary(first_text, 1, 4, None) and len(whole) > 140
    first_sentence = whole.split(". ")[0]
    assert closed_text.startswith(first_sentence) and closed_text.endswith("…")
    assert opened_text.count(first_sentence) == 1 and "…" not in opened_text
    assert clipped == []
    keep(shot, shot.name)
