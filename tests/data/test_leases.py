"""Claims are leases: kept alive by the run that holds them, lapsed within ``CLAIM_SECONDS`` of its
death (at once when the holder was a process of this machine), on SQLite and Redis alike; an answer
that arrives after its claim lapsed is still kept."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from virtual_clock import run as run_virtual

from batchsum.data import journal as journal_module
from batchsum.data import stores
from batchsum.data.journal import RedisStore, SharedJournal
from batchsum.data.results import OK, Answer
from batchsum.data.stores import CLAIM_RENEW_SECONDS, CLAIM_SECONDS, Leases, claim_owner, holder_is_gone

ELSEWHERE = "another-host.example:4242:0123456789ab"
ANSWER = Answer("a summary", OK, None, None, 200, 1)


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(journal_module.time, "time", clock)
    return clock


def _held_elsewhere(path: Path) -> SharedJournal:
    holder = SharedJournal(path)
    holder._owner = ELSEWHERE  # a run on another machine: never judged from here
    return holder


def test_a_lease_on_another_machine_lapses_after_claim_seconds(tmp_path: Path, clock: _Clock) -> None:
    holder, waiter = _held_elsewhere(tmp_path / "j.sqlite"), SharedJournal(tmp_path / "j.sqlite")
    assert holder.claim("k")
    clock.now += CLAIM_SECONDS - 1
    assert not waiter.claim("k")
    clock.now += 2
    assert waiter.claim("k")  # the holder died (it stopped renewing): the waiter goes on
    assert not holder.claim("k")


def test_a_renewed_lease_holds(tmp_path: Path, clock: _Clock) -> None:
    holder, waiter = _held_elsewhere(tmp_path / "j.sqlite"), SharedJournal(tmp_path / "j.sqlite")
    assert holder.claim("k") and holder.claim("other")
    for _ in range(10):  # a slow answer: ten renewals, the lease never lapses
        clock.now += CLAIM_RENEW_SECONDS
        holder.renew(["k", "other"])
        assert not waiter.claim("k") and not waiter.claim("other")
    holder.release("k")
    assert waiter.claim("k")
    assert not waiter.claim("other")


def test_an_answer_after_its_lease_lapsed_is_kept(tmp_path: Path, clock: _Clock) -> None:
    holder, waiter = _held_elsewhere(tmp_path / "j.sqlite"), SharedJournal(tmp_path / "j.sqlite")
    assert holder.claim("k")
    clock.now += CLAIM_SECONDS + 1
    assert waiter.claim("k")
    holder.put("k", ANSWER)  # the late answer (paid for) is kept, and the waiter sees it
    assert waiter.get("k") == ANSWER
    holder.release("k")  # not the holder any more: the waiter's claim stays
    assert not SharedJournal(tmp_path / "j.sqlite").claim("k")


def _claim_in_a_process(code: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "claimed"
    return process


def test_a_killed_holder_on_this_machine_is_passed_over_at_once(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    process = _claim_in_a_process(
        f"""
        import time
        from batchsum.data.journal import SharedJournal
        journal = SharedJournal({str(path)!r})
        assert journal.claim("k")
        print("claimed", flush=True)
        time.sleep(600)
        """
    )
    waiter = SharedJournal(path)
    assert not waiter.claim("k")  # alive: its claim holds
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert waiter.claim("k")  # gone: taken over without waiting for the lease
    assert not SharedJournal(path).claim("k")  # and only one taker wins


def test_holder_is_gone_judges_only_this_machine() -> None:
    assert not holder_is_gone(claim_owner())  # this very process
    assert not holder_is_gone(ELSEWHERE)
    assert not holder_is_gone("garbage")
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = f"{claim_owner().split(':')[0]}:{finished.stdout.strip()}:ab"
    assert holder_is_gone(gone)


class _CountingStore:
    def __init__(self) -> None:
        self.renewed: list[list[str]] = []

    def renew(self, keys: list[str]) -> None:
        self.renewed.append(sorted(keys))


def test_leases_renew_what_is_held_while_it_is_held() -> None:
    async def main() -> list[list[str]]:
        store = _CountingStore()
        leases = Leases(store)  # type: ignore[arg-type]
        leases.hold("a")
        leases.hold("b")
        await asyncio.sleep(CLAIM_RENEW_SECONDS * 2 + 0.5)
        leases.drop("a")
        await asyncio.sleep(CLAIM_RENEW_SECONDS)
        leases.drop("b")
        await asyncio.sleep(CLAIM_RENEW_SECONDS * 3)  # nothing held: no more renewals, the keeper ends
        assert leases._keeper is not None and leases._keeper.done()
        leases.close()
        return store.renewed

    assert run_virtual(main()) == [["a", "b"], ["a", "b"], ["b"]]


def test_the_lease_outlives_the_poll_and_lapses_well_within_30_seconds() -> None:
    assert stores.CLAIM_POLL_SECONDS < CLAIM_RENEW_SECONDS < CLAIM_SECONDS <= 30


def test_redis_leases(redis_url: str) -> None:
    pytest.importorskip("redis")
    import redis

    identity = f"leases-{claim_owner().split(':')[2]}"
    holder, waiter = RedisStore(redis_url, identity), RedisStore(redis_url, identity)
    raw = redis.Redis.from_url(redis_url)
    name = f"batchsum:answers:{{{identity}}}:claim:k"
    try:
        assert holder.claim("k") and not waiter.claim("k")
        raw.pexpire(name, 1000)  # most of the lease gone
        holder.renew(["k"])
        assert raw.pttl(name) > 1000  # renewed to a whole lease
        waiter.renew(["k"])  # not its claim: untouched
        assert raw.get(name) == holder._owner.encode()
        holder.release("k")
        assert waiter.claim("k")
        # A holder of this machine whose process is gone is passed over at once.
        finished = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
        )
        raw.set(name, f"{claim_owner().split(':')[0]}:{finished.stdout.strip()}:ab", px=int(CLAIM_SECONDS * 1000))
        assert holder.claim("k")
        assert raw.get(name) == holder._owner.encode()
        raw.set(name, ELSEWHERE, px=int(CLAIM_SECONDS * 1000))
        assert not holder.claim("k")  # elsewhere: its lease must lapse
    finally:
        raw.delete(name)
        raw.close()
        holder.close()
        waiter.close()
