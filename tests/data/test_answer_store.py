"""The answer store every job shares: kept by service and request fingerprint, summaries only, a file
of the user's own (0600) that many processes open at once, pruned by age and size in small steps,
the per-key stores of earlier versions taken in when it first opens; on Redis the same by service."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from batchsum.data import store_upkeep
from batchsum.data.journal import Journal, SharedJournal
from batchsum.data.machine_store import MachineStore, default_store_path
from batchsum.data.redis_store import PREFIX, RedisStore, RedisUpkeep
from batchsum.data.results import FAILED, OK, Answer
from batchsum.data.scopes import Scopes, Trust, look_at_store, open_store
from batchsum.data.store_upkeep import MachineUpkeep
from batchsum.data.stores import MemoryStore, StoreError
from tests.support import wait_for

ROOT = Path(__file__).parents[2]
SUMMARY = Answer("a summary", OK, None, None, 200, 1)
REFUSAL = Answer(None, FAILED, "unprocessable", "the text was refused", 422, 1)
SERVICE = "https://api.example.com"
MODE_1 = Trust(1)  # a run in mode 1: every answer of the store served


def test_the_machine_store_is_a_file_of_the_users_own_in_the_cache_folder(tmp_path):
    store = open_store("machine", SERVICE)
    try:
        assert store.path == default_store_path() == Path(os.environ["XDG_CACHE_HOME"]) / "batchsum" / "answers.sqlite"
        store.put("k", SUMMARY)
        for path in store.path.parent.glob("answers.sqlite*"):
            assert path.stat().st_mode & 0o777 == 0o600, path  # the WAL and its index too
    finally:
        store.close()
    loose = tmp_path / "loose.sqlite"  # made by someone else before, readable by others
    loose.touch(mode=0o644)
    loose.chmod(0o644)
    MachineStore(loose, SERVICE).close()
    assert loose.stat().st_mode & 0o777 == 0o600


def test_answers_are_kept_by_service_and_fingerprint_and_only_summaries(tmp_path):
    path = tmp_path / "store.sqlite"
    one, other = MachineStore(path, SERVICE), MachineStore(path, "https://other.example.com")
    one.put("k", SUMMARY)
    one.put("refused", REFUSAL)  # a refusal stays with its output: never shared
    assert one.get_many(["k", "refused"]) == {"k": SUMMARY}
    assert other.get("k") is None  # another service's answer to the same request is not this one's
    one.put("k", SUMMARY._replace(summary="a newer summary"))  # refresh: the new answer replaces it
    assert MachineStore(path, SERVICE).get("k").summary == "a newer summary"


def test_a_jobs_refusals_are_kept_for_that_job_alone_and_for_a_day(tmp_path):
    path = tmp_path / "store.sqlite"
    job, other_job, no_job = (MachineStore(path, SERVICE, job=j) for j in ("job-1", "job-2", None))
    job.put("refused", REFUSAL)
    job.put("k", SUMMARY)
    assert job.get_many(["refused", "k"]) == {"refused": REFUSAL, "k": SUMMARY}
    assert other_job.get_many(["refused", "k"]) == no_job.get_many(["refused", "k"]) == {"k": SUMMARY}
    assert MachineStore(path, "https://other.example.com", job="job-1").get("refused") is None
    db = sqlite3.connect(path)
    db.execute("UPDATE refusals SET written = written - 86401")  # a day later: asked again
    db.commit()
    assert job.get("refused") is None
    assert [name for (name,) in db.execute("SELECT fingerprint FROM refusals")] == ["refused"]
    MachineUpkeep(path).prune()
    assert db.execute("SELECT COUNT(*) FROM refusals").fetchone()[0] == 0  # pruned with the old answers
    db.close()


def test_a_store_of_an_earlier_version_gets_the_refusals_table_when_first_opened(tmp_path):
    path = tmp_path / "store.sqlite"
    MachineStore(path, SERVICE).close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE refusals")  # as this round's first stores were made
    db.commit()
    db.close()
    store = MachineStore(path, SERVICE, job="job")
    store.put("refused", REFUSAL)
    assert store.get("refused") == REFUSAL


def test_a_file_that_is_not_a_store_is_refused_and_left_as_it_was(tmp_path):
    other = tmp_path / "other.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE mine (x)")
    db.commit()
    db.close()
    before = other.read_bytes()
    with pytest.raises(StoreError, match="not a batchsum answer store"):
        MachineStore(other, SERVICE)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError):
        MachineStore(garbage, SERVICE)
    assert other.read_bytes() == before and garbage.read_bytes() == b"not a database at all" * 100


@pytest.mark.slow
def test_many_processes_opening_a_new_store_at_once_all_open_it(tmp_path):
    path = tmp_path / "store.sqlite"
    code = textwrap.dedent(
        f"""
        import sys
        from batchsum.data.machine_store import MachineStore
        store = MachineStore({str(path)!r}, "s")
        store.put(sys.argv[1], __import__("batchsum.data.results", fromlist=["Answer"]).Answer("x", "ok", None, None, 200, 1))
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes = [
        subprocess.Popen([sys.executable, "-c", code, f"k{i}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        for i in range(8)
    ]
    outcomes = [p.communicate(timeout=60) for p in processes]
    assert [p.returncode for p in processes] == [0] * 8, [err.decode()[-500:] for _, err in outcomes]
    assert len(MachineStore(path, "s")) == 8


def test_a_store_that_cannot_be_opened_says_why_in_one_error(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):  # root writes anywhere: a path under a file fails for everyone
            target = tmp_path / "a-file"
            target.write_text("")
            where = f"sqlite://{target}/answers.sqlite"
        else:
            where = f"sqlite://{folder}/answers.sqlite"
        with pytest.raises(StoreError, match="cannot be opened"):
            open_store(where, SERVICE)
    finally:
        folder.chmod(0o700)


def test_a_store_whose_named_folder_is_missing_makes_no_folders(tmp_path):
    """A mistyped ``--store sqlite:///PATH``: one error naming the folder, and no folder made."""
    with pytest.raises(StoreError, match="its folder .*typo.* does not exist"):
        open_store(f"sqlite://{tmp_path}/typo/deeper/answers.sqlite", SERVICE)
    assert not (tmp_path / "typo").exists()


def test_a_damaged_store_says_in_its_one_error_how_to_start_a_new_one(tmp_path):
    path = tmp_path / "answers.sqlite"
    MachineStore(path, SERVICE).close()
    data = bytearray(path.read_bytes())
    data[100:300] = b"\xff" * 200  # page 1's tree of tables: nothing in the file can be found
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="malformed; move the file aside and the next run starts a new store"):
        open_store(f"sqlite://{path}", SERVICE)


def _aged(path: Path, service: str, count: int, written: float, size: int = 50) -> None:
    db = sqlite3.connect(path)
    db.executemany(
        "INSERT INTO answers (service, fingerprint, summary, attempts, written) VALUES (?, ?, ?, 1, ?)",
        [(service, f"{service}-{written}-{i}", "x" * size, written) for i in range(count)],
    )
    db.commit()
    db.close()


def test_the_retention_prunes_old_answers_in_small_transactions(tmp_path, monkeypatch):
    path = tmp_path / "store.sqlite"
    MachineStore(path, SERVICE).close()
    now = time.time()
    _aged(path, SERVICE, 1200, now - 91 * 86400)  # past the 90 days
    _aged(path, SERVICE, 30, now - 10 * 86400)
    statements: list[str] = []
    upkeep = MachineUpkeep(path)
    upkeep._db.set_trace_callback(statements.append)
    assert upkeep.prune(now) == 1200
    deletes = [s for s in statements if s.startswith("DELETE FROM answers")]
    assert len(deletes) == 3 and all(f"LIMIT {store_upkeep.PRUNE_ROWS}" in s for s in deletes)  # 500 at a time
    assert not any("BEGIN" in s for s in statements)  # each its own short transaction (autocommit)
    assert len(MachineStore(path, SERVICE)) == 30
    upkeep.configure(retention_days=5)  # set for every process using the store
    assert MachineUpkeep(path).prune(now) == 30


def test_the_size_cap_removes_the_oldest_first_and_gives_the_space_back(tmp_path):
    path = tmp_path / "store.sqlite"
    MachineStore(path, SERVICE).close()
    now = time.time()
    _aged(path, SERVICE, 2000, now - 3 * 86400, size=2000)  # about 4 MB, the oldest
    _aged(path, SERVICE, 200, now - 86400, size=2000)
    upkeep = MachineUpkeep(path)
    assert upkeep.size() > 4_000_000
    upkeep.configure(max_bytes=2 << 20)
    gone = upkeep.prune(now)
    assert upkeep.size() <= 2 << 20 and gone >= 1000
    young = sqlite3.connect(path).execute("SELECT COUNT(*) FROM answers WHERE written > ?", (now - 2 * 86400,))
    assert young.fetchone()[0] == 200  # the oldest went first
    assert os.path.getsize(path) < 4_000_000  # pages back to the disk (incremental vacuum)


def test_pruning_is_due_once_an_hour_whoever_opens_the_store(tmp_path):
    path = tmp_path / "store.sqlite"
    MachineStore(path, SERVICE).close()
    upkeep = MachineUpkeep(path)
    now = 1_000_000_000.0
    assert upkeep.due(now)
    assert not MachineUpkeep(path).due(now + 60)  # another process, a minute later
    assert MachineUpkeep(path).due(now + store_upkeep.PRUNE_EVERY + 1)
    assert MachineUpkeep(path).due(now - 2 * store_upkeep.PRUNE_EVERY)  # the clock stepped back: due


def test_pruning_never_holds_a_writer_up_for_long(tmp_path):
    """A run writes while the store prunes 20,000 old answers: each of its writes waits at most for
    one small transaction."""
    path = tmp_path / "store.sqlite"
    MachineStore(path, SERVICE).close()
    _aged(path, SERVICE, 20_000, time.time() - 100 * 86400)
    import threading

    upkeep = MachineUpkeep(path)
    pruner = threading.Thread(target=upkeep.prune)
    writer = MachineStore(path, SERVICE)
    writes = 0
    pruner.start()
    while pruner.is_alive():
        writer.put(f"new-{writes}", SUMMARY)
        writes += 1
    pruner.join()
    assert writes > 1 and len(writer) == writes  # it kept writing the whole time, nothing lost


def _old_store(folder: Path, name: str, rows: list[tuple[str, Answer]], service: str | None) -> Path:
    path = folder / name
    with SharedJournal(path) as journal:
        if service is not None:
            journal.serve(service)
        for key, answer in rows:
            journal.put(key, answer)
    return path


def test_the_old_per_key_stores_are_taken_in_the_first_time_the_store_opens(tmp_path, caplog):
    folder = default_store_path().parent
    folder.mkdir(parents=True)
    _old_store(folder, "answers-0123456789abcdef.sqlite", [("a", SUMMARY), ("b", REFUSAL)], SERVICE)
    _old_store(folder, "answers-fedcba9876543210.sqlite", [("c", SUMMARY)], "batchsum-local")
    (folder / "answers-ffffffffffffffff.sqlite").write_text("not a journal")  # left alone
    with caplog.at_level(logging.INFO, logger="batchsum"):
        store = open_store("machine", SERVICE)
    try:
        assert store.get_many(["a", "b", "c"]) == {"a": SUMMARY}  # a summary of this service; no refusal
        assert MachineStore(store.path, "batchsum-local").get("c") == SUMMARY
        assert any("2 answers of earlier versions' stores" in r.getMessage() for r in caplog.records)
        assert store_upkeep.take_in_old(store.connection, store.path) == 0  # once
    finally:
        store.close()


def test_the_cluster_store_keeps_answers_by_service_and_takes_in_a_keys_old_answers(redis_url):
    import redis

    raw = redis.Redis.from_url(redis_url)
    service = f"https://cluster-{os.urandom(4).hex()}.example"
    identity = os.urandom(8).hex()
    a, b = "a" * 64, "b" * 64  # fingerprints (SHA-256, hex)
    old = f"batchsum:answers:{{{identity}}}:"
    raw.set(old + a, json.dumps(list(SUMMARY)))
    raw.set(old + b, json.dumps(list(REFUSAL)))
    raw.set(old + "claim:" + a, "someone")
    store = open_store(redis_url, service, identity)
    try:
        assert store.get_many([a, b]) == {a: SUMMARY}
        assert raw.exists(f"{PREFIX}imported:{identity}")
        assert 0 < raw.ttl(f"{PREFIX}{{{service}}}:{a}") <= 90 * 86400
        store.put("c" * 64, REFUSAL)
        assert store.get("c" * 64) is None
        assert RedisStore(redis_url, "https://another.example").get(a) is None
        job = RedisStore(redis_url, service, job="job-1")  # a job whose only scope the store is
        job.put("c" * 64, REFUSAL)
        assert job.get("c" * 64) == REFUSAL and 0 < raw.ttl(job._refusal("c" * 64)) <= 86400
        assert store.get("c" * 64) is None and RedisStore(redis_url, service, job="job-2").get("c" * 64) is None
        upkeep = RedisUpkeep(redis_url)
        assert (service, pytest.approx(time.time(), abs=60)) in upkeep.inventory()
        assert upkeep.remove(service=service) == 1 and store.get(a) is None
    finally:
        store.close()
        raw.close()


def test_scopes_copy_the_stores_answers_into_the_journal_and_keep_refusals_out_of_the_store(tmp_path):
    journal = Journal(tmp_path / "j.sqlite")
    journal.serve(SERVICE)
    store = MachineStore(tmp_path / "store.sqlite", SERVICE)
    store.put("known", SUMMARY)
    scopes = Scopes(journal, store, trust=MODE_1)
    assert scopes.lookup(["known", "new"]) == ({"known": SUMMARY}, {"known"})
    assert journal.get("known") == SUMMARY  # the journal holds every answer of its output
    scopes.put("refused", REFUSAL)
    assert journal.get("refused") == REFUSAL and store.get("refused") is None
    assert scopes.lookup(["known"]) == ({"known": SUMMARY}, set())  # now the journal's own
    assert Scopes(journal, store, refresh=True, trust=MODE_1).lookup(["known"]) == ({}, set())


def test_memory_keeps_only_what_no_store_on_disk_keeps(tmp_path):
    memory = MemoryStore()
    store = MachineStore(tmp_path / "store.sqlite", SERVICE)
    scopes = Scopes(memory, store, keeps_all=False, trust=MODE_1)
    scopes.put("ok", SUMMARY)
    scopes.put("refused", REFUSAL)
    assert memory.items() == [("refused", REFUSAL)] and store.get("ok") == SUMMARY
    assert scopes.get("ok") == SUMMARY and scopes.get("refused") == REFUSAL


def test_a_store_that_fails_mid_run_is_said_once_left_and_used_again_once_it_answers(tmp_path, caplog, monkeypatch):
    """A store whose writes fail (a full disk): said once, left (no claims: the run sends; its answers
    in memory), tried again with a backoff; once it answers it is used again and takes the answers
    kept meanwhile."""
    import asyncio

    from batchsum.data import store_link
    from batchsum.data.scopes import AsyncScopes

    monkeypatch.setattr(store_link, "RETRY_FIRST", 0.05)
    memory = MemoryStore()
    store = MachineStore(tmp_path / "store.sqlite", SERVICE)
    full = {"disk": True}
    real_put, real_ping = store.put_many, store.ping

    def put_many(answers):
        if full["disk"]:
            raise StoreError("database or disk is full")
        real_put(answers)

    def ping():
        if full["disk"]:
            raise StoreError("database or disk is full")
        real_ping()

    store.put_many, store.ping = put_many, ping

    async def main():
        scopes = AsyncScopes(Scopes(memory, store, keeps_all=False, trust=MODE_1))
        scopes.put("ok", SUMMARY)
        await asyncio.to_thread(wait_for, lambda: not scopes.link.attached, 60, "the store left")  # the loop runs on
        assert memory.get("ok") == SUMMARY  # what the store did not take, kept in memory
        assert await scopes.take("k") is True  # no claims while it is out: the run sends
        assert (await scopes.lookup(["ok"]))[0] == {"ok": SUMMARY}
        scopes.put("other", SUMMARY)
        assert memory.get("other") == SUMMARY
        full["disk"] = False
        await asyncio.to_thread(wait_for, lambda: scopes.link.attached, 60, "the store used again")
        assert store.get("ok") == SUMMARY  # the answers kept meanwhile, put when it answered again
        assert await scopes.take("k") is True and await scopes.take("k2") is True
        await scopes.aclose()

    with caplog.at_level(logging.WARNING, logger="batchsum"):
        asyncio.run(main())
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "failed" in m]) == 1 and "goes on with its own answers alone" in said[0]
    assert len([m for m in said if "uses it again" in m]) == 1


