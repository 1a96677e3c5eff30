"""Claims are leases: kept alive by the run that holds them, lapsed within ``CLAIM_SECONDS`` of its
death as the machine's monotonic clock counts (a wall clock stepped either way changes nothing), at
once when the holder was surely a dead process of this machine; a holder in another container
sharing the host name is never judged from here. On SQLite and Redis alike; an answer that arrives
after its claim lapsed is still kept."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from virtual_clock import run as run_virtual

from batchsum.data import leases
from batchsum.data.journal import SharedJournal
from batchsum.data.leases import (
    CLAIM_LOOK_FIRST,
    CLAIM_LOOK_MOST,
    CLAIM_RENEW_SECONDS,
    CLAIM_SECONDS,
    Holder,
    Leases,
    claim_owner,
    holder_is_gone,
    lapsed,
)
from batchsum.data.redis_store import RedisStore
from batchsum.data.results import OK, Answer
from batchsum.service.errors import JournalError
from tests.support import need

ANSWER = Answer("a summary", OK, None, None, 200, 1)
ROOT = Path(__file__).parents[2]


class _Clocks:
    """The monotonic and the wall clock, moved by the test (``leases.now``)."""

    def __init__(self) -> None:
        self.mono = 5_000.0
        self.wall = 1_000_000.0

    def __call__(self) -> tuple[float, float]:
        return self.mono, self.wall

    def tick(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> _Clocks:
    clocks = _Clocks()
    monkeypatch.setattr(leases, "now", clocks)
    return clocks


def _elsewhere() -> Holder:
    """A run on another machine: another boot id, another machine, another pid namespace."""
    return dataclasses.replace(Holder.new(), host="another-host", machine="0" * 16, boot="another-boot", pids="1")


def _as(journal: SharedJournal, holder: Holder) -> SharedJournal:
    journal._claims.holder = holder
    journal._claims._text = holder.text()
    return journal


def _dead_pid() -> int:
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(finished.stdout)


def test_a_lease_on_this_machine_lapses_after_claim_seconds_of_its_monotonic_clock(tmp_path, clocks):
    holder, waiter = SharedJournal(tmp_path / "j.sqlite"), SharedJournal(tmp_path / "j.sqlite")
    assert holder.claim("k")
    clocks.tick(CLAIM_SECONDS - 1)
    assert not waiter.claim("k")
    clocks.tick(2)
    assert waiter.claim("k")  # the holder stopped renewing: the waiter goes on
    assert not holder.claim("k")


def test_a_wall_clock_stepped_forward_lapses_no_live_lease(tmp_path, clocks):
    holder, waiter = SharedJournal(tmp_path / "j.sqlite"), SharedJournal(tmp_path / "j.sqlite")
    assert holder.claim("k")
    clocks.wall += 30  # NTP, a person: 30 s forward in an instant
    assert not waiter.claim("k")
    clocks.wall += 3600
    assert not waiter.claim("k")  # an hour: still nothing lapsed, the monotonic clock did not move
    clocks.tick(CLAIM_RENEW_SECONDS)
    holder.renew(["k"])
    clocks.tick(CLAIM_SECONDS - 1)
    assert not waiter.claim("k")


def test_a_wall_clock_stepped_back_keeps_no_dead_lease(tmp_path, clocks):
    holder, waiter = SharedJournal(tmp_path / "j.sqlite"), SharedJournal(tmp_path / "j.sqlite")
    assert holder.claim("k")
    clocks.wall -= 300  # five minutes back: by the wall clock the lease would last 5 min 20 s
    clocks.mono += CLAIM_SECONDS + 1
    assert waiter.claim("k")  # its holder stopped renewing CLAIM_SECONDS ago: no stall


def test_a_renewed_lease_holds(tmp_path, clocks):
    holder, waiter = SharedJournal(tmp_path / "j.sqlite"), SharedJournal(tmp_path / "j.sqlite")
    assert holder.claim("k") and holder.claim("other")
    for _ in range(10):  # a slow answer: ten renewals, the lease never lapses
        clocks.tick(CLAIM_RENEW_SECONDS)
        holder.renew(["k", "other"])
        assert not waiter.claim("k") and not waiter.claim("other")
    holder.release("k")
    assert waiter.claim("k")
    assert not waiter.claim("other")
    assert not waiter.claim("k")  # held by this very run already: not won twice


def test_a_lease_from_another_machine_lapses_by_its_own_wall_clock_expiry(tmp_path, clocks):
    holder, waiter = _as(SharedJournal(tmp_path / "j.sqlite"), _elsewhere()), SharedJournal(tmp_path / "j.sqlite")
    assert holder.claim("k")
    clocks.mono += 3600  # this machine's monotonic clock says nothing of another machine's
    clocks.wall += CLAIM_SECONDS - 1
    assert not waiter.claim("k")
    clocks.wall += 2
    assert waiter.claim("k")


def test_a_lease_from_another_boot_of_this_machine_has_lapsed(tmp_path, clocks):
    before = dataclasses.replace(Holder.new(), boot="the-boot-before")
    holder, waiter = _as(SharedJournal(tmp_path / "j.sqlite"), before), SharedJournal(tmp_path / "j.sqlite")
    assert holder.claim("k")
    assert waiter.claim("k")  # the machine rebooted since: at once, whatever either clock says


def test_lapsed_reads_the_boot_then_the_machine_then_the_wall_clock():
    here = Holder.new()
    at = (100.0, 1_000.0)
    assert not lapsed(here, 100.0 - CLAIM_SECONDS + 1, 0.0, at)  # same boot: the monotonic age, not the expiry
    assert lapsed(here, 100.0 - CLAIM_SECONDS - 1, 10_000.0, at)
    assert lapsed(dataclasses.replace(here, boot="other"), 100.0, 10_000.0, at)  # another boot here
    other_clock = dataclasses.replace(here, clocks="another-time-namespace")
    assert not lapsed(other_clock, -1e9, 1_001.0, at) and lapsed(other_clock, 1e9, 999.0, at)
    assert not lapsed(_elsewhere(), -1e9, 1_001.0, at) and lapsed(_elsewhere(), 1e9, 999.0, at)
    assert not lapsed("host:123:abcdef", 0.0, 1_001.0, at) and lapsed("host:123:abcdef", 0.0, 999.0, at)


def test_an_answer_after_its_lease_lapsed_is_kept(tmp_path, clocks):
    holder, waiter = SharedJournal(tmp_path / "j.sqlite"), SharedJournal(tmp_path / "j.sqlite")
    assert holder.claim("k")
    clocks.tick(CLAIM_SECONDS + 1)
    assert waiter.claim("k")
    holder.put("k", ANSWER)  # the late answer (paid for) is kept, and the waiter sees it
    assert waiter.get("k") == ANSWER
    holder.release("k")  # not the holder any more: the waiter's claim stays
    assert not SharedJournal(tmp_path / "j.sqlite").claim("k")


def test_a_release_that_fails_keeps_the_claim_held_renewed_and_let_go_by_the_next(tmp_path, clocks):
    path = tmp_path / "j.sqlite"
    holder, waiter = SharedJournal(path), SharedJournal(path)
    assert holder.claim("k")
    holder._db.execute("PRAGMA busy_timeout=0")
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process writing: the release's delete cannot
    with pytest.raises(JournalError, match="locked"):
        holder.release("k")
    writer.execute("ROLLBACK")
    writer.close()
    clocks.tick(CLAIM_SECONDS - 1)
    holder.renew(["k"])  # still held: renewed
    clocks.tick(CLAIM_SECONDS - 1)
    assert not waiter.claim("k")
    holder.release("k")  # the next release lets it go
    assert waiter.claim("k")


def test_only_the_claims_a_run_holds_are_renewed_and_its_own_row_it_let_go_is_taken_back(tmp_path, clocks):
    path = tmp_path / "j.sqlite"
    holder, waiter = SharedJournal(path), SharedJournal(path)
    assert holder.claim("k") and holder.claim("gone")
    holder._claims.held.discard("gone")  # let go of in its books, its row left behind
    clocks.tick(CLAIM_SECONDS - 1)
    holder.renew(["k"])
    clocks.tick(2)
    assert not waiter.claim("k")  # renewed
    assert waiter.claim("gone")  # not renewed: lapsed
    assert not holder.claim("k")  # held already: not won twice
    assert holder.claim("mine")
    holder._claims.held.discard("mine")
    assert holder.claim("mine")  # its own row it no longer holds: taken back, never waited on
    assert not waiter.claim("mine")


def _claim_in_a_process(code: str, prefix: list[str] | None = None) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [*(prefix or []), sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "claimed"
    return process


def test_a_killed_holder_on_this_machine_is_passed_over_at_once(tmp_path):
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


def test_holder_is_gone_only_when_surely_a_dead_process_of_this_machine():
    here = Holder.new()
    assert not holder_is_gone(claim_owner())  # this very process
    assert not holder_is_gone(_elsewhere())
    assert not holder_is_gone("garbage") and not holder_is_gone(None)
    assert not holder_is_gone(f"{here.host}:{_dead_pid()}:ab")  # an older batchsum's: says nothing of its boot
    dead = dataclasses.replace(here, pid=_dead_pid())
    assert holder_is_gone(dead)
    # Another container sharing the host name (and the kernel: the same boot id), in its own pid
    # namespace: its pid means nothing here, dead or alive.
    assert not holder_is_gone(dataclasses.replace(dead, pids="4026532999"))
    assert not holder_is_gone(dataclasses.replace(here, pid=1, pids="4026532999"))
    # Another boot: the pid is not that process's.
    assert not holder_is_gone(dataclasses.replace(dead, boot="another-boot"))
    # A pid taken again by a process started at another time: the holder is gone.
    parent = dataclasses.replace(here, pid=os.getppid())
    assert not holder_is_gone(dataclasses.replace(parent, started=leases._started(os.getppid())))
    assert holder_is_gone(dataclasses.replace(parent, started=(leases._started(os.getppid()) or 0) + 1))
    assert not holder_is_gone(dataclasses.replace(parent, started=None))  # no start time: not sure


def test_the_start_time_is_read_past_a_command_name_with_spaces_and_parentheses(tmp_path):
    script = tmp_path / "a name) with (parens"
    shutil.copy(sys.executable, script)
    process = subprocess.Popen([str(script), "-c", "import time; time.sleep(30)"])
    try:
        started = leases._started(process.pid)
        assert started is not None and started >= (leases._started(os.getpid()) or 0)
    finally:
        process.kill()
        process.wait()


class _CountingStore:
    def __init__(self) -> None:
        self.renewed: list[list[str]] = []

    def renew(self, keys: list[str]) -> None:
        self.renewed.append(sorted(keys))


def test_leases_renew_what_is_held_while_it_is_held() -> None:
    async def main() -> list[list[str]]:
        store = _CountingStore()
        leases = Leases(store)
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


def test_a_waiting_look_comes_well_within_a_lease_and_the_lease_lapses_within_30_seconds() -> None:
    assert CLAIM_LOOK_FIRST < CLAIM_LOOK_MOST <= CLAIM_RENEW_SECONDS < CLAIM_SECONDS <= 30


def _redis_pair(redis_url: str) -> tuple[RedisStore, RedisStore, object, str]:
    pytest.importorskip("redis")
    import redis

    service = f"https://leases-{os.urandom(6).hex()}.example"
    holder, waiter = RedisStore(redis_url, service), RedisStore(redis_url, service)
    return holder, waiter, redis.Redis.from_url(redis_url), f"batchsum:store:{{{service}}}:claim:k"


def test_redis_leases(redis_url: str) -> None:
    holder, waiter, raw, name = _redis_pair(redis_url)
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
        raw.set(name, dataclasses.replace(Holder.new(), pid=_dead_pid()).text(), px=int(CLAIM_SECONDS * 1000))
        assert holder.claim("k")
        assert raw.get(name) == holder._owner.encode()
        raw.set(name, _elsewhere().text(), px=int(CLAIM_SECONDS * 1000))
        assert not holder.claim("k")  # elsewhere: its lease must lapse
    finally:
        raw.delete(name)
        raw.close()
        holder.close()
        waiter.close()


def test_two_containers_sharing_a_host_name_on_one_redis_keep_their_live_claims(redis_url: str) -> None:
    """A holder with this host name and this boot id, in another pid namespace, whose pid is no
    process here: alive in its container, so its claim holds until its lease lapses."""
    holder, waiter, raw, name = _redis_pair(redis_url)
    try:
        container = dataclasses.replace(Holder.new(), pid=_dead_pid(), pids="4026532999")
        raw.set(name, container.text(), px=int(CLAIM_SECONDS * 1000))
        assert not waiter.claim("k")
        assert raw.get(name) == container.text().encode()
        raw.pexpire(name, 1)  # its lease lapsed (it died, or stopped renewing)
        while raw.exists(name):
            pass
        assert waiter.claim("k")
    finally:
        raw.delete(name)
        raw.close()
        holder.close()
        waiter.close()


def test_a_real_container_holding_a_claim_on_redis_is_not_taken_over(redis_url: str, tmp_path: Path) -> None:
    """The same, with a real pid namespace (``unshare --pid``): the holder runs as pid 1 of its own
    namespace, on this host name and this kernel."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--pid", "--fork", "true"], capture_output=True).returncode:
        need("a new pid namespace", "unshare from util-linux, run as root (or with user namespaces)")
    holder, waiter, raw, name = _redis_pair(redis_url)
    service = name.split("{")[1].split("}")[0]
    process = _claim_in_a_process(
        f"""
        import os, time
        from batchsum.data.redis_store import RedisStore
        store = RedisStore({redis_url!r}, {service!r})
        assert store.claim("k")
        print("claimed", flush=True)
        time.sleep(600)
        """,
        prefix=[unshare, "--pid", "--fork", "--mount-proc", "--kill-child"],
    )
    try:
        container = Holder.from_text(raw.get(name))
        assert container is not None and container.host == Holder.new().host and container.pids != Holder.new().pids
        assert not waiter.claim("k")  # alive in its container
        process.kill()
        process.wait()
        assert not waiter.claim("k")  # gone, but not surely from here: its lease lapses on its own
        raw.pexpire(name, 1)
        while raw.exists(name):
            pass
        assert waiter.claim("k")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        raw.delete(name)
        raw.close()
        holder.close()
        waiter.close()
