"""A stop is a stop in every phase, and nothing paid for is lost: a journal whose writes start failing
mid-run, an input that breaks midway, a signal while rows are answered from the journal, a signal
after the output is complete. Real processes, real signals, real files; counted at the service."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchsum.data.journal import Journal
from batchsum.local import Faults, LocalService
from tests.support import KEY, article, summarize_argv, wait_for


@pytest.fixture
def service():
    with LocalService([KEY]) as running:
        yield running


def cli(source: Path, output: Path, *flags: str) -> list[str]:
    return summarize_argv(source, output, *flags, "--rpm", "0", "--quiet")


def environment(service: LocalService) -> dict[str, str]:
    return {**os.environ, "BATCHSUM_API_KEY": KEY, "BATCHSUM_BASE_URL": service.url}


def texts(n: int, seed: int = 0) -> list[str]:
    return [article(25, seed=seed + i) + f" Row {seed + i}." for i in range(n)]


def limit_file_size(limit: int):
    """In the child: files it writes may grow to ``limit`` bytes, and a write past that fails (EFBIG)
    instead of killing it: a journal whose writes start failing mid-run, as on a full quota."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.slow
def test_answers_the_journal_could_not_take_survive_to_the_rerun(service, tmp_path):
    rows = texts(200)
    pd.DataFrame({"n": range(200), "text": rows}).to_parquet(tmp_path / "in.parquet")
    out, journal = tmp_path / "out.parquet", tmp_path / "out.parquet.journal.sqlite"
    service.faults = Faults(latency=0.02)
    # The budget in this process only: the limit on file sizes is for the journal to meet.
    argv = cli(tmp_path / "in.parquet", out, "--concurrency", "8", "--budget", "none")
    first = subprocess.run(
        argv, env=environment(service), capture_output=True, text=True, timeout=120, preexec_fn=limit_file_size(200_000)
    )
    assert first.returncode == 1, first.stderr
    err = first.stderr.strip().splitlines()[-1]
    assert "cannot write the journal" in err and "which the next run imports first" in err
    side = journal.with_name(journal.name + ".unsaved.jsonl")
    assert f"kept in {side}" in err and side.exists()
    paid = service.stats()["answered_unique"]
    assert 0 < paid < 200 and service.stats()["answered_twice"] == 0

    # The fault lifted: the rerun imports the side file first and pays for no text twice.
    again = subprocess.run(argv, env=environment(service), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert service.stats()["answered_twice"] == 0 and service.stats()["answered_unique"] == 200
    assert not side.exists()
    assert (pd.read_parquet(out)["summary_status"] == "ok").all()


def corrupt_last_row_group(path: Path) -> None:
    """Overwrite the middle of the file's last row group's data with garbage (its footer stays good)."""
    meta = pq.ParquetFile(path).metadata
    column = meta.row_group(meta.num_row_groups - 1).column(meta.num_columns - 1)
    size = column.total_compressed_size
    with open(path, "r+b") as file:
        file.seek(column.data_page_offset + size // 4)
        file.write(bytes(range(256)) * (size // 512 + 1))


@pytest.mark.slow
def test_an_input_that_breaks_midway_keeps_the_answers_and_writes_the_rows_read(service, tmp_path):
    """10,000 rows (100 distinct texts) in five row groups; the last one corrupt. The run stops
    there: exit 1 (a stopped run, not a usage error), every row read written in order (answered ones
    with their summaries, the rest failed as not_sent), the answers kept; mended, the rerun pays for
    none of them again."""
    base = texts(100)
    table = pa.table({"n": list(range(10_000)), "text": [base[i % 100] for i in range(10_000)]})
    src = tmp_path / "in.parquet"
    pq.write_table(table, src, row_group_size=2000, compression="none", use_dictionary=False)
    corrupt_last_row_group(src)
    out = tmp_path / "out.csv"
    argv = cli(src, out)
    done = subprocess.run(argv, env=environment(service), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    err = done.stderr.strip().splitlines()[-1]
    assert "cannot be read as Parquet" in err and "a rerun pays for none of them again" in err
    written = pd.read_csv(out)
    # Every row read before the break (pages before the garbage may still be read), in order.
    assert 4096 <= len(written) < 10_000 and list(written["n"]) == list(range(len(written)))
    ok = written["summary_status"] == "ok"
    assert set(written["summary_status"]) <= {"ok", "failed"} and set(written.loc[~ok, "summary_error"]) <= {"not_sent"}
    assert f"holds the {len(written)} rows" in err
    paid = service.stats()["answered_unique"]
    assert 0 < paid <= 100 and f"{paid} new answers are kept" in err, err

    # Mended: the rerun pays only for what was not answered.
    pq.write_table(table, src, row_group_size=2000)
    again = subprocess.run(argv, env=environment(service), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert service.stats()["answered_twice"] == 0 and service.stats()["answered_unique"] == 100
    assert (pd.read_csv(out)["summary_status"] == "ok").all()


# The CLI in a process of its own whose input stops after its tenth batch until the test says go: the
# walk of rows answered by the journal is held there busy (a loop that never yields, as a walk of
# known rows is), so a signal sent then arrives while the walk is under way, however fast the walk
# and however late a busy machine lets the test run.
HELD_WALK = """
import os, sys
from batchsum.data import dataset_input
held, go = sys.argv[1], sys.argv[2]
batches = dataset_input.DatasetInput.batches
def gated(self, batch_rows=None):
    for number, batch in enumerate(batches(self, batch_rows)):
        if number == 10:
            open(held, "w").close()
            while not os.path.exists(go):
                pass
        yield batch
dataset_input.DatasetInput.batches = gated
import batchsum.cli
sys.argv = ["batchsum", *sys.argv[3:]]
sys.exit(batchsum.cli.main())
"""


@pytest.mark.slow
def test_a_signal_while_rows_come_from_the_journal_stops_at_once(service, tmp_path):
    """100,000 rows answered from the journal: a SIGTERM while they are walked is acted on promptly
    (the run stops before the end), and the partial output is not left behind. The walk is held busy
    after its tenth batch until the signal is sent (``HELD_WALK``): no race with its end."""
    base = texts(50)
    rows = [base[i % 50] for i in range(100_000)]
    pd.DataFrame({"text": rows}).to_parquet(tmp_path / "in.parquet")
    out = tmp_path / "out.parquet"
    argv = cli(tmp_path / "in.parquet", out)
    assert subprocess.run(argv, env=environment(service), capture_output=True, timeout=300).returncode == 0
    out.unlink()
    service.state.reset_stats()
    progress = tmp_path / "progress.txt"
    held, go = tmp_path / "held", tmp_path / "go"
    watched = [sys.executable, "-c", HELD_WALK, str(held), str(go), *argv[3:-1]]  # with the bar: no --quiet
    proc = subprocess.Popen(
        watched, env={**environment(service), "COLUMNS": "200"}, stderr=open(progress, "w"), text=True
    )
    wait_for(held.exists, what=lambda: f"the walk to be held: {progress.read_text()}", alive=proc)
    proc.send_signal(signal.SIGTERM)
    go.touch()  # the walk goes on only now: the signal came while it was under way
    proc.wait(timeout=120)
    err = progress.read_text()
    assert proc.returncode == 143, err
    assert "terminated (SIGTERM)" in err and "rows were done" in err
    assert "batchsum: batchsum:" not in err and "batchsum: SIGTERM: stopping" in err  # one prefix
    done = int(err.split("terminated (SIGTERM): ")[1].split(" rows")[0])
    assert done < 100_000  # acted on before the end
    assert not out.exists() and service.stats()["requests"] == 0


def test_a_signal_after_the_output_is_complete_keeps_it_and_exits_0(service, tmp_path):
    """SIGTERMs sent from the moment the finished output is in place until the process is gone
    (closing the journal, the budget, the client, the interpreter's own exit): each is noted, the
    finished output is kept, and the run ends as it would have."""
    pd.DataFrame({"text": texts(20)}).to_parquet(tmp_path / "in.parquet")
    out = tmp_path / "out.parquet"
    argv = cli(tmp_path / "in.parquet", out)
    proc = subprocess.Popen(argv, env=environment(service), stderr=subprocess.PIPE, text=True)
    wait_for(out.exists, what="the finished output", every=0.001, alive=proc)
    sent = 0
    while proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        sent += 1
        time.sleep(0.002)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (sent, err)
    assert "wrote" in err
    assert sent == 0 or "the output is already complete" in err
    assert (pd.read_parquet(out)["summary_status"] == "ok").all() and len(pd.read_parquet(out)) == 20


def test_the_journal_imports_a_side_file_left_by_an_earlier_run(tmp_path):
    from batchsum.data.results import Answer

    path = tmp_path / "j.sqlite"
    with Journal(path) as journal:
        where = journal.spill([("f1", Answer("one", "ok", None, None, 200, 1))])
    assert where == str(path.with_name("j.sqlite.unsaved.jsonl"))
    Path(where).write_text(Path(where).read_text() + '["f2", "two"')  # a line cut short by the fault
    with Journal(path) as journal:
        assert journal.get("f1") == Answer("one", "ok", None, None, 200, 1) and journal.get("f2") is None
    assert not Path(where).exists()


def test_a_run_stopped_before_its_store_opened_counts_no_new_answers():
    # A signal during the budget check stops the run before its journal is open: the CLI's
    # "interrupted: ... N new answers kept" line reads the count then, and must get 0, not a crash.
    from batchsum.options import RunSpec
    from batchsum.run import Run

    run = Run(RunSpec.from_kwargs(api_key=KEY, base_url="http://127.0.0.1:9", budget="none", progress=False))
    assert run.new_answers == 0


def test_the_loops_signal_handlers_are_replaced_without_passing_through_the_default():
    # A SIGTERM storm after the output is complete is only noted: when the run's loop ends, each
    # handler is replaced in one step, never through the default disposition (for SIGTERM: death),
    # however briefly. (The storm test above meets that moment only now and then.)
    import asyncio

    from batchsum.cli.signals import StopOnSignal

    real, dispositions = signal.signal, []
    before = {signum: signal.getsignal(signum) for signum in StopOnSignal.SIGNALS}

    def recording(signum, handler):
        dispositions.append((signum, handler))
        return real(signum, handler)

    async def a_finished_run(stop: StopOnSignal) -> None:
        current = asyncio.current_task()
        assert current is not None
        stop.arm(current)
        stop.finish()
        stop.disarm()

    try:
        signal.signal = recording
        with StopOnSignal(lambda line: None) as stop:
            asyncio.run(a_finished_run(stop))
    finally:
        signal.signal = real
        for signum, handler in before.items():
            real(signum, handler)
    assert dispositions and (signal.SIGTERM, signal.SIG_DFL) not in dispositions
