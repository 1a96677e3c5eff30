"""The budget's schema 4 on every kind of budget (in this process, a SQLite file, a real redis-server):
the runs' registry (entries published with a call, listed, lapsed, removed), a job's stop seen by its
runs and no other, and the epoch (the same for every user; another once the budget came back empty,
when a quota claim on the old one counts nothing and what a run saw counted on the old one is added,
once however many runs remember it)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid

import pytest

from batchsum.pacing.budgets.budget import ProcessBudget, RedisBudget, Report, SQLiteBudget
from batchsum.pacing.budgets.exchange import ENTRY_CHARS, RUN_LEASE_SECONDS, BudgetReset, Member

DAY = ("day:2026-11-27", 86400.0)
HOUR = ("hour:2026-11-27T15", 3600.0)


def run(coro):
    return asyncio.run(coro)


def entry(**fields):
    return json.dumps({"host": "here", "pid": 1, "door": "cli", **fields})


async def publish(budget, member, **fields):
    return await budget.reserve(0.0, Report(run=member, entry=entry(**fields)), start=False)


async def closing(*budgets):
    for budget in budgets:
        await budget.aclose()


def test_runs_published_by_any_user_are_listed_with_their_share_and_removed_when_they_leave(users):
    a, b = users(), users()
    one, two = Member("job1", "host-a/11/x"), Member("job2", "host-b/22/y")

    async def main():
        await publish(a, one, share=0.5, sent=3)
        await publish(b, two, sent=7)
        await publish(a, one, share=0.5, sent=4)  # published again: one entry, the latest
        listed = await b.runs()
        await a.leave(one)
        after = await a.runs()
        await closing(a, b)
        return listed, after

    listed, after = run(main())
    assert [(e.run_id, e.member, e.data["sent"], e.share) for e in listed] == [
        ("job1", "host-a/11/x", 4, 0.5),
        ("job2", "host-b/22/y", 7, 1.0),
    ]
    assert all(e.now >= e.seen for e in listed)
    assert [e.member for e in after] == ["host-b/22/y"]


def test_a_call_without_an_entry_publishes_nothing_and_an_entry_too_long_is_not_kept(users):
    budget = users()

    async def main():
        await budget.reserve(0.0, Report(run=Member("r", "m1")), start=False)
        await budget.reserve(
            0.0, Report(run=Member("r", "m2"), entry=json.dumps({"x": "y" * ENTRY_CHARS})), start=False
        )
        found = await budget.runs()
        await closing(budget)
        return found

    assert run(main()) == []


def test_a_jobs_stop_is_seen_by_each_of_its_runs_on_their_next_call_and_by_no_other(users):
    driver, worker, other = users(), users(), users()

    async def main():
        before = await worker.reserve(0.0, Report(run=Member("job", "w1")), start=False)
        await driver.post_stop("job", "the job was cancelled")
        seen = [await u.reserve(0.01, Report(run=Member("job", m))) for u, m in ((worker, "w1"), (driver, "w2"))]
        elsewhere = await other.reserve(0.0, Report(run=Member("another", "w3")), start=False)
        anonymous = await other.reserve(0.0, start=False)
        await closing(driver, worker, other)
        return before, seen, elsewhere, anonymous

    before, seen, elsewhere, anonymous = run(main())
    assert before.stop is None
    assert [slot.stop for slot in seen] == ["the job was cancelled"] * 2
    assert elsewhere.stop is None and anonymous.stop is None


def test_every_user_sees_one_epoch_and_a_quota_claim_on_it_counts(users):
    a, b = users(), users()

    async def main():
        first = await a.reserve(0.0, start=False)
        second = await b.reserve(0.0, start=False)
        counted = await b.quota_claim([DAY, HOUR], None, epoch=first.epoch)
        await closing(a, b)
        return first, second, counted

    first, second, counted = run(main())
    assert first.epoch and first.epoch == second.epoch
    assert counted.counts == (1, 1) and counted.counted and counted.epoch == first.epoch


def test_a_quota_claim_on_an_epoch_the_budget_does_not_have_counts_nothing(users):
    budget = users()

    async def main():
        await budget.quota_claim([DAY], None)
        with pytest.raises(BudgetReset) as refused:
            await budget.quota_claim([DAY], None, epoch="an-epoch-of-before")
        used = await budget.quota_used(DAY[0])
        await closing(budget)
        return refused.value, used

    refused, used = run(main())
    assert refused.epoch == budget.epoch and used == 1


def test_an_old_epochs_counts_are_added_to_the_new_ones_once_the_most_any_run_saw(users):
    """Three runs remember the old epoch's counts (5, then 7, then 6 in the day): what the new epoch
    counted stays, and the old epoch's day is added once, the most any of them saw; a restore into an
    epoch the budget no longer has counts nothing (``BudgetReset``)."""
    a, b = users(), users()

    async def main():
        for _ in range(2):  # claims on the new epoch before any run restored: they stay
            now = await a.quota_claim([DAY], None)
        await a.quota_restore(now.epoch, "old", [(DAY[0], 5, DAY[1]), (HOUR[0], 4, HOUR[1])])
        first = [await a.quota_used(name) for name in (DAY[0], HOUR[0])]
        await b.quota_restore(now.epoch, "old", [(DAY[0], 7, DAY[1])])  # a run that saw more: the rest
        await a.quota_restore(now.epoch, "old", [(DAY[0], 6, DAY[1]), (HOUR[0], 4, HOUR[1])])  # nothing new
        again = [await b.quota_used(name) for name in (DAY[0], HOUR[0])]
        await b.quota_restore(now.epoch, "older", [(DAY[0], 3, DAY[1])])  # another old epoch: its own
        other = await b.quota_used(DAY[0])
        with pytest.raises(BudgetReset):
            await a.quota_restore("not-the-budgets-epoch", "old", [(DAY[0], 9, DAY[1])])
        last = await a.quota_used(DAY[0])
        await closing(a, b)
        return first, again, other, last

    first, again, other, last = run(main())
    assert first == [2 + 5, 4]
    assert again == [2 + 7, 4]
    assert other == last == 2 + 7 + 3


def test_a_redis_that_comes_back_empty_answers_with_another_epoch_and_refuses_the_old_ones_claims(redis_url):
    import redis

    identity = uuid.uuid4().hex
    a, b = RedisBudget(redis_url, identity), RedisBudget(redis_url, identity)

    async def main():
        before = await a.reserve(0.0, start=False)
        await a.quota_claim([DAY], 10, epoch=before.epoch)
        redis.Redis.from_url(redis_url).flushdb()  # as a restart without its data
        # The first call after it may be a quota claim or a step: either makes the new epoch, once.
        with pytest.raises(BudgetReset) as refused:
            await b.quota_claim([DAY], 10, epoch=before.epoch)
        after = await a.reserve(0.0, start=False)
        used = await a.quota_used(DAY[0])
        await closing(a, b)
        return before, refused.value, after, used

    before, refused, after, used = run(main())
    assert refused.epoch != before.epoch
    assert after.epoch == refused.epoch
    assert used == 0  # nothing counted on the new epoch by a claim made on the old one


def test_an_entry_not_published_again_within_the_lease_has_lapsed_and_goes_on_the_next_publication():
    now = [1000.0]
    budget = ProcessBudget(lambda: now[0], shared=True)

    async def main():
        await publish(budget, Member("old", "m-old"))
        now[0] += RUN_LEASE_SECONDS - 1
        await publish(budget, Member("new", "m-new"))
        both = [e.run_id for e in await budget.runs()]
        now[0] += 2  # the old one's lease is over
        one = [e.run_id for e in await budget.runs()]
        return both, one

    assert run(main()) == (["old", "new"], ["new"])


def test_a_lapsed_entry_is_not_listed_on_a_sqlite_or_redis_budget(tmp_path, redis_url, monkeypatch):
    import redis

    identity = uuid.uuid4().hex
    sqlite_budget = SQLiteBudget(tmp_path / "budget.sqlite", identity)
    redis_budget = RedisBudget(redis_url, identity)

    async def main():
        for budget in (sqlite_budget, redis_budget):
            await publish(budget, Member("old", "m-old"))
            await publish(budget, Member("new", "m-new"))
        # Age the old entry by its lease and more, where each budget keeps when it was seen.
        db = sqlite3.connect(tmp_path / "budget.sqlite")
        db.execute("UPDATE runs SET seen = seen - ? WHERE member='m-old'", (RUN_LEASE_SECONDS + 1,))
        db.commit()
        db.close()
        client = redis.Redis.from_url(redis_url)
        seen_key = f"batchsum:budget:{{{identity}}}:runs:seen"
        client.zadd(seen_key, {"m-old": float(client.zscore(seen_key, "m-old")) - RUN_LEASE_SECONDS - 1})
        listed = [[e.run_id for e in await budget.runs()] for budget in (sqlite_budget, redis_budget)]
        await closing(sqlite_budget, redis_budget)
        return listed

    assert run(main()) == [["new"], ["new"]]


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_forgetting_a_key_forgets_its_runs_and_stops(kind, tmp_path, request):
    identity = uuid.uuid4().hex
    if kind == "sqlite":
        budget = SQLiteBudget(tmp_path / "budget.sqlite", identity)
    else:
        budget = RedisBudget(request.getfixturevalue("redis_url"), identity)

    async def main():
        await publish(budget, Member("job", "m1"))
        await budget.recall("abc123", "svc")  # names the budget's key (what forget matches by)
        await budget.post_stop("job", "stopped")
        await budget.forget("abc123", "svc")
        runs = await budget.runs()
        slot = await budget.reserve(0.0, Report(run=Member("job", "m1")), start=False)
        await closing(budget)
        return runs, slot.stop

    assert run(main()) == ([], None)


def test_a_budget_file_of_an_earlier_schema_opens_with_its_state_and_gains_the_registry(tmp_path):
    path = tmp_path / "budget.sqlite"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE budgets (id TEXT PRIMARY KEY, tat REAL NOT NULL, paused_until REAL NOT NULL, reason TEXT,
            pace REAL, pace_version INTEGER NOT NULL, updated REAL NOT NULL);
        INSERT INTO budgets VALUES ('k', 0, 0, NULL, 240.0, 3, 0);
        """
    )
    db.commit()
    db.close()
    budget = SQLiteBudget(path, "k")

    async def main():
        slot = await publish(budget, Member("job", "m1"))
        runs = await budget.runs()
        await closing(budget)
        return slot, runs

    slot, runs = run(main())
    assert slot.pace_version == 3 and slot.epoch
    assert [e.member for e in runs] == ["m1"]
    schema = sqlite3.connect(path).execute("SELECT value FROM meta WHERE name='schema'").fetchone()
    assert schema == ("5",)  # with the live lane (schema 4: the quotas' restores, a table of its own)


