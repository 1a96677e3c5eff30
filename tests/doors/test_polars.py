"""``df.batchsum`` on Polars: every input column then the result columns as pl.String / pl.Int32,
rows in order, the same answers and records as the pandas accessor on the same rows (skipped and
failed ones too), inside a running event loop as well."""

from __future__ import annotations

import pandas as pd
import pytest

pl = pytest.importorskip("polars")

import batchsum.polars  # noqa: E402  (registers df.batchsum for Polars)
from batchsum.data.results import result_columns  # noqa: E402
from batchsum.errors import InputError  # noqa: E402
from batchsum.local import Faults  # noqa: E402
from batchsum.pandas_ext import clear_cache  # noqa: E402
from tests.support import KEY, article, wait_for_count  # noqa: E402

TEXTS = [article(30, seed=i) for i in range(5)] + [None, "too short", article(30, seed=0), "   "]


@pytest.fixture
def opts(svc):
    clear_cache()
    return {"api_key": KEY, "base_url": svc.url, "rpm": 0, "progress": False, "budget": "none"}


def test_types_order_and_answers_equal_the_pandas_accessor(svc, opts):
    frame = pl.DataFrame({"id": list(range(len(TEXTS))), "text": TEXTS})
    svc.faults = Faults(script=["ok", "ok", "422"])  # one row refused by the service: a failed row
    out = frame.batchsum.summarize("text", type="bullets", **opts)
    assert out.columns == ["id", "text", *result_columns()]
    assert out.schema["summary"] == pl.String and out.schema["summary_status"] == pl.String
    assert out.schema["summary_http_status"] == pl.Int32 and out.schema["summary_attempts"] == pl.Int32
    assert out.schema["summary_requests"] == pl.Int32
    assert out["id"].to_list() == list(range(len(TEXTS)))
    statuses = out["summary_status"].to_list()
    assert statuses.count("skipped") == 3 and statuses.count("failed") == 1

    # The pandas accessor on the same rows, from the same answers (the failed row is not kept: a 422
    # is permanent and answered again from the cache).
    by_pandas = pd.DataFrame({"id": list(range(len(TEXTS))), "text": TEXTS}).batchsum.summarize(
        "text", type="bullets", **opts
    )
    for name in result_columns():
        assert out[name].to_list() == [None if pd.isna(v) else v for v in by_pandas[name].tolist()], name
    assert batchsum.polars.last_run()["rows"] == len(TEXTS)


def test_a_series_gives_the_result_columns_and_works_in_a_running_loop(svc, opts):
    series = pl.Series("text", TEXTS[:3])
    out = series.batchsum.summarize(**opts)
    assert out.columns == result_columns() and out["summary_status"].to_list() == ["ok"] * 3

    async def inside_a_loop() -> object:
        return series.batchsum.summarize(percentage=2, **opts)  # the sync call, from a running loop

    import asyncio

    assert asyncio.run(inside_a_loop())["summary_status"].to_list() == ["ok"] * 3


async def test_asummarize_awaits_in_the_running_loop(svc, opts):
    out = await pl.DataFrame({"text": TEXTS[:2]}).batchsum.asummarize("text", output_column="digest", **opts)
    assert out.columns == ["text", *result_columns("digest")]


def test_bad_input_is_one_clear_error_before_anything_is_sent(svc, opts):
    frame = pl.DataFrame({"text": TEXTS[:2], "summary": ["x", "y"]})
    with pytest.raises(InputError, match="no column 'body'"):
        frame.batchsum.summarize("body", **opts)
    with pytest.raises(InputError, match="already has column 'summary'"):
        frame.batchsum.summarize("text", **opts)
    assert svc.stats()["requests"] == 0


def test_a_column_that_is_not_text_is_skipped_per_row_as_on_pandas(svc, opts):
    out = pl.DataFrame({"n": [1, 2]}).batchsum.summarize("n", **opts)
    assert out["summary_status"].to_list() == ["skipped", "skipped"] and out["summary_error"].to_list() == [
        "empty",
        "empty",
    ]


def test_an_object_column_of_strings_reads_as_text_and_other_objects_fail_per_row(svc, opts):
    values = [article(30, seed=1), {"not": "text"}, b"bytes", article(30, seed=2)]
    out = pl.DataFrame({"text": pl.Series(values, dtype=pl.Object)}).batchsum.summarize("text", **opts)
    assert out["summary_status"].to_list() == ["ok", "skipped", "skipped", "ok"]
    assert "not a text" in (out["summary_message"][1] or "")


