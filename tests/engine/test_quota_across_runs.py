"""A configured quota across processes: a run whose claim is refused while another run's claims on the
key may still be given back (a 429, a stop) waits for them, as it waits for its own, instead of
judging the key spent (issue 52, item 11). Each run publishes its pending claims in its entry in the
runs' registry (``quota_pending``), on the calls it makes anyway; a refused run reads the registry.
Through ``batchsum summarize``, on the machine's budget and on Redis'."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import deque
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchsum.local import Faults, LocalService
from tests.support import KEY, article, stderr_until, wait_for

ROOT = Path(__file__).resolve().parents[2]
OTHERS = "waits for requests other runs on the key hold"


@pytest.fixture(params=["machine", "redis"])
def budget(request, tmp_path) -> str:
    """The key's budget the runs share: the machine's (a cache folder of the test's own), or Redis'."""
    return request.getfixturevalue("redis_url") if request.param == "redis" else "machine"


@pytest.fixture
def svc():
    """A local service of the test's own: its address makes the key's counts on a budget new (the
    session's Redis keeps every earlier test's)."""
    with LocalService([KEY]) as service:
        yield service


class Runs:
    """``batchsum summarize`` runs on one key and one budget, in ``folder``, against ``svc``."""

    def __init__(self, svc, folder: Path, budget: str) -> None:
        self.svc, self.folder = svc, folder
        self.env = {
            **os.environ,
            "BATCHSUM_API_KEY": KEY,
            "BATCHSUM_BASE_URL": svc.url,
            "BATCHSUM_BUDGET": budget,
            "BATCHSUM_RPM": "600",
            "XDG_CACHE_HOME": str(folder / "cache"),
            "PYTHONPATH": str(ROOT),
        }

    def command(self, name: str, texts: int, *flags: str) -> list[str]:
        seed = sum(map(ord, name)) * 1000
        pq.write_table(pa.table({"text": [article(20, seed=seed + i) for i in range(texts)]}), self.folder / name)
        return [sys.executable, "-m", "batchsum", "summarize", name, "-o", f"out-{name}", "--column", "text",
                "--quota", "30/day", "--quiet", "--report", f"{name}.json", *flags]  # fmt: skip

    def start(self, name: str, texts: int, *flags: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(name, texts, *flags), env=self.env, cwd=self.folder,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def run(self, name: str, texts: int, *flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(name, texts, *flags), env=self.env, cwd=self.folder, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip

    def report(self, name: str) -> dict:
        return json.loads((self.folder / f"{name}.json").read_text())

    def waiting(self) -> list[str]:
        """What ``batchsum top`` shows the key's runs waiting for."""
        done = subprocess.run(
            [sys.executable, "-m", "batchsum", "top", "--once", "--json"], env=self.env, cwd=self.folder,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        keys = json.loads(done.stdout)["keys"] if done.returncode == 0 else []
        return [run["waiting"] for key in keys for run in key["runs"] if run.get("waiting")]

    def admitted(self) -> int:
        return int(self.svc.stats()["by_status"].get("200", 0))


@pytest.mark.slow
def test_a_run_refused_by_the_count_waits_for_the_claims_another_run_gives_back(svc, tmp_path, budget):
    """Run C pays 26 of a daily quota of 30. Run A claims the last 4, which the service holds. Run B,
    started then, is refused by the count with none of its own claims pending: it waits for A's (shown
    in ``batchsum top``). A is stopped (SIGINT: nothing new starts, the answers on the wire are
    awaited), and the service answers its 4 with 429s: A gives them back and ends; B claims them and
    pays for them. The service admits 30 in all. (Judged spent from its own claims alone, B stopped
    at once, and the day ended at 26.)"""
    runs = Runs(svc, tmp_path, budget)
    assert runs.run("c.parquet", 26).returncode == 0 and runs.admitted() == 26
    svc.faults = Faults(script=deque(["429"] * 4), retry_after=1, hold_after=0)
    a = runs.start("a.parquet", 4)
    b = None
    try:
        wait_for(lambda: svc.state.in_progress == 4, what="A's 4 requests held at the service", alive=a)
        b = runs.start("b.parquet", 10)
        wait_for(lambda: b.poll() is not None or any(OTHERS in w for w in runs.waiting()), what="B refused")
        a.send_signal(signal.SIGINT)
        stderr_until(a, "stopping; waiting for answers on the wire")
        svc.state.faults.release()
        assert a.wait(120) == 130
        b_err = b.communicate(timeout=300)[1]
    finally:
        for process in (a, b):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert runs.admitted() == 30, b_err
    assert runs.report("b.parquet")["requests"]["texts_sent"] == 4 and "quota" in b_err, b_err
    assert runs.report("a.parquet")["requests"]["texts_sent"] == 0


@pytest.mark.slow
def test_two_runs_on_one_key_with_429s_given_back_spend_a_quota_whole(svc, tmp_path, budget):
    """Two runs of 60 texts on one key, ``--quota 30/day``, while the service answers a fifth of the
    requests 429 (Retry-After 1 s: each such claim is given back and taken again): the service admits
    30 in all, and each run ends on the quota spent with every claim of the other's settled."""
    runs = Runs(svc, tmp_path, budget)
    svc.faults = Faults(rates={"429": 0.2}, retry_after=1, seed=7)
    first, second = runs.start("one.parquet", 60), runs.start("two.parquet", 60)
    try:
        errors = [process.communicate(timeout=300)[1] for process in (first, second)]
    finally:
        for process in (first, second):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert runs.admitted() == 30, errors
    for error in errors:
        assert "daily quota of 30 (configured)" in error, error
    paid = sum(runs.report(name)["requests"]["texts_sent"] for name in ("one.parquet", "two.parquet"))
    assert paid == 30


def test_on_the_virtual_clock_a_refused_run_waits_for_the_claims_another_run_gives_back():
    """The same on the virtual clock, two runs in one process on one budget (each its own count and
    its entry in the runs' registry): run A claims a daily quota of 10 whole, its first request
    answered, the other 9 held by the service, then answered 429 asking for 100 s, past A's
    ``max_wait``: A gives the 9 back and stops. Run B, refused by the count meanwhile with none of
    its own pending, waits for A's, then claims and pays for the 9: the service admits 10."""
    import asyncio

    import httpx

    import batchsum
    from batchsum.engine import summarize_stream
    from batchsum.engine.lanes import KeyLane
    from batchsum.errors import QuotaSpent
    from batchsum.pacing import Pacer
    from batchsum.pacing.budgets.budget import ProcessBudget
    from batchsum.pacing.budgets.presence import Presence, member_of
    from batchsum.service.key_plans import Quota
    from tests import virtual_clock

    async def main():
        loop = asyncio.get_running_loop()
        budget = ProcessBudget(loop.time, shared=True)
        held, release, admitted, a_first = [], asyncio.Event(), [], []

        async def service(request: httpx.Request) -> httpx.Response:
            if request.headers["authorization"].endswith("a" * 20) and a_first:  # A's: held, then a long "later"
                held.append(request)
                await release.wait()
                return httpx.Response(429, headers={"Retry-After": "100"}, json={"error": "Too many requests"})
            admitted.append(request)
            a_first.append(request)  # A's first request (alone: it proves the key) answered at once
            return httpx.Response(200, json={"result": "A summary."})

        async def run(name: str, key: str, texts: list[str], **options) -> list:
            client = batchsum.AsyncClient(key, "http://127.0.0.1:9", transport=httpx.MockTransport(service))
            presence = Presence(member_of(name))
            lane = KeyLane(client, Pacer(600, budget=budget, presence=presence), quota=Quota(10, "day"), budget=budget)
            assert lane.counted is not None
            presence.describe = lambda: {"quota_pending": lane.counted.pending}
            lane.counted.others.publish(presence.member.member, presence.published)
            rows = []
            try:
                async for row in summarize_stream(texts, client, lanes=[lane], **options):
                    rows.append(row.status if row.status == "ok" else f"{row.status}:{row.error}")
            except QuotaSpent:
                pass
            finally:
                await client.aclose()
            return rows

        texts = [article(20, seed=9600 + i) for i in range(20)]
        a = asyncio.ensure_future(run("a", "a" * 20, texts[:10], max_wait=1))
        while len(held) < 9:
            await asyncio.sleep(0.1)
        b = asyncio.ensure_future(run("b", "b" * 20, texts[10:]))
        await asyncio.sleep(10)  # B refused by the count, waiting (virtual seconds: no test time)
        assert not b.done()
        release.set()
        return await a, await b, len(admitted)

    a_rows, b_rows, admitted = virtual_clock.run(main())
    assert a_rows.count("ok") == 1 and b_rows.count("ok") == 9 and admitted == 10, (a_rows, b_rows)