def test_a_dry_run_looks_at_the_store_without_making_or_writing_it(tmp_path):
    assert look_at_store("machine", SERVICE) is None and not default_store_path().exists()
    open_store("machine", SERVICE).close()
    looking = look_at_store("machine", SERVICE)
    with pytest.raises(StoreError):
        looking.put("k", SUMMARY)
    looking.close()


def _connections_to(path: Path) -> int:
    """This process's open files on the store ``path`` (its connections')."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path))


def test_opening_the_store_takes_one_connection_and_sets_up_only_a_new_file(monkeypatch):
    import threading

    from batchsum.data import store_file

    open_store("machine", SERVICE).close()  # made, set up, and pruned (due the first time) on a thread
    for thread in threading.enumerate():
        if thread.name == "batchsum-store-prune":
            thread.join()
    connects: list[object] = []
    set_ups: list[object] = []
    real_connect, real_set_up = sqlite3.connect, store_file._set_up
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: connects.append(a) or real_connect(*a, **k))
    monkeypatch.setattr(store_file, "_set_up", lambda db: set_ups.append(db) or real_set_up(db))
    store = open_store("machine", SERVICE)
    try:
        assert len(connects) == 1 and set_ups == []  # the upkeep on the store's connection; the file as it was
        store.put("k", SUMMARY)
        assert store.get("k") == SUMMARY
    finally:
        store.close()


def test_a_store_whose_upkeep_fails_at_its_opening_is_closed(monkeypatch):
    from batchsum.data import store_upkeep

    def failing(*args: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(store_upkeep, "keep_up", failing)
    with pytest.raises(RuntimeError) as raised:
        open_store("machine", SERVICE)
    assert raised.value is not None and _connections_to(default_store_path()) == 0


def _later_than(moment: float) -> float:
    """The wall clock, once it has moved past ``moment``."""
    while (now := time.time()) <= moment:
        pass
    return now


def test_refresh_skips_only_the_answers_written_before_the_run_started(tmp_path, redis_url):
    journal = Journal(tmp_path / "j.sqlite")
    journal.serve(SERVICE)
    machine = MachineStore(tmp_path / "store.sqlite", SERVICE)
    cluster = RedisStore(redis_url, f"https://refresh-{os.urandom(4).hex()}.example")
    memory = MemoryStore()
    for scope in (journal, machine, cluster, memory):
        scope.put("old", SUMMARY)
    started = _later_than(time.time())
    for own, store, keeps_all in ((journal, machine, True), (memory, cluster, False)):
        scopes = Scopes(own, store, keeps_all=keeps_all, refresh=True, started=started, trust=MODE_1)
        assert scopes.lookup(["old"]) == ({}, set())  # asked again
        scopes.put("mine", SUMMARY)
        scopes.put("refused", REFUSAL)
        assert scopes.lookup(["mine", "refused"])[0] == {"mine": SUMMARY, "refused": REFUSAL}  # this run's own
        store.put("theirs", SUMMARY)  # another run's, while this one ran
        assert scopes.lookup(["theirs"]) == ({"theirs": SUMMARY}, {"theirs"})
        assert Scopes(own, store, trust=MODE_1).lookup(["old"])[0] == {"old": SUMMARY}  # without refresh: everything
    cluster.close()


class _Record:
    """A key's record as ``Trust`` reads it: the modes the service answered it in."""

    def __init__(self, *modes: int) -> None:
        self.modes = modes

    def proven(self, mode: int) -> float | None:
        return 1.0 if mode in self.modes else None


