"""The streaming path at scale: the window bounded by bytes, reruns answered in bulk (blocks), the
same results and counts whichever way rows arrive, fingerprints kept from earlier journals, and a
CLI run that reads Parquet without pandas. Figures (memory, speed) are in benchmarks/scale.py."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import batchsum
from batchsum.data.datasets import BATCH_ROWS, DatasetInput
from batchsum.data.journal import Journal
from batchsum.data.results import Answer, RowResult
from batchsum.data.stores import MemoryStore
from batchsum.engine import RowBlock, fingerprint, summarize_stream, text_fingerprint
from batchsum.engine.tally import BatchStats
from batchsum.local import Faults
from batchsum.service import contract
from batchsum.service.client import PreparedRequest, validate_params
from tests.support import KEY, article

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [False, True], ids=["rows", "blocks"])
async def test_a_row_held_back_by_a_long_retry_bounds_the_window_by_bytes_and_reading_waits(svc, blocks):
    """The first row's request hangs until the client's timeout, then is tried again; the rows behind
    it are answered at once. While it is held, the rows read stay within the window's bytes (a
    window of 1000 rows would have let 1000 in): reading waits for the held row, then goes on."""
    svc.faults = Faults(script=["hang"], hang_seconds=5)
    text_bytes = len(article(1500, seed=0))
    window_bytes = 8 * text_bytes
    bound = -(-window_bytes // text_bytes)  # rows read before the window is full
    read = 0
    while_held: list[int] = []  # rows read, each time an answer arrived behind the held row

    def rows():
        nonlocal read
        for i in range(40):
            text = article(1500, seed=i)
            if blocks:
                if i % 2 == 0:
                    read += 2
                    yield RowBlock([text, article(1500, seed=i + 1)], 2 * len(text))
            else:
                read += 1
                yield text

    def note(stats: BatchStats) -> None:
        if stats.yielded == 0:
            while_held.append(read)

    async with batchsum.AsyncClient(KEY, svc.url, timeout=2, max_retries=2) as client:
        results = [
            r
            async for r in summarize_stream(
                rows(), client, window=1000, window_bytes=window_bytes, concurrency=8, on_result=note
            )
        ]
    assert [r.status for r in results] == ["ok"] * 40 and results[0].attempts == 2
    slack = 1 if blocks else 0  # a block is read whole
    assert max(while_held) <= bound + slack  # never past the bound while the first row was held
    assert max(while_held) >= bound - 1  # and the held row did hold the reading there
    assert svc.stats()["answered_unique"] == 40


POOL = [article(12 + i, seed=i) for i in range(6)] + ["", "too short", None, 3.5, "x\ud800 lone surrogate " * 3]


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.integers(0, len(POOL) - 1), min_size=1, max_size=40), known=st.sets(st.integers(0, 5)))
def test_blocks_and_rows_give_the_same_results_and_counts(svc, picks, known):
    """A list (taken in blocks, looked up in bulk) and a generator (row by row) give the same
    results, in order, and the same counts; answers already in the store are reused either way."""
    texts = [POOL[i] for i in picks]
    params = validate_params()

    async def run(rows):
        store, stats = MemoryStore(), BatchStats()
        for i in known:  # some answers known before the run
            store.put(fingerprint(PreparedRequest(POOL[i], params)), Answer(f"known {i}", "ok", None, None, 200, 1))
        async with batchsum.AsyncClient(KEY, svc.url) as client:
            out = [r async for r in summarize_stream(rows, client, params, store=store, stats=stats)]
        return out, (stats.done, stats.ok, stats.skipped, stats.failed, stats.reused, stats.sent, stats.yielded)

    in_blocks = asyncio.run(run(list(texts)))
    by_row = asyncio.run(run(iter(texts)))
    assert in_blocks == by_row
    assert len(in_blocks[0]) == len(texts)


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=300),
    mode=st.sampled_from([1, 2]),
    percentage=st.integers(1, 6),
    kind=st.sampled_from([None, *contract.SummaryType]),
)
def test_the_fast_fingerprint_is_the_fingerprint(text, mode, percentage, kind):
    params = validate_params(mode, percentage, kind)
    assert text_fingerprint(params)(text) == fingerprint(PreparedRequest(text, params))


async def test_a_journal_written_before_blocks_still_answers_every_row(svc, tmp_path):
    """A journal written by the code before this change (commit 0b11be0: row by row, its own
    fingerprints) answers a run today: nothing is sent, each row gets the journal's answer."""
    journal = tmp_path / "old.sqlite"
    shutil.copy(FIXTURES / "journal-0b11be0.sqlite", journal)
    texts = json.loads((FIXTURES / "journal-0b11be0.texts.json").read_text(encoding="utf-8"))
    with Journal(journal) as store:
        async with batchsum.AsyncClient(KEY, svc.url) as client:
            for params in ({}, {"mode": 2, "percentage": 2, "type": "bullets"}):
                stats = BatchStats()
                results = [r async for r in summarize_stream(texts * 3, client, store=store, stats=stats, **params)]
                assert [r.status for r in results] == ["ok"] * 6 + ["skipped", "ok"] + ["ok"] * 6 + [
                    "skipped",
                    "ok",
                ] + ["ok"] * 6 + ["skipped", "ok"]
                assert stats.sent == 0 and stats.reused == 21
    assert svc.stats()["answered_unique"] == 0


