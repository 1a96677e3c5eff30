"""The notebook apps without a browser: set values, click(), read what the user would see."""

import pandas as pd
import pytest

pytest.importorskip("ipywidgets")

import batchsum
from batchsum.local import Faults
from batchsum.local.summarizer import summarize as local_summary
from batchsum.pandas_ext import clear_cache
from batchsum.widgets import FrameApp, TextApp, render_summary
from tests.support import BASIC_KEY, EXPIRED_KEY, KEY, article, wait_for_count

TEXT = article(80)


def text_app(svc, key=KEY, **kwargs):
    return batchsum.widget(api_key=key, base_url=svc.url, max_retries=kwargs.pop("max_retries", 0), **kwargs)


def click(app):
    app.button.click()
    app.wait()


def test_the_word_count_says_whether_the_text_fits(svc):
    app = text_app(svc)
    assert isinstance(app, TextApp)
    app.text.value = "one two three"
    assert "3 words: needs at least 10" in app.count.value
    app.text.value = article(10)
    assert "10 words: within 10..5000" in app.count.value
    app.text.value = article(5001)
    assert "5001 words: over the limit of 5000" in app.count.value


@pytest.mark.parametrize(
    "label, kind, check",
    [
        ("Default", "default", lambda html: html.count("<p>") >= 1),
        ("Bullets", "bullets", lambda html: "<ul><li>" in html),
        ("Headings & points", "summary_2", lambda html: "<h4>" in html and "<li>" in html),
        ("Best line", "best_line", lambda html: "<blockquote" in html),
    ],
)
def test_summarize_renders_each_format_for_reading(svc, label, kind, check):
    app = text_app(svc)
    app.text.value = TEXT
    app.mode.value = 2
    app.length.value = 5
    app.format.label = label
    assert app.format.value == kind
    click(app)
    assert app.error is None and app.summary == local_summary(TEXT, 2, 5, None if kind == "default" else kind)
    assert check(app.result.value) and app.message.value == ""
    assert not app.button.disabled


@pytest.mark.parametrize(
    "setup, words",
    [
        (
            lambda svc, app: setattr(app, "_connection", {**app._connection, "api_key": "wrong"}),
            "did not accept the API key",
        ),
        (
            lambda svc, app: setattr(app, "_connection", {**app._connection, "api_key": EXPIRED_KEY}),
            "plan does not allow",
        ),
        (
            lambda svc, app: (
                setattr(app, "_connection", {**app._connection, "api_key": BASIC_KEY}),
                setattr(app.mode, "value", 2),
            ),
            "'Advanced' needs a premium plan",
        ),
        (lambda svc, app: setattr(app.text, "value", "far too short"), "too short"),
        (lambda svc, app: setattr(app.text, "value", article(5001)), "too long"),
        (lambda svc, app: setattr(svc, "faults", Faults(script=["429"])), "Rate limited"),
        (lambda svc, app: setattr(svc, "faults", Faults(script=["502"])), "down or unreachable"),
        (lambda svc, app: setattr(svc, "faults", Faults(script=["500"])), "down or unreachable"),
        (lambda svc, app: setattr(svc, "faults", Faults(script=["hang"], hang_seconds=2)), "did not answer in time"),
    ],
)
def test_each_failure_is_explained_in_plain_words(svc, setup, words):
    app = text_app(svc, timeout=0.5)
    app.text.value = TEXT
    setup(svc, app)
    click(app)
    assert app.summary is None and words in app.message.value
    assert "Traceback" not in app.message.value


def test_render_summary_escapes_and_structures():
    html = render_summary("## Budget <b>\n- first point\n- second\n\nplain line", "summary_2")
    assert "<h4>Budget &lt;b&gt;</h4>" in html and "<ul><li>first point</li><li>second</li></ul>" in html
    assert "<p>plain line</p>" in html


@pytest.fixture
def frame():
    texts = [article(25, seed=i) for i in range(12)] + [None, "short"]
    return pd.DataFrame({"id": range(14), "body": texts, "n": [1.5] * 14})


