"""What a budget shows of its keys and their runs (``pacing.look.view``), read without writing it
(``pacing.look.readonly``): on a real SQLite file (while runs write it, and after they are gone) and a real
redis-server; a job's processes as one run; runs that disagree on the limit; quotas, a pause and a
search; a lapsed entry gone; a budget not made yet is no keys; Redis read in plain reads (no script)
whatever the number of runs, and never written; a key's state the same read from either back-end."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import threading
import uuid
from pathlib import Path

import pytest

from batchsum.pacing.budgets.budget import RedisBudget, Report, SQLiteBudget
from batchsum.pacing.budgets.exchange import RUN_LEASE_SECONDS, Member
from batchsum.pacing.look.view import UNKNOWN, read_view
from batchsum.service.settings import key_hash

SERVICE = "http://127.0.0.1:9"
KEY = "test-key-premium-0123456789"
HASH = key_hash(KEY)


def run(coro):
    return asyncio.run(coro)


def entry(**fields):
    return json.dumps(
        {"host": "here", "pid": 11, "door": "cli", "rpm": 600, "source": "configured", "share": 1.0, **fields}
    )


async def publish(budget, member, **fields):
    return await budget.reserve(0.0, Report(run=member, entry=entry(**fields)), start=False)


async def activity(budget, starts: int, refused: int = 0):
    """``starts`` starts committed now on the key (and ``refused`` of them answered 429)."""
    await budget.check()  # as a run opens it: made when it is not yet
    await budget.recall(HASH, SERVICE)  # names the budget: its key's hash at its service
    for i in range(starts):
        await budget.reserve(0.0, Report(refused=(0.0,) if i < refused else ()))


def sqlite_where(path: Path) -> str:
    return f"sqlite://{path}"


def snapshot(folder: Path) -> dict[str, str]:
    """Every file of ``folder`` and its content's digest: what a reader must leave as it found it."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(params=["sqlite", "redis"])
def place(request, tmp_path):
    """(a budget of the key there, where a reader reads it)."""
    identity = uuid.uuid4().hex
    if request.param == "sqlite":
        path = tmp_path / "budget.sqlite"
        return lambda: SQLiteBudget(path, identity), sqlite_where(path)
    url = request.getfixturevalue("redis_url")
    __import__("redis").Redis.from_url(url).flushdb()
    return lambda: RedisBudget(url, identity), url


def test_runs_on_a_key_are_shown_with_the_keys_starts_and_429s_on_either_budget(place):
    users, where = place
    a, b = users(), users()

    async def main():
        await activity(a, 12, refused=2)
        await publish(a, Member("nightly", "h1/1/x"), sent=40, reused=3, rows_left=60, rate_1m=40, eta_s=6.0)
        await publish(b, Member("notebook", "h2/2/y"), share=0.5, sent=8, rows_left=2, rate_1m=8, door="notebook")
        view = await read_view(where, "here")
        await a.aclose()
        await b.aclose()
        return view

    view = run(main())
    [key] = view.keys
    assert (key.key, key.service, key.limit, key.limit_source) == (HASH, SERVICE, 600, "configured")
    assert (key.rate_1m, key.starts_10s, key.rate_limited_1m) == (12, 12, 2)
    assert [(r.run_id, r.host, r.pid, r.door, r.share, r.sent, r.rows_left) for r in key.runs] == [
        ("nightly", "here", 11, "cli", 1.0, 40, 60),
        ("notebook", "here", 11, "notebook", 0.5, 8, 2),
    ]  # in the order they started (these say nothing of it: by run id)
    shown = json.dumps(view.as_json())
    assert KEY not in shown


