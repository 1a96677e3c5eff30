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
from batchsum.engine.fingerprints import text_fingerprint
from batchsum.engine.tally import BatchStats
from batchsum.local import Faults
from batchsum.service import contract
from tests.support import KEY, article, wait_for

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


@pytest.mark.slow
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


async def test_the_dry_run_of_a_split_job_done_replays_its_reduce_from_the_store_and_says_nothing_to_send(svc):
    """Every answer of the job kept (its parts' and its reduce's): the dry run replays the reduce from
    the part summaries kept and looks each reduce request up, so it says 0 to send (it said "0 to 20",
    adding the reduce's bound whatever the store held); the run then sends 0."""
    rows = [DOC_12K, DOC_31K, article(30)]
    store = MemoryStore()
    await collect(svc, rows, store=store, long_texts="split")
    plan = plan_batch(rows, long_texts_policy="split", shared=store)
    assert (plan.to_send, plan.parts, plan.reduces, plan.reduce_max) == (0, 0, 0, 0)
    assert "would send:       0 requests;" in plan.describe(600)
    assert "0 part requests and 0 reduce requests" in plan.describe(600)
    svc.state.reset_stats()
    await collect(svc, rows, store=store, long_texts="split")
    assert svc.stats()["requests"] == 0


async def test_a_reduce_round_not_kept_is_counted_exactly_and_only_the_rounds_after_it_are_a_bound(svc):
    """The parts kept and the reduce's last request forgotten: the replay finds it, to send (exact,
    the last round: nothing after it); with the first round of a tree forgotten, its requests are
    exact and the rounds after them a bound the run keeps within."""
    rows = [DOC_31K]
    store = MemoryStore()
    stats = BatchStats()
    await collect(svc, rows, store=store, stats=stats, long_texts="split")
    reduces = stats.sent_by_kind["reduce"]
    assert reduces > 1  # 31,000 words: a tree of rounds, then the last request
    params = contract.Params(contract.Mode.STANDARD, contract.PERCENTAGE_DEFAULT, None)
    parts = long_texts.split_text(DOC_31K)
    part_params = long_texts.part_params(params)
    summaries = [store.get(text_fingerprint(part_params)(part)).summary for part in parts]
    plan = long_texts.reduce_plan(summaries, contract.count_words(DOC_31K), params)
    rounds, step = [], next(plan)
    try:
        while True:
            rounds.append(step)
            step = plan.send([store.get(text_fingerprint(step.params)(t)).summary for t in step.texts])
    except StopIteration:
        pass
    assert sum(len(r.texts) for r in rounds) == reduces and rounds[-1].final
    last = rounds[-1]
    store.pop(text_fingerprint(last.params)(last.texts[0]))
    forgot_last = plan_batch(rows, long_texts_policy="split", shared=store)
    assert (forgot_last.to_send, forgot_last.reduces, forgot_last.reduce_max) == (1, 1, 0)
    first = rounds[0]
    for text in first.texts:
        store.pop(text_fingerprint(first.params)(text))
    forgot_first = plan_batch(rows, long_texts_policy="split", shared=store)
    assert forgot_first.reduces == len(first.texts) and forgot_first.reduce_max >= reduces - len(first.texts)
    assert f"{len(first.texts)} to " in forgot_first.describe(600)
    svc.state.reset_stats()
    await collect(svc, rows, store=store, long_texts="split")
    sent = svc.stats()["requests"]
    assert forgot_first.reduces <= sent <= forgot_first.reduces + forgot_first.reduce_max


@pytest.mark.slow
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
    three = lambda: stats.sent_by_kind["part"] >= 3  # noqa: E731
    await asyncio.to_thread(wait_for, three, what="three parts sent")  # the loop runs on
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


@pytest.mark.slow
def test_a_split_job_done_then_its_dry_run_for_another_output_says_0_requests_and_the_run_sends_0(
    env, tmp_path, capsys
):
    """Issue 48 through the command line: a split long-text job into one output; the dry run of the
    same rows into another output (the machine's store holds every answer) says "would send: 0
    requests", and the run sends 0."""
    from batchsum.cli import main

    pd.DataFrame({"text": [DOC_12K, DOC_31K, article(30)]}).to_parquet(tmp_path / "in.parquet")
    argv = ["summarize", str(tmp_path / "in.parquet"), "--column", "text", "--long-texts", "split", "--rpm", "0"]
    assert main([*argv, "-o", str(tmp_path / "first.parquet"), "--quiet"]) == 0
    first = env.stats()["requests"]
    assert first > long_texts.count_parts(DOC_12K) + long_texts.count_parts(DOC_31K) + 1  # reduces paid too
    capsys.readouterr()
    assert main([*argv, "-o", str(tmp_path / "second.parquet"), "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "would send:       0 requests;" in dry and "0 part requests and 0 reduce requests" in dry, dry
    assert "requests needed:  0 paid requests for the whole job (more" in dry
    assert main([*argv, "-o", str(tmp_path / "second.parquet"), "--quiet"]) == 0
    assert env.stats()["requests"] == first  # the run sent 0
    again = pd.read_parquet(tmp_path / "second.parquet")
    assert list(again["summary"]) == list(pd.read_parquet(tmp_path / "first.parquet")["summary"])


@pytest.mark.slow
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
