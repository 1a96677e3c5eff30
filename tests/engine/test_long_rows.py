"""Texts over the service's 5000 words, end to end on the local service (its limit is real): split
into parts, the parts' summaries reduced into one answer of the row's type; every request through
the same store, dedup, budget and pacer as any other; truncate and skip; the same answer on every
front-end. Counted at the service."""

from __future__ import annotations

import asyncio
import re

import pandas as pd
import pytest

import batchsum
from batchsum.data.journal import Journal
from batchsum.data.stores import MemoryStore
from batchsum.engine import long_texts, plan_batch, summarize_stream
from batchsum.engine.tally import BatchStats
from batchsum.local import Faults
from batchsum.service import contract
from tests.conftest import KEY, article

LATE = (
    "The airship crew moored the zeppelin at the mast while helium tanks were refilled. "
    "Zeppelin pilots logged the helium levels before each flight over the valley. "
)


def with_late_topic(words: int, late_words: int) -> list[str]:
    """``words`` words: the last ``late_words`` on a topic found nowhere earlier (the zeppelin)."""
    early = article(words - late_words).split()
    late = (LATE * (late_words // len(LATE.split()) + 1)).split()[:late_words]
    return early + late


def paragraphs(words: int, late_words: int = 4000) -> str:
    tokens = with_late_topic(words, late_words)
    return "\n\n".join(" ".join(tokens[i : i + 120]) for i in range(0, len(tokens), 120))


def one_line(words: int, late_words: int = 8000) -> str:
    """One line, no punctuation at all (a transcript)."""
    return " ".join(t.strip(".") for t in with_late_topic(words, late_words))


DOC_12K = paragraphs(12_000)
DOC_31K = one_line(31_000)


async def collect(svc, rows, store=None, stats=None, **options):
    options.setdefault("concurrency", 8)
    async with batchsum.AsyncClient(KEY, svc.url) as client:
        return [r async for r in summarize_stream(rows, client, store=store, stats=stats, **options)]


@pytest.mark.parametrize("kind", [None, "bullets"])
async def test_long_texts_are_summarized_in_parts_into_one_answer_of_the_rows_type(svc, kind):
    stats = BatchStats()
    store = MemoryStore()
    rows = [DOC_12K, DOC_31K, article(40)]
    results = await collect(svc, rows, store=store, stats=stats, long_texts="split", type=kind, mode=2)
    assert [r.status for r in results] == ["ok"] * 3, results
    long12, long31, short = results
    assert short.requests == 1 and short.message is None
    for result, text in [(long12, DOC_12K), (long31, DOC_31K)]:
        parts = long_texts.count_parts(text)
        assert result.requests > parts and f"summarized in {parts} parts" in result.message
        assert contract.count_words(result.summary) < contract.MAX_WORDS
        assert "zeppelin" in result.summary.lower()  # the last part's topic, found nowhere in the first 5000 words
        if kind == "bullets":
            assert all(line.startswith("- ") for line in result.summary.splitlines())
    # No request the service received was over its limit: it would have answered 422.
    assert svc.stats()["by_status"] == {"200": stats.sent}
    assert stats.sent_by_kind["part"] == long_texts.count_parts(DOC_12K) + long_texts.count_parts(DOC_31K)
    assert stats.sent == stats.sent_by_kind["part"] + stats.sent_by_kind["reduce"] + 1
    assert "long-text parts" in stats.account()

    # A rerun on the same answers pays nothing.
    svc.state.reset_stats()
    again = await collect(svc, rows, store=store, long_texts="split", type=kind, mode=2)
    assert again == results and svc.stats()["requests"] == 0


async def test_the_dry_run_counts_parts_exactly_and_bounds_the_reduce_requests(svc):
    rows = [DOC_12K, DOC_31K, DOC_12K, article(30)]
    plan = plan_batch(rows, long_texts_policy="split")
    stats = BatchStats()
    await collect(svc, rows, stats=stats, long_texts="split")
    assert plan.long_rows == 3 and plan.parts == stats.sent_by_kind["part"]  # the repeated row's parts: sent once
    assert plan.reduce_max >= stats.sent_by_kind["reduce"]
    assert "part requests" in plan.describe(600) and "at most" in plan.describe(600)
    skipped = plan_batch(rows)
    assert skipped.skipped_by_reason["too_long"] == 3 and skipped.skipped_long_cost[0] == plan.parts + 3


async def test_a_stop_in_the_middle_of_a_long_row_keeps_its_finished_parts(svc, tmp_path):
    # The service holds every part after the third until the stop is made: the row cannot finish
    # first, however late a busy machine lets this test look.
    svc.faults = Faults(latency=0.2, hold_after=3)
    path = tmp_path / "j.sqlite"
    stats = BatchStats()

    async def run() -> None:
        with Journal(path) as journal:
            await collect(svc, [DOC_31K], store=journal, stats=stats, long_texts="split", concurrency=2)

    task = asyncio.ensure_future(run())
    while stats.sent_by_kind["part"] < 3:
        await asyncio.sleep(0.02)
    task.cancel()
    svc.faults.release()  # the parts on the wire answer the stop's wait for them
    with pytest.raises(asyncio.CancelledError):
        await task
    with Journal(path) as journal:
        kept = len(journal)
    assert kept >= 3
    svc.faults = Faults()
    with Journal(path) as journal:
        results = await collect(svc, [DOC_31K], store=journal, long_texts="split")
    assert results[0].status == "ok"
    assert svc.stats()["answered_twice"] == 0  # the finished parts were not paid again


async def test_a_part_that_fails_fails_its_row_saying_which_part(svc):
    svc.faults = Faults(script=["ok", "422"])
    results = await collect(svc, [DOC_12K, article(30)], long_texts="split", concurrency=1)
    assert results[0].status == "failed" and results[0].error == "unprocessable"
    assert re.match(r"part \d of 3: ", results[0].message)
    assert results[1].status == "ok"


async def test_truncate_sends_the_first_words_and_says_so_and_skip_says_what_split_would_cost(svc):
    stats = BatchStats()
    truncated = await collect(svc, [DOC_12K], long_texts="truncate", stats=stats)
    assert truncated[0].status == "ok" and truncated[0].requests == 1
    assert "first 4500 of 12000 words" in truncated[0].message and stats.sent == 1
    stats = BatchStats()
    skipped = await collect(svc, [DOC_12K, DOC_31K], stats=stats)
    assert [r.error for r in skipped] == ["too_long", "too_long"] and stats.sent == 0
    assert "long_texts='split'" in stats.account() and "10 part requests" in stats.account()


def test_the_same_long_row_gives_the_same_answer_on_every_front_end(env, tmp_path):
    import dask.dataframe as dd

    import batchsum.dask  # noqa: F401
    from batchsum.cli import main

    frame = pd.DataFrame({"text": [DOC_12K, article(30)]})
    by_pandas = frame.batchsum.summarize("text", long_texts="split", rpm=0, progress=False)
    by_dask = (
        dd.from_pandas(frame, npartitions=1)
        .batchsum.summarize("text", long_texts="split", rpm=0, budget="none")
        .compute(scheduler="sync")
    )
    frame.to_parquet(tmp_path / "in.parquet")
    argv = ["summarize", str(tmp_path / "in.parquet"), "-o", str(tmp_path / "out.parquet"), "--column", "text"]
    assert main([*argv, "--rpm", "0", "--long-texts", "split", "--quiet"]) == 0
    by_cli = pd.read_parquet(tmp_path / "out.parquet")
    for other in (by_dask, by_cli):
        assert list(other["summary"]) == list(by_pandas["summary"])
        assert list(other["summary_requests"]) == list(by_pandas["summary_requests"])
    assert by_pandas["summary_status"].tolist() == ["ok", "ok"] and by_pandas["summary_requests"][0] > 3
