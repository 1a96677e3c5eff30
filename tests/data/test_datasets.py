"""Datasets in and out through the CLI: CSV, JSON Lines and hive-partitioned inputs, each output
format read back with pandas with the documented dtypes, a remote round trip through an
S3-compatible server (moto's standalone server on loopback), an http:// input, and the bad cases:
one line, exit 2, nothing sent, no file created."""

from __future__ import annotations

import functools
import http.server
import json
import os
import threading
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import batchsum
from batchsum.cli import main
from batchsum.data.datasets import DatasetInput
from tests.support import KEY, article


def run(*argv):
    return main(["summarize", *argv, "--quiet", "--rpm", "0"])


def frame(n=12, offset=0):
    texts = [article(15, seed=offset + i) for i in range(n)]
    texts[1] = "too short"
    return pd.DataFrame({"id": [f"r{offset + i}" for i in range(n)], "text": texts})


def one_line_error(capsys, *words):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("batchsum: error:"), err
    for word in words:
        assert word in err, err
    return err


def test_csv_input_keeps_text_that_looks_like_numbers_as_text(env, tmp_path):
    data = frame()
    data.loc[2, "text"] = "12345"
    data.loc[3, "text"] = 'A text, with "quotes", commas\nand a line break, long enough to be summarized by it.'
    data.to_csv(tmp_path / "in.csv", index=False)
    assert run(str(tmp_path / "in.csv"), "-o", str(tmp_path / "out.parquet"), "--column", "text") == 0
    out = pd.read_parquet(tmp_path / "out.parquet")
    assert out["id"].tolist() == data["id"].tolist()
    assert out.loc[2, "summary_error"] == "too_short" and out.loc[3, "summary_status"] == "ok"


def test_jsonl_input_and_format_given_for_an_unusual_extension(env, tmp_path):
    data = frame()
    with open(tmp_path / "in.log", "w", encoding="utf-8") as file:
        for row in data.to_dict("records"):
            file.write(json.dumps(row) + "\n")
    out = tmp_path / "out.parquet"
    assert run(str(tmp_path / "in.log"), "-o", str(out), "--column", "text", "--format", "JSONL") == 0
    assert pd.read_parquet(out)["id"].tolist() == data["id"].tolist()


def test_a_hive_partitioned_folder_adds_its_partitions_as_columns_in_file_then_row_order(env, tmp_path):
    root = tmp_path / "data"
    parts = {"2023": frame(5, 0), "2024": frame(7, 100)}
    for year, part in parts.items():
        (root / f"year={year}").mkdir(parents=True)
        part.iloc[:3].to_parquet(root / f"year={year}" / "a.parquet", index=False)
        part.iloc[3:].to_parquet(root / f"year={year}" / "b.parquet", index=False)
    (root / "_SUCCESS").write_text("")  # hidden and marker files are not data
    (root / ".hidden.parquet").write_text("not data")
    (root / "_temporary" / "0").mkdir(parents=True)
    (root / "_temporary" / "0" / "part-9.parquet").write_text("a half-written file")
    out = tmp_path / "out.parquet"
    assert run(str(root), "-o", str(out), "--column", "text") == 0
    result = pd.read_parquet(out)
    assert result["id"].tolist() == parts["2023"]["id"].tolist() + parts["2024"]["id"].tolist()
    assert result["year"].tolist() == [2023] * 5 + [2024] * 7


def test_input_order_is_file_then_row_across_many_batches(tmp_path):
    for name, n in (("b.csv", 2500), ("a.csv", 1500)):
        pd.DataFrame({"text": [f"{name} {i}" for i in range(n)]}).to_csv(tmp_path / name, index=False)
    texts = list(DatasetInput([str(tmp_path)], "text").texts(batch_rows=700))
    assert texts == [f"a.csv {i}" for i in range(1500)] + [f"b.csv {i}" for i in range(2500)]