def test_a_jobs_processes_are_one_run_whose_rows_left_are_unknown(place):
    users, where = place
    budget = users()

    async def main():
        await activity(budget, 1)
        for n, host in enumerate(("worker-a", "worker-b", "worker-a")):
            await publish(budget, Member("spark-job", f"{host}/{n}/t"), host=host, pid=100 + n, sent=5, rows_left=None)
        view = await read_view(where, "here")
        await budget.aclose()
        return view

    [key] = run(main()).keys
    [job] = key.runs
    assert (job.run_id, job.processes, job.pid, job.host) == ("spark-job", 3, None, "worker-a, worker-b")
    assert job.sent == 15 and job.rows_left == UNKNOWN and job.eta_s is None


def test_runs_that_disagree_on_the_limit_are_each_shown_and_the_key_says_so(place):
    users, where = place
    budget = users()

    async def main():
        await activity(budget, 1)
        await publish(budget, Member("a", "m1"), rpm=600, source="configured")
        await publish(budget, Member("b", "m2"), rpm=300, source="remembered (found 2026-11-25 14:02)")
        await publish(budget, Member("c", "m3"), rpm=600, source="configured")
        view = await read_view(where, "here")
        await budget.aclose()
        return view

    [key] = run(main()).keys
    assert key.disagree and key.limit_source == "disagree" and key.limit == 300
    assert sorted((item.limit, item.source, item.runs) for item in key.limits) == [
        (300, "remembered", ("b",)),
        (600, "configured", ("a", "c")),
    ]


def test_a_pause_a_configured_quota_and_a_search_under_way_are_shown(place):
    users, where = place
    budget = users()
    day = f"day:{__import__('time').strftime('%Y-%m-%d', __import__('time').gmtime())}"

    async def main():
        await activity(budget, 2)
        await budget.reserve(0.0, Report(pause_for=30.0, pause_reason="the service answered 429"), start=False)
        for _ in range(7):
            await budget.quota_claim([(day, 86400.0)], None)
        await publish(budget, Member("a", "m1"), quota="100/day")
        state = {"cap": 1000, "value": None, "source": "searching", "search": {"phase": "climb", "level": 240.0}}
        await budget.lead("holder", json.dumps(state))
        view = await read_view(where, "here")
        await budget.aclose()
        return view

    [key] = run(main()).keys
    assert key.paused_until is not None and key.paused_until > key.now + 20
    assert key.pause_reason == "the service answered 429"
    [quota] = key.quotas
    assert (quota.name, quota.source, quota.limit, quota.used, quota.left) == (
        "daily quota of 100",
        "configured",
        100,
        7,
        93,
    )
    assert key.counted["day"] == 7
    assert key.search == {"phase": "climb", "level": 240.0, "cap": 1000.0}


def test_a_stated_quota_and_a_remembered_limit_are_shown_when_no_run_is_on_the_key(place):
    users, where = place
    budget = users()
    import time

    async def main():
        await activity(budget, 1)
        stated = {"limit": 300, "window": 86400, "remaining": 45, "reset_at": time.time() + 3600}
        await budget.remember(
            HASH, SERVICE, {"quota": json.dumps(stated), "limit": json.dumps({"rpm": 240, "how": "found"})}
        )
        view = await read_view(where, "here")
        await budget.aclose()
        return view

    [key] = run(main()).keys
    assert key.runs == () and (key.limit, key.limit_source) == (240, "remembered")
    [quota] = key.quotas
    assert (quota.name, quota.source, quota.left, quota.spent) == ("daily quota of 300", "stated", 45, False)


def test_an_idle_key_is_not_shown_unless_asked_and_a_budget_not_made_yet_is_no_keys(tmp_path):
    path = tmp_path / "budget.sqlite"
    assert run(read_view(sqlite_where(path), "here")).keys == ()
    assert not path.exists()  # reading made nothing
    budget = SQLiteBudget(path, uuid.uuid4().hex)

    async def main():
        await budget.check()
        await budget.recall(HASH, SERVICE)
        await budget.aclose()
        return await read_view(sqlite_where(path), "here"), await read_view(sqlite_where(path), "here", every=True)

    idle, every = run(main())
    assert idle.keys == () and [k.key for k in every.keys] == [HASH]


