"""The pacer on a virtual clock: the window bound, no initial burst, shared 429 pauses, the ramp,
a lower pace after repeated 429s."""

import asyncio
import bisect
import random

import pytest

from batchsum.pacing import JITTER_MARGIN, Pacer, max_starts
from tests.virtual_clock import VirtualClock


def most_starts_in_any_window(starts, window):
    """The largest number of starts in a closed window [t, t + window], over every t."""
    starts = sorted(starts)
    return max(bisect.bisect_right(starts, s + window) - i for i, s in enumerate(starts))


def run_senders(rpm, senders, attempts_each, *, retry_share=0.0, rate_limit_at=(), retry_after=2.0, seed=1):
    """Senders that each make ``attempts_each`` requests; some attempts fail and are retried at once
    (every attempt goes through the pacer); attempts starting at the times in ``rate_limit_at`` get a 429."""
    clock = VirtualClock()
    pacer = Pacer(rpm, clock=clock.time, sleep=clock.sleep)
    starts, limited = [], []
    rng = random.Random(seed)
    pending_429 = sorted(rate_limit_at)

    async def sender():
        for _ in range(attempts_each):
            while True:
                started = await pacer.before_attempt()
                assert started == pytest.approx(clock.now)
                starts.append(started)
                await clock.sleep(0.3)  # the request takes a while
                if pending_429 and started >= pending_429[0]:
                    pending_429.pop(0)
                    limited.append(started)
                    pacer.after_rate_limit(started, retry_after)
                    continue
                if rng.random() < retry_share:
                    continue  # a 5xx: retried, and the retry is paced too
                break

    async def main():
        await asyncio.gather(*(sender() for _ in range(senders)))

    asyncio.run(clock.run(main()))
    return starts, limited, pacer


@pytest.mark.parametrize("rpm", [1, 7, 60, 250, 3000])
def test_no_window_ever_holds_more_than_its_share_plus_one(rpm):
    starts, _, _ = run_senders(rpm, senders=12, attempts_each=25, retry_share=0.3)
    assert len(starts) > 300
    for window in [0.01, 0.5, 1, 2.5, 7, 10, 30, 59.9, 60, 61, 120, 600]:
        assert most_starts_in_any_window(starts, window) <= max_starts(rpm, window), window


def test_the_first_minute_has_no_burst():
    starts, _, _ = run_senders(60, senders=50, attempts_each=3)
    assert most_starts_in_any_window(starts, 60) <= 61
    assert most_starts_in_any_window(starts, 1) <= 2
    gaps = [b - a for a, b in zip(sorted(starts), sorted(starts)[1:])]
    assert min(gaps) == pytest.approx(1 + JITTER_MARGIN)


def test_a_429_pauses_every_sender_until_retry_after_then_ramps_up():
    starts, limited, pacer = run_senders(120, senders=10, attempts_each=10, rate_limit_at=[10.0], retry_after=5.0)
    assert len(limited) == 1
    t429 = limited[0] + 0.3  # when the 429 answer arrived
    after = sorted(s for s in starts if s > t429)
    assert after[0] >= t429 + 5.0  # nobody started during the pause
    assert not [s for s in starts if t429 < s < t429 + 5.0]
    gaps = [b - a for a, b in zip(after, after[1:])]
    normal = 60 / 120 * (1 + JITTER_MARGIN)
    assert gaps[0] > 1.5 * normal  # the ramp starts slow ...
    assert gaps[-1] == pytest.approx(normal)  # ... and returns to the full pace
    assert pacer.pace == 120  # one episode: not yet a lower pace
    assert pacer.rate_limited == 1


def test_the_window_bound_holds_with_429s_and_retries_mixed_in():
    starts, limited, _ = run_senders(90, senders=8, attempts_each=30, retry_share=0.2,
                                     rate_limit_at=[20, 21, 40, 80.5, 81], retry_after=1.5)
    assert len(limited) == 5
    for window in [0.1, 1, 5, 30, 60, 90]:
        assert most_starts_in_any_window(starts, window) <= max_starts(90, window)


def test_repeated_429_episodes_lower_the_pace_and_report_it():
    clock = VirtualClock()
    reported = []
    pacer = Pacer(100, clock=clock.time, sleep=clock.sleep, on_pace_change=reported.append)

    async def main():
        first = await pacer.before_attempt()
        pacer.after_rate_limit(first, 1.0)  # episode 1: kept at 100 (maybe an earlier run's requests)
        pacer.after_rate_limit(first, 1.0)  # a straggler of the same episode: no new episode
        second = await pacer.before_attempt()
        pacer.after_rate_limit(second, 1.0)  # episode 2: the real limit is lower
        third = await pacer.before_attempt()
        pacer.after_rate_limit(third, None)  # episode 3, no Retry-After: a backoff pause, lower again

    asyncio.run(clock.run(main()))
    assert reported == [80.0, 64.0]
    assert pacer.pace == 64.0 and pacer.rate_limited == 4


def test_rpm_0_does_not_pace_but_still_shares_429_pauses():
    clock = VirtualClock()
    pacer = Pacer(0, clock=clock.time, sleep=clock.sleep)

    async def main():
        starts = [await pacer.before_attempt() for _ in range(5)]
        pacer.after_rate_limit(starts[-1], 3.0)
        starts.append(await pacer.before_attempt())
        return starts

    starts = asyncio.run(clock.run(main()))
    assert starts[:5] == [0.0] * 5 and starts[5] == 3.0


@pytest.mark.parametrize("rpm", [-1, float("nan")])
def test_an_invalid_rpm_is_refused(rpm):
    with pytest.raises(ValueError, match="invalid rpm"):
        Pacer(rpm)
