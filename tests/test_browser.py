"""A real browser: voila serves notebooks/widget.ipynb on loopback, headless Chromium types a text,
clicks Summarize and sees the summary. A screenshot is saved in the test's temporary folder."""

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "widget.ipynb"
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

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed: `apt-get install chromium` (Debian's package) to run the browser test",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def voila(tmp_path):
    pytest.importorskip("voila")
    port = free_port()
    log = (tmp_path / "voila.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "voila",
            str(NOTEBOOK),
            "--no-browser",
            f"--port={port}",
            "--Voila.ip=127.0.0.1",
            "--VoilaConfiguration.file_allowlist=[]",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=NOTEBOOK.parent,
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "voila.log").read_text()
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(20)


def test_a_person_types_a_text_clicks_summarize_and_reads_the_summary(voila, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    text = (
        "The museum will reopen on Saturday after a two-year renovation of its main hall. "
        "Visitors can see the restored ceiling paintings and a new gallery of local photography. "
        "Entry is free for the first weekend, and the café has moved to the ground floor. "
        "The director thanked the volunteers who helped move more than four thousand objects."
    )
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(voila, timeout=120_000)
            area = page.locator(".batchsum-text-app textarea").first
            area.wait_for(timeout=120_000)
            area.fill(text)
            page.get_by_text("words: within 10..5000").wait_for(timeout=30_000)
            page.locator(".batchsum-text-app button", has_text="Summarize").click()
            summary = page.locator(".batchsum-summary").first
            summary.wait_for(timeout=60_000)
            shown = summary.inner_text()
            page.screenshot(path=str(tmp_path / "widget.png"), full_page=True)
        finally:
            browser.close()
    from batchsum.local.summarizer import summarize as local_summary

    assert shown.strip() == local_summary(text, 1, 4, None)
    assert (tmp_path / "widget.png").stat().st_size > 10_000