@pytest.mark.parametrize("dtype", ["categorical", "enum"])
def test_categorical_and_enum_columns_read_as_text(svc, opts, dtype):
    texts = [article(30, seed=3), article(30, seed=4)]
    kind = pl.Categorical if dtype == "categorical" else pl.Enum(texts)
    out = pl.DataFrame({"text": pl.Series(texts, dtype=kind)}).batchsum.summarize("text", **opts)
    assert out["summary_status"].to_list() == ["ok", "ok"]


def test_a_lazy_frame_sunk_to_parquet_streams_through_one_run_with_the_eager_answers(svc, opts, tmp_path):
    texts = [article(20, seed=4000 + i % 90) if i % 13 else None for i in range(300)]
    pl.DataFrame({"id": range(300), "text": texts}).write_parquet(tmp_path / "in.parquet")
    lazy = pl.scan_parquet(tmp_path / "in.parquet").batchsum.summarize("text", **opts)
    assert isinstance(lazy, pl.LazyFrame)
    assert svc.state.stats()["requests"] == 0  # lazy: nothing sent yet
    assert lazy.collect_schema().names() == ["id", "text", *result_columns()]
    batchsum.polars.LAZY_BATCH_ROWS, before = 32, batchsum.polars.LAZY_BATCH_ROWS  # many batches
    try:
        lazy.sink_parquet(tmp_path / "out.parquet")
    finally:
        batchsum.polars.LAZY_BATCH_ROWS = before
    sunk = pl.read_parquet(tmp_path / "out.parquet")
    assert svc.state.stats()["by_status"] == {"200": 90}  # each distinct text once
    clear_cache()
    eager = pl.read_parquet(tmp_path / "in.parquet").batchsum.summarize("text", **opts)
    assert sunk.equals(eager)
    assert sunk["id"].to_list() == list(range(300))
    assert sunk.filter(pl.col("text").is_null())["summary_status"].unique().to_list() == ["skipped"]


def test_a_lazy_head_pays_only_for_its_rows_and_a_filter_after_applies_to_the_results(svc, opts, tmp_path):
    pl.DataFrame({"id": range(50), "text": [article(20, seed=5000 + i) for i in range(50)]}).write_parquet(
        tmp_path / "in.parquet"
    )
    lazy = pl.scan_parquet(tmp_path / "in.parquet").batchsum.summarize("text", **opts)
    assert lazy.head(5).collect()["id"].to_list() == list(range(5))
    assert svc.state.stats()["requests"] == 5
    picked = lazy.filter(pl.col("summary_status") == "ok").select("id", "summary").collect()
    assert picked.columns == ["id", "summary"] and picked.height == 50


def test_a_lazy_frame_refuses_a_missing_column_when_summarize_is_called(svc, opts, tmp_path):
    lazy = pl.LazyFrame({"id": [1], "body": ["a text"]})
    with pytest.raises(InputError, match="no column 'text'"):
        lazy.batchsum.summarize("text", **opts)
    assert svc.state.stats()["requests"] == 0


LONG_KEY = "bs-lazy-plan-secret-0123456789-abcdefghij"
PASSWORD = "hunter2-redis-password-9876"


def _pieces(secret: str) -> list[bytes]:
    return [secret[i : i + 10].encode() for i in range(len(secret) - 9)]


def _blobs(lazy: pl.LazyFrame) -> dict[str, bytes]:
    """Every form a lazy plan takes outside the process: serialized (binary, JSON, pickled),
    explained and printed. JSON carries pickled Python as arrays of byte values: those are decoded too."""
    import json
    import pickle
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Polars deprecates its JSON format
        as_json = lazy.serialize(format="json")
    arrays: list[bytes] = []

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            if value and all(isinstance(item, int) for item in value):
                arrays.append(bytes(item & 0xFF for item in value))
            for item in value:
                walk(item)

    walk(json.loads(as_json))
    return {
        "binary": lazy.serialize(),
        "json": as_json.encode(),
        "json byte arrays": b"\n".join(arrays),
        "pickle": pickle.dumps(lazy),
        "explain": lazy.explain().encode(),
        "explain unoptimized": lazy.explain(optimized=False).encode(),
        "str": str(lazy).encode(),
        "repr": repr(lazy).encode(),
        "html": lazy._repr_html_().encode(),
    }