def test_the_journal_looks_up_many_answers_in_one_go(tmp_path):
    with Journal(tmp_path / "j.sqlite") as journal:
        keys = [f"{i:064x}" for i in range(1200)]  # more than one query's worth
        for key in keys[::3]:
            journal.put(key, Answer(key[-4:], "ok", None, None, 200, 1))
        found = journal.get_many(keys + ["missing"])
    assert set(found) == set(keys[::3]) and found[keys[3]].summary == keys[3][-4:]
    memory = MemoryStore()
    memory.put("a", Answer("s", "ok", None, None, 200, 1))
    assert memory.get_many(["a", "b"]) == {"a": Answer("s", "ok", None, None, 200, 1)}


def test_the_redis_store_looks_up_many_answers_in_one_go(redis_url):
    from batchsum.data.redis_store import RedisStore

    store = RedisStore(redis_url, "scale-test")
    try:
        store.put("a", Answer("s", "ok", None, None, 200, 1))
        assert store.get_many(["a", "b"]) == {"a": Answer("s", "ok", None, None, 200, 1)}
    finally:
        store.close()


def test_wide_rows_are_read_in_smaller_batches(tmp_path):
    """Batches hold about BATCH_BYTES, so a dataset of wide rows is not read 1024 rows at a time."""
    wide = tmp_path / "wide.parquet"
    pq.write_table(pa.table({"text": [article(200, seed=i) * 20 for i in range(300)]}), wide)
    narrow = tmp_path / "narrow.parquet"
    pq.write_table(pa.table({"text": [article(12, seed=i) for i in range(3000)]}), narrow)
    wide_input, narrow_input = DatasetInput([str(wide)], "text"), DatasetInput([str(narrow)], "text")
    assert wide_input.batch_rows() < 100 and narrow_input.batch_rows() == BATCH_ROWS
    assert sum(batch.num_rows for batch in wide_input.batches()) == 300
    assert list(narrow_input.texts()) == [article(12, seed=i) for i in range(3000)]


