"""The answer store as runs share it, through the real stores (a SQLite file, a real redis-server):
texts set aside are looked at together, never polled one by one; two runs on two keys split the
texts; a Redis restarted mid-run is used again; a store the user cannot write is read; answers kept
to the key that paid (``store_scope``); a store prefix on Redis; a format-1 store migrated; a mode-2
answer never served to a key whose plan refuses mode 2; journals made 0600."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import batchsum
from batchsum.data import store_link
from batchsum.data.machine_store import MachineStore, default_store_path
from batchsum.data.redis_store import RedisStore, RedisUpkeep
from batchsum.data.results import OK, Answer
from batchsum.data.scopes import Scopes, Trust, look_at_store
from batchsum.data.stores import MemoryStore, clear_process_caches
from batchsum.engine import summarize_stream
from batchsum.engine.fingerprints import text_fingerprint
from batchsum.engine.tally import BatchStats
from batchsum.errors import BatchsumError, NotPremiumError
from batchsum.local import Faults, LocalService
from batchsum.local.state import Account
from batchsum.run.run import run_texts
from batchsum.run.spec import RunSpec
from batchsum.service import contract
from tests.support import BASIC_KEY, KEY, RedisServer, article, need, wait_for, wait_for_count

ROOT = Path(__file__).parents[2]
PARAMS = contract.parse_params(1, contract.PERCENTAGE_DEFAULT, None)
SUMMARY = Answer("a summary", OK, None, None, 200, 1)


def texts(start: int, stop: int) -> list[str]:
    return [article(30, seed=i) for i in range(start, stop)]


def fingerprints(rows: list[str], params: contract.Params = PARAMS) -> list[str]:
    identify = text_fingerprint(params)
    return [identify(text) for text in rows]


class Counted:
    """A store whose calls are counted: how many of each, and how many keys each was given."""

    COUNTED = ("get_many", "take_many", "look_many", "put_many", "release_many", "renew", "changed", "claim")

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls: dict[str, int] = {}
        self.keys: dict[str, list[int]] = {}
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.store, name)
        if name not in self.COUNTED:
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                self.calls[name] = self.calls.get(name, 0) + 1
                if args and not isinstance(args[0], str):
                    self.keys.setdefault(name, []).append(len(list(args[0])))
            return found(*args, **kwargs)

        return counted


def _store(where: str, service: str, request: pytest.FixtureRequest) -> Any:
    if where == "redis":
        return RedisStore(request.getfixturevalue("redis_url"), service)
    return MachineStore(default_store_path(), service)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["machine", "redis"])
def test_texts_set_aside_are_looked_at_together_not_one_by_one(svc, where, request):
    """Another run holds every text (it has them on the wire): this run claims each once, at its turn,
    sets it aside, and then looks at all of them in one read each time (the store says an answer
    landed, or a backoff passed); never a write per waiting text, never a look per text. When the
    other run's answers land, every row is answered from them and nothing is sent."""
    service = contract.service_identity(svc.url)
    rows = texts(0, 120)
    keys = fingerprints(rows)
    if where == "machine":
        default_store_path().parent.mkdir(parents=True, exist_ok=True)
    other = _store(where, service, request)
    assert all(other.take_many(keys, look=False).values())  # the other run has every text on the wire
    counted = Counted(_store(where, service, request))

    async def main() -> tuple[list[Any], BatchStats, float, int]:
        stats = BatchStats()
        async with batchsum.AsyncClient(KEY, svc.url) as client:
            stream = summarize_stream(
                rows, client, stats=stats, rpm=600, store=Scopes(MemoryStore(), counted, trust=Trust(1))
            )
            task = asyncio.ensure_future(_collect(stream))
            turns = lambda: sum(counted.keys.get("take_many", [])) >= len(keys)  # noqa: E731
            await asyncio.to_thread(wait_for, turns, what="each text to reach its turn")  # the loop runs on
            waited_from = time.monotonic()
            looks_before = counted.calls.get("look_many", 0)
            await asyncio.sleep(2.0)  # every text waits on the other run
            waited = time.monotonic() - waited_from
            looks = counted.calls.get("look_many", 0) - looks_before
            await asyncio.get_running_loop().run_in_executor(None, other.put_many, [(k, SUMMARY) for k in keys])
            results = await asyncio.wait_for(task, 60)
        return results, stats, waited, looks

    results, stats, waited, looks = asyncio.run(main())
    other.close()
    assert [r.status for r in results] == ["ok"] * len(rows) and stats.sent == 0 and svc.stats()["requests"] == 0
    assert sum(counted.keys["take_many"]) == len(keys)  # each text claimed once, at its turn: no claim polled
    assert max(counted.keys["look_many"]) == len(keys)  # one look covers every waiting text
    # One read per WATCH_STEP at the very most (a look per text every 0.5 s would be ~480 here).
    assert looks <= waited / store_link.WATCH_STEP + 3, (looks, waited)


