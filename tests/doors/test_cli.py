"""The command line: Parquet in, Parquet out, exit codes, one-line errors, nothing sent on bad input."""

import os
import pty
import subprocess
import sys
from pathlib import Path

import httpx
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import batchsum
from batchsum.cli import build_parser, main
from batchsum.data.journal import Journal
from batchsum.data.results import result_columns
from batchsum.local.summarizer import summarize as local_summary
from tests.support import EXPIRED_KEY, KEY, RESULT_COLUMNS, article, free_port, wait_for


def frame(n=30):
    texts = [article(20, seed=i) for i in range(n)]
    texts[3] = None
    texts[4] = "too short"
    texts[5] = texts[0]
    return pd.DataFrame({"id": [f"r{i}" for i in range(n)], "text": texts, "score": range(n)})


def write(df, path):
    df.to_parquet(path, index=False)
    return str(path)


def run(*argv):
    return main(["summarize", *argv, "--quiet"])


def test_a_file_is_summarized_into_every_column_plus_the_results(env, tmp_path, capsys):
    df = frame()
    src = write(df, tmp_path / "in.parquet")
    out = tmp_path / "out.parquet"
    assert run(src, "-o", str(out), "--column", "text", "--mode", "2", "--type", "best_line", "--rpm", "0") == 0
    result = pd.read_parquet(out)
    assert list(result.columns) == ["id", "text", "score", *RESULT_COLUMNS]
    assert list(result["id"]) == list(df["id"]) and list(result["score"]) == list(range(30))
    for text, summary, status in zip(df["text"], result["summary"], result["summary_status"]):
        if status == "ok":
            assert summary == local_summary(text, 2, 4, "best_line")
    assert result.loc[3, "summary_error"] == "empty" and result.loc[4, "summary_error"] == "too_short"
    assert env.stats()["requests"] == 27  # 30 rows - 2 skipped - 1 duplicate
    err = capsys.readouterr().err
    assert "30 rows: 28 ok, 2 skipped (empty 1, too_short 1), 0 failed; 27 sent, 1 reused" in err
    assert not list(tmp_path.glob(".*.partial"))
    for written in (out, tmp_path / "out.parquet.journal.sqlite"):
        assert KEY.encode() not in written.read_bytes()  # the key is in no file we write


def test_running_the_same_command_again_sends_nothing(env, tmp_path):
    src = write(frame(), tmp_path / "in.parquet")
    out = str(tmp_path / "out.parquet")
    assert run(src, "-o", out, "--column", "text", "--rpm", "0") == 0
    env.state.reset_stats()
    assert run(src, "-o", out, "--column", "text", "--rpm", "0") == 0
    assert env.stats()["requests"] == 0
    assert (tmp_path / "out.parquet.journal.sqlite").exists()


def test_folders_and_globs_are_read_in_order_in_record_batches(env, tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    df = frame(40)
    write(df.iloc[:25], folder / "a.parquet")
    write(df.iloc[25:], folder / "b.parquet")
    for args in ([str(folder)], [str(folder / "*.parquet")], [str(folder / "a.parquet"), str(folder / "b.parquet")]):
        out = tmp_path / "out.parquet"
        assert run(*args, "-o", str(out), "--column", "text", "--rpm", "0") == 0
        assert list(pd.read_parquet(out)["id"]) == list(df["id"])


def test_a_large_string_and_dictionary_column_work(env, tmp_path):
    texts = [article(15, seed=i) for i in range(5)]
    table = pa.table({"text": pa.array(texts, pa.large_string()), "cat": pa.array(texts).dictionary_encode()})
    pq.write_table(table, tmp_path / "in.parquet")
    for column in ("text", "cat"):
        assert (
            run(
                str(tmp_path / "in.parquet"),
                "-o",
                str(tmp_path / f"{column}.parquet"),
                "--column",
                column,
                "--rpm",
                "0",
            )
            == 0
        )


def test_dry_run_sends_nothing_and_says_what_would_happen(env, tmp_path, capsys):
    src = write(frame(), tmp_path / "in.parquet")
    assert run(src, "-o", str(tmp_path / "out.parquet"), "--column", "text", "--dry-run", "--rpm", "30") == 0
    out = capsys.readouterr().out
    assert "would send:       27 requests; at 30 requests/min that takes at least 0m52s" in out
    assert "would skip:       2 rows (empty 1, too_short 1)" in out
    assert env.stats()["requests"] == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]
    assert not list(Path(os.environ["XDG_CACHE_HOME"]).iterdir())  # nor the budget's file


