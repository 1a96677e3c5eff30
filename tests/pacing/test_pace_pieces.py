"""The pieces of ``batchsum.pacing``, each against the invariant its docstring states: the spacing
rule's arithmetic, the pause and ramp, stated room and its distrust, who is alone on a budget, and
the key's record (proof and distrust from run to run). Pure values and a fake clock: no loop."""

from __future__ import annotations

import bisect
import math
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from batchsum.pacing import JITTER_MARGIN, KeyRecord, interval_of, max_starts
from batchsum.pacing.budgets.budget import ProcessBudget, Remembered, Slot
from batchsum.pacing.pause import RAMP_START, Pause
from batchsum.pacing.stated_room import ALONE_AFTER, Company, StatedRoom


def most_in_half_open_window(times: list[float], window: float) -> int:
    """The most of ``times`` in any [t, t + window): the densest such window starts at a time."""
    times = sorted(times)
    return max((bisect.bisect_left(times, t + window) - i for i, t in enumerate(times)), default=0)


# -- spacing --------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    rpm=st.floats(min_value=1, max_value=60_000),
    extra=st.lists(st.floats(min_value=0, max_value=5), min_size=1, max_size=60),
    window=st.floats(min_value=1e-3, max_value=600),
)
def test_starts_an_interval_apart_hold_at_most_the_plans_count_in_any_window(rpm, extra, window):
    """The rule's arithmetic: starts at least ``interval_of(rpm)`` apart (however much later each one
    goes out) never put more than ``ceil(rpm * w / 60)`` in a half-open window of w seconds."""
    step = interval_of(rpm)
    starts, t = [], 0.0
    for late in extra:
        starts.append(t)
        t += step * (1 + late)
    assert most_in_half_open_window(starts, window) <= max_starts(rpm, window)


def test_the_interval_is_the_plans_and_a_little_more():
    assert interval_of(600) == 0.1 * (1 + JITTER_MARGIN)
    assert interval_of(0) == 0.0
    assert max_starts(600, 1) == 10 and max_starts(600, 60) == 600 and max_starts(600, 0.05) == 1


# -- pause and ramp --------------------------------------------------------------------------------


@given(st.lists(st.tuples(st.floats(0, 1000), st.booleans()), max_size=30))
def test_a_pause_only_ever_ends_later_and_the_ramp_only_widens(holds):
    pause = Pause()
    latest = -math.inf
    for until, started in holds:
        pause.hold(until, "why")
        latest = max(latest, until)
        assert pause.until == latest
        if started:
            pause.started(0.0)
        assert 1.0 <= pause.ramp <= RAMP_START


def test_a_429_without_a_retry_after_backs_off_more_with_each_episode_and_never_waits_zero():
    pause = Pause()
    waits = [pause.after_429(None, new_episode=True)[0] for _ in range(6)]
    assert all(w > 0 for w in waits) and waits[-1] > waits[0]
    assert pause.after_429(7.0, new_episode=False) == (7.0, "the service answered 429 (Retry-After 7)")
    pause.clean_answer()
    assert pause.episodes == 0


# -- stated room ------------------------------------------------------------------------------------


class Said:
    def __init__(self, remaining, reset, per_minute=None):
        self.remaining, self.reset, self.per_minute = remaining, reset, per_minute


def test_room_is_what_was_stated_less_our_starts_the_service_may_not_have_counted():
    room = StatedRoom()
    starts = [0.0, 0.1, 0.2, 0.3]  # the stating attempt started at 0.1; 0.2 and 0.3 came after it
    assert room.note(Said(10, 30), 0.1, 0.5, starts, wire=[0.0])  # 0.0 is on the wire from before
    assert room.left(0.5) == 10 - 2 - 1
    for _ in range(7):
        room.used(0.6)
    assert room.left(0.6) == 0 and math.isclose(room.reset_wait(0.6), 29.9)  # used up: nothing before the reset
    assert room.left(0.1 + 30) == 0  # and it expires at the earliest reset


def test_a_429_while_room_is_stated_distrusts_every_later_statement():
    room = StatedRoom()
    room.note(Said(100, 10), 0.0, 0.1, [0.0], wire=[])
    assert room.refused(0.2)  # news: the statement was contradicted
    assert not room.trusted and room.contradicted
    assert not room.note(Said(100, 10), 1.0, 1.1, [0.0, 1.0], wire=[]) and room.left(1.1) == 0
    assert room.reset_wait(1.1) == 0  # an untrusted statement never stalls the run either


def test_a_429_when_no_room_is_stated_is_no_contradiction():
    room = StatedRoom()
    assert not room.refused(0.0) and room.trusted
    room.note(Said(0, 5), 0.0, 0.1, [0.0], wire=[])
    assert not room.refused(0.2) and room.trusted  # "none left" and then a 429 agree


def test_room_a_record_distrusts_is_never_used():
    room = StatedRoom(trusted=False)
    assert not room.note(Said(100, 10), 0.0, 0.1, [0.0], wire=[]) and room.left(0.1) == 0


def slot(wait=0.0, starts=0, deferred=False):
    return Slot(
        wait=wait, at=None, paused_for=0, pause_mark=0, pause_reason=None, pace=None, pace_version=0,
        starts=starts, refused=0, deferred=deferred,
    )  # fmt: skip


def test_a_run_is_alone_until_the_budget_shows_another_users_starts_or_reservations():
    company = Company(shared=True)
    ours = [0.0, 0.1]
    company.look(slot(starts=2), 0.2, ours)
    assert company.alone(0.2)
    company.look(slot(starts=5), 0.3, ours)  # more starts on the key than ours
    assert not company.alone(0.3) and company.alone(0.3 + ALONE_AFTER + 1)
    late = Company(shared=True)
    late.look(slot(wait=0.0), 1.0, [], reserved=0.1)
    late.started(1.0, 0.1)
    late.look(slot(wait=0.5), 1.05, [1.0], reserved=0.1)  # ours was due at 1.1: someone reserved ahead
    assert not late.alone(1.1)
    assert Company(shared=False).alone(0.0)


# -- the key's record -------------------------------------------------------------------------------


def record(*entries: tuple[str, float]) -> KeyRecord:
    now = time.time()
    return KeyRecord(ProcessBudget(), "k", "s", [Remembered("k", "s", n, "", now - age) for n, age in entries])


def test_a_key_is_proven_by_an_answer_in_its_mode_within_a_day_not_refused_since():
    assert record(("answered:1", 60)).proven(1) is not None
    assert record(("answered:1", 60)).proven(2) is None
    assert record(("answered:1", 90_000)).proven(1) is None
    assert record(("answered:1", 60), ("refused", 30)).proven(1) is None
    assert record(("answered:1", 30), ("refused", 60)).proven(1) is not None  # answered again since
    assert record(("answered:2", 60), ("refused:2", 30)).proven(2) is None
    assert record(("answered:1", 60), ("refused:2", 30)).proven(1) is not None


def test_a_records_notes_wait_for_a_flush_and_a_budget_that_remembers_nothing_loses_them_quietly():
    import asyncio

    rec = record()
    rec.answered(1)
    rec.room_contradicted()
    assert rec.pending == {"answered:1": "", "room_contradicted": ""}
    asyncio.run(rec.flush())
    assert rec.pending == {}
    assert record(("room_contradicted", 10)).room_distrusted and not record().room_distrusted