def test_an_entry_not_published_within_its_lease_is_not_shown(tmp_path):
    path = tmp_path / "budget.sqlite"
    budget = SQLiteBudget(path, uuid.uuid4().hex)

    async def main():
        await activity(budget, 1)
        await publish(budget, Member("old", "m-old"))
        await publish(budget, Member("new", "m-new"))
        await budget.aclose()
        db = sqlite3.connect(path)
        db.execute("UPDATE runs SET seen = seen - ? WHERE member='m-old'", (RUN_LEASE_SECONDS + 1,))
        db.commit()
        db.close()
        return await read_view(sqlite_where(path), "here")

    [key] = run(main()).keys
    assert [r.run_id for r in key.runs] == ["new"]


def test_reading_a_sqlite_budget_writes_nothing_while_runs_write_it_and_after_they_are_gone(tmp_path):
    path = tmp_path / "budget.sqlite"
    budget = SQLiteBudget(path, uuid.uuid4().hex)

    async def main():
        await activity(budget, 5)
        await publish(budget, Member("a", "m1"), sent=5)
        before = snapshot(tmp_path)  # a writer holds the file: its log and index are there
        live = await read_view(sqlite_where(path), "here")
        during = snapshot(tmp_path)
        await budget.aclose()  # the last connection gone: the log is folded into the file and removed
        after_close = snapshot(tmp_path)
        closed = await read_view(sqlite_where(path), "here")
        return before, live, during, after_close, closed, snapshot(tmp_path)

    before, live, during, after_close, closed, after = run(main())
    # The file and its log are as they were. The log's index (-shm, shared memory, not the budget) holds
    # the readers' marks: a reader that may write it sets one there, as any reader of a WAL file does.
    assert "budget.sqlite-wal" in before and sorted(during) == sorted(before)
    assert {k: v for k, v in during.items() if k != "budget.sqlite-shm"} == {
        k: v for k, v in before.items() if k != "budget.sqlite-shm"
    }
    assert sorted(after_close) == ["budget.sqlite"] and after == after_close  # no log or index made by reading
    assert [r.sent for r in live.keys[0].runs] == [5] == [r.sent for r in closed.keys[0].runs]


def test_redis_is_read_in_three_round_trips_of_plain_reads_whatever_the_number_of_runs_and_never_written(redis_url):
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    budget = RedisBudget(redis_url, uuid.uuid4().hex)

    def watched(read) -> list[str]:
        """The commands clients sent Redis while ``read`` ran (MONITOR; a script's own calls left out)."""
        seen: list[str] = []
        ready = threading.Event()

        def listen() -> None:
            with redis.Redis.from_url(redis_url).monitor() as monitor:
                for command in monitor.listen():
                    if command["command"] == "ECHO watching":
                        ready.set()
                    elif command["command"] == "ECHO done":
                        return
                    elif command.get("client_type") != "lua":
                        seen.append(command["command"].split()[0].upper())

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        while not ready.is_set():
            client.echo("watching")
            ready.wait(0.05)
        read()
        client.echo("done")
        thread.join(30)
        return seen

    def contents() -> dict[bytes, bytes]:
        return {key: client.dump(key) for key in sorted(client.keys("*"))}

    async def publish_runs(n: int):
        for i in range(n):
            await publish(budget, Member(f"run{i:03d}", f"m{i}"), sent=i)

    async def measure() -> tuple[list[str], int]:
        views = []
        sent = await asyncio.to_thread(watched, lambda: views.append(asyncio.run(read_view(redis_url, "here"))))
        return sent, len(views[0].keys[0].runs)

    async def main():
        await activity(budget, 3)
        await publish_runs(2)
        few = await measure()
        await publish_runs(60)
        many = await measure()
        stored = contents()
        await read_view(redis_url, "here")
        await budget.aclose()
        return few, many, stored, contents()

    (few, runs_few), (many, runs_many), before, after = run(main())
    assert (runs_few, runs_many) == (2, 60)
    # The names, the clock (the budget hash's expiry and what is left of it), then the key's pause and
    # pace, runs, lead, quota counts and remembered entries, and its ledger a second at a time: plain
    # reads (no script, no TIME), the same whatever the number of runs (after redis-py's own hello).
    reads = [c for c in few if c not in ("HELLO", "CLIENT")]
    assert few == many and reads[:8] == [
        "HGETALL",
        "PEXPIRETIME",
        "PTTL",
        "HMGET",
        "HGETALL",
        "HMGET",
        "MGET",
        "HGETALL",
    ]
    assert reads[8:] == ["HGETALL"] * 71, few  # the ledger's 70 s: the seconds of their start and end and those between
    assert before == after


