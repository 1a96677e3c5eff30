"""One run at a time per file, whatever the file is called: a journal or an output reached through
a symlink, ``dir/../name`` or a hard link meets the lock of a run that names it directly. Real
``batchsum summarize`` processes against the local service; what was paid is counted there.

The first run is held mid-way by the service's latency (raised once it has started, lowered once
the second run has been refused and the third is waiting), so the runs overlap whatever the load."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from batchsum.data.journal import Journal, RunLock
from batchsum.errors import InputError
from batchsum.local import Faults
from tests.support import KEY, article, stderr_until, summarize_argv, wait_for

ROWS = 24


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "in.parquet"
    pd.DataFrame({"n": range(ROWS), "text": [article(15, seed=i) + f" Row {i}." for i in range(ROWS)]}).to_parquet(path)
    return path


def command(source, output, *extra):
    return summarize_argv(source, output, "--rpm", "0", "--concurrency", "2", "--quiet", *extra)


def overlap(service, first_argv, second_argv, *, then_wait=True):
    """Run ``first_argv``; while it is held mid-way, ``second_argv`` is refused naming it, then
    (``then_wait``) waits with ``--wait`` and finishes after it, each text paid for once. Returns
    the waiting run's stderr."""
    environ = {**os.environ, "BATCHSUM_API_KEY": KEY, "BATCHSUM_BASE_URL": service.url}
    service.faults = Faults(hold_after=1)  # every request after the first held until released below
    first = subprocess.Popen(first_argv, env=environ, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: service.stats()["requests"] >= 1, what="its first request", alive=first)  # its locks held
        refused = subprocess.run(second_argv, env=environ, capture_output=True, text=True, timeout=60)
        assert first.poll() is None, "the first run ended before the second was tried"
        assert refused.returncode == 2, refused.stderr
        assert f"in use by another batchsum run (pid {first.pid} on " in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        if not then_wait:
            service.faults = Faults()
            assert first.wait(60) == 0, first.communicate()
            return refused.stderr
        waiting = subprocess.Popen(second_argv + ["--wait"], env=environ, stderr=subprocess.PIPE, text=True)
        said = stderr_until(waiting, "waiting for the other run")
        assert "waiting for the other run" in said[0], said  # the first thing it says
        service.faults = Faults()
        assert first.wait(60) == 0, first.communicate()
        rest = "".join(said) + waiting.communicate(timeout=120)[1]
        assert waiting.returncode == 0, rest
    finally:
        service.faults = Faults()
        first.kill()
        first.wait()
    stats = service.stats()
    assert stats["answered_unique"] == ROWS and stats["answered_twice"] == 0, stats
    return rest


@pytest.mark.slow
@pytest.mark.parametrize("spelling", ["symlink", "dotdot", "hardlink"])
def test_a_journal_under_another_name_is_locked_against_a_run_naming_it(svc, tmp_path, source, spelling):
    (tmp_path / "real" / "inner").mkdir(parents=True)
    journal = tmp_path / "real" / "run.journal.sqlite"
    if spelling == "symlink":
        other = tmp_path / "link.sqlite"
        other.symlink_to(journal)  # dangling until the first run creates the journal
    elif spelling == "dotdot":
        # Through a symlinked folder, ".." is the parent of where the link points, as the system
        # resolves it: alias/../NAME is real/NAME, not NAME beside alias.
        (tmp_path / "alias").symlink_to(tmp_path / "real" / "inner", target_is_directory=True)
        other = tmp_path / "alias" / ".." / journal.name
    else:
        Journal(journal).close()  # a hard link needs a file to link to
        other = tmp_path / "hard.sqlite"
        os.link(journal, other)
    first = command(source, tmp_path / "a.parquet", "--journal", journal)
    second = command(source, tmp_path / "b.parquet", "--journal", other)
    rest = overlap(svc, first, second)
    assert f"{ROWS} reused" in rest
    assert pd.read_parquet(tmp_path / "b.parquet")["summary_status"].eq("ok").all()


@pytest.mark.slow
def test_an_output_through_a_symlink_is_locked_and_shares_its_journal(svc, tmp_path, source):
    output = tmp_path / "out.parquet"
    link = tmp_path / "link.parquet"
    link.symlink_to(output)
    rest = overlap(svc, command(source, output), command(source, link))
    assert f"{ROWS} reused" in rest  # the default journal is the resolved output's
    assert not (tmp_path / "link.parquet.journal.sqlite").exists()


@pytest.mark.slow
def test_an_output_through_a_symlink_is_locked_whatever_the_journals(svc, tmp_path, source):
    output = tmp_path / "out.parquet"
    link = tmp_path / "link.parquet"
    link.symlink_to(output)
    first = command(source, output, "--journal", tmp_path / "a.sqlite")
    second = command(source, link, "--journal", tmp_path / "b.sqlite")
    refusal = overlap(svc, first, second, then_wait=False)
    assert f"the output {link} is in use" in refusal
    assert not (tmp_path / "b.sqlite").exists()  # refused before its journal was made


def test_a_run_that_creates_its_journal_locks_the_new_file_for_its_hard_links(tmp_path):
    journal = tmp_path / "new.sqlite"
    with RunLock(journal, "journal"):
        Journal(journal).close()  # created under the lock: its inode is now held too
        os.link(journal, tmp_path / "hard.sqlite")
        probe = (
            "import sys; from batchsum.data.journal import RunLock\n"
            "try:\n    RunLock(sys.argv[1], 'journal')\nexcept Exception as exc:\n    print(exc)"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe, str(tmp_path / "hard.sqlite")], capture_output=True, text=True, timeout=60
        )
        assert f"in use by another batchsum run (pid {os.getpid()} on " in done.stdout, done
    assert not (tmp_path / ".new.sqlite.lock").exists()
    with RunLock(tmp_path / "hard.sqlite", "journal"):  # free again once released
        pass


def test_one_file_as_output_and_journal_under_two_names_is_refused_by_name(tmp_path):
    output = tmp_path / "out.parquet"
    output.write_bytes(b"")
    os.link(output, tmp_path / "hard.sqlite")
    (tmp_path / "link.sqlite").symlink_to(output)
    with RunLock(output, "output"):
        for name in ("hard.sqlite", "link.sqlite"):
            with pytest.raises(InputError, match=f"the journal {tmp_path / name} is the output {output} under"):
                RunLock(tmp_path / name, "journal")
    with RunLock(tmp_path / "link.sqlite", "journal"):
        pass


def test_the_lock_file_is_beside_the_real_file_and_removed_when_done(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)
    with RunLock(tmp_path / "alias" / "j.sqlite", "journal") as lock:
        assert lock.real == tmp_path / "real" / "j.sqlite"
        assert (tmp_path / "real" / ".j.sqlite.lock").exists()
    assert not (tmp_path / "real" / ".j.sqlite.lock").exists()
