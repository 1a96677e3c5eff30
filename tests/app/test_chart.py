"""The run chart's arithmetic without a browser: ``series(timeline)`` turns a run's per-second rows
into the lines drawn. The rate line is requests started in the trailing window (the last minute,
or the run so far when shorter) per minute; the time axis is in seconds up to three minutes and in
minutes beyond, ticking on round values."""

import pytest

pytest.importorskip("bqplot")

from hypothesis import given
from hypothesis import strategies as st

from batchsum.app.chart import MAX_TICKS, TICK_STEPS, RunChart, axis_unit, round_ticks, series


def timeline(started_per_second: list[int], *, refused: dict[int, int] | None = None, rpm: float = 600.0) -> dict:
    """A timeline as ``Timeline.to_dict()`` gives it: one row per second that saw something."""
    refused = refused or {}
    rows = [
        [second, started, refused.get(second, 0), started]
        for second, started in enumerate(started_per_second)
        if started or refused.get(second)
    ]
    return {"rpm": rpm, "seconds": rows, "pace": [[0.0, rpm]], "pauses": []}


def test_a_20_second_run_at_600_a_minute_reads_600_not_200():
    lines = series(timeline([10] * 20))
    assert lines["unit"] == "seconds" and lines["end"] == 20
    assert list(lines["per_minute"]) == [600.0] * 21  # from time 0 to the end of second 20
    assert list(lines["x"]) == list(range(21))
    assert lines["done"][-1] == 200


def test_past_a_minute_the_window_is_the_trailing_minute():
    # 10 a second for a minute, then nothing for a minute: the line falls back to 0 over the second minute.
    lines = series(timeline([10] * 60 + [0] * 59 + [1]))
    rate = dict(zip(lines["x"], lines["per_minute"], strict=True))
    assert rate[60] == 600 and rate[90] == 300 and rate[119] == pytest.approx(10 * 1 * 60 / 60)
    assert rate[120] == 1  # one request in the last minute
    assert lines["unit"] == "seconds" and lines["ticks"] == [0, 15, 30, 45, 60, 75, 90, 105, 120]


def test_a_long_run_is_drawn_in_minutes_on_round_ticks():
    lines = series(timeline([1] * 600))  # ten minutes at 60 a minute
    assert lines["unit"] == "minutes" and lines["end"] == 10
    assert lines["ticks"] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert lines["x"][-1] == 10 and set(lines["per_minute"][1:]) == {60.0}
    day = series(timeline([0] * 86_399 + [1]))
    assert day["unit"] == "minutes" and day["ticks"][:3] == [0, 180, 360] and len(day["x"]) <= 1_600


def test_a_429_sits_on_the_rate_line_in_the_middle_of_its_second_and_pauses_keep_their_times():
    data = timeline([2, 2, 2, 2], refused={2: 1})
    data["pauses"] = [[2.3, 3.3, "the service answered 429 (Retry-After 1)"]]
    data["pace"] = [[0.0, 600.0], [2.3, 300.0]]
    lines = series(data)
    assert list(lines["refused_at"]) == [2.5] and list(lines["refused_rate"]) == [120.0]
    assert lines["pauses"] == [(2.3, 3.3, "the service answered 429 (Retry-After 1)")]
    assert lines["pace_x"] == [0.0, 2.3, 4.0] and lines["pace_y"] == [600.0, 300.0, 300.0]


def test_the_axis_covers_a_pause_that_outlasts_the_last_request():
    data = timeline([3])
    data["pauses"] = [[0.5, 30.0, "the service answered 429 (Retry-After 30)"]]
    lines = series(data)
    assert lines["end"] == 30 and lines["ticks"][-1] == 30 and lines["pace_x"][-1] == 30


def test_an_empty_timeline_draws_an_empty_second():
    lines = series({"rpm": 0, "seconds": [], "pace": [], "pauses": []})
    assert lines["unit"] == "seconds" and lines["end"] == 1 and list(lines["per_minute"]) == [0.0, 0.0]


def test_the_chart_labels_its_axis_by_the_unit_it_draws():
    chart = RunChart()
    chart.update(timeline([10] * 20), total=200)
    axis = chart.figure.axes[0]
    assert axis.label == "seconds since the start" and list(axis.tick_values) == list(range(0, 21, 2))
    assert chart.x_scale.max == 20 and list(chart.rate.y) == [600.0] * 21
    chart.update(timeline([1] * 600), total=600)
    assert axis.label == "minutes since the start" and list(axis.tick_values) == list(range(11))


@given(st.lists(st.integers(0, 30), min_size=1, max_size=400))
def test_each_point_is_what_started_in_its_trailing_window_per_minute(started):
    lines = series(timeline(started))
    reached = max([i + 1 for i, n in enumerate(started) if n] or [1])  # the timeline ends at its last start
    unit_seconds = lines["scale"]
    assert unit_seconds == (1 if reached <= 180 else 60) and lines["end"] * unit_seconds == reached
    for x, rate in list(zip(lines["x"], lines["per_minute"], strict=True))[1:]:
        end = round(x * unit_seconds)  # the end of a second, in seconds since the start
        window = min(60, end)
        assert rate == pytest.approx(sum(started[end - window : end]) * 60 / window)


@given(st.floats(min_value=0, max_value=1e7, allow_nan=False))
def test_ticks_are_few_round_and_cover_the_run(end):
    ticks = round_ticks(end)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else None
    assert ticks[0] == 0 and len(ticks) <= MAX_TICKS + 1
    assert ticks[-1] <= max(end, 1) < ticks[-1] + (step or 2)
    if step is not None:
        assert step in TICK_STEPS or str(int(step)).strip("0") == "1"  # a step of the table or a power of ten
        assert all(b - a == step for a, b in zip(ticks, ticks[1:], strict=False))


@pytest.mark.parametrize("length, unit", [(0, "seconds"), (59, "seconds"), (180, "seconds"), (181, "minutes")])
def test_runs_up_to_three_minutes_read_in_seconds(length, unit):
    assert axis_unit(length)[0] == unit