def test_a_lazy_plan_holds_no_piece_of_the_key_serialized_explained_or_printed(svc, opts, tmp_path):
    texts = [article(20, seed=7000 + i) for i in range(6)]
    options = {**opts, "api_key": KEY, "budget": f"redis://:{PASSWORD}@127.0.0.1:1/0"}
    secret_lazy = pl.LazyFrame({"text": texts}).batchsum.summarize("text", **{**options, "api_key": LONG_KEY})
    blobs = _blobs(secret_lazy)
    assert len(blobs["json byte arrays"]) > 1000  # the pickled source is there, and was read
    for secret in (LONG_KEY, PASSWORD):
        held = [name for name, blob in blobs.items() for piece in _pieces(secret) if piece in blob]
        assert not held, f"a piece of {secret[:3]}... in {sorted(set(held))}"

    # The plan still runs where it was made, as it is and loaded back from its serialized form.
    import io

    lazy = pl.LazyFrame({"text": texts}).batchsum.summarize("text", **opts)
    assert lazy.collect()["summary_status"].to_list() == ["ok"] * 6
    again = pl.LazyFrame.deserialize(io.BytesIO(lazy.serialize()))
    assert again.collect()["summary_status"].to_list() == ["ok"] * 6
    assert svc.state.stats()["requests"] == 6  # loaded back, it found the same answers


@pytest.mark.slow
def test_a_lazy_plan_run_in_another_process_reads_the_key_there_or_says_so(svc, opts, tmp_path):
    import os
    import subprocess
    import sys

    texts = [article(20, seed=7100 + i) for i in range(3)]
    plan = tmp_path / "plan.bin"
    plan.write_bytes(pl.LazyFrame({"text": texts}).batchsum.summarize("text", **opts).serialize())
    script = (
        "import sys, polars as pl, batchsum.polars\n"
        "try:\n"
        "    out = pl.LazyFrame.deserialize(open(sys.argv[1], 'rb')).collect()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc); sys.exit(1)\n"
        "print(out['summary_status'].to_list())\n"
    )
    env = {name: value for name, value in os.environ.items() if not name.startswith("BATCHSUM_")}
    with_key = subprocess.run(
        [sys.executable, "-c", script, str(plan)], env={**env, "BATCHSUM_API_KEY": KEY}, capture_output=True, text=True
    )
    assert with_key.returncode == 0 and with_key.stdout.strip() == "['ok', 'ok', 'ok']", with_key.stderr
    without = subprocess.run([sys.executable, "-c", script, str(plan)], env=env, capture_output=True, text=True)
    assert without.returncode == 1
    assert without.stdout.strip() == (
        "ConfigurationError this lazy plan was made in another process, which kept its key: "
        "set BATCHSUM_API_KEY (or BATCHSUM_API_KEYS) where the plan runs"
    )


def test_the_polars_result_types_are_the_arrow_ones():
    import pyarrow as pa

    from batchsum.data.results import arrow_types

    empty = pl.from_arrow(pa.schema([(str(i), t) for i, t in enumerate(arrow_types())]).empty_table())
    assert tuple(empty.schema.values()) == batchsum.polars._RESULT_TYPES