def test_local_runs_without_a_key(tmp_path, capsys):
    src = write(frame(12), tmp_path / "in.parquet")
    assert run(src, "-o", str(tmp_path / "out.parquet"), "--column", "text", "--local") == 0
    assert "local reference service" in capsys.readouterr().err
    assert (pd.read_parquet(tmp_path / "out.parquet")["summary_status"] == "ok").sum() == 10


@pytest.mark.parametrize(
    "key, code, words",
    [
        ("wrong-key", "incorrect API key provided", "Check the key"),
        (EXPIRED_KEY, "you are not premium for this request", "Check your plan"),
    ],
)
def test_a_fatal_401_exits_1_after_one_request_and_says_to_fix_the_key_or_plan(
    env, tmp_path, capsys, monkeypatch, key, code, words
):
    monkeypatch.setenv("BATCHSUM_API_KEY", key)
    src = write(frame(), tmp_path / "in.parquet")
    assert run(src, "-o", str(tmp_path / "out.parquet"), "--column", "text", "--concurrency", "8") == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code in err and words in err and "run the command again" in err and "resume" not in err
    assert env.stats()["requests"] == 1 and not list(tmp_path.glob("*journal*"))  # nothing left to resume
    assert not (tmp_path / "out.parquet").exists() and not list(tmp_path.glob(".*.partial"))


def bad_inputs(tmp_path):
    good = write(frame(), tmp_path / "good.parquet")
    (tmp_path / "notes.parquet").write_text("this is not parquet")
    (tmp_path / "zero.parquet").write_bytes(b"")
    write(frame().iloc[:0], tmp_path / "norows.parquet")
    write(pd.DataFrame({"text": [1, 2]}), tmp_path / "ints.parquet")
    write(pd.DataFrame({"text": ["a"], "summary": ["b"]}), tmp_path / "clash.parquet")
    write(pd.DataFrame({"other": ["a b c d e f g h i j k"]}), tmp_path / "other.parquet")
    out = str(tmp_path / "out.parquet")
    return [
        ([good, "-o", out, "--column", "body"], "no column 'body'"),
        ([str(tmp_path / "ints.parquet"), "-o", out, "--column", "text"], "not text"),
        ([str(tmp_path / "notes.parquet"), "-o", out, "--column", "text"], "cannot be read as Parquet"),
        ([str(tmp_path / "zero.parquet"), "-o", out, "--column", "text"], "is empty (0 bytes)"),
        ([str(tmp_path / "missing.parquet"), "-o", out, "--column", "text"], "no such file"),
        ([str(tmp_path / "nothing*.parquet"), "-o", out, "--column", "text"], "no file matches"),
        ([good, "-o", str(tmp_path / "no" / "such" / "out.parquet"), "--column", "text"], "does not exist"),
        ([good, "-o", good, "--column", "text"], "is also an input"),
        ([str(tmp_path / "clash.parquet"), "-o", out, "--column", "text"], "--output-column"),
        ([good, str(tmp_path / "other.parquet"), "-o", out, "--column", "text"], "inputs must match"),
        ([good, "-o", out, "--column", "text", "--journal", str(tmp_path / "notes.parquet")], "not a batchsum journal"),
    ]


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_an_input_with_no_rows_writes_an_empty_output_with_the_result_columns(env, tmp_path, capsys, kind):
    """A nightly job's input is empty some nights: exit 0 and an output of no rows, its columns the
    input's and the results', so the steps after it read it as on any night."""
    source = tmp_path / f"norows.{kind}"
    empty = frame().iloc[:0]
    empty.to_parquet(source, index=False) if kind == "parquet" else empty.to_csv(source, index=False)
    out = tmp_path / f"out.{kind}"
    assert run(str(source), "-o", str(out), "--column", "text") == 0
    assert "wrote " in capsys.readouterr().err and env.stats()["requests"] == 0
    written = pd.read_parquet(out) if kind == "parquet" else pd.read_csv(out)
    assert len(written) == 0 and list(written.columns) == [*empty.columns, *result_columns()]