@pytest.mark.slow
def test_a_cli_run_over_parquet_never_imports_pandas(env, tmp_path):
    """The command reads and writes Parquet with pyarrow alone: pandas (and pyarrow.dataset, which
    imports it) stay unloaded, and the output still reads back into pandas with the result dtypes."""
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "text": [article(15, seed=1), article(15, seed=2), "short"]}), source)
    out = tmp_path / "out.parquet"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "batchsum.cli", "summarize", str(source), "-o", str(out)]
        + ["--column", "text", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    loaded = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "pyarrow.parquet" in loaded and "httpx" in loaded  # what the run needs
    assert not {"pandas.core.frame", "pyarrow.dataset", "pyarrow._dataset"} & loaded
    assert "tqdm" not in loaded  # --quiet: no bar, and no bar's package
    import pandas as pd

    frame = pd.read_parquet(out)
    assert list(frame["summary_status"]) == ["ok", "ok", "skipped"]
    assert str(frame["summary"].dtype) == "string" and str(frame["summary_http_status"].dtype) == "Int32"


def test_hand_written_pandas_metadata_reads_back_every_input_type(tmp_path):
    """The output's pandas metadata, written without pandas, reads back as pandas would read the
    same columns with none: input columns as Arrow converts them, result columns with their dtypes."""
    import datetime

    import pandas as pd

    from batchsum.data.datasets import DatasetOutput

    table = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "text": ["a", "b"],
            "when": pa.array([datetime.datetime(2024, 1, 1), None], pa.timestamp("us")),
            "day": pa.array([datetime.date(2024, 1, 1), None], pa.date32()),
            "tags": pa.array([[1, 2], None], pa.list_(pa.int32())),
            "kind": pa.array(["x", "y"]).dictionary_encode(),
            "price": pa.array([1.5, None]),
            "flag": pa.array([True, False]),
        }
    )
    out = DatasetOutput(tmp_path / "out.parquet", table.schema)
    rows = [RowResult("s", "ok", None, None, 200, 1, 1), RowResult(None, "skipped", "too_short", "m", None, 0, 0)]
    out.write(table.to_batches()[0], rows)
    out.commit()
    frame = pd.read_parquet(tmp_path / "out.parquet")
    plain = table.to_pandas()
    for name in table.column_names:
        assert frame[name].dtype == plain[name].dtype, name
    assert [str(frame[c].dtype) for c in ("summary", "summary_http_status", "summary_attempts")] == [
        "string",
        "Int32",
        "int32",
    ]


def _problem_by_full_count(text: str) -> tuple[contract.SkipReason, str] | None:
    """``text_problem`` as it was, counting every word (for texts that are valid strings)."""
    words = contract.count_words(text)
    if words == 0:
        return contract.SkipReason.EMPTY, "the text is empty or only white space"
    if words < contract.MIN_WORDS:
        word = "word" if words == 1 else "words"
        return contract.SkipReason.TOO_SHORT, f"{words} {word}; the service needs at least {contract.MIN_WORDS}"
    if words > contract.MAX_WORDS:
        return contract.SkipReason.TOO_LONG, f"{words} words; the service takes at most {contract.MAX_WORDS}"
    return None


@settings(max_examples=150, deadline=None)
@given(
    words=st.one_of(st.integers(0, 12), st.integers(4990, 5010)),
    gap=st.sampled_from([" ", "  ", "\n", "\t", "\u3000", " \u00a0"]),
    word=st.sampled_from(["a", "é", "word", "x1"]),
    edges=st.sampled_from(["", " ", "\n\n"]),
)
def test_counting_words_up_to_what_matters_gives_the_same_answer(words, gap, word, edges):
    """``text_problem`` counts a text's words only as far as the limits need; its answer (reason and
    message, with the exact count) is the full count's, at and around both limits."""
    text = edges + gap.join([word] * words) + edges
    assert contract.text_problem(text) == _problem_by_full_count(text)


RESULTS = st.builds(
    RowResult,
    st.one_of(st.none(), st.sampled_from(["", "A summary.", "Another one, longer.", "é ✓", "A long one. " * 20])),
    st.sampled_from(["ok", "skipped", "failed"]),
    st.one_of(st.none(), st.sampled_from(["too_short", "server_error"])),
    st.one_of(st.none(), st.just("the service's words")),
    st.one_of(st.none(), st.sampled_from([200, 422, 500])),
    st.integers(0, 3),
    st.integers(0, 2),
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.one_of(st.lists(RESULTS, max_size=40), st.builds(lambda r, n: [r] * n, RESULTS, st.integers(1, 40))))
def test_result_columns_made_whole_are_the_columns_made_row_by_row(results):
    """A column that one value fills (a rerun's statuses and codes) is made from that value; every
    column is the one ``pa.array`` makes of the rows' values, types, nulls and all."""
    from batchsum.data.results import arrow_columns, arrow_types

    columns = list(zip(*results)) if results else [() for _ in RowResult._fields]
    expected = [pa.array(list(values), type=t) for values, t in zip(columns, arrow_types())]
    made = arrow_columns(results)
    assert [column.type for column in made] == arrow_types()
    assert [column.to_pylist() for column in made] == [column.to_pylist() for column in expected]