@pytest.mark.slow
def test_a_lazy_run_loads_neither_pyarrow_nor_pandas_and_cuts_polars_chunks_small(svc, tmp_path):
    """pandas (about 40 MB, loaded by pyarrow's first conversion of Python values) and pyarrow
    (about 40 MB) stay out of a process that streams a LazyFrame; a chunk as large as a Parquet
    row group reaches the run in slices of LAZY_BATCH_ROWS."""
    import subprocess
    import sys

    rows = 5000
    texts = [article(12, seed=7200 + i % 40) for i in range(rows)]
    pl.DataFrame({"id": range(rows), "text": texts}).write_parquet(tmp_path / "in.parquet", row_group_size=rows)
    script = (
        "import sys, polars as pl, batchsum.polars, batchsum.run.batches as b\n"
        "seen, init = [], b.BatchStream.__init__\n"
        "def counted(batches):\n"
        "    for batch in batches:\n"
        "        seen.append(len(batch))\n"
        "        yield batch\n"
        "b.BatchStream.__init__ = lambda self, spec, batches, *a, **k: init(self, spec, counted(batches), *a, **k)\n"
        "lazy = pl.scan_parquet(sys.argv[1]).batchsum.summarize('text', api_key=sys.argv[3], base_url=sys.argv[4],\n"
        "    rpm=0, budget='none', progress=False)\n"
        "lazy.sink_parquet(sys.argv[2])\n"
        "print(max(seen), sum(seen), 'pyarrow' in sys.modules, 'pandas' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "in.parquet"), str(tmp_path / "out.parquet"), KEY, svc.url],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(batchsum.polars.LAZY_BATCH_ROWS), str(rows), "False", "False"]
    assert (pl.read_parquet(tmp_path / "out.parquet")["summary_status"] == "ok").all()


def test_a_lazy_plan_with_a_budget_object_keeps_it_in_this_process_and_runs(svc, opts):
    from batchsum.pacing.budgets.budget import open_budget

    budget = open_budget("none", "lazy-budget-object")
    texts = [article(20, seed=7300 + i) for i in range(3)]
    lazy = pl.LazyFrame({"text": texts}).batchsum.summarize("text", **{**opts, "budget": budget})
    assert lazy.collect()["summary_status"].to_list() == ["ok"] * 3


def test_a_lazy_plan_with_several_keys_holds_no_piece_of_any(svc, opts):
    """A run's keys (``api_key=[...]``) stay in the process that made the plan, as its one key does."""
    other = "zq" + LONG_KEY[2:][::-1]
    lazy = pl.LazyFrame({"text": [article(20, seed=7100)]}).batchsum.summarize(
        "text", **{**opts, "api_key": [LONG_KEY, other]}
    )
    for secret in (LONG_KEY, other):
        held = [name for name, blob in _blobs(lazy).items() for piece in _pieces(secret) if piece in blob]
        assert not held, f"a piece of a key in {sorted(set(held))}"


AFTER_STOP = 25  # at most this many requests admitted after SIGINT (at 600/min: the turns already due, the wire)

CHILD_COLLECT = """
import os, sys, time
import polars as pl
import batchsum.polars
path, how, report = sys.argv[1], sys.argv[2], sys.argv[3]
options = dict(base_url=os.environ["BATCHSUM_BASE_URL"], rpm=600, progress=False, report=report)
try:
    try:
        if how == "lazy":
            pl.scan_parquet(path).batchsum.summarize("text", **options).collect()
        else:
            pl.read_parquet(path).batchsum.summarize("text", **options)
        print("finished")
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        for _ in range(10):  # a clean-up that takes a while: a second KeyboardInterrupt would cut it short
            time.sleep(0.02)
        print("cleaned up")
    except Exception as exc:
        print("error:", type(exc).__name__, exc)
except KeyboardInterrupt:
    print("interrupted again")
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["lazy", "eager"])
def test_sigint_while_collecting_stops_the_run_and_keeps_every_answer(svc, opts, tmp_path, how):
    """A lazy collect runs the source on Polars' threads while the main thread waits in Polars' code:
    SIGINT is heard on its behalf (the wakeup fd) and the run stops; the eager call waits in Python
    and stops on the ``KeyboardInterrupt`` itself. Either raises one ``KeyboardInterrupt``, whose
    handler runs to its end (Polars raises one of its own from the collect, and Python's handler
    raised another into that block: ``run.interrupts`` raises none for a signal the collect raised).
    The next collect pays for none of it again."""
    import json
    import os
    import signal
    import subprocess
    import sys

    rows = 800
    path = tmp_path / "in.parquet"
    pl.DataFrame({"text": [article(20, seed=41000 + i) for i in range(rows)]}).write_parquet(path, row_group_size=100)
    env = dict(os.environ, BATCHSUM_API_KEY=KEY, BATCHSUM_BASE_URL=svc.url, PYTHONPATH=os.getcwd())
    report = tmp_path / "run.json"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_COLLECT, str(path), how, str(report)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    at = wait_for_count(svc, 30, alive=child)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    assert out.split("\n") == ["interrupted", "cleaned up", ""], out  # one KeyboardInterrupt, its handler whole
    after = svc.stats()["requests"] - at
    assert after <= AFTER_STOP
    print(f"{how}: requests after the signal: {after}")
    stopped = json.loads(report.read_text())
    assert stopped["outcome"] == "stopped" and stopped["requests"]["texts_sent"] == svc.stats()["answered"]
    assert stopped["cause"] == "signal"  # heard as an interrupt at either door, not as a cancel
    if how == "lazy":
        assert stopped["error"]["type"] == "RunInterrupted"
    again = pl.scan_parquet(path).batchsum.summarize("text", **{**opts, "budget": "machine"}).collect()
    assert again["summary_status"].to_list() == ["ok"] * rows
    assert svc.stats()["answered_unique"] == rows and svc.stats()["answered_twice"] == 0