async def _collect(stream: Any) -> list[Any]:
    return [row async for row in stream]


@pytest.mark.slow
def test_two_runs_on_two_keys_through_the_machine_store_split_the_texts_and_each_goes_at_its_pace(tmp_path):
    """Two runs over the same 60 texts, one on a key at 60/min, the other on a key at 600/min started
    a second later, sharing the machine's store (two processes' worth: two holders): every row ok in
    both, the fast run sends most of them, and a text is paid twice at most for what was on the wire."""
    slow, fast = "slow-key-0123456789", "fast-key-0123456789"
    accounts = {slow: Account(rpm=60), fast: Account(rpm=600)}
    rows = texts(0, 60)
    with LocalService([slow, fast], accounts=accounts, faults=Faults(latency=0.2, latency_spread=0.2)) as svc:
        outcomes: dict[str, tuple[list[Any], BatchStats]] = {}

        def one(key: str, delay: float) -> None:
            time.sleep(delay)
            stats = BatchStats()
            spec = RunSpec.from_kwargs(api_key=key, base_url=svc.url, progress=False, rpm=accounts[key].rpm)
            outcomes[key] = (asyncio.run(run_texts(spec, rows, stats=stats)), stats)

        threads = [threading.Thread(target=one, args=job) for job in ((slow, 0.0), (fast, 1.0))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(240)
        stats = svc.stats()
    assert all(r.status == "ok" for results, _ in outcomes.values() for r in results)
    assert outcomes[fast][1].sent >= 45 and outcomes[slow][1].sent <= 15
    assert stats["answered_unique"] == 60 and stats["answered"] <= 60 + 2  # at most the texts on the wire twice


@pytest.mark.slow
def test_a_redis_store_restarted_mid_run_is_used_again(svc, tmp_path, caplog, monkeypatch):
    """Redis stopped mid-run and started again empty: the run says once that the store failed, goes
    on, and uses the store again once it answers (the answers kept meanwhile put there then); every row
    ok, nothing paid twice; a later job pays only for what was lost with the restart."""
    pytest.importorskip("redis")
    monkeypatch.setattr(store_link, "RETRY_FIRST", 0.2)
    redis = RedisServer(tmp_path)
    redis.start()
    svc.faults = Faults(latency=0.1, latency_spread=0.1)
    rows = texts(5000, 5080)
    spec = RunSpec.from_kwargs(api_key=KEY, base_url=svc.url, progress=False, rpm=1200, budget="none", store=redis.url)
    outcome: list[list[Any]] = []
    try:
        with caplog.at_level(logging.INFO, logger="batchsum"):
            runner = threading.Thread(target=lambda: outcome.append(asyncio.run(run_texts(spec, rows))))
            runner.start()
            wait_for_count(svc, 20)
            redis.stop()
            time.sleep(1.0)
            redis.start()
            runner.join(120)
        store = RedisStore(redis.url, contract.service_identity(svc.url))
        kept = store.get_many(fingerprints(rows))
        store.close()
        assert [r.status for r in outcome[0]] == ["ok"] * len(rows)
        assert svc.stats()["requests"] == len(rows) and svc.stats()["answered_twice"] == 0
        said = [r.getMessage() for r in caplog.records if r.name == "batchsum"]
        assert len([m for m in said if " failed (" in m]) == 1, said
        assert len([m for m in said if "uses it again" in m]) == 1, said
        assert len(kept) >= len(rows) - 30  # what was answered after the stop (kept meanwhile) is there
        again = asyncio.run(run_texts(spec, rows))
        assert all(r.status == "ok" for r in again)
        assert svc.stats()["requests"] == 2 * len(rows) - len(kept)  # only what was lost with the restart
    finally:
        redis.stop()
        clear_process_caches()  # what this process kept while the store was out is this test's alone


def test_a_claim_lost_with_a_restarted_redis_is_made_again_by_its_holders_renewal(redis_url):
    service = f"https://renew-{os.urandom(4).hex()}.example"
    holder, other = RedisStore(redis_url, service), RedisStore(redis_url, service)
    try:
        assert holder.take_many(["k"], look=False) == {"k": True}
        holder._redis.delete(holder._claim("k"))  # Redis came back without its data
        holder.renew(["k"])
        assert other.take_many(["k"], look=False) == {"k": False}  # held again: the other waits
        holder.release("k")
        assert other.take_many(["k"], look=False) == {"k": True}
    finally:
        holder.close()
        other.close()


def _read_only_view(source: Path, view: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """``command`` run where ``view`` shows ``source`` read-only (a read-only bind mount in a mount
    namespace of its own: the same files, which this user cannot write there)."""
    unshare = shutil.which("unshare")
    probe = [unshare or "unshare", "--map-root-user", "--mount", "true"]
    if unshare is None or subprocess.run(probe, capture_output=True).returncode:
        need("a mount namespace", "unshare from util-linux, with user namespaces allowed")
    view.mkdir(exist_ok=True)
    script = f'mount --bind "{source}" "{view}" && mount -o remount,bind,ro "{view}" && exec "$@"'
    return subprocess.run(
        [unshare, "--map-root-user", "--mount", "sh", "-c", script, "sh", *command],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=180,
    )


def _summarize(source: Path, output: Path, store: str) -> list[str]:
    """The command summarizing ``source`` into ``output`` with the answer store ``store``, unpaced."""
    return [sys.executable, "-m", "batchsum.cli", "summarize", str(source), "-o", str(output), "--column", "text"] + [
        "--quiet",
        "--rpm",
        "0",
        "--store",
        store,
    ]


@pytest.mark.slow
def test_a_store_in_a_read_only_folder_is_read_and_new_answers_go_to_the_journal_alone(env, tmp_path):
    """A store the user cannot write (a read-only file system here): its answers are used, with one
    line that new answers go to the journal alone, whether its owner has it open to write (its -shm
    there: read through it, what the owner commits is seen) or not (read as it is); it is never
    written."""
    import pandas as pd

    folder, view = tmp_path / "team", tmp_path / "view"
    folder.mkdir()
    store = f"sqlite://{folder}/answers.sqlite"
    pd.DataFrame({"text": texts(0, 10)}).to_parquet(tmp_path / "ten.parquet")
    pd.DataFrame({"text": texts(0, 14)}).to_parquet(tmp_path / "more.parquet")
    first = subprocess.run(
        _summarize(tmp_path / "ten.parquet", tmp_path / "a.parquet", store),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=180,
    )
    assert first.returncode == 0, first.stderr
    assert env.stats()["requests"] == 10 and not Path(f"{folder}/answers.sqlite-wal").exists()  # its owner closed it
    read_only = f"sqlite://{view}/answers.sqlite"
    done = _read_only_view(folder, view, *_summarize(tmp_path / "more.parquet", tmp_path / "b.parquet", read_only))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "answer store" in line]
    assert (
        len(lines) == 1 and "cannot be written here" in lines[0] and "new answers go to the journal alone" in lines[0]
    )
    assert env.stats()["requests"] == 14  # 10 from the store, 4 paid
    assert len(MachineStore(folder / "answers.sqlite", contract.service_identity(env.url))) == 10  # never written
    # Its owner now has it open to write, and keeps a new answer: a reader sees it through the -shm.
    owner = MachineStore(folder / "answers.sqlite", contract.service_identity(env.url))
    owner.put(fingerprints(texts(13, 14))[0], SUMMARY)
    assert Path(f"{folder}/answers.sqlite-shm").exists()
    done = _read_only_view(folder, view, *_summarize(tmp_path / "more.parquet", tmp_path / "c.parquet", read_only))
    owner.close()
    assert done.returncode == 0, done.stderr
    assert env.stats()["requests"] == 14 + 3  # the owner's new answer was read; three texts paid again
    assert pd.read_parquet(tmp_path / "c.parquet")["summary"].tolist()[13] == "a summary"


def test_a_store_read_as_it_is_sees_a_writer_that_appears(tmp_path):
    """Read with no writer (immutable), then its owner opens it and writes: the next read goes
    through the owner's -shm and sees the new answer."""
    folder, view = tmp_path / "team", tmp_path / "view"
    folder.mkdir()
    MachineStore(folder / "answers.sqlite", "s").close()
    code = f"""
import sys
from batchsum.data.machine_store import MachineStore
store = MachineStore({str(view / "answers.sqlite")!r}, "s")
print(store.writable, store._immutable, store.get("k"), flush=True)
sys.stdin.readline()
print(store.get("k").summary, store._immutable, flush=True)
"""
    unshare = shutil.which("unshare")
    probe = [unshare or "unshare", "--map-root-user", "--mount", "true"]
    if unshare is None or subprocess.run(probe, capture_output=True).returncode:
        need("a mount namespace", "unshare from util-linux, with user namespaces allowed")
    view.mkdir()
    script = f'mount --bind "{folder}" "{view}" && mount -o remount,bind,ro "{view}" && exec "$@"'
    reader = subprocess.Popen(
        [unshare, "--map-root-user", "--mount", "sh", "-c", script, "sh", sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert reader.stdout is not None and reader.stdin is not None
    assert reader.stdout.readline().split() == ["False", "True", "None"]
    owner = MachineStore(folder / "answers.sqlite", "s")
    owner.put("k", SUMMARY)
    reader.stdin.write("go\n")
    reader.stdin.flush()
    assert reader.stdout.readline().split() == ["a", "summary", "False"]
    reader.wait(30)
    owner.close()


def _format_1(path: Path, answers: list[tuple[str, str, str]]) -> None:
    """A store as batchsum made it before answers had a scope (format 1)."""
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE answers (service TEXT NOT NULL, fingerprint TEXT NOT NULL, summary TEXT NOT NULL,
            attempts INTEGER NOT NULL, written REAL NOT NULL, PRIMARY KEY (service, fingerprint));
        CREATE INDEX answers_by_age ON answers (written);
        CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('format', 'batchsum-store-1');
        CREATE TABLE refusals (job TEXT NOT NULL, service TEXT NOT NULL, fingerprint TEXT NOT NULL,
            answer TEXT NOT NULL, written REAL NOT NULL, PRIMARY KEY (job, service, fingerprint));
        CREATE TABLE claims (fingerprint TEXT PRIMARY KEY, holder TEXT NOT NULL, mono REAL NOT NULL,
            expires REAL NOT NULL) WITHOUT ROWID;
        PRAGMA journal_mode=WAL;
        """
    )
    db.executemany("INSERT INTO answers VALUES (?, ?, ?, 1, ?)", [(*a, time.time()) for a in answers])
    db.commit()
    db.close()


def test_a_format_1_store_is_read_as_it_is_and_migrated_in_place_when_opened_to_write(tmp_path):
    path = tmp_path / "answers.sqlite"
    _format_1(path, [("s", "k", "kept"), ("other", "k", "theirs")])
    looking = look_at_store(f"sqlite://{path}", "s")  # a dry run reads it, format 1 and all
    assert looking.get("k").summary == "kept" and len(looking) == 1
    assert look_at_store(f"sqlite://{path}", "s", scope="abc").get("k") is None  # no answer kept to a key there
    looking.close()
    store = MachineStore(path, "s")
    assert store.format == 2 and store.get("k").summary == "kept" and len(store) == 1
    assert MachineStore(path, "other").get("k").summary == "theirs"
    store.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE name='format'").fetchone() == ("batchsum-store-2",)
    assert db.execute("SELECT scope FROM answers").fetchall() == [("",), ("",)]
    db.close()


@pytest.mark.parametrize("where", ["machine", "redis"])
def test_answers_kept_to_the_key_that_paid_are_served_to_that_key_alone(svc, where, request):
    store = request.getfixturevalue("redis_url") if where == "redis" else None
    rows = [article(30, seed=9000 + i) + f" {where}" for i in range(5)]

    def paid(key: str, scope: str) -> int:
        before = svc.stats()["requests"]
        spec = RunSpec.from_kwargs(api_key=key, base_url=svc.url, progress=False, rpm=0, store=store, store_scope=scope)
        assert all(r.status == "ok" for r in asyncio.run(run_texts(spec, rows)))
        return int(svc.stats()["requests"] - before)

    assert paid(KEY, "key") == 5
    assert paid(BASIC_KEY, "key") == 5  # another key: its own answers, paid again
    assert paid(KEY, "key") == 0 and paid(BASIC_KEY, "key") == 0
    assert paid(BASIC_KEY, "service") == 5  # the service's answers (every key's) were none of these
    assert paid(KEY, "service") == 0


def test_a_redis_store_prefix_keeps_teams_apart_and_never_reaches_the_client(redis_url):
    service = f"https://prefix-{os.urandom(4).hex()}.example"
    one, two = RedisStore(f"{redis_url}?prefix=team-a", service), RedisStore(f"{redis_url}?prefix=team-b", service)
    plain = RedisStore(redis_url, service)
    try:
        one.put("a" * 64, SUMMARY)
        assert one.get("a" * 64) == SUMMARY and two.get("a" * 64) is None and plain.get("a" * 64) is None
        assert one._redis.exists(f"team-a:batchsum:store:{{{service}}}:{'a' * 64}")
        assert "prefix" not in one._redis.connection_pool.connection_kwargs
        assert "prefix team-a" in one.where
        assert (service, pytest.approx(time.time(), abs=60)) in RedisUpkeep(f"{redis_url}?prefix=team-a").inventory()
        assert service not in {s for s, _ in RedisUpkeep(f"{redis_url}?prefix=team-b").inventory()}
        assert RedisUpkeep(f"{redis_url}?prefix=team-a").remove(service=service) == 1 and one.get("a" * 64) is None
        with pytest.raises(BatchsumError, match="invalid prefix"):
            RedisStore(f"{redis_url}?prefix=a%20b", service)
    finally:
        for store in (one, two, plain):
            store.close()


@pytest.mark.slow
def test_a_budget_url_with_a_prefix_prefixes_the_store_that_follows_it_never_the_budget(redis_url):
    """``--budget redis://...?prefix=NAME``: the store that follows the budget keeps its keys under
    ``NAME:``; the budget's keys are the key's, unprefixed; redis-py never sees the prefix."""
    import redis

    rows = [article(20, seed=9300 + i) for i in range(3)]
    with LocalService([KEY]) as svc:
        spec = RunSpec.from_kwargs(budget=f"{redis_url}?prefix=team-c", api_key=KEY, base_url=svc.url, progress=False)
        assert [r.status for r in asyncio.run(run_texts(spec, rows))] == ["ok"] * 3
        client = redis.Redis.from_url(redis_url)
        stored = [k.decode() for k in client.scan_iter(f"*batchsum:store:{{{svc.url}}}:*")]
        assert len(stored) == 3 and all(k.startswith("team-c:batchsum:store:") for k in stored)
        identity = batchsum.AsyncClient(KEY, svc.url).identity
        assert client.exists(f"batchsum:budget:{{{identity}}}") and not list(
            client.scan_iter("team-c:batchsum:budget:*")
        )


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("?prefix=a%20b", "invalid prefix 'a b'"),
        ("?prefix=a&prefix=b", "invalid prefix 'b'"),
        ("?foo=1", "the Redis client knows no option 'foo'"),
        ("?socket_timeout=soon", "Invalid value for 'socket_timeout' in connection URL;"),
        ("?protocol=4", "protocol must be either 2 or 3;"),
    ],
)
def test_a_redis_url_the_client_cannot_read_is_one_line_where_the_option_is_read(query, says):
    from batchsum.errors import BudgetError, InvalidParameterError
    from batchsum.service.settings import budget_spec, store_spec

    url = f"redis://user:s3cret-pw@127.0.0.1:6379/0{query}"
    for check, error in (
        (lambda: budget_spec(url), BudgetError),
        (lambda: store_spec(url, None), InvalidParameterError),
    ):
        with pytest.raises(error) as raised:
            check()
        line = str(raised.value)
        assert says in line and "s3cret-pw" not in line and "\n" not in line


def test_a_redis_url_the_client_can_read_is_taken_whole_and_its_password_never_said():
    from batchsum.errors import BudgetError
    from batchsum.service.location import Location
    from batchsum.service.settings import budget_spec

    socket = "unix:///tmp/redis.sock?db=2&prefix=team-a"
    place = budget_spec(socket)
    assert place.text == socket and (place.url, place.prefix) == ("unix:///tmp/redis.sock?db=2", "team-a:")
    other = Location.parse("redis://h:6379/0?socket_timeout=1&prefix=t", "store")
    assert (other.url, other.prefix) == ("redis://h:6379/0?socket_timeout=1", "t:")
    with pytest.raises(BudgetError) as raised:
        budget_spec("redis://:s3cret/pw@127.0.0.1:6379/0")  # a '/' in a password not percent-encoded
    assert "port is not a number" in str(raised.value) and "s3cret" not in str(raised.value)


def _mode_2(svc: LocalService, key: str, budget: str | None, **options: Any) -> RunSpec:
    return RunSpec.from_kwargs(mode=2, api_key=key, base_url=svc.url, progress=False, rpm=0, budget=budget, **options)


def _basic_run(spec: RunSpec, rows: list[str]) -> tuple[list[Any], BatchStats, str | None]:
    """A run that may stop on the plan's 401: its rows (none when it stopped), its counts, its stop's line."""
    stats = BatchStats()
    try:
        return asyncio.run(run_texts(spec, rows, stats=stats)), stats, None
    except NotPremiumError as exc:
        return [], stats, str(exc)


@pytest.mark.parametrize("where", ["machine", "redis"])
def test_a_stored_mode_2_answer_is_never_served_to_a_key_whose_plan_refuses_mode_2(where, request):
    """A premium key pays for mode-2 answers (a long text's parts among them); a basic key (mode 1
    only) over the same texts is served none of them, by the look-up of known rows nor by a long
    text's parts: its first request goes to the service, which refuses it, and no row is ok. Another
    premium key not yet proven in mode 2 pays its first request and takes the rest from the store.
    On the machine's budget and store, and on Redis'."""
    budget = request.getfixturevalue("redis_url") if where == "redis" else None
    second = "second-premium-0123456789"
    rows = [article(30, seed=9100 + i) for i in range(4)]
    long = article(contract.MAX_WORDS + 200, seed=9199)  # split: its parts are requests of their own
    with LocalService([KEY, second, f"{BASIC_KEY}:basic"]) as svc:

        def run(key: str, texts: list[str]) -> list[Any]:
            return _basic_run(_mode_2(svc, key, budget, long_texts="split"), texts)[0]

        assert [r.status for r in run(KEY, rows + [long])] == ["ok"] * 5
        paid = svc.stats()["requests"]
        assert [r.status for r in run(KEY, rows + [long])] == ["ok"] * 5 and svc.stats()["requests"] == paid  # proven
        for texts in (rows, [long]):  # the rows looked up in bulk; the long text's parts, one by one
            rows_back, stats, stopped = _basic_run(_mode_2(svc, BASIC_KEY, budget, long_texts="split"), texts)
            assert rows_back == [] and stats.from_store == 0 and stopped == "401: you are not premium for this request"
        assert svc.stats()["requests"] == paid + 2 and svc.stats()["by_status"].get("401") == 2
        assert [r.status for r in run(second, rows)] == ["ok"] * 4 and svc.stats()["requests"] == paid + 3  # its first


@pytest.mark.parametrize("where", ["machine", "redis"])
def test_a_basic_key_beside_a_premium_one_is_served_nothing_and_stops_on_the_plans_401(where, request, monkeypatch):
    """Issue 52, case 2. A premium key, proven in mode 2, has 8 texts on the wire (held by the service);
    a basic key's run over the same texts, same store, finds each claimed at its turn and sets it
    aside. When the premium run's answers land, the basic run is served none of them (the waiting
    texts' read asks the trust as every read does): it takes a turn for a text, its first request
    goes to the service, and it stops on the plan's 401 line, as it does when it starts after the
    premium run has finished. On the machine's budget and store, and on Redis'."""
    from batchsum.engine._answers import Waiting

    budget = request.getfixturevalue("redis_url") if where == "redis" else None
    rows = [article(30, seed=9300 + i) for i in range(8)]
    set_aside: set[str] = set()  # the texts the basic run waits on (a probe: when to let the service answer)
    waiting = Waiting.answer

    async def answer(self: Waiting, key: str) -> Any:
        set_aside.add(key)
        return await waiting(self, key)

    monkeypatch.setattr(Waiting, "answer", answer)
    with LocalService([KEY, f"{BASIC_KEY}:basic"]) as svc:
        assert _basic_run(_mode_2(svc, KEY, budget), [article(30, seed=9399)])[0][0].status == "ok"  # proven
        svc.faults = Faults(hold_after=0)  # every request held until the test lets the service answer
        premium: list[Any] = []
        thread = threading.Thread(target=lambda: premium.extend(_basic_run(_mode_2(svc, KEY, budget), rows)[0]))
        thread.start()
        wait_for(lambda: svc.stats()["most_in_progress"] >= len(rows), what="every text claimed and on the wire")
        beside: list[Any] = []
        basic = threading.Thread(target=lambda: beside.append(_basic_run(_mode_2(svc, BASIC_KEY, budget), rows)))
        basic.start()
        wait_for(lambda: len(set_aside) == len(rows) or not basic.is_alive(), what="every text set aside")
        assert len(set_aside) == len(rows)  # the basic run waits on the premium run's claims
        svc.faults.release()
        thread.join(60)
        basic.join(60)
        assert [r.status for r in premium] == ["ok"] * len(rows)
        ((served, stats, stopped),) = beside
        assert served == [] and stats.from_store == 0 and stats.reused == 0  # 0 rows served from the store
        assert stopped == "401: you are not premium for this request"
        after, stats_after, stopped_after = _basic_run(_mode_2(svc, BASIC_KEY, budget), rows)  # after it finished
        assert after == [] and stats_after.from_store == 0 and stopped_after == stopped
        assert svc.stats()["by_status"] == {"200": len(rows) + 1, "401": 2}  # each basic run: its one first request


@pytest.mark.parametrize("where", ["machine", "redis"])
def test_the_dry_run_and_duckdbs_estimate_count_the_stores_mode_2_answers_as_the_run_would_be_served_them(
    where, request
):
    """After a premium key paid for 4 mode-2 answers: a dry run and DuckDB's estimate on that key
    count them answered by the store; on a basic key (not proven in mode 2) they count them to send,
    as its run would be served none of them, and the dry run's store line says why. Nothing sent."""
    from batchsum.run.run import dry_run

    duckdb = pytest.importorskip("duckdb")
    import batchsum.duckdb

    budget = request.getfixturevalue("redis_url") if where == "redis" else None
    rows = [article(30, seed=9500 + i) for i in range(4)]
    with LocalService([KEY, f"{BASIC_KEY}:basic"]) as svc:
        assert [r.status for r in _basic_run(_mode_2(svc, KEY, budget), rows)[0]] == ["ok"] * 4
        paid = svc.stats()["requests"]
        premium, basic = dry_run(_mode_2(svc, KEY, budget), rows), dry_run(_mode_2(svc, BASIC_KEY, budget), rows)
        assert "would send:       0 requests" in premium and "already answered: 4 rows (4 in the store)" in premium
        assert "would send:       4 requests" in basic and "already answered: 0 rows" in basic
        stores = [next(line for line in plan.splitlines() if line.startswith("store:")) for plan in (premium, basic)]
        assert "proven" not in stores[0] and "no key of this run is proven in mode 2 yet" in stores[1]
        estimates = {}
        for key in (KEY, BASIC_KEY):
            con = duckdb.connect()
            try:
                batchsum.duckdb.register(
                    con, mode=2, api_key=key, base_url=svc.url, rpm=0, budget=budget, progress=False
                )
                (estimates[key],) = con.execute("SELECT batchsum_estimate(?)", [rows]).fetchone()
            finally:
                con.close()
        assert (estimates[KEY]["would_send"], estimates[KEY]["from_store"]) == (0, 4)
        assert (estimates[BASIC_KEY]["would_send"], estimates[BASIC_KEY]["from_store"]) == (4, 0)
        assert svc.stats()["requests"] == paid


def test_a_new_journal_is_made_0600_like_the_store(env, tmp_path):
    from batchsum.data.journal import Journal

    with Journal(tmp_path / "j.sqlite") as journal:
        journal.put("k", SUMMARY)
        for path in tmp_path.glob("j.sqlite*"):
            assert path.stat().st_mode & 0o777 == 0o600, path


def test_a_redis_budget_object_keeps_its_prefix_for_the_store_that_follows_it():
    from batchsum.pacing.budgets.redis_budget import RedisBudget
    from batchsum.service.settings import store_spec

    budget = RedisBudget("redis://127.0.0.1:6379/0?prefix=team-d", "some-key-id")  # nothing connected
    assert store_spec(None, budget).text == "redis://127.0.0.1:6379/0?prefix=team-d"
    assert budget._bare == "redis://127.0.0.1:6379/0"  # what its Redis client is made from
