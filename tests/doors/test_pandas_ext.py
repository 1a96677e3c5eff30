"""The pandas accessor: any index, inside a running loop, async, interrupt then resume."""

import _thread
import asyncio
import json
import threading

import numpy as np
import pandas as pd
import pytest

import batchsum
from batchsum.local import Faults
from batchsum.local.summarizer import summarize as local_summary
from batchsum.pandas_ext import clear_cache
from tests.support import BASIC_KEY, EXPIRED_KEY, KEY, RESULT_COLUMNS, article, wait_for_count


@pytest.fixture
def opts(svc):
    clear_cache()
    return {"api_key": KEY, "base_url": svc.url, "rpm": 0, "progress": False}


def texts(n):
    return [article(20, seed=i) for i in range(n)]


@pytest.mark.parametrize(
    "index",
    [
        pd.RangeIndex(6),
        pd.Index(["b", "a", "c", "e", "d", "f"]),
        pd.Index([3, 3, 1, 1, 2, 2]),
        pd.MultiIndex.from_tuples([("x", 1), ("x", 2), ("y", 1), ("y", 2), ("z", 1), ("z", 1)]),
        pd.date_range("2026-01-01", periods=6),
    ],
)
def test_every_column_plus_results_on_the_same_index_in_the_same_order(svc, opts, index):
    values = texts(4) + [None, "short one"]
    df = pd.DataFrame({"text": values, "n": range(6)}, index=index)
    out = df.batchsum.summarize("text", mode=2, type="bullets", **opts)
    assert list(out.columns) == ["text", "n"] + RESULT_COLUMNS
    assert out.index.equals(df.index) and list(out["n"]) == list(range(6))
    assert list(out["summary_status"]) == ["ok"] * 4 + ["skipped"] * 2
    for text, summary in zip(values[:4], out["summary"][:4]):
        assert summary == local_summary(text, 2, 4, "bullets")
    assert out["summary_http_status"].dtype == "Int32" and pd.isna(out["summary_http_status"].iloc[4])
    assert df.columns.tolist() == ["text", "n"]  # the input is untouched


def test_the_series_accessor_returns_the_result_columns_on_its_index(opts):
    s = pd.Series(texts(3) + [np.nan], index=["w", "x", "y", "z"], name="body")
    out = s.batchsum.summarize(percentage=2, **opts)
    assert list(out.columns) == RESULT_COLUMNS and list(out.index) == ["w", "x", "y", "z"]
    assert list(out["summary_error"].fillna("-")) == ["-", "-", "-", "empty"]


def test_the_sync_accessor_works_inside_a_running_event_loop(svc, opts):
    df = pd.DataFrame({"text": texts(5)})

    async def notebook_cell():
        assert asyncio.get_running_loop().is_running()
        return df.batchsum.summarize("text", **opts)

    out = asyncio.run(notebook_cell())
    assert (out["summary_status"] == "ok").all()


async def test_asummarize_runs_in_the_callers_loop(opts):
    df = pd.DataFrame({"text": texts(4)})
    out = await df.batchsum.asummarize("text", output_column="digest", **opts)
    assert list(out.columns)[:2] == ["text", "digest"] and (out["digest_status"] == "ok").all()
    series_out = await df["text"].batchsum.asummarize(**opts)
    assert list(series_out["summary"]) == list(out["digest"])


def test_calling_again_reuses_every_answer(svc, opts):
    df = pd.DataFrame({"text": texts(8)})
    df.batchsum.summarize("text", **opts)
    assert svc.stats()["requests"] == 8
    df.batchsum.summarize("text", **opts)
    assert svc.stats()["requests"] == 8


@pytest.mark.slow
def test_an_interrupt_stops_sending_and_the_rerun_sends_only_what_was_not_finished(svc, opts, tmp_path):
    # The first 10 answered at once, the rest in 1.5 s each: the 50 rows left take 18 s at 4 at a
    # time, so the interrupt sent after the 10th answer lands before the run can end, however late a
    # busy machine lets the pressing thread run. Slowed at the service, not on any clock.
    svc.faults = Faults(latency=1.5, latency_after=10)
    df = pd.DataFrame({"text": texts(60)})

    def press_stop_after_answers(count):
        wait_for_count(svc, count, "answered")
        _thread.interrupt_main()  # what Jupyter's stop button and Ctrl-C do

    threading.Thread(target=press_stop_after_answers, args=(10,), daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        df.batchsum.summarize("text", concurrency=4, report=tmp_path / "report.json", **opts)
    answered = svc.stats()["answered"]
    assert 10 <= answered < 60
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["outcome"], report["cause"]) == ("stopped", "signal")  # an interrupt, not a cancel
    # The call returned once its answers on the wire were in: nothing is left at the service, so
    # nothing more can be answered for this run (its loop is gone: nothing more can be sent).
    assert svc.state.in_progress == 0 and svc.stats()["answered"] == answered
    svc.faults = Faults()
    out = df.batchsum.summarize("text", concurrency=4, **opts)
    assert (out["summary_status"] == "ok").all()
    stats = svc.stats()
    assert stats["answered_unique"] == 60 and stats["answered_twice"] == 0