def test_a_journal_read_whole_answers_as_its_queries_do_and_keeps_what_is_written_after(tmp_path):
    """A small journal is read in one scan once a run has asked for a quarter of its answers; from
    then on its look-ups answer what the file holds, what the run writes after included, and a
    refreshing run's (``since``) still asks the file."""
    path = tmp_path / "j.sqlite"
    keys = [f"{i:064x}" for i in range(400)]
    with Journal(path) as journal:
        journal.serve("https://svc")
        journal.put_many([(key, Answer(key[-6:], "ok", None, None, 200, 1)) for key in keys[:300]])
        first = journal.get_many(keys[:50] + ["missing"])  # an eighth: still asked of the file
        assert journal._whole._answers is None and len(first) == 50
        assert journal.get_many(keys[50:100]) and journal._whole._answers is not None  # a quarter: read whole
        journal.put(keys[300], Answer("later", "ok", None, None, 200, 1))
        journal.put_many([(keys[301], Answer("later too", "ok", None, None, 200, 1))])
        remembered = journal.get_many(keys + ["missing"])
        since = journal.get_many(keys, since=journal.last_write())
    with Journal(path) as fresh:  # the same file, asked by query
        fresh.serve("https://svc")
        assert fresh.get_many(keys + ["missing"]) == remembered
    assert len(remembered) == 302 and remembered[keys[301]].summary == "later too"
    assert set(since) <= {keys[300], keys[301]} and keys[301] in since


def test_a_shared_journal_is_never_read_whole_another_runs_answers_are_seen(tmp_path):
    from batchsum.data.journal import SharedJournal

    path = tmp_path / "shared.sqlite"
    keys = [f"{i:064x}" for i in range(40)]
    with SharedJournal(path) as one, SharedJournal(path) as other:
        one.put_many([(key, Answer("s", "ok", None, None, 200, 1)) for key in keys[:20]])
        assert len(one.get_many(keys)) == 20
        other.put_many([(key, Answer("t", "ok", None, None, 200, 1)) for key in keys[20:]])
        assert len(one.get_many(keys)) == 40 and one._whole._answers is None


def _threads(prefix: str) -> list[str]:
    import threading

    return [thread.name for thread in threading.enumerate() if thread.name.startswith(prefix)]


def test_the_read_ahead_stops_its_thread_when_reading_stops_early_and_when_the_input_closes(tmp_path):
    path = tmp_path / "in.parquet"
    texts = [article(12, seed=i) for i in range(5000)]
    pq.write_table(pa.table({"text": texts}), path)
    source = DatasetInput([str(path)], "text")
    assert [text for batch in source.batches(700) for text in batch.column(0).to_pylist()] == texts
    batches = source.batches(700)
    assert next(batches).num_rows == 700  # decoded ahead, in order
    assert _threads("batchsum-read")
    batches.close()  # a stop: the reading ends here
    assert not _threads("batchsum-read")
    batches = source.batches(700)
    next(batches)
    source.close()  # the input closed while a reading is under way: its thread first
    assert not _threads("batchsum-read")


def test_a_broken_input_raises_where_its_batch_would_come_through_the_read_ahead(tmp_path):
    from batchsum.errors import InputError
    from batchsum.service.errors import BrokenInputError

    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [article(12, seed=i) for i in range(4000)]}), path, row_group_size=1000)
    data = bytearray(path.read_bytes())
    meta = pq.ParquetFile(path).metadata
    last = meta.row_group(3).column(0)
    start = last.dictionary_page_offset or last.data_page_offset
    data[start : start + 64] = b"\xff" * 64  # the last row group's pages damaged, the footer intact
    path.write_bytes(bytes(data))
    read = []
    with pytest.raises((BrokenInputError, InputError)):
        for batch in DatasetInput([str(path)], "text").batches(500):
            read.append(batch.num_rows)
    assert sum(read) == 3000 and set(read) == {500}  # every batch before the damaged one came, in order
    assert not _threads("batchsum-read")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_an_output_on_a_full_disk_says_so_once_and_its_abort_raises_nothing_and_removes_the_partial_file(
    tmp_path, monkeypatch
):
    """A real full disk (``/dev/full``): the write or the commit is the output's one line; the abort
    that follows (its buffer fails to flush again) raises nothing and the partial file goes."""
    from batchsum.data import datasets
    from batchsum.data.datasets import DatasetOutput
    from batchsum.errors import OutputError

    table = pa.table({"text": [article(12, seed=i) for i in range(30)]})
    rows = [RowResult("s", "ok", None, None, 200, 1, 1)] * 10
    for fmt in ("parquet", "csv", "jsonl"):
        out = DatasetOutput(tmp_path / f"out.{fmt}", table.schema)
        out._file.close()
        out._file = open("/dev/full", "wb")  # noqa: SIM115 - the output's file, closed by its abort
        out._writer = {"parquet": datasets._RowGroups, "csv": datasets.pcsv.CSVWriter}.get(
            fmt, lambda file, _: datasets._JsonLinesWriter(file)
        )(out._file, out.schema)
        with pytest.raises(OutputError, match="No space left on device"):
            for batch in table.to_batches(max_chunksize=10):
                out.write(batch, rows)
            out.commit()
        out.abort()  # nothing raised
        assert out._file.closed and not out.partial.exists(), fmt


