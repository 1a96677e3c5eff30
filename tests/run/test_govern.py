"""Spend a run can cap and runs a scheduler can see (issue 23): the request cap, the sample, the share
of the key, the run report, JSON logs and OpenTelemetry metrics. Against the strict local service
with a short window (60 requests per 6 seconds), counted at the service; no timing is asserted."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import batchsum
from batchsum.cli import main
from batchsum.local import LocalService
from batchsum.options import RunSpec
from batchsum.pacing import JITTER_MARGIN
from batchsum.pacing.budgets.budget import RESERVE, RESERVE_ONLY, ProcessBudget, Report, Share, Slot, SQLiteBudget
from batchsum.run import run_texts
from batchsum.run.report import BatchStats
from tests.support import EXPIRED_KEY, KEY, article

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "run-report.schema.json").read_text())
PLAN = 600  # the strict service's 60 per 6 seconds, per minute
INTERVAL = 60 / PLAN * (1 + JITTER_MARGIN)  # the pacer's spacing at the plan's pace


@pytest.fixture(scope="module")
def strict():
    with LocalService([KEY, f"{EXPIRED_KEY}:expired"], rpm=60, window=6) as service:
        yield service


@pytest.fixture
def fresh(strict: LocalService, monkeypatch: pytest.MonkeyPatch) -> LocalService:
    strict.state.reset_stats()
    monkeypatch.setenv("BATCHSUM_API_KEY", KEY)
    monkeypatch.setenv("BATCHSUM_BASE_URL", strict.url)
    return strict


def texts(n: int, seed: int = 0) -> list[str]:
    return [article(30 + i % 20, seed=seed * 10_000 + i) for i in range(n)]


def dataset(tmp_path: Path, n: int, seed: int = 0) -> Path:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": texts(n, seed)}), path)
    return path


def paid_at(service: LocalService) -> int:
    """What the service billed: the summaries it answered (a 200 each)."""
    return int(service.state.stats()["by_status"].get("200", 0))


def validate(report: dict) -> dict:
    jsonschema.validate(report, SCHEMA)
    return report


def matches_service(report: dict, service: LocalService, wrong_key: int = 0) -> None:
    """The report's counts are what the service logged: requests, 429s, what it billed (its 200s:
    nothing here loses an answer on the way), what used its rate (every request but its 429s and
    its ``wrong_key`` 401s)."""
    stats = service.state.stats()
    rate_limited = stats["by_status"].get("429", 0)
    assert report["requests"]["sent"] == stats["requests"]
    assert report["requests"]["rate_limited"] == rate_limited
    assert report["requests"]["paid"] == stats["by_status"].get("200", 0)
    assert report["requests"]["used_rate"] == stats["requests"] - rate_limited - wrong_key
    assert report["requests"]["by_outcome"].get("ok", 0) == stats["answered"]


# -- the request cap ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_cap_of_50_on_200_rows_sends_50_paid_requests_and_three_more_runs_finish_paying_for_no_text_twice(
    fresh: LocalService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = dataset(tmp_path, 200)
    out, report = tmp_path / "out.parquet", tmp_path / "run.json"
    command = [
        "summarize", str(source), "-o", str(out), "--column", "text", "--rpm", str(PLAN),
        "--budget", "none", "--max-requests", "50", "--report", str(report), "--quiet",
    ]  # fmt: skip
    assert main(command) == 1
    assert paid_at(fresh) == 50
    message = capsys.readouterr().err
    assert "the 150 not sent" in message and "run the same command again" in message and "--max-requests 50" in message
    table = pq.read_table(out).to_pydict()
    assert len(table["text"]) == 200  # every row, in order
    assert table["summary_status"].count("ok") == 50
    assert table["summary_error"].count("not_sent") == 150
    first = validate(json.loads(report.read_text()))
    assert first["outcome"] == "stopped" and first["error"]["type"] == "RequestCapReached"
    assert first["cause"] == "request_cap"
    matches_service(first, fresh)

    codes = []
    for _ in range(3):
        codes.append(main(command))
        assert paid_at(fresh) <= 50 * (len(codes) + 1)
    assert codes == [1, 1, 0]
    stats = fresh.state.stats()
    assert stats["answered_unique"] == 200 and stats["answered_twice"] == 0  # no text paid for twice
    assert pq.read_table(out).to_pydict()["summary_status"].count("ok") == 200
    last = validate(json.loads(report.read_text()))
    assert last["outcome"] == "finished" and last["requests"]["paid"] == 50 and last["requests"]["reused"] == 150


def test_the_dry_run_says_how_many_requests_the_job_needs_and_how_many_runs_at_the_cap(
    fresh: LocalService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = dataset(tmp_path, 120)
    command = ["summarize", str(source), "-o", str(tmp_path / "o.parquet"), "--column", "text", "--dry-run"]
    assert main([*command, "--max-requests", "50"]) == 0
    shown = capsys.readouterr().out
    assert "requests needed:  120 paid requests" in shown and "at max_requests 50: 3 runs" in shown
    assert fresh.state.stats()["requests"] == 0


@pytest.mark.slow
def test_a_cap_counts_what_the_service_billed_not_its_429s_nor_its_5xx(svc: LocalService) -> None:
    """The cap holds what was billed: a 429 (the service's "later") and a 5xx (its failure) are
    given back, so 30 summaries are answered whatever came between them."""
    from batchsum.local import Faults

    svc.faults = Faults(rates={"500": 0.3, "429": 0.2}, seed=3)
    spec = RunSpec.from_kwargs(api_key=KEY, base_url=svc.url, rpm=0, budget="none", progress=False, max_requests=30)
    with pytest.raises(batchsum.RequestCapReached):
        asyncio.run(run_texts(spec, texts(60, seed=7)))
    by_status = svc.state.stats()["by_status"]
    assert paid_at(svc) == 30 and by_status.get("500", 0) > 0 and by_status.get("429", 0) > 0


# -- the sample --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_sample_is_spread_seeded_and_its_answers_are_reused_by_the_full_run(
    fresh: LocalService, tmp_path: Path
) -> None:
    source = dataset(tmp_path, 100, seed=1)
    out = tmp_path / "sample.parquet"
    base = ["summarize", str(source), "--column", "text", "--rpm", str(PLAN), "--budget", "none", "--quiet"]
    journal = ["--journal", str(tmp_path / "answers.sqlite")]
    assert main([*base, "-o", str(out), *journal, "--sample", "10"]) == 0
    sample = pq.read_table(out).to_pydict()
    positions = [i for i, status in enumerate(sample["summary_status"]) if status == "ok"]
    assert len(positions) == 10 and len(sample["text"]) == 100
    assert positions[-1] - positions[0] > 50  # spread over the input, not its head
    assert sample["summary_error"].count("not_sent") == 90
    assert fresh.state.stats()["answered"] == 10
    again = tmp_path / "again.parquet"
    assert main([*base, "-o", str(again), "--journal", str(tmp_path / "other.sqlite"), "--sample", "10"]) == 0
    assert pq.read_table(again).to_pydict()["summary_status"] == sample["summary_status"]  # the same rows
    fresh.state.reset_stats()
    assert main([*base, "-o", str(tmp_path / "full.parquet"), *journal]) == 0
    stats = fresh.state.stats()
    assert stats["answered"] == 90 and stats["answered_twice"] == 0  # the sample's 10 reused


# -- the share of the key ----------------------------------------------------------------------


class Recording(SQLiteBudget):
    """The machine budget, noting every start it committed (on its own clock) with the wait its
    reservation gave."""

    def __init__(self, path: Path, key_id: str, log: list[tuple[str, float, float]], name: str) -> None:
        super().__init__(path, key_id)
        self.log, self.name = log, name
        self.waited = 0.0

    async def _call(self, what: int, interval: float, report: Report, share: Share | None) -> Slot:
        slot = await super()._call(what, interval, report, share)
        if what in (RESERVE, RESERVE_ONLY) and slot.at is not None:
            self.waited = slot.wait
        if slot.committed:
            assert slot.at is not None
            self.log.append((self.name, slot.at, self.waited))
        return slot


def most_in_window(times: list[float], window: float) -> int:
    times = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most


@pytest.mark.slow
def test_two_runs_on_one_key_one_at_half_share_the_budget_keeps_both_promises(strict: LocalService, tmp_path: Path):
    strict.state.reset_stats()
    from batchsum.service.client import Client

    with Client(api_key=KEY, base_url=strict.url) as client:
        identity = client.identity
    log: list[tuple[str, float, float]] = []
    path = tmp_path / "budget.sqlite"

    def spec(name: str, share: float) -> RunSpec:
        budget = Recording(path, identity, log, name)
        return RunSpec.from_kwargs(
            api_key=KEY, base_url=strict.url, rpm=PLAN, budget=budget, share=share, progress=False
        )

    async def both() -> None:
        await asyncio.gather(
            run_texts(spec("shared", 0.5), texts(50, seed=2)), run_texts(spec("other", 1.0), texts(70, seed=3))
        )

    asyncio.run(both())
    shared = [at for name, at, _ in log if name == "shared"]
    other = [(at, wait) for name, at, wait in log if name == "other"]
    assert len(shared) == 50 and len(other) == 70
    # The shared run holds at most half of any window of the plan (60 per 6 s): 30, and the one it began with.
    assert most_in_window(shared, 6.0) <= 31
    # While both run, the other's starts wait at most one interval of the rate left to it (0.5 of the plan).
    both_running = [wait for at, wait in other if at <= max(shared)]
    assert both_running and max(both_running) <= INTERVAL / (1 - 0.5) + 1e-3
    # The key's window is never exceeded.
    assert most_in_window([at for _, at, _ in log], 6.0) <= 60
    assert strict.state.stats()["by_status"].get("429", 0) == 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["process", "machine", "redis"])
def test_every_budget_kind_defers_a_shared_run_and_never_lets_it_hold_a_slot_ahead(kind: str, tmp_path: Path, request):
    """Greedy askers on each budget kind: the shared one (0.25) gets at most its share of the
    starts, and the other's starts are delayed by at most the one slot the shared run took (one
    interval of the key, less than one of the rate left to it), and nothing is reserved while
    deferred."""
    if kind == "process":
        budget_a = budget_b = ProcessBudget(shared=True)
    elif kind == "machine":
        budget_a, budget_b = (SQLiteBudget(tmp_path / "b.sqlite", "key") for _ in range(2))
    else:
        from batchsum.pacing.budgets.budget import RedisBudget

        url = request.getfixturevalue("redis_url")
        budget_a = RedisBudget(url, f"share-{time.time_ns()}")
        budget_b = RedisBudget(url, budget_a.id)
    interval, share = 0.02, Share("job", 0.25)
    starts: dict[str, list[float]] = {"shared": [], "other": []}
    waits: list[float] = []

    async def asker(name: str, budget, share: Share | None, count: int) -> None:
        while len(starts[name]) < count:
            slot = await budget.reserve(interval, share=share)
            if slot.deferred:
                assert slot.at is None
            else:
                starts[name].append(slot.at)
                if share is None:
                    waits.append(slot.wait)
            await asyncio.sleep(max(0.0, slot.wait))

    async def both() -> None:
        await asyncio.gather(asker("shared", budget_a, share, 15), asker("other", budget_b, None, 45))
        await budget_a.aclose()
        await budget_b.aclose()

    asyncio.run(both())
    everything = sorted(starts["shared"] + starts["other"])
    assert all(b - a >= interval - 1e-6 for a, b in zip(everything, everything[1:]))  # the key's spacing
    shared = starts["shared"]
    assert all(b - a >= interval / share.fraction - 1e-6 for a, b in zip(shared, shared[1:]))
    during = [w for w, at in zip(waits, starts["other"]) if at <= max(shared)]
    # Its own interval, plus at most one: the slot the shared run took; one interval of the rate left
    # to the other is longer still (interval / (1 - 0.25)).
    assert max(during) - interval <= interval + 1e-3 <= interval / (1 - share.fraction) + 1e-3


# -- the run report ----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_report_of_a_normal_run_with_429s_matches_the_service_and_validates(
    fresh: LocalService, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from batchsum.local import Faults

    path = tmp_path / "normal.json"
    # 1.5 times the plan's rate and concurrency: the service answers some 429s, and the report counts
    # them. One is sure, however slowly a busy machine lets the run send: the 21st request's, with a
    # Retry-After of 3 s (a pause the run's watch, looking every quarter second, cannot miss).
    spec = RunSpec.from_kwargs(rpm=PLAN * 1.5, budget="none", progress=False, report=path, max_wait=60)
    fresh.faults = Faults(script=["ok"] * 20 + ["429"], retry_after=3)
    try:
        with caplog.at_level("INFO", logger="batchsum"):
            results = asyncio.run(run_texts(spec, texts(90, seed=4)))
    finally:
        fresh.faults = Faults()
    events = [getattr(record, "event", None) for record in caplog.records]
    assert "pause" in events and "resume" in events  # a 429's pause (at least a second), seen and told
    assert all(r.status == "ok" for r in results)
    report = validate(json.loads(path.read_text()))
    assert report["outcome"] == "finished" and report["rows"]["ok"] == 90
    matches_service(report, fresh)
    assert report["requests"]["rate_limited"] > 0
    assert report["latency"]["count"] == report["requests"]["sent"]
    assert report["timeline"]["in_flight"]
    assert KEY not in path.read_text()
    assert main(["report", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "outcome:      finished" in shown and f"{report['requests']['paid']} paid" in shown


def test_the_report_of_a_failed_run_matches_the_service(fresh: LocalService, tmp_path: Path) -> None:
    path = tmp_path / "failed.json"
    spec = RunSpec.from_kwargs(api_key=EXPIRED_KEY, mode=2, rpm=PLAN, budget="none", progress=False, report=path)
    with pytest.raises(batchsum.NotPremiumError):
        asyncio.run(run_texts(spec, texts(20, seed=5)))
    report = validate(json.loads(path.read_text()))
    assert report["outcome"] == "stopped" and report["error"]["type"] == "NotPremiumError"
    assert report["cause"] == "key_refused"
    matches_service(report, fresh)
    assert report["requests"]["sent"] == 1 and report["requests"]["paid"] == 0  # the refusal was not billed


def test_plot_run_draws_a_report_file(fresh: LocalService, tmp_path: Path) -> None:
    pytest.importorskip("bqplot")
    path = tmp_path / "r.json"
    asyncio.run(run_texts(RunSpec.from_kwargs(rpm=0, budget="none", progress=False, report=path), texts(5, 9)))
    assert batchsum.plot_run(str(path)) is not None


# -- logs and metrics --------------------------------------------------------------------------


@pytest.mark.slow
def test_json_logs_parse_line_by_line_and_say_start_stop_and_end(
    fresh: LocalService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = dataset(tmp_path, 30, seed=6)
    command = [
        "summarize", str(source), "-o", str(tmp_path / "o.parquet"), "--column", "text", "--rpm", str(PLAN),
        "--budget", "none", "--max-requests", "10", "--log-format", "json",
    ]  # fmt: skip
    assert main(command) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    events = [json.loads(line) for line in lines]  # JSON only, every line
    names = [e["event"] for e in events]
    assert names[0] == "start" and "stop" in names and "end" in names
    end = next(e for e in events if e["event"] == "end")
    assert end["requests"]["paid"] == 10 and end["outcome"] == "stopped"
    assert KEY not in "\n".join(lines)


@pytest.mark.slow
def test_opentelemetry_metrics_count_what_the_report_counts(fresh: LocalService, tmp_path: Path) -> None:
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    path = tmp_path / "otel.json"
    spec = RunSpec.from_kwargs(rpm=PLAN * 1.5, budget="none", progress=False, report=path, max_wait=60)
    paces: list[dict] = []

    from batchsum.local import Faults

    async def run_and_look() -> None:
        # The service holds every request after the 5th until the gauges are read: the run is under
        # way when they are, however late a busy machine lets this look happen.
        task = asyncio.ensure_future(run_texts(spec, texts(40, seed=8)))
        while fresh.stats()["answered"] < 5:
            assert not task.done(), task.result()
            await asyncio.sleep(0.01)
        paces.append(reader.get_metrics_data().to_json())  # the pace gauge reports a run while it runs
        fresh.faults.release()
        await task

    fresh.faults = Faults(hold_after=5)
    try:
        asyncio.run(run_and_look())
    finally:
        fresh.faults = Faults()
    report = json.loads(path.read_text())
    sums: dict[str, dict[tuple, float]] = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    if point.attributes.get("batchsum.run") != report["run_id"]:
                        continue
                    key = tuple(sorted((k, v) for k, v in point.attributes.items() if k != "batchsum.run"))
                    value = getattr(point, "value", None)
                    if value is None:
                        value = point.count  # a histogram: how many were recorded
                    sums.setdefault(metric.name, {})[key] = value
    requests = sums["batchsum.requests"]
    assert sum(requests.values()) == report["requests"]["sent"]
    assert requests.get((("outcome", "rate_limited"),), 0) == report["requests"]["rate_limited"]
    assert sum(sums.get("batchsum.rate_limited", {}).values()) == report["requests"]["rate_limited"]
    assert sum(sums["batchsum.rows"].values()) == report["rows"]["done"] == 40
    assert sum(sums["batchsum.request.duration"].values()) == report["latency"]["count"]
    assert sum(sums.get("batchsum.paid", {}).values()) == report["requests"]["paid"] == paid_at(fresh)
    assert sum(sums["batchsum.in_flight"].values()) == 0
    assert any(report["run_id"] in data and "batchsum.pace" in data for data in paces)


def test_the_options_are_checked_once(fresh: LocalService) -> None:
    for bad in ({"share": 0}, {"share": 1.5}, {"max_requests": 0}, {"sample": -1}):
        with pytest.raises(batchsum.InvalidParameterError):
            RunSpec.from_kwargs(**bad)
    described = RunSpec.from_kwargs(share=0.8, max_requests=5).describe()
    assert described["share"] == 0.8 and described["max_requests"] == 5


@pytest.mark.slow
def test_a_run_whose_rows_fail_reports_what_the_service_logged(fresh: LocalService, tmp_path: Path) -> None:
    from batchsum.local import Faults

    path = tmp_path / "failing.json"
    fresh.faults = Faults(rates={"500": 1.0})
    try:
        spec = RunSpec.from_kwargs(rpm=PLAN, budget="none", progress=False, report=path, max_retries=1)
        results = asyncio.run(run_texts(spec, texts(6, seed=11)))
    finally:
        fresh.faults = Faults()
    assert {r.error for r in results} == {"server_error"}
    report = validate(json.loads(path.read_text()))
    assert report["rows"]["failed_by_code"] == {"server_error": 6}
    assert report["requests"]["retried"] == 6 and report["requests"]["by_outcome"] == {"server_error": 12}
    assert report["requests"]["paid"] == 0 and report["requests"]["used_rate"] == 12  # the service's failures
    assert report["outcome"] == "finished" and report["cause"] is None
    matches_service(report, fresh)


def test_dask_partitions_write_a_report_each_beside_a_merged_one(fresh: LocalService, tmp_path: Path) -> None:
    dd = pytest.importorskip("dask.dataframe")
    import pandas as pd

    import batchsum.dask  # noqa: F401  (registers ddf.batchsum)

    path = tmp_path / "reports" / "nightly.json"
    data = pd.DataFrame({"text": texts(12, seed=12)})
    out = dd.from_pandas(data, npartitions=3).batchsum.summarize(
        "text", rpm=0, api_key=KEY, base_url=fresh.url, budget="none", report=str(path), share=0.5
    )
    result = out.compute(scheduler="threads")
    assert (result["summary_status"] == "ok").all()
    parts = sorted(path.parent.glob("nightly.part-*.json"))
    assert len(parts) == 3
    reports = [validate(json.loads(part.read_text())) for part in parts]
    assert len({r["run_id"] for r in reports}) == 1  # one run: one share for all its partitions
    merged = validate(json.loads(path.read_text()))
    assert merged["partitions"] == 3 and merged["rows"]["done"] == 12 and merged["rows"]["ok"] == 12
    matches_service(merged, fresh)


def test_without_the_otel_extra_nothing_is_recorded_and_the_run_goes_on(
    svc: LocalService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from batchsum.run.telemetry import Metrics, available

    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if it were not installed
    assert not available() and Metrics.open("run", lambda: 0.0) is None
    path = tmp_path / "r.json"
    spec = RunSpec.from_kwargs(api_key=KEY, base_url=svc.url, rpm=0, budget="none", progress=False, report=path)
    assert all(r.status == "ok" for r in asyncio.run(run_texts(spec, texts(3, seed=13))))
    assert json.loads(path.read_text())["rows"]["ok"] == 3


def test_the_batchsum_logger_gives_an_application_every_event(svc: LocalService, caplog: pytest.LogCaptureFixture):
    spec = RunSpec.from_kwargs(api_key=KEY, base_url=svc.url, rpm=0, budget="none", progress=False)
    with caplog.at_level("INFO", logger="batchsum"):
        asyncio.run(run_texts(spec, texts(3, seed=14)))
    events = [getattr(record, "event", None) for record in caplog.records if record.name == "batchsum"]
    assert events[0] == "start" and events[-1] == "end"
    end = caplog.records[-1]
    assert end.fields["rows"]["ok"] == 3  # type: ignore[attr-defined]


def test_on_dask_the_cap_and_the_sample_hold_for_the_job_as_a_whole(fresh: LocalService, tmp_path: Path) -> None:
    """The job's cap is divided among its partitions (the parts add up to it): 10 paid requests over
    3 partitions, never 30; every row comes back, the unsent ones failed as not_sent; a sample of 6
    sends 6 rows."""
    dd = pytest.importorskip("dask.dataframe")
    import pandas as pd

    import batchsum.dask  # noqa: F401  (registers ddf.batchsum)

    data = dd.from_pandas(pd.DataFrame({"text": texts(30, seed=15)}), npartitions=3)
    common = {"rpm": 0, "api_key": KEY, "base_url": fresh.url, "budget": "none"}
    capped = data.batchsum.summarize("text", max_requests=10, report=str(tmp_path / "cap.json"), **common)
    result = capped.compute(scheduler="threads")
    assert len(result) == 30 and (result["summary_status"] == "ok").sum() == 10
    assert (result["summary_error"] == "not_sent").sum() == 20
    assert paid_at(fresh) == 10
    merged = validate(json.loads((tmp_path / "cap.json").read_text()))
    assert merged["outcome"] == "stopped" and merged["requests"]["paid"] == 10
    fresh.state.reset_stats()
    other = dd.from_pandas(pd.Series(texts(30, seed=16)), npartitions=3)  # texts not answered yet
    sampled = other.batchsum.summarize(sample=6, **common).compute(scheduler="threads")
    assert (sampled["summary_status"] == "ok").sum() == 6 and fresh.state.stats()["answered"] == 6


def test_pandas_at_the_cap_returns_every_row_and_warns(svc: LocalService) -> None:
    import pandas as pd

    frame = pd.DataFrame({"text": texts(12, seed=17)})
    options = {"api_key": KEY, "base_url": svc.url, "rpm": 0, "budget": "none", "progress": False}
    with pytest.warns(RuntimeWarning, match="request cap of 5"):
        out = frame.batchsum.summarize("text", max_requests=5, **options)
    assert len(out) == 12 and (out["summary_status"] == "ok").sum() == 5
    assert (out["summary_error"] == "not_sent").sum() == 7
    again = frame.batchsum.summarize("text", **options)  # the same call without the cap: the rest
    assert (again["summary_status"] == "ok").all() and svc.state.stats()["answered_twice"] == 0


# -- what the report says of a stop, and what it counts as paid (schema 3) -----------------------------


def test_every_stop_gets_its_cause_from_one_mapping_and_anything_else_is_a_failure():
    from batchsum.errors import (
        AuthenticationError,
        BrokenInputError,
        BudgetError,
        JournalError,
        NotPremiumError,
        OutputError,
        QuotaSpent,
        RequestCapReached,
    )
    from batchsum.run.report import STOP_CAUSES, run_report, stop_cause

    stops = {
        KeyboardInterrupt(): "signal",
        asyncio.CancelledError(): "cancel",
        RequestCapReached(5): "request_cap",
        QuotaSpent([("abc", "daily quota of 5 (configured)", time.time() + 60)]): "quota",
        AuthenticationError("incorrect API key provided", status_code=401): "key_refused",
        NotPremiumError("you are not premium for this request", status_code=401): "key_refused",
        BudgetError("the Redis at redis://localhost:1 cannot be reached"): "budget_unreachable",
        JournalError("disk full"): "journal",
        BrokenInputError("row group 3 is corrupt"): "input",
        OutputError("cannot write out.parquet"): "output",
    }
    causes = SCHEMA["properties"]["cause"]["enum"]
    assert set(STOP_CAUSES.values()) <= set(causes)
    for error, cause in stops.items():
        assert stop_cause(error) == cause
        report = run_report(BatchStats(), run_id="r", options={}, started_at=0.0, ended_at=1.0, error=error)
        assert (report["outcome"], report["cause"]) == ("stopped", cause)
        validate(report | {"options": RunSpec.from_kwargs(local=True).describe()})
    failed = run_report(BatchStats(), run_id="r", options={}, started_at=0.0, ended_at=1.0, error=RuntimeError("x"))
    assert (failed["outcome"], failed["cause"]) == ("failed", None)
    finished = run_report(BatchStats(), run_id="r", options={}, started_at=0.0, ended_at=1.0)
    assert (finished["outcome"], finished["cause"]) == ("finished", None)


def test_a_report_of_schema_2_is_still_read_described_and_merged(fresh: LocalService, tmp_path: Path) -> None:
    from batchsum.run.report import describe_report, merge_reports

    path = tmp_path / "now.json"
    spec = RunSpec.from_kwargs(rpm=PLAN, budget="none", progress=False, report=path)
    asyncio.run(run_texts(spec, texts(6, seed=21)))
    now = validate(json.loads(path.read_text()))
    assert now["schema"] == "batchsum-run-report/4" and now["door"] == "python" and now["gateway"] is None
    old = json.loads(path.read_text())
    old["schema"] = "batchsum-run-report/2"
    del old["cause"], old["requests"]["used_rate"], old["utilization"]["used_per_minute"], old["door"], old["gateway"]
    shown = describe_report(old)
    assert "outcome:      finished" in shown and "6 paid, 6 used the rate" in shown
    merged = validate(merge_reports([old, now], run_id=now["run_id"]))
    assert merged["requests"]["paid"] == 12 and merged["requests"]["used_rate"] == 12 and merged["cause"] is None
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert main(["report", str(tmp_path / "old.json")]) == 0


@pytest.mark.slow
def test_lost_answers_count_as_paid_and_a_connection_never_made_does_not(fresh: LocalService, tmp_path: Path) -> None:
    """A connection the service cut after the request arrived may have been billed: it counts as
    paid (the cap and a quota are never overspent) and as used the rate; a connection never made (a
    port nobody listens on) reached nothing and costs nothing."""
    import socket

    from batchsum.local import Faults

    fresh.faults = Faults(rates={"drop": 1.0})
    try:
        path = tmp_path / "dropped.json"
        spec = RunSpec.from_kwargs(rpm=0, budget="none", progress=False, report=path, max_retries=1)
        results = asyncio.run(run_texts(spec, texts(4, seed=22)))
    finally:
        fresh.faults = Faults()
    assert {r.error for r in results} == {"connection_error"}
    dropped = validate(json.loads(path.read_text()))
    assert dropped["requests"]["sent"] == fresh.state.stats()["requests"] == 8
    assert dropped["requests"]["paid"] == dropped["requests"]["used_rate"] == 8
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    path = tmp_path / "refused.json"
    spec = RunSpec.from_kwargs(base_url=closed, rpm=0, budget="none", progress=False, report=path, max_retries=1)
    results = asyncio.run(run_texts(spec, texts(3, seed=23)))
    assert {r.error for r in results} == {"connection_error"}
    refused = validate(json.loads(path.read_text()))
    assert refused["requests"]["sent"] == 6 and refused["requests"]["paid"] == refused["requests"]["used_rate"] == 0


def test_what_an_attempt_cost_is_one_rule_for_the_report_the_cap_and_the_quota() -> None:
    import httpx

    from batchsum.engine.tally import Charge, charge
    from batchsum.errors import (
        APIConnectionError,
        APIResponseValidationError,
        APITimeoutError,
        AuthenticationError,
        NotPremiumError,
        RateLimitError,
        ServerError,
        TextTooLongError,
    )
    from batchsum.service.client import AsyncClient

    never_made = AsyncClient(KEY, "http://127.0.0.1:9")._core.transport_error(httpx.ConnectError("refused"))
    cases = {
        None: Charge(paid=True, used_rate=True),
        APIResponseValidationError("the body is not JSON"): Charge(True, True),
        RateLimitError("Too Many Requests", status_code=429): Charge(False, False),
        AuthenticationError("incorrect API key provided", status_code=401): Charge(False, False),
        NotPremiumError("you are not premium for this request", status_code=401): Charge(False, True),
        TextTooLongError("Text exceeds word limit", status_code=422): Charge(False, True),
        ServerError("An unexpected error occurred", status_code=500): Charge(False, True),
        APITimeoutError("no answer in time"): Charge(True, True),
        APIConnectionError("the server closed the connection"): Charge(True, True),
        asyncio.CancelledError(): Charge(True, True),
        never_made: Charge(False, False),
    }
    for error, cost in cases.items():
        assert charge(error) == cost, error
