"""``rpm="auto"`` for one run on virtual time: a limit found from a cautious start is remembered for
the key and the next run starts at it, a limit the service states is used at once, the cap holds;
its spellings (``auto``, ``auto:N``, ``$BATCHSUM_RPM``) and ``batchsum limits``. The search judged by
the key (several runs, every window kind, contradictions, probes, the lead) is ``test_auto_search.py``.

The simulated services are those of ``test_short_job.py`` (an ``httpx.MockTransport`` whose answers
take virtual seconds), with clock-aligned fixed windows added: the limit's truth is the service's,
and the run is judged by what it found, what the service refused, and that every row came back."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest

import batchsum
from batchsum.engine import summarize_stream
from batchsum.errors import InvalidParameterError
from batchsum.local.state import ClockWindow, FixedWindow, SlidingWindow, TokenBucket
from batchsum.pacing import KeyRecord, Pacer
from batchsum.pacing.auto.limit import Found
from batchsum.run.spec import AUTO_MAX_RPM, RunSpec, check_rate
from tests import virtual_clock
from tests.pacing.test_short_job import KEY, Remembering, Service, gaps, told, uniform

MINUTE = 60.0


def kinds(rpm: int) -> dict[str, object]:
    """Every window kind of the pace issue's suite, each at ``rpm`` a minute."""
    return {
        "sliding minute": SlidingWindow(rpm, MINUTE),
        "fixed minute from the first request": FixedWindow(rpm, MINUTE),
        "fixed minute on the clock": ClockWindow(rpm, MINUTE),
        "fixed 10 s windows": ClockWindow(max(1, rpm // 6), 10.0),
        "fixed 1 s windows": ClockWindow(max(1, rpm // 60), 1.0),
        "token bucket": bucket(rpm),
    }


def bucket(rpm: int) -> TokenBucket:
    """A bucket refilled at ``rpm`` a minute that holds about 2.5 s of it (one token at least)."""
    size = max(1, rpm // 24)
    return TokenBucket(size, size * MINUTE / rpm)


def texts(n: int, seed: int = 0) -> list[str]:
    return [f"Text {seed}-{i} has enough words in it to be worth a summary of its own here." for i in range(n)]


def run_auto(service: Service, n: int, *, cap: float = AUTO_MAX_RPM, record: KeyRecord | None = None, seed=0):
    """``n`` texts with ``rpm="auto"`` (capped at ``cap``); (rows, pacer, virtual seconds, limit at 3 min)."""
    at_three: list[str] = []

    async def main():
        pacer = Pacer(cap, auto=True, record=record)

        async def watch():
            await asyncio.sleep(3 * MINUTE)
            at_three.append(pacer.auto.limit())

        watcher = asyncio.ensure_future(watch())
        async with batchsum.AsyncClient(KEY, "http://127.0.0.1:9", transport=httpx.MockTransport(service)) as client:
            rows = [row async for row in summarize_stream(texts(n, seed), client, rpm=cap, pacer=pacer, record=record)]
        watcher.cancel()
        return rows, pacer, asyncio.get_running_loop().time()

    rows, pacer, wall = virtual_clock.run(main())
    return rows, pacer, wall, (at_three[0] if at_three else pacer.auto.limit())


def service_with(limit, latency=(0.3, 0.7)) -> Service:
    service = Service("sliding", latency=uniform(*latency))
    service.limit = limit
    return service


# -- finding the limit -----------------------------------------------------------------------------


def test_the_first_run_against_a_sliding_240_is_within_1_3x_of_what_the_limit_allows():
    service = service_with(SlidingWindow(240, MINUTE))
    rows, pacer, wall, limit = run_auto(service, 500)
    assert [r.status for r in rows] == ["ok"] * 500
    assert service.refused <= 12
    assert wall <= 1.3 * 500 / 240 * MINUTE, wall  # virtual seconds


def test_auto_never_goes_above_its_cap():
    service = service_with(SlidingWindow(600, MINUTE))
    rows, pacer, wall, limit = run_auto(service, 400, cap=120)
    assert service.refused == 0 and limit == 120
    assert min(gaps(service.arrivals[1:])) >= 60 / 120 - 1e-9


# -- remembered, stated, shared ---------------------------------------------------------------------


def test_a_limit_found_is_remembered_and_the_next_run_starts_at_it_with_no_429():
    record = KeyRecord(Remembering(), "keyhash", "https://svc", [])
    first = service_with(SlidingWindow(240, MINUTE))
    run_auto(first, 500, record=record)
    assert "limit" in told(record)
    found = Found.from_json(record.budget.told["limit"], 0.0)
    assert found is not None and abs(found.rpm - 240) <= 0.05 * 240

    import time

    from batchsum.pacing.budgets.budget import Remembered

    entries = [
        Remembered("keyhash", "https://svc", name, value, time.time()) for name, value in record.budget.told.items()
    ]
    again = KeyRecord(Remembering(), "keyhash", "https://svc", entries)
    second = service_with(SlidingWindow(240, MINUTE))
    rows, pacer, wall, limit = run_auto(second, 300, record=again, seed=1)
    assert [r.status for r in rows] == ["ok"] * 300
    assert second.refused == 0
    assert second.arrivals[1] < 1.0  # proven: no lone first request
    per_minute = 299 / (second.arrivals[-1] - second.arrivals[0]) * MINUTE
    assert per_minute >= 0.95 * 240, per_minute
    assert pacer.auto.source.kind == "remembered"
    assert pacer.auto.source.detail().endswith("by a search, remembered for the key")


def test_a_limit_the_service_states_is_used_from_the_first_answer():
    service = Service("sliding", latency=uniform(0.3, 0.7), rpm=300, state_room="RateLimit-")
    service.limit = SlidingWindow(300, MINUTE)
    rows, pacer, wall, limit = run_auto(service, 600)
    assert service.refused == 0 and limit == 300
    assert pacer.auto.source.kind == "stated" and pacer.auto.describe() == "300/min (stated by the service)"


# -- spellings --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "rate"),
    [("auto", (AUTO_MAX_RPM, True)), ("AUTO:1200", (1200.0, True)), ("60", (60.0, False)), (90, (90.0, False))],
)
def test_rpm_takes_a_number_auto_or_auto_with_a_cap(given, rate):
    assert check_rate(given, text=True) == rate
    if isinstance(given, str) and not given.lower().startswith("auto"):  # from Python, a number is a number
        with pytest.raises(InvalidParameterError, match="invalid rpm"):
            check_rate(given)


@pytest.mark.parametrize("given", ["auto:0", "auto:x", "auto:", "automatic", "-1", "auto:2000000"])
def test_a_bad_rate_is_one_line_naming_rpm(given):
    with pytest.raises(InvalidParameterError, match="invalid rpm"):
        check_rate(given)


def test_the_environment_and_every_front_end_take_auto():
    spec = RunSpec.from_kwargs(api_key="k" * 20, environ={"BATCHSUM_RPM": "auto:900"})
    assert (spec.rpm, spec.auto) == (900.0, True) and spec.describe()["rpm"] == "auto:900"
    assert RunSpec.from_kwargs(api_key="k" * 20, rpm="auto").describe()["rpm"] == "auto"
    assert RunSpec.from_kwargs(local=True, rpm="auto").rpm == 0  # the local service has no limit to find


# -- through the CLI, against the local service ------------------------------------------------------


@pytest.mark.slow
def test_the_cli_runs_auto_against_the_local_service_and_reports_where_the_limit_came_from(env, tmp_path, budget_at):
    import json

    import pandas as pd

    from batchsum.cli import main
    from tests.support import article

    src, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pd.DataFrame({"text": [article(60, seed=i) for i in range(4)]}).to_parquet(src)
    report = tmp_path / "report.json"
    args = ["summarize", str(src), "-o", str(out), "--column", "text", "--quiet", "--rpm", "auto:300"]
    args += ["--budget", budget_at]
    assert main([*args, "--report", str(report)]) == 0
    assert (pd.read_parquet(out)["summary_status"] == "ok").all()
    pace = json.loads(report.read_text())["pace"]
    assert pace["limit_source"] == "searching" and pace["probe_rate_limited"] == 0, pace
    assert pace["limit_detail"].startswith("searching: trying "), pace


def _remember(key: str, service: str, rpm: float) -> None:
    import asyncio

    from batchsum.options import key_hash
    from batchsum.pacing.auto.key_record import LIMIT
    from batchsum.pacing.budgets.budget import open_budget

    async def go():
        budget = open_budget("machine", "")
        try:
            await budget.remember(key_hash(key), service, {LIMIT: Found(rpm, "found", 0).to_json()})
        finally:
            await budget.aclose()

    asyncio.run(go())


def test_batchsum_limits_lists_what_is_remembered_marks_this_key_and_forgets(monkeypatch, capsys):
    from batchsum.cli import main
    from batchsum.options import key_hash

    mine, other = "k" * 24, "o" * 24
    _remember(mine, "https://api.example.test", 240)
    _remember(other, "https://api.example.test", 600)
    _remember(other, "http://127.0.0.1:9/v1", 90)
    monkeypatch.setenv("BATCHSUM_API_KEY", mine)

    assert main(["limits"]) == 0
    listed = capsys.readouterr().out
    assert f"key {key_hash(mine)} (this key)" in listed and f"key {key_hash(other)}\n" in listed
    assert "240/min, found" in listed and "600/min" in listed and "90/min" in listed
    assert mine[:6] not in listed and other[:6] not in listed  # never a piece of a key

    assert main(["limits", "--service", "https://api.example.test/", "--this-key"]) == 0
    assert capsys.readouterr().out.count("\n") == 1

    assert main(["limits", "--service", "http://127.0.0.1:9/v1", "--forget"]) == 0
    assert "forgot 1 remembered limits" in capsys.readouterr().out
    assert main(["limits"]) == 0
    assert "90/min" not in capsys.readouterr().out

    assert main(["limits", "--forget"]) == 0 and "forgot 2" in capsys.readouterr().out
    assert main(["limits"]) == 0 and "no limits remembered" in capsys.readouterr().out
    assert main(["limits", "--budget", "none"]) == 0 and "remembers nothing" in capsys.readouterr().out


def test_batchsum_limits_this_key_without_a_key_is_one_line(capsys):
    from batchsum.cli import main

    assert main(["limits", "--this-key"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_batchsum_limits_forget_clears_the_keys_proof_and_its_budgets_shared_pace(capsys):
    """What the budget knows of the key at that service goes with its limit (a run after it searches
    from the cautious start and sends its first request alone); answers are not the budget's."""
    from batchsum.cli import main
    from batchsum.options import key_hash
    from batchsum.pacing.auto.key_record import LIMIT
    from batchsum.pacing.budgets.budget import Report, open_budget

    hashed, service = key_hash("k" * 24), "https://api.example.test"

    async def setup():
        budget = open_budget("machine", "the-keys-budget")
        await budget.check()
        await budget.recall(hashed, service)
        await budget.remember(hashed, service, {LIMIT: Found(240, "found", 0).to_json(), "answered:1": ""})
        await budget.reserve(0.0, Report(pace=237.6))
        await budget.lead("a", '{"level": 240}')
        await budget.aclose()

    async def look():
        budget = open_budget("machine", "the-keys-budget")
        try:
            return await budget.recall(hashed, service), await budget.look(), await budget.lead("b")
        finally:
            await budget.aclose()

    asyncio.run(setup())
    entries, slot, lead = asyncio.run(look())
    assert len(entries) == 2 and slot.pace == 237.6 and lead.state is not None
    assert main(["limits", "--forget"]) == 0 and "forgot 1 remembered limits" in capsys.readouterr().out
    entries, slot, lead = asyncio.run(look())
    assert entries == [] and slot.pace is None and lead.state is None


@pytest.mark.slow
def test_cli_processes_started_together_under_auto_share_one_lead(budget_at, tmp_path, monkeypatch):
    """Three ``batchsum summarize --rpm auto`` processes on one key, at once: one holds the lead of
    the key's search (a lease on the budget), the others follow what it publishes; every row ok, no
    429, each report names the one limit, and the lead is let go at the end with its state kept. On
    the machine's budget and on Redis, near and 20 ms away."""
    import os
    import subprocess
    import sys

    import pandas as pd

    from batchsum.local import LocalService
    from batchsum.pacing.budgets.budget import open_budget
    from tests.support import article

    key = f"bs-auto-lead-key-{uuid.uuid4().hex[:12]}"  # the Redis variants share one server
    flag = ["--budget", budget_at]
    env = {**os.environ, "BATCHSUM_API_KEY": key, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    with LocalService([key], rpm=900, room_headers="ratelimit") as service:
        env["BATCHSUM_BASE_URL"] = service.url
        runs = []
        for n in range(3):
            pd.DataFrame({"text": [article(30, seed=100 * n + i) for i in range(30)]}).to_parquet(
                tmp_path / f"{n}.parquet"
            )
            argv = [sys.executable, "-m", "batchsum.cli", "summarize", str(tmp_path / f"{n}.parquet")]
            argv += ["-o", str(tmp_path / f"{n}-out.parquet"), "--column", "text", "--rpm", "auto", "--quiet"]
            argv += ["--report", str(tmp_path / f"{n}.json"), *flag]
            runs.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True))
        errors = [p.communicate(timeout=120)[1] for p in runs]
        assert [p.returncode for p in runs] == [0, 0, 0], errors
        stats = service.state.stats()
        identity = __import__("batchsum").AsyncClient(key, service.url).identity
    assert stats["by_status"] == {"200": 90}, stats
    sources = {json.loads((tmp_path / f"{n}.json").read_text())["pace"]["limit_source"] for n in range(3)}
    assert sources == {"stated"}, sources  # each heard it from its own answers, the followers too

    async def lead():
        on = open_budget(budget_at, identity)
        try:
            return await on.lead("a test")
        finally:
            await on.aclose()

    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"])  # the machine the processes shared
    after = asyncio.run(lead())
    assert after.holder == "a test" and after.state is not None and '"kind": "stated"' in after.state


@pytest.mark.slow
def test_a_plan_halved_at_the_same_address_is_remembered_and_the_next_run_pays_no_429(budget_at, tmp_path):
    """Issue 52 items 0 and 7 in real runs, on the machine's budget and on Redis near and 20 ms away:
    run 1 learns 400/min (its service states it); the service is replaced at the same address by one
    that admits half (33 in any 10 s, stating nothing); run 2 meets it with the limit remembered,
    draws a few 429s (each a pause: on a far budget nothing is reserved meanwhile, so its schedule is
    not pushed out) and lowers the key's record to what the service admitted; run 3 pays no 429 at
    it. (A sliding minute, whose refusals come a minute apart, is judged on the virtual clock:
    ``test_auto_search.py``; the full figures are ``benchmarks/auto.py --only halved``.)"""
    import os
    import subprocess
    import sys

    import pandas as pd

    from batchsum.local import LocalService
    from tests.support import article

    key = f"bs-auto-halved-key-{uuid.uuid4().hex[:12]}"  # the Redis variants share one server
    env = {**os.environ, "BATCHSUM_API_KEY": key, "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def cli(name: str, rows: int, url: str) -> dict:
        pd.DataFrame({"text": [article(25, seed=hash(name) % 1000 * 100 + i) for i in range(rows)]}).to_parquet(
            tmp_path / f"{name}.parquet"
        )
        argv = [sys.executable, "-m", "batchsum.cli", "summarize", str(tmp_path / f"{name}.parquet")]
        argv += ["-o", str(tmp_path / f"{name}-out.parquet"), "--column", "text", "--rpm", "auto", "--quiet"]
        argv += ["--report", str(tmp_path / f"{name}.json"), "--budget", budget_at]
        done = subprocess.run(
            argv, env={**env, "BATCHSUM_BASE_URL": url}, stderr=subprocess.PIPE, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        assert (pd.read_parquet(tmp_path / f"{name}-out.parquet")["summary_status"] == "ok").all()
        return json.loads((tmp_path / f"{name}.json").read_text())

    with LocalService([key], rpm=400, room_headers="ratelimit") as old:
        port = old.port
        first = cli("first", 30, old.url)
    assert first["pace"]["limit"] == 400 and first["pace"]["limit_source"] == "stated", first["pace"]
    with LocalService([key], rpm=33, window=10, port=port) as halved:
        second = cli("second", 100, halved.url)  # two refusals a window apart, judged well before its end
        refused = halved.state.stats()["by_status"].get("429", 0)
        third = cli("third", 15, halved.url)
        stats = halved.state.stats()["by_status"]
    assert 0 < refused <= 20, refused
    assert second["pace"]["limit_source"] == "found" and second["pace"]["limit"] <= 200, second["pace"]
    # The key's record, or the state run 2 published as it left (a run within 5 minutes follows it).
    assert third["pace"]["limit_source"] in ("remembered", "followed") and third["pace"]["limit"] <= 200, third["pace"]
    assert "lowered" in third["pace"]["limit_detail"], third["pace"]
    assert stats == {"200": 115, "429": refused}, stats  # the third run: no 429