def test_the_frame_app_runs_with_progress_preview_and_result(svc, frame):
    clear_cache()
    app = batchsum.widget(frame, api_key=KEY, base_url=svc.url, rpm=0)
    assert isinstance(app, FrameApp) and app.column.options == ("body",)
    tickets = pd.read_parquet(__import__("pathlib").Path(__file__).parents[2] / "examples" / "tickets.parquet")
    assert batchsum.widget(tickets, local=True).column.value == "text"  # the wordiest column first
    app.format.value = "best_line"
    app.run_button.click()
    app.wait()
    assert app.error is None and app.result is not None
    assert list(app.result["id"]) == list(range(14))
    assert list(app.result["summary_status"]) == ["ok"] * 12 + ["skipped"] * 2
    assert app.progress.value == 14 and "14/14 rows · ok 12 · skipped 2 · failed 0" in app.status.value
    table = app.table.table.value
    assert "<table" in table and table.count("batchsum-badge skipped") == 2 and "no text (missing value)" in table
    record = app.result.attrs["batchsum"]
    assert record["ok"] == 12 and sum(row[3] for row in record["timeline"]["seconds"]) == 14


def test_the_result_table_pages_filters_names_rows_by_id_and_saves(svc, tmp_path, monkeypatch):
    clear_cache()
    texts = [article(150, seed=200 + i) for i in range(33)] + ["short"] * 4
    frame = pd.DataFrame({"ticket": [f"T-{i:03d}" for i in range(37)], "body": texts})
    app = batchsum.widget(frame, api_key=KEY, base_url=svc.url, rpm=0)
    app.run_button.click()
    app.wait()
    table = app.table
    assert table.where.value == "page 1 of 3 · 37 rows" and table.previous.disabled and not table.next.disabled
    assert table.table.value.count("batchsum-row") == 15
    table.next.click()
    table.next.click()
    assert table.where.value == "page 3 of 3 · 37 rows" and table.next.disabled
    assert table.table.value.count("batchsum-row") == 7
    table.filter.value = "skipped"
    assert table.where.value == "page 1 of 1 · 4 rows" and table.table.value.count("batchsum-badge skipped") == 4
    assert "<td>33</td>" in table.table.value  # row numbers until an id column is chosen
    table.id_column.value = "ticket"
    assert "<td>T-033</td>" in table.table.value and "<th style='width:14%'>ticket</th>" in table.table.value
    table.filter.value = "ok"
    shown = table.table.value
    assert "<details><summary><span class='batchsum-excerpt'>" in shown and "…</span>" in shown  # the start
    assert "failed" not in shown.replace("batchsum-badge failed", "")
    monkeypatch.chdir(tmp_path)
    table.path.value = "out"
    table.save_parquet.click()
    table.save_csv.click()
    assert pd.read_parquet(tmp_path / "out.parquet")["ticket"].tolist() == frame["ticket"].tolist()
    back = pd.read_csv(tmp_path / "out.csv", dtype=batchsum.result_dtypes())
    assert (back["summary_status"] == "skipped").sum() == 4
    assert str(tmp_path / "out.csv") in table.saved.value


def test_an_opened_summary_shows_the_whole_once_and_a_short_one_has_nothing_to_open():
    from batchsum.data.results import RowResult
    from batchsum.widgets import ResultTable

    long_summary = " ".join(f"Point {i} of the reply." for i in range(12))
    short_summary = "The password reset email never arrives."
    table = ResultTable(pd.DataFrame({"text": ["a", "b"]}))
    table.show([RowResult(s, "ok", None, None, 200, 1) for s in (long_summary, short_summary)], None)
    long_cell, short_cell = table.table.value.split("<tr class='batchsum-row'>")[1:]
    # Closed: the start; opened: the style hides the start, so the whole summary reads once.
    assert long_cell.count("<details>") == 1 and long_cell.count("Point 11 of") == 1
    assert "<span class='batchsum-excerpt'>Point 0 of the reply." in long_cell and "…</span>" in long_cell
    assert "<span class='batchsum-hide'>hide</span></summary><div class='batchsum-summary'><p>Point 0" in long_cell
    assert "details[open] > summary .batchsum-excerpt" in table.table.value.split("<table")[0]
    # A summary no longer than its start is shown whole, once, with nothing to open.
    assert "<details>" not in short_cell and short_cell.count(short_summary) == 1
    assert f"<p>{short_summary}</p>" in short_cell