def test_an_output_whose_writer_fails_on_its_thread_raises_and_leaves_no_partial_file(tmp_path, monkeypatch):
    """Row groups are written on the writer's thread, one at a time: its error (a full disk) is raised
    at the next hand-over or at the commit, and the partial output is removed."""
    from batchsum.data import datasets
    from batchsum.data.datasets import DatasetOutput
    from batchsum.errors import OutputError

    monkeypatch.setattr(datasets, "ROW_GROUP_BYTES", 1)  # a row group per batch
    table = pa.table({"text": [article(12, seed=i) for i in range(30)]})
    rows = [RowResult("s", "ok", None, None, 200, 1, 1)] * 10
    out = DatasetOutput(tmp_path / "out.parquet", table.schema)
    for batch in table.to_batches(max_chunksize=10):
        out.write(batch, rows)
    out.commit()
    back = pq.read_table(tmp_path / "out.parquet")
    assert back.column("text").to_pylist() == table.column("text").to_pylist()
    assert pq.ParquetFile(tmp_path / "out.parquet").num_row_groups == 3

    written = []

    def full_disk(self, table, *args, **kwargs):
        if written:
            raise OSError(28, "No space left on device")
        written.append(table.num_rows)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full_disk)
    out = DatasetOutput(tmp_path / "again.parquet", table.schema)
    with pytest.raises(OutputError, match=r"cannot write .*again.parquet \(No space left on device\); every answer"):
        for batch in table.to_batches(max_chunksize=10):
            out.write(batch, rows)
        out.commit()
    out.abort()
    assert not list(tmp_path.glob(".again.parquet.*")) and not (tmp_path / "again.parquet").exists()
    assert not _threads("batchsum-write")


def test_the_commands_own_process_runs_the_collector_on_young_objects_less_often_and_never_on_the_imports():
    """``own_collector`` (the CLI's own process only): what the imports made is frozen out of the
    collector's passes, and its youngest pass waits for ``COLLECT_EVERY`` new objects, not 700."""
    import gc

    from batchsum._imports import COLLECT_EVERY, own_collector

    threshold = gc.get_threshold()
    try:
        own_collector()
        assert gc.get_threshold() == (COLLECT_EVERY, *threshold[1:]) and gc.get_freeze_count() > 0
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def test_a_journal_empty_when_first_asked_asks_its_file_only_for_what_the_run_wrote(tmp_path):
    """A first run, or a new output the answer store answers: its journal held nothing when first
    asked, so a look-up asks the file only for the keys the run has written since."""
    keys = [f"{i:064x}" for i in range(50)]
    with Journal(tmp_path / "j.sqlite") as journal:
        journal.serve("https://svc")
        asked: list[str] = []
        journal._db.set_trace_callback(asked.append)
        assert journal.get_many(keys[:20]) == {}
        assert not [sql for sql in asked if sql.startswith("SELECT fingerprint")]  # nothing asked of the file
        journal.put_many([(key, Answer(key[-4:], "ok", None, None, 200, 1)) for key in keys[:5]])
        asked.clear()
        found = journal.get_many(keys[:20])
        assert set(found) == set(keys[:5]) and found[keys[0]].summary == keys[0][-4:]
        lookups = [sql for sql in asked if sql.startswith("SELECT fingerprint")]
        assert len(lookups) == 1 and lookups[0].count("'") == 2 * 5  # only the 5 it wrote