def test_trust_serves_mode_1_always_mode_2_to_a_run_with_a_key_proven_in_it_and_nothing_when_not_said():
    assert Trust.of(1, []).serves and Trust.of(1, [_Record()]).serves
    assert not Trust.of(2, []).serves and not Trust.of(2, [None, _Record(1)]).serves
    assert Trust.of(2, [_Record(1), _Record(1, 2)]).serves  # one key of the run proven is enough
    unproven = Trust.of(2, [_Record(1)])
    unproven.prove()  # the run's own mode-2 request was answered
    assert unproven.serves
    assert not Trust().serves and not Scopes(None, MemoryStore()).trust.serves  # who asks not said: nothing


def test_strangers_are_served_nothing_in_any_mode_before_a_key_of_theirs_is_proven_in_it():
    """A gateway's clients bring keys of their own: a key the service never accepted gets nothing."""
    assert not Trust.of(1, [], strangers=True).serves and not Trust.of(1, [_Record(2)], strangers=True).serves
    assert Trust.of(1, [_Record(1)], strangers=True).serves and Trust.of(2, [_Record(2)], strangers=True).serves
    stranger = Trust.of(1, [None], strangers=True)
    stranger.prove()  # its own request was answered: the service accepted the key
    assert stranger.serves


@pytest.mark.parametrize("where", ["machine", "redis"])
def test_every_read_of_the_store_asks_the_trust_and_a_run_whose_key_is_not_proven_in_mode_2_is_served_none(
    where, tmp_path, request
):
    """The store holds a mode-2 answer another key paid for. A run whose keys are not proven in mode 2
    is served it by no read: the look-up of known rows (``Scopes.lookup``, ``stored``, and on the
    loop ``AsyncScopes.lookup``), the claim at the turn (``take``: it claims the text instead) and
    the waiting texts' read (``look``: the text is no longer held, so the run takes a turn for it).
    Once its own mode-2 request is answered, every read serves it."""
    import asyncio

    from batchsum.data.scopes import AsyncScopes

    prefix = f"trust-{os.urandom(4).hex()}"

    def opened() -> Any:
        if where == "redis":
            return RedisStore(f"{request.getfixturevalue('redis_url')}?prefix={prefix}", SERVICE)
        return MachineStore(tmp_path / "store.sqlite", SERVICE)

    paid = opened()  # another run's (another holder)
    paid.put("answered", SUMMARY)  # another key's answer, its claim let go
    store = opened()
    trust = Trust.of(2, [_Record(1)])  # a basic key: answered in mode 1 only
    scopes = Scopes(MemoryStore(), store, trust=trust)
    assert scopes.lookup(["answered"]) == ({}, set()) and scopes.stored(["answered"]) == {}

    async def main() -> None:
        near = AsyncScopes(scopes)
        assert await near.lookup(["answered"]) == ({}, set())
        assert await near.look(["answered"]) == ({}, set())  # not served, and not held: its turn comes
        assert await near.take("answered") is True  # claimed, not served: this run sends it
        near.release("answered")
        trust.prove()
        assert await near.lookup(["answered"]) == ({"answered": SUMMARY}, {"answered"})
        assert await near.look(["answered"]) == ({"answered": SUMMARY}, set())
        assert await near.take("answered") == SUMMARY
        await near.aclose()

    asyncio.run(main())
    assert scopes.stored(["answered"]) == {"answered": SUMMARY}
    paid.close()
    store.close()