@pytest.mark.parametrize("name", ["out.parquet", "out.csv", "out.jsonl"])
def test_each_output_format_reads_back_with_the_documented_dtypes(env, tmp_path, name):
    data = frame()
    data.to_parquet(tmp_path / "in.parquet", index=False)
    assert run(str(tmp_path / "in.parquet"), "-o", str(tmp_path / name), "--column", "text") == 0
    dtypes = batchsum.result_dtypes()
    if name.endswith(".parquet"):
        back = pd.read_parquet(tmp_path / name)
    elif name.endswith(".csv"):
        back = pd.read_csv(tmp_path / name, dtype=dtypes)
    else:
        back = pd.read_json(tmp_path / name, lines=True, dtype=dtypes)
    assert {column: str(back[column].dtype) for column in dtypes} == dtypes
    assert back["id"].tolist() == data["id"].tolist()
    assert back.loc[1, "summary_status"] == "skipped" and pd.isna(back.loc[1, "summary_http_status"])
    assert (back.drop(index=1)["summary_status"] == "ok").all()
    assert not list(tmp_path.glob(".*.partial"))


def test_the_accessor_gives_the_same_dtypes(svc):
    out = frame(3).batchsum.summarize("text", api_key=KEY, base_url=svc.url, rpm=0, progress=False)
    assert {c: str(out[c].dtype) for c in batchsum.result_dtypes()} == batchsum.result_dtypes()


def test_an_unknown_output_extension_is_refused_before_anything_is_sent(env, tmp_path, capsys):
    frame().to_parquet(tmp_path / "in.parquet")
    for name in ("out.xlsx", "summaries", "out.json"):
        assert run(str(tmp_path / "in.parquet"), "-o", str(tmp_path / name), "--column", "text") == 2
        one_line_error(capsys, ".parquet, .pq, .csv, .jsonl")
    assert env.stats()["requests"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]


def test_a_nested_column_cannot_go_to_csv(env, tmp_path, capsys):
    pq.write_table(pa.table({"text": [article(15)], "tags": [["a", "b"]]}), tmp_path / "in.parquet")
    assert run(str(tmp_path / "in.parquet"), "-o", str(tmp_path / "out.csv"), "--column", "text") == 2
    one_line_error(capsys, "'tags'", "CSV")
    assert run(str(tmp_path / "in.parquet"), "-o", str(tmp_path / "out.jsonl"), "--column", "text") == 0
    assert json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])["tags"] == ["a", "b"]


# -- remote datasets ----------------------------------------------------------------------------------


def test_a_remote_round_trip_through_an_s3_compatible_server(env, s3, tmp_path):
    data = frame()
    with s3.open_output_stream("data/in/part-0.csv") as out:
        out.write(data.to_csv(index=False).encode())
    assert run("s3://data/in/", "-o", "s3://data/out/summaries.parquet", "--column", "text") == 0
    back = pq.read_table("data/out/summaries.parquet", filesystem=s3).to_pandas()
    assert back["id"].tolist() == data["id"].tolist()
    assert (back.drop(index=1)["summary_status"] == "ok").all()
    assert env.stats()["answered"] == len(data) - 1


@pytest.mark.parametrize(
    "source, output, words",
    [
        ("s3://data/in.parquet", "s3://no-such-bucket/out.parquet", "no-such-bucket"),
        ("s3://data/missing.parquet", "s3://data/out.parquet", "no such file"),
        ("s3://data/broken.parquet", "s3://data/out.parquet", "cannot be read as Parquet"),
        ("s3://data/in.parquet", "s3://data/out.txt", ".parquet"),
    ],
)
def test_remote_problems_are_one_line_exit_2_and_nothing_sent(env, s3, tmp_path, capsys, source, output, words):
    with s3.open_output_stream("data/in.parquet") as out:
        pq.write_table(pa.Table.from_pandas(frame()), out)
    with s3.open_output_stream("data/broken.parquet") as out:
        out.write(b"this is not parquet")
    assert run(source, "-o", output, "--column", "text") == 2
    one_line_error(capsys, words)
    assert env.stats()["requests"] == 0


def test_an_http_input_through_fsspec(env, tmp_path):
    pytest.importorskip("aiohttp")
    frame().to_csv(tmp_path / "in.csv", index=False)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/in.csv"
        assert run(url, "-o", str(tmp_path / "out.parquet"), "--column", "text") == 0
    finally:
        server.shutdown()
    assert len(pd.read_parquet(tmp_path / "out.parquet")) == 12


def test_a_remote_output_keeps_its_journal_in_the_cache_folder(env, s3, tmp_path):
    frame().to_parquet(tmp_path / "in.parquet")
    assert run(str(tmp_path / "in.parquet"), "-o", "s3://data/o.jsonl", "--column", "text") == 0
    journals = list(Path(os.environ["XDG_CACHE_HOME"]).glob("batchsum/journals/o.jsonl.*.journal.sqlite"))
    assert len(journals) == 1