def test_the_text_app_only_offers_summarize_for_a_text_the_service_takes(svc):
    app = text_app(svc)
    assert app.button.disabled
    app.text.value = "too short"
    assert app.button.disabled and "needs at least 10" in app.count.value
    app.text.value = TEXT
    assert not app.button.disabled
    app.text.value = "word " * 5001
    assert app.button.disabled and "over the limit" in app.count.value


def test_plot_run_draws_what_the_accessor_returned(svc):
    from batchsum.app.chart import series

    out = pd.DataFrame({"body": [article(25, seed=i) for i in range(6)]}).batchsum.summarize(
        "body", api_key=KEY, base_url=svc.url, rpm=6000, progress=False
    )
    figure = batchsum.plot_run(out)
    assert type(figure.children[0]).__name__ == "Figure" and "the plan&#x27;s limit" in figure.children[1].value
    lines = series(out.attrs["batchsum"]["timeline"])
    assert lines["done"][-1] == 6 and lines["rpm"] == 6000
    with pytest.raises(ValueError, match="no run to draw"):
        batchsum.plot_run(pd.DataFrame())


def test_cancel_keeps_what_finished_and_run_again_reuses_it(svc, frame):
    clear_cache()
    # The service holds every request after the third until the test lets it go: the run cannot end
    # before Cancel, however late a busy machine lets the test run. Cancel reaches the run's loop
    # before the held answer does (it is queued there first), so the run stops with it in flight.
    svc.faults = Faults(hold_after=3)
    app = batchsum.widget(frame, api_key=KEY, base_url=svc.url, rpm=0, concurrency=1)
    app.run_button.click()
    wait_for_count(svc, 3, "answered")
    app.cancel_button.click()
    svc.faults.release()  # the answer on the wire comes, and is kept
    app.wait()
    done = len(app.result)
    assert 2 <= done < 14 and "Cancelled after" in app.status.value
    assert (app.result["summary_status"] == "ok").all()
    svc.faults = Faults()
    app.run_button.click()
    app.wait()
    assert len(app.result) == 14 and (app.result["summary_status"] != "failed").all()
    assert svc.stats()["answered_unique"] == 12 and svc.stats()["answered_twice"] == 0


def test_the_frame_app_explains_a_wrong_key(svc, frame):
    clear_cache()
    app = batchsum.widget(frame, api_key="wrong", base_url=svc.url, rpm=0)
    app.run_button.click()
    app.wait()
    assert "did not accept the API key" in app.status.value and len(app.result) == 0


def test_widget_refuses_other_data():
    with pytest.raises(TypeError, match="DataFrame"):
        batchsum.widget([1, 2, 3])


@pytest.mark.slow
def test_the_frame_app_takes_auto_per_minute_and_says_where_the_limit_came_from(frame):
    """The "Per minute" field takes ``auto``; the state line then names the limit in force and its
    source, as the progress line does."""
    from batchsum.local import LocalService

    clear_cache()
    with LocalService([KEY], rpm=600, room_headers="ratelimit") as service:
        app = batchsum.widget(frame, api_key=KEY, base_url=service.url)
        app.rpm.value = "auto"
        app.run_button.click()
        app.wait()
    assert app.error is None and (app.result["summary_status"] != "failed").all()
    assert "limit 600/min (stated by the service)" in app.status.value
    app.rpm.value = "auto:x"
    app.run_button.click()
    assert app.error is not None and "invalid rpm" in app.status.value