def test_a_pacer_publishes_its_runs_entry_at_most_once_a_second_and_hears_its_jobs_stop_once():
    """On the virtual clock: 600 starts at 600/min publish the entry about once a second (a minute's
    worth, not a start's worth), every call names the run, and a stop posted midway is told once."""
    from batchsum.pacing import Pacer
    from batchsum.pacing.budgets.presence import Presence
    from tests import virtual_clock

    class Counting(ProcessBudget):
        entries = 0

        async def _call(self, what, interval, report, share):
            assert report.run is not None and report.run.run_id == "job"
            self.entries += report.entry is not None
            return await super()._call(what, interval, report, share)

    budget = Counting(lambda: asyncio.get_running_loop().time(), shared=True)
    stops: list[str] = []
    clock = lambda: asyncio.get_running_loop().time()  # noqa: E731
    presence = Presence(Member("job", "m"), lambda: {"sent": 1}, on_stop=stops.append, clock=clock)
    pacer = Pacer(600, budget=budget, presence=presence)

    async def main():
        for i in range(600):
            await pacer.before_attempt()
            if i == 300:
                await budget.post_stop("job", "cancelled")
        return await budget.runs()

    listed = virtual_clock.run(main())
    assert 55 <= budget.entries <= 62  # 60 s of starts: one entry a second
    assert stops == ["cancelled"]
    assert [(e.run_id, e.data["sent"]) for e in listed] == [("job", 1)]


def test_a_run_is_on_its_keys_budget_while_it_runs_and_leaves_it_when_it_ends(svc, tmp_path):
    """A real run through the run layer on a budget file: its entry is there while it runs (read from
    the callback each row calls) and gone once it ends."""
    import batchsum
    from tests.support import KEY, article

    path = tmp_path / "budget.sqlite"
    seen: list[list[str]] = []

    def look(result):  # called on the run's loop: the file read as it is
        if len(seen) < 3:
            with sqlite3.connect(path) as db:
                seen.append([member for (member,) in db.execute("SELECT member FROM runs")])

    texts = [article(30, seed=i) for i in range(6)]
    results = asyncio.run(
        batchsum.summarize_texts(
            texts, api_key=KEY, base_url=svc.url, budget=f"sqlite://{path}", rpm=6000, progress=False, on_result=look
        )
    )
    assert all(r.status == "ok" for r in results)
    assert seen and all(len(members) == 1 for members in seen)
    after = asyncio.run(SQLiteBudget(path, _identity(svc)).runs())
    assert after == []


def _identity(svc):
    from batchsum.service.client import Client
    from tests.support import KEY

    with Client(api_key=KEY, base_url=svc.url) as client:
        return client.identity