def test_every_bad_input_is_one_line_exit_2_and_nothing_sent(env, tmp_path, capsys):
    for argv, words in bad_inputs(tmp_path):
        assert run(*argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err and err.startswith("batchsum: error:"), err
    assert env.stats()["requests"] == 0
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize(
    "flag",
    [
        ["--mode", "3"],
        ["--percentage", "0"],
        ["--percentage", "7"],
        ["--type", "poem"],
        ["--rpm", "-1"],
        ["--concurrency", "0"],
        ["--timeout", "abc"],
        ["--max-retries", "-1"],
    ],
)
def test_invalid_parameters_are_usage_errors(env, tmp_path, capsys, flag):
    src = write(frame(), tmp_path / "in.parquet")
    assert run(src, "-o", str(tmp_path / "o.parquet"), "--column", "text", *flag) == 2
    err = capsys.readouterr().err
    assert "invalid" in err or "must be" in err or "is not a number" in err
    assert len(err.splitlines()) == 2 and err.splitlines()[1] == "batchsum: see 'batchsum summarize --help'"
    assert env.stats()["requests"] == 0


def test_no_key_is_a_usage_error_that_speaks_to_a_cli_user(svc, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BATCHSUM_BASE_URL", svc.url)
    src = write(frame(), tmp_path / "in.parquet")
    for argv in (["summarize", src, "-o", str(tmp_path / "o.parquet"), "--column", "text"], ["text", article(20)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "BATCHSUM_API_KEY" in err and "--local" in err, err
        assert "api_key" not in err
    assert svc.stats()["requests"] == 0


def test_version(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"batchsum {batchsum.__version__}"
    assert main(["--version"]) == 0


@pytest.mark.parametrize(
    "given, sent",
    [
        ("default", None),
        ("DEFAULT", None),
        ("Bullets", "bullets"),
        ("best_line", "best_line"),
        ("SUMMARY_2", "summary_2"),
    ],
)
def test_type_accepts_default_and_any_case(env, capsys, given, sent):
    text = article(40)
    assert main(["text", text, "--type", given]) == 0
    assert capsys.readouterr().out.strip() == local_summary(text, 1, 4, sent)


def test_an_unknown_type_is_one_line_naming_the_choices(capsys):
    assert main(["text", "a text", "--type", "haiku"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "invalid type 'haiku'" in err[0] and "default, summary_2, bullets, best_line" in err[0]
    assert err[1] == "batchsum: see 'batchsum text --help'"


def test_text_on_a_terminal_says_how_to_pass_one_instead_of_waiting(env):
    main_fd, terminal = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "batchsum.cli", "text"], stdin=terminal, capture_output=True, text=True, timeout=60
        )
    finally:
        os.close(main_fd)
        os.close(terminal)
    assert done.returncode == 2
    assert "no text given" in done.stderr and "batchsum text < article.txt" in done.stderr
    assert env.stats()["requests"] == 0


def test_text_explains_errors_as_summarize_does(env, capsys, monkeypatch):
    monkeypatch.setenv("BATCHSUM_API_KEY", EXPIRED_KEY)
    assert main(["text", article(20)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith('batchsum: error: the service answered 401 "') and "NotPremiumError" not in err
    port = free_port()
    monkeypatch.setenv("BATCHSUM_API_KEY", KEY)
    assert main(["text", article(20), "--base-url", f"http://127.0.0.1:{port}", "--max-retries", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert f"cannot reach the service at http://127.0.0.1:{port}" in err and "after 2 attempts" in err


def test_journal_command_shows_what_a_journal_holds(env, tmp_path, capsys):
    src = write(frame(), tmp_path / "in.parquet")
    out = tmp_path / "out.parquet"
    assert run(src, "-o", str(out), "--column", "text", "--rpm", "0") == 0
    capsys.readouterr()
    assert main(["journal", str(tmp_path / "out.parquet.journal.sqlite")]) == 0
    shown = capsys.readouterr().out
    assert "answers:    27 (ok 27)" in shown and f"output:     {out}" in shown and "safe to delete" in shown
    assert main(["journal", str(src)]) == 2
    assert "is not a batchsum journal" in capsys.readouterr().err


def test_every_flag_has_help(capsys):
    from batchsum.cli import build_parser

    parser = build_parser()
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            assert action.help, (name, action.dest)


def test_text_summarizes_an_argument_or_stdin(env, capsys, monkeypatch):
    text = article(40)
    assert main(["text", text, "--type", "bullets"]) == 0
    assert capsys.readouterr().out.startswith("- ")
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(text))
    assert main(["text", "--percentage", "1"]) == 0
    assert capsys.readouterr().out.strip() == local_summary(text, 1, 1, None)
    assert main(["text", "too short"]) == 2
    assert "at least 10" in capsys.readouterr().err


def test_journal_keeps_answers_across_opens_and_refuses_other_files(tmp_path):
    from batchsum.errors import InputError

    path = tmp_path / "j.sqlite"
    with Journal(path) as journal:
        journal.put("abc", ("summary", "ok", None, None, 200, 2))
    with Journal(path) as journal:
        assert journal.get("abc") == ("summary", "ok", None, None, 200, 2) and len(journal) == 1
        assert journal.get("nope") is None
    (tmp_path / "x.sqlite").write_text("garbage " * 100)
    with pytest.raises(InputError, match="not a batchsum journal"):
        Journal(tmp_path / "x.sqlite")
    with pytest.raises(InputError, match="does not exist"):
        Journal(tmp_path / "missing" / "j.sqlite")


def test_serve_starts_and_answers(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "batchsum.cli", "serve", "--port", str(port), "--key", "k1"]
        + ["--rpm", "5", "--limit-kind", "fixed", "--room-headers", "x-ratelimit"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert "batchsum local service on http://127.0.0.1:" in line and "5 requests/min per key, fixed" in line

        def answer() -> httpx.Response | None:
            try:
                return httpx.post(
                    f"http://127.0.0.1:{port}/api/user/summarize",
                    headers={"Authorization": "Bearer k1"},
                    json={"text": article(30), "mode": 1},
                )
            except httpx.ConnectError:
                return None

        response = wait_for(answer, what="the service to answer", every=0.05, alive=proc)
        assert response.status_code == 200 and response.json()["result"]
        assert response.headers["X-RateLimit-Limit"] == "5" and response.headers["X-RateLimit-Remaining"] == "4"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("command", [["store"], ["limits"], ["summarize", "--help"]])
def test_a_reader_that_stops_early_ends_the_listing_quietly(command, tmp_path):
    """``batchsum limits | head -1``: standard output a pipe whose reader is gone (closed before the
    command starts, so every write finds it gone): exit 0, no traceback."""
    read, write = os.pipe()
    os.close(read)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "XDG_CACHE_HOME": str(tmp_path)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "batchsum", *command], stdout=write, stderr=subprocess.PIPE, env=env, timeout=120
        )
    finally:
        os.close(write)
    assert done.returncode == 0 and b"Traceback" not in done.stderr and b"BrokenPipe" not in done.stderr, done.stderr