def comparable(state) -> dict:
    """A key's state with its times taken from its budget's own clock (each budget was written at
    its own moment), to the second; its ledger as the figures ``top`` shows."""
    now = state.now
    since = lambda at: round(at - now) if at else None  # noqa: E731
    return {
        "key": (state.key_hash, state.service),
        "pause": (since(state.paused_until), state.pause_reason),
        "pace": state.pace,
        "ledger": [
            (state.ledger.started(now - window, now + 0.1), state.ledger.refusals(now - window, now + 0.1))
            for window in (10, 60)
        ],
        "runs": [(e.run_id, e.member, dict(e.data)) for e in state.runs],
        "lead": (since(state.lead_until), state.lead_state),
        "paid": state.paid,
        "remembered": [(e.name, e.value, since(e.at)) for e in state.remembered],
    }


def test_a_keys_state_read_from_either_back_end_is_the_same(redis_url, tmp_path):
    """One function turns what a budget stores into the key's state (``readonly.key_state``): the same
    runs, ledger, pause, pace, lead, counts and remembered entries, written to a SQLite file and to a
    real redis-server, read back as the same state."""
    from batchsum.pacing.look.readonly import read_states

    __import__("redis").Redis.from_url(redis_url).flushdb()
    identity = uuid.uuid4().hex
    day = f"day:{__import__('time').strftime('%Y-%m-%d', __import__('time').gmtime())}"
    stated = {"limit": 300, "window": 86400, "remaining": 45, "reset_at": __import__("time").time() + 3600}

    async def fill(budget) -> None:
        await activity(budget, 9, refused=3)
        await budget.reserve(
            0.0, Report(pause_for=30.0, pause_reason="the service answered 429", pace=0.25), start=False
        )
        for _ in range(4):
            await budget.quota_claim([(day, 86400.0)], None)
        await publish(budget, Member("nightly", "h1/1/x"), sent=40, rows_left=60, quota="100/day")
        await publish(budget, Member("spark-job", "exec-0/9/c"), host="exec-0", rows_left=None)
        await budget.lead("holder", json.dumps({"cap": 1000, "search": {"phase": "climb", "level": 240.0}}))
        await budget.remember(HASH, SERVICE, {"quota": json.dumps(stated), "limit": json.dumps({"rpm": 240})})

    async def main():
        states = []
        for budget, where in (
            (SQLiteBudget(tmp_path / "budget.sqlite", identity), sqlite_where(tmp_path / "budget.sqlite")),
            (RedisBudget(redis_url, identity), redis_url),
        ):
            await fill(budget)
            [state] = await read_states(where)
            states.append(state)
            await budget.aclose()
        return states

    on_sqlite, on_redis = run(main())
    assert comparable(on_sqlite) == comparable(on_redis)
    assert on_sqlite.pace == 0.25 and on_sqlite.paid == {"day": 4} and on_sqlite.ledger.refusals(0, 1e12) == 3
    assert [e.run_id for e in on_sqlite.runs] == ["nightly", "spark-job"]