def test_a_journal_keeps_answers_across_sessions(svc, opts, tmp_path):
    df = pd.DataFrame({"text": texts(5)})
    df.batchsum.summarize("text", journal=tmp_path / "j.sqlite", **opts)
    clear_cache()  # a new session
    df.batchsum.summarize("text", journal=tmp_path / "j.sqlite", **opts)
    assert svc.stats()["requests"] == 5


def test_bad_input_is_a_clear_error_before_anything_is_sent(svc, opts):
    df = pd.DataFrame({"text": texts(2), "summary": ["x", "y"]})
    with pytest.raises(batchsum.InputError, match="no column 'body'.*'text'"):
        df.batchsum.summarize("body", **opts)
    with pytest.raises(batchsum.InputError, match="output_column"):
        df.batchsum.summarize("text", **opts)
    for kwargs in ({"mode": 0}, {"percentage": 9}, {"type": "essay"}):
        with pytest.raises(batchsum.InvalidParameterError):
            df.batchsum.summarize("text", output_column="s", **kwargs, **opts)
    assert svc.stats()["requests"] == 0


def test_a_wrong_key_raises_after_one_request(svc, opts):
    df = pd.DataFrame({"text": texts(10)})
    with pytest.raises(batchsum.AuthenticationError):
        df.batchsum.summarize("text", **{**opts, "api_key": "wrong"})
    with pytest.raises(batchsum.NotPremiumError):
        df.batchsum.summarize("text", **{**opts, "api_key": EXPIRED_KEY})
    assert svc.stats()["requests"] == 2


def test_local_true_needs_no_key_or_url():
    clear_cache()
    out = pd.DataFrame({"text": texts(2)}).batchsum.summarize("text", local=True, progress=False)
    assert (out["summary_status"] == "ok").all()


def test_progress_shows_a_text_bar_outside_notebooks(opts, capsys):
    pd.DataFrame({"text": texts(3)}).batchsum.summarize("text", **{**opts, "progress": True})
    err = capsys.readouterr().err
    assert "3/3" in err and "ok 3" in err


def test_at_the_cap_the_account_counts_every_row_the_frame_holds_duplicates_included(svc, opts):
    """Rows with the same text share one request; a cap that leaves it unsent gives each of them a
    ``not_sent`` record, and the account counts each of them (it once counted only the first)."""
    texts = [article(20, seed=7000 + i % 40) for i in range(120)]  # each text three times
    with pytest.warns(RuntimeWarning, match="request cap of 15") as caught:
        out = pd.DataFrame({"text": texts}).batchsum.summarize("text", max_requests=15, **opts)
    account = out.attrs["batchsum"]["account"]
    not_sent = int((out["summary_error"] == "not_sent").sum())
    assert len(out) == 120 and not_sent > 0
    assert account.startswith(f"120 rows: {int((out['summary_status'] == 'ok').sum())} ok")
    assert f"not_sent {not_sent}" in account
    assert f"{not_sent} rows remain" in str(caught[0].message)


@pytest.mark.parametrize("where", ["machine", "redis"])
def test_this_process_memory_serves_a_mode_2_answer_only_to_a_key_proven_in_mode_2(svc, where, request):
    """With ``store="none"`` a run's answers stay in this process's memory, which every later run of
    the process reads (a notebook's next cell): it is a store shared by runs, not a run's own scope,
    so the store's rule holds there too. A premium key pays for 6 mode-2 answers, and its next call
    pays for none; a basic key after it in the same process is served none of them: its first
    request goes to the service, which refuses it (the plan's 401). On the machine's budget and on
    Redis' (where the premium key's proof is kept)."""
    from batchsum.errors import NotPremiumError

    budget = request.getfixturevalue("redis_url") if where == "redis" else "machine"
    df = pd.DataFrame({"text": [article(30, seed=9300 + i) for i in range(6)]})
    options = {"base_url": svc.url, "rpm": 0, "progress": False, "store": "none", "budget": budget, "mode": 2}
    clear_cache()
    assert (df.batchsum.summarize("text", api_key=KEY, **options)["summary_status"] == "ok").all()
    paid = svc.stats()["requests"]
    assert paid == 6
    assert (df.batchsum.summarize("text", api_key=KEY, **options)["summary_status"] == "ok").all()
    assert svc.stats()["requests"] == paid  # the premium key, proven in mode 2, is served its memory
    with pytest.raises(NotPremiumError, match="not premium"):
        df.batchsum.summarize("text", api_key=BASIC_KEY, **options)
    assert svc.stats()["requests"] == paid + 1 and svc.stats()["by_status"].get("401") == 1


def test_this_process_memory_keeps_a_keys_answers_to_that_key_under_store_scope_key():
    """``store_scope="key"`` keeps an answer to the key that paid for it, in this process's memory
    as in the store: another key's run in the same process pays for its own."""
    from batchsum.local import LocalService

    other = "other-premium-0123456789"
    df = pd.DataFrame({"text": [article(30, seed=9400 + i) for i in range(4)]})
    with LocalService([KEY, other]) as service:
        options = {"base_url": service.url, "rpm": 0, "progress": False, "store": "none", "store_scope": "key"}
        clear_cache()
        for key, paid in ((KEY, 4), (KEY, 4), (other, 8)):
            assert (df.batchsum.summarize("text", api_key=key, **options)["summary_status"] == "ok").all()
            assert service.stats()["requests"] == paid
