"""What ``--rpm auto`` shares through the key's budget, on each kind of budget (this process, a real
SQLite file, a real redis-server): the key's ledger (starts when committed, answers at the tick of the
start they answer), the lead of the key's search (one holder; renewed; lapsing when its holder stops;
its state kept for a successor), a shared pace and state that expire, ``forget`` clearing them, and a
budget whose clock is stepped forward or back."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from batchsum.pacing.budgets import exchange, gcra
from batchsum.pacing.budgets.budget import RedisBudget, Report, SQLiteBudget
from batchsum.pacing.budgets.ledger import TICK, Ledger, Tally, tick_of


def run(coro):
    return asyncio.run(coro)


async def closing(budget, call):
    try:
        return await call(budget)
    finally:
        await budget.aclose()


# -- the key's ledger --------------------------------------------------------------------------------


def test_starts_are_counted_when_committed_and_answers_at_the_tick_of_their_start(users):
    async def main():
        a, b = users(), users()
        for _ in range(3):
            assert (await a.reserve(0.0)).committed
        await b.reserve(0.0, Report(answered=(0.0, 0.0), refused=(0.0,)), start=False)
        await asyncio.sleep(0.35)
        # Answers told 0.3 s after their starts land on the ticks of those starts, whoever tells them.
        await b.reserve(0.0, Report(answered=(0.3,)), start=False)
        slot = await b.look()
        ledger = await a.ledger()
        await a.aclose()
        await b.aclose()
        return slot, ledger

    slot, ledger = run(main())
    assert (slot.starts, slot.answered, slot.refused) == (3, 3, 1)
    now = ledger.now
    assert ledger.started(now - 5, now + 1) == 3
    assert ledger.admitted(now - 5, now + 1) == 3 and ledger.refusals(now - 5, now + 1) == 1
    # Every answer went to the ticks the starts are on (within a tick), none to the last 0.2 s.
    assert ledger.admitted(now - 0.2, now + 1) == 0
    assert ledger.first_refused(now - 5) is not None and ledger.pending(now - 5, now + 1) == 0


def test_the_trailing_minute_is_summed_from_the_tick_a_minute_back_on_every_budget(users):
    """The counts a reservation returns cover the 60 s before it to the tick, on Redis as on SQLite
    (Redis summed whole seconds: up to 61 s, a cap held up to 1.7% low while verifying)."""

    async def main():
        budget = users()
        try:
            ages = (59.6, 59.8, 60.2, 60.4, 60.6, 60.8, 61.5)
            return await budget.reserve(0.0, Report(answered=ages, refused=ages), start=False)
        finally:
            await budget.aclose()

    slot = run(main())
    assert (slot.answered, slot.refused) == (2, 2)


def test_a_ledger_sums_a_span_with_its_edge_ticks_shared_out_and_tells_what_is_answered():
    tallies = [Tally(t, starts=4, answered=4 if t < 50 else 0) for t in range(100)]
    ledger = Ledger.of(10.0, tallies, 10.0)
    assert ledger.started(0.0, 10.0) == 400
    assert ledger.started(1.05, 2.05) == 40  # half a tick at each end
    assert ledger.started(0.02, 0.07) == 2  # within one tick
    assert ledger.admitted(4.0, 6.0) == 40 and ledger.pending(4.0, 6.0) == 40
    assert ledger.answered_until(0.0) == pytest.approx(50 * TICK)
    assert ledger.first_admitted(3.0) == pytest.approx(3.0) and ledger.last_admitted(0.0) == pytest.approx(5.0)
    assert tick_of(0.3) == 3  # not 2 (0.3 / 0.1 is 2.9999...)


# -- the lead ----------------------------------------------------------------------------------------


def test_one_run_leads_the_search_the_others_see_its_state_and_it_renews_its_lease(users):
    async def main():
        a, b = users(), users()
        first = await a.lead("a", '{"level": 90}')
        second = await b.lead("b", '{"level": 400}')  # not b's to publish
        renewed = await a.lead("a")
        views = first, second, renewed
        await a.aclose()
        await b.aclose()
        return views

    first, second, renewed = run(main())
    assert first.holder == second.holder == renewed.holder == "a"
    assert second.state == renewed.state == '{"level": 90}'


def test_a_lead_let_go_passes_at_once_and_keeps_the_state_for_the_next(users):
    async def main():
        a, b = users(), users()
        await a.lead("a", '{"level": 135}')
        await a.lead("a", '{"level": 202}', release=True)
        taken = await b.lead("b")
        await a.aclose()
        await b.aclose()
        return taken

    taken = run(main())
    assert taken.holder == "b" and taken.state == '{"level": 202}'


def test_a_lead_whose_holder_stops_renewing_it_lapses(users, monkeypatch):
    # The lease is shortened for the test (the budget's own clock decides; Redis reads its TIME).
    monkeypatch.setattr(exchange, "LEASE_SECONDS", 0.3)
    for module in (
        "batchsum.pacing.budgets.budget",
        "batchsum.pacing.budgets.sqlite_budget",
        "batchsum.pacing.budgets.redis_budget",
    ):
        monkeypatch.setattr(f"{module}.LEASE_SECONDS", 0.3)

    async def main():
        a, b = users(), users()
        first = await a.lead("a", '{"level": 60}')
        held = await b.lead("b")
        await asyncio.sleep(0.5)  # a died: no renewal
        taken = await b.lead("b")
        await a.aclose()
        await b.aclose()
        return first, held, taken

    first, held, taken = run(main())
    # The budget's own clock says how long after a's lead b asked (a busy machine may let more than
    # the lease pass between the two calls): within the lease, a holds it; after it, b takes it.
    asked_after = held.now - first.now
    if asked_after < 0.3 - 0.01:
        assert held.holder == "a"
    elif asked_after > 0.3 + 0.01:
        assert held.holder == "b"
    assert taken.now - first.now > 0.3 and taken.holder == "b" and taken.state == '{"level": 60}'


def test_a_shared_pace_or_state_not_written_for_five_minutes_is_nobodys(tmp_path, monkeypatch):
    clock = [time.time()]
    monkeypatch.setattr("batchsum.pacing.budgets.sqlite_budget.time.time", lambda: clock[0])
    budget = SQLiteBudget(tmp_path / "budget.sqlite", "id")

    async def main():
        await budget.reserve(0.0, Report(pace=240.0))
        await budget.lead("a", '{"level": 240}', release=True)
        fresh = await budget.look(), await budget.lead("b")
        clock[0] += exchange.SHARED_SECONDS + 1
        stale = await budget.look(), await budget.lead("c")
        await budget.aclose()
        return fresh, stale

    (slot, lead), (stale_slot, stale_lead) = run(main())
    assert slot.pace == 240.0 and lead.state == '{"level": 240}'
    assert stale_slot.pace is None and stale_lead.state is None and stale_lead.holder == "c"


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_forgetting_a_key_clears_its_budgets_pace_counts_and_search(kind, tmp_path, request):
    if kind == "sqlite":
        budget = SQLiteBudget(tmp_path / "budget.sqlite", uuid.uuid4().hex)
    else:
        budget = RedisBudget(request.getfixturevalue("redis_url"), uuid.uuid4().hex)

    async def main():
        await budget.check()  # as a run does: the budget checked (made), then its key's record recalled
        await budget.recall("keyhash", "https://svc")
        await budget.remember("keyhash", "https://svc", {"limit": '{"rpm": 240, "how": "found"}', "answered:1": ""})
        await budget.reserve(0.0, Report(pace=240.0, answered=(0.0,)))
        await budget.lead("a", '{"level": 240}')
        before = await budget.look(), await budget.ledger(), await budget.lead("b")
        gone = await budget.forget("keyhash", "https://svc")
        after = await budget.look(), await budget.ledger(), await budget.lead("b"), await budget.recall("k", "s")
        await budget.aclose()
        return before, gone, after

    (slot, ledger, lead), gone, (slot2, ledger2, lead2, left) = run(main())
    assert slot.pace == 240.0 and ledger.admitted(ledger.now - 60, ledger.now + 1) == 1 and lead.state
    assert gone == 2 and left == []
    assert slot2.pace is None and ledger2.admitted(ledger2.now - 60, ledger2.now + 1) == 0
    assert lead2.holder == "b" and lead2.state is None


# -- a clock stepped forward or back -----------------------------------------------------------------


@pytest.mark.parametrize("step", [-300.0, 30.0])
def test_a_machine_budget_whose_clock_is_stepped_neither_stalls_nor_bursts(step, tmp_path, monkeypatch):
    """An NTP step back five minutes (or a resumed machine's clock set forward) mid-run: the next
    start is an interval after the last one, on the new clock, not five minutes later, nor at once
    with the one before."""
    clock = [1_800_000_000.0]
    monkeypatch.setattr("batchsum.pacing.budgets.sqlite_budget.time.time", lambda: clock[0])
    budget = SQLiteBudget(tmp_path / "budget.sqlite", "id")
    interval = 0.5

    async def main():
        starts = []
        for i in range(6):
            if i == 3:
                clock[0] += step
            slot = await budget.reserve(interval)
            while not slot.committed:
                clock[0] += slot.wait
                slot = await budget.commit(interval)
            starts.append(clock[0])
        await budget.aclose()
        return starts

    starts = run(main())
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    stepped = gaps.pop(2) - step  # the gap across the step, on the old clock
    assert all(gap == pytest.approx(interval) for gap in gaps), gaps
    assert stepped <= interval + 1e-6  # no stall: the schedule moved with the clock
    if step > 0:
        assert gaps[2] >= interval - 1e-6  # and no burst after a step forward


def test_the_gcra_state_moves_its_schedule_back_with_the_clock():
    state = gcra.State(tat=1000.5, last=1000.0, paused_until=1000.2, updated=1000.0)
    at, committed, _, _ = state.advance(700.0, 0.5, Report(), exchange.RESERVE)
    assert at == pytest.approx(700.5) and not committed  # an interval after the last start, moved back
    assert state.paused_until == pytest.approx(700.2)


# -- where a limit came from, handed over ------------------------------------------------------------


def _auto(cap: float = 1e6, remembered=None):
    from batchsum.pacing.auto.limit import AutoLimit

    return AutoLimit(cap, remembered, wall=lambda: 1_790_000_000.0)


def _settled(how: str, value: float = 240.0):
    """A leader's limit, known ``how`` (found by its search, or stated by its service)."""
    from batchsum.pacing.auto.search import Settle

    leader = _auto()
    from batchsum.pacing.auto.limit import stated

    if how == "stated":
        stated(leader, value)
    else:
        leader._settle(*Settle(value, "found"), 0.0)
    return leader


@pytest.mark.parametrize("resume", [False, True])
def test_a_limit_another_runs_search_found_is_followed_never_found_or_stated_by_this_run(resume):
    from batchsum.pacing.auto.handover import published, taken_on

    follower = _auto()
    assert taken_on(follower, published(_settled("found")), resume=resume)
    assert follower.value == 240 and follower.source.kind == "followed"
    assert follower.source.detail().startswith("found ") and "by a search; followed from another run" in (
        follower.source.detail()
    )
    # Handed on again (the follower leads later): still another run's finding.
    third = _auto()
    assert taken_on(third, published(follower), resume=True) and third.source.kind == "followed"


def test_a_limit_another_runs_service_stated_is_followed_until_this_runs_own_answers_state_it():
    """Issue 48 item 5: the published state carried "stated by the service" for 300 s, and a run whose
    service stated nothing read it as its own."""
    from batchsum.pacing.auto.handover import published, taken_on
    from batchsum.pacing.auto.limit import heard

    state = published(_settled("stated", 300.0))
    silent = _auto()
    assert taken_on(silent, state, resume=True)
    assert silent.source.kind == "followed" and silent.source.detail().startswith("stated by the service ")
    assert silent.describe().startswith("300/min (stated by the service ") and "followed from another run" in (
        silent.describe()
    )
    heard(silent, 600.0)  # its own service states another limit: not what it follows
    assert silent.source.kind == "followed"
    heard(silent, 300.0)  # ... and now the same one: stated to this run too
    assert silent.source.kind == "stated"
    heard_first = _auto()
    heard_first.heard = 300.0
    assert taken_on(heard_first, state) and heard_first.source.kind == "stated"


def test_a_remembered_limit_stays_remembered_and_a_lower_cap_is_capped_when_taken_on():
    from batchsum.pacing.auto.handover import published, taken_on
    from batchsum.pacing.auto.limit import Found

    leader = _auto(remembered=Found(240.0, "found", 1_780_000_000.0))
    assert leader.source.kind == "remembered"
    follower, capped = _auto(), _auto(cap=120.0)
    assert taken_on(follower, published(leader)) and follower.source == leader.source
    assert taken_on(capped, published(leader)) and capped.value == 120 and capped.source.kind == "capped"
    assert capped.source.detail().startswith("the cap (auto:120); the key's record: found ")


def test_a_state_an_older_version_published_is_read_as_followed():
    import json

    from batchsum.pacing.auto.handover import published, taken_on

    data = json.loads(published(_settled("found")))
    data["source"] = "stated by the service"  # the text an older version published
    follower = _auto()
    assert taken_on(follower, json.dumps(data)) and follower.source.kind == "followed"


def test_every_source_reads_one_vocabulary_and_survives_its_json():
    from batchsum.pacing.auto.sources import KINDS, Source

    for kind in KINDS:
        source = Source(kind, "found", 1_790_000_000.0, 120.0 if kind == "capped" else None)
        assert Source.from_data(json.loads(json.dumps(source.data()))) == source
        assert source.detail() and "\n" not in source.detail()
    assert Source.configured().detail().startswith("configured")


def test_what_the_runs_on_a_key_may_send_together_is_their_shares_summed_at_most_one():
    from types import SimpleNamespace

    from batchsum.pacing.budgets.budget import ProcessBudget
    from batchsum.pacing.search_lead import key_share

    class Registry(ProcessBudget):
        def __init__(self, shares):
            super().__init__()
            self.shares = shares

        async def runs(self):
            return [SimpleNamespace(share=share) for share in self.shares]

    assert run(key_share(ProcessBudget(), 0.5)) == 0.5  # no registry: this run alone
    assert run(key_share(Registry([0.3, 0.3]), 0.3)) == pytest.approx(0.6)
    assert run(key_share(Registry([0.3, None]), 0.3)) == 1.0  # a run without a share: the whole key
    assert run(key_share(Registry([0.7, 0.6]), 0.7)) == 1.0  # at most the key's pace
    assert run(key_share(Registry([]), 0.4)) == 0.4  # this run's entry not published yet

    class Plain(Registry):  # entries as plain JSON
        async def runs(self):
            return [{"share": share} for share in self.shares]

    assert run(key_share(Plain([0.25, 0.25]), 0.25)) == 0.5 and run(key_share(Plain([0.25, None]), 0.25)) == 1.0
