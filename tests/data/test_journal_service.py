"""A journal knows its service: an answer is reused only for the same service and the same request;
one journal may hold several services' answers; a journal written before answers carried their
service is adopted by the first service that resumes it (said once), so nothing is paid again."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pandas as pd

from batchsum.cli import main
from batchsum.data.journal import Journal
from batchsum.data.results import Answer
from batchsum.service.contract import LOCAL_SERVICE, service_identity
from tests.support import KEY, article, refuse_the_final_rename

FIXTURES = Path(__file__).parents[1] / "fixtures"


def source(tmp_path: Path, n: int = 6) -> Path:
    path = tmp_path / "in.parquet"
    pd.DataFrame({"text": [article(40, seed=i) for i in range(n)]}).to_parquet(path)
    return path


def summarize(*argv: str) -> int:
    return main(["summarize", *argv, "--column", "text", "--quiet", "--rpm", "0"])


def test_answers_of_the_local_service_are_not_reused_for_another_service(svc, tmp_path, monkeypatch):
    src, out = source(tmp_path), tmp_path / "out.parquet"
    assert summarize(str(src), "-o", str(out), "--local") == 0
    monkeypatch.setenv("BATCHSUM_API_KEY", KEY)
    monkeypatch.setenv("BATCHSUM_BASE_URL", svc.url)
    assert summarize(str(src), "-o", str(out)) == 0
    assert svc.stats()["by_status"].get("200", 0) == 6  # every text sent to this service, none reused
    assert summarize(str(src), "-o", str(out)) == 0
    assert svc.stats()["by_status"].get("200", 0) == 6  # the same service again: all reused
    journal = next(tmp_path.glob("*.journal*"))
    services = {row[0] for row in sqlite3.connect(journal).execute("SELECT service FROM answers")}
    assert services == {LOCAL_SERVICE, service_identity(svc.url)}  # one journal, two services' answers


def test_a_journal_names_services_without_credentials_or_query(tmp_path):
    with Journal(tmp_path / "j.sqlite") as journal:
        journal.serve(service_identity("https://user:secret@api.example.test:443/v1/?token=abc"))
        journal.put("f" * 64, Answer("A summary.", "ok", None, None, 200, 1))
    text = (tmp_path / "j.sqlite").read_bytes()
    assert b"secret" not in text and b"token" not in text and b"https://api.example.test/v1" in text


def test_a_journal_from_before_services_is_adopted_once_and_pays_nothing_again(svc, tmp_path, monkeypatch, capsys):
    """The fixture was written by the code of commit 0b11be0 (no service per answer)."""
    journal = tmp_path / "old.sqlite"
    shutil.copy(FIXTURES / "journal-0b11be0.sqlite", journal)
    texts = json.loads((FIXTURES / "journal-0b11be0.texts.json").read_text(encoding="utf-8"))
    src, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pd.DataFrame({"text": texts}).to_parquet(src)
    monkeypatch.setenv("BATCHSUM_API_KEY", KEY)
    monkeypatch.setenv("BATCHSUM_BASE_URL", svc.url)
    args = [str(src), "-o", str(out), "--journal", str(journal)]
    assert main(["summarize", *args, "--column", "text", "--rpm", "0", "--quiet"]) in (0, 1)
    assert svc.stats()["answered_unique"] == 0  # every answer reused
    said = capsys.readouterr().err
    assert "written before answers carried their service" in said and service_identity(svc.url) in said
    meta = dict(sqlite3.connect(journal).execute("SELECT name, value FROM meta").fetchall())
    assert meta["adopted_by"] == service_identity(svc.url)
    assert main(["summarize", *args, "--column", "text", "--rpm", "0", "--quiet"]) in (0, 1)
    assert "carried their service" not in capsys.readouterr().err  # said once


def test_the_dry_run_counts_an_unadopted_journals_answers_and_leaves_it_as_it_was(svc, tmp_path, monkeypatch, capsys):
    journal = tmp_path / "old.sqlite"
    shutil.copy(FIXTURES / "journal-0b11be0.sqlite", journal)
    before = journal.read_bytes()
    texts = json.loads((FIXTURES / "journal-0b11be0.texts.json").read_text(encoding="utf-8"))
    src = tmp_path / "in.parquet"
    pd.DataFrame({"text": texts}).to_parquet(src)
    monkeypatch.setenv("BATCHSUM_API_KEY", KEY)
    monkeypatch.setenv("BATCHSUM_BASE_URL", svc.url)
    argv = [str(src), "-o", str(tmp_path / "out.parquet"), "--journal", str(journal), "--dry-run"]
    assert summarize(*argv) == 0
    assert re.search(r"would send:\s+0 requests", capsys.readouterr().out)
    assert journal.read_bytes() == before


def test_a_refused_key_leaves_no_journal_and_does_not_advise_resuming(svc, tmp_path, monkeypatch, capsys):
    src, out = source(tmp_path), tmp_path / "out.parquet"
    monkeypatch.setenv("BATCHSUM_API_KEY", "wrong-key-0123456789abcdef")
    monkeypatch.setenv("BATCHSUM_BASE_URL", svc.url)
    assert summarize(str(src), "-o", str(out)) == 1
    said = capsys.readouterr().err
    assert "resume" not in said and "nothing was kept" in said
    assert not list(tmp_path.glob("*journal*")) and not out.exists()


def test_messages_say_what_is_true(svc, tmp_path, monkeypatch, capsys):
    import subprocess
    import sys

    src, out = source(tmp_path, 10), tmp_path / "out.parquet"
    assert summarize(str(src), "-o", str(out), "--local", "--sample", "3") == 0
    said = capsys.readouterr().err
    assert "7 rows were not sent" in said and "without --sample" in said and "transient" not in said
    not_a_journal = tmp_path / "notes.sqlite"
    not_a_journal.write_text("hello")
    assert main(["journal", str(not_a_journal)]) == 2
    assert "--journal" not in capsys.readouterr().err.replace("with --journal", "")
    ran = subprocess.run([sys.executable, "-m", "batchsum", "text", "--help"], capture_output=True, text=True)
    assert ran.returncode == 0 and "standard input" in ran.stdout and "usage: batchsum text" in ran.stdout


def test_a_folder_that_refuses_the_output_ends_in_one_line_naming_it(tmp_path, monkeypatch, capsys):
    """The final rename refused (the folder made read-only at the end): one line naming the output,
    no traceback; the journal keeps every answer, so the rerun pays nothing."""
    refuse_the_final_rename(monkeypatch)
    src, out = source(tmp_path), tmp_path / "out.parquet"
    assert summarize(str(src), "-o", str(out), "--local") != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "cannot write" in err and str(out) in err and "Permission denied" in err
    monkeypatch.undo()
    assert summarize(str(src), "-o", str(out), "--local") == 0
    assert "0 sent, 6 reused" in capsys.readouterr().err


def test_after_a_resume_the_eta_counts_only_the_rows_sent():
    """900 of 1000 rows came from the journal at once, 50 were sent in the last 50 s: the ETA is the
    50 left at one a second, not the journal's speed."""
    import io
    import types

    from batchsum.run.progress import ProgressBar

    stats = types.SimpleNamespace(
        work_total=1000, work_done=950, total=1000, done=950, reused=900, from_store=0, ok=950, skipped=0, failed=0,
        rate_limited=0, waiting=None, pacer_state=lambda: None,
    )  # fmt: skip
    bar = ProgressBar(1000, file=io.StringIO())
    bar._bar.start_t -= 50  # the run began 50 s ago
    bar(stats)
    line = bar._bar.format_meter(**bar._bar.format_dict)
    assert "<00:5" in line or "<00:4" in line, line  # about 50 s left (not a fraction of a second)
    bar.close()


def test_two_workers_adopting_one_old_journal_at_once_both_open_it(tmp_path):
    """The workers of a Dask or Spark job open one shared journal together: both adopt it, one stamps."""
    import threading

    from batchsum.data.journal import SharedJournal

    journal = tmp_path / "old.sqlite"
    shutil.copy(FIXTURES / "journal-0b11be0.sqlite", journal)
    opened = [SharedJournal(journal), SharedJournal(journal)]
    errors: list[BaseException] = []

    def adopt(store):
        try:
            store.serve("https://api.example.test")
        except BaseException as exc:  # noqa: BLE001 - any failure is the test's
            errors.append(exc)

    threads = [threading.Thread(target=adopt, args=(store,)) for store in opened]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    services = {row[0] for row in sqlite3.connect(journal).execute("SELECT service FROM answers")}
    assert services == {"https://api.example.test"}
    for store in opened:
        store.close()
