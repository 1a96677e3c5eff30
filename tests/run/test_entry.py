"""What a run publishes of itself on its key's budget (``run.entry``): the whole entry a person reads in
``batchsum top`` (host, pid, door, output redacted, limit and source, share, sent, reused, rows left,
its rate, ETA, when it started), at most once a second, on a call of its own when its pacer is quiet,
removed when the run ends; each front-end names itself."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pandas as pd
import pytest

from batchsum.pacing.budgets.budget import ProcessBudget
from batchsum.pacing.budgets.exchange import Report
from batchsum.pacing.look.view import read_view
from batchsum.run import entry as entry_module
from batchsum.run.entry import Entry, _shown
from batchsum.run.run import Run
from batchsum.run.spec import RunSpec
from tests.support import KEY, article, wait_for


class Recording(ProcessBudget):
    """A budget in this process that keeps every entry published to it, with when (its clock)."""

    def __init__(self) -> None:
        super().__init__(shared=True)
        self.published: list[tuple[float, dict]] = []

    async def _call(self, what, interval, report: Report, share):
        if report.entry is not None:
            self.published.append((time.monotonic(), json.loads(report.entry)))
        return await super()._call(what, interval, report, share)


@pytest.mark.slow
def test_a_run_publishes_its_whole_entry_while_it_runs_and_removes_it_when_it_ends(svc, tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHSUM_HOST", "batch-host-7")
    svc.state.rpm = 0
    budget = f"sqlite://{tmp_path / 'budget.sqlite'}"
    journal = tmp_path / "run.journal.sqlite"
    spec = RunSpec.from_kwargs(
        api_key=KEY, base_url=svc.url, rpm=300, share=0.5, budget=budget, journal=journal, progress=False, store="none"
    )
    texts = [article(20, seed) for seed in range(40)]

    async def main():
        async with Run(spec, total=len(texts)) as run:
            seen = []

            async def watch() -> None:
                while True:
                    view = await read_view(budget, "here")
                    runs = view.keys[0].runs if view.keys else ()
                    if runs and runs[0].sent >= 5:
                        seen.append(runs[0])
                        return
                    await asyncio.sleep(0.2)

            watcher = asyncio.ensure_future(watch())
            async for _ in run.stream(texts):
                pass
            await asyncio.wait_for(watcher, 60)
        after = await read_view(budget, "here")
        return run.run_id, seen[0], after

    run_id, shown, after = asyncio.run(main())
    assert (shown.run_id, shown.host, shown.pid, shown.processes, shown.door) == (
        run_id,
        "batch-host-7",
        os.getpid(),
        1,
        "python",
    )
    assert (shown.output, shown.rpm, shown.limit_source, shown.share) == (str(journal), 300, "configured", 0.5)
    assert shown.sent >= 5 and 40 - shown.sent <= shown.rows_left <= 40  # a row done is a request answered
    assert shown.rate_1m == shown.sent and shown.rate_limited == 0 and shown.started_at <= time.time()
    assert [k.runs for k in after.keys] in ([()], [])  # its entry left with it


def test_an_output_is_shown_as_every_message_shows_a_location():
    signed = "s3://AKIDEXAMPLE:wJalrXUtnFEMI@bucket/out.parquet?X-Amz-Signature=abcdef0123&x=1"
    shown = _shown(signed)
    assert (
        "wJalrXUtnFEMI" not in shown and "abcdef0123" not in shown and shown.startswith("s3://***@bucket/out.parquet")
    )
    long = _shown("/data/" + "x" * 1000 + "/out.parquet")
    assert len(long) == entry_module.OUTPUT_CHARS - 1 and long.endswith("/out.parquet") and "…" in long


@pytest.mark.slow
def test_an_entry_goes_at_most_once_a_second_and_a_quiet_run_publishes_on_its_own(monkeypatch):
    """On a clock the test moves: the pacer's calls stamp an entry only a second after the last; a run
    whose pacer makes no call publishes on a call of its own every KEEP_ALIVE_SECONDS (shortened here)."""
    monkeypatch.setattr(entry_module, "KEEP_ALIVE_SECONDS", 2.0)
    clock = [100.0]
    budget = Recording()
    spec = RunSpec.from_kwargs(api_key=KEY, base_url="http://127.0.0.1:9", rpm=60, progress=False)
    from batchsum.engine.tally import BatchStats

    entry = Entry("run-1", budget, spec, BatchStats(total=10), shared=False, clock=lambda: clock[0])

    async def published_after(count: int) -> int:
        more = lambda: len(budget.published) > count  # noqa: E731
        await asyncio.to_thread(wait_for, more, 60, f"an entry after the first {count}")  # the loop runs on
        return len(budget.published)

    async def main():
        stamped = []
        for step in range(30):  # the pacer calling every 0.1 s for 3 s
            clock[0] = 100.0 + step / 10
            stamped.append(entry.stamp(Report()).entry is not None)
        clock[0] = 104.1  # the pacer quiet for longer than KEEP_ALIVE_SECONDS: a call of the run's own
        keeping = asyncio.ensure_future(entry.keep_alive())
        first = await published_after(0)
        clock[0] += 1.5  # quiet for less than KEEP_ALIVE_SECONDS: nothing
        await asyncio.sleep(1.0)
        still = len(budget.published)
        clock[0] += 0.6  # quiet for longer: one call of its own
        again = await published_after(still)
        keeping.cancel()
        return stamped, first, still, again

    stamped, first, still, again = asyncio.run(main())
    assert [i for i, s in enumerate(stamped) if s] == [0, 10, 20]  # once a second of the clock
    assert (first, still, again) == (1, 1, 2)


def test_each_front_end_names_itself_in_its_entry(svc):
    budget = Recording()
    frame = pd.DataFrame({"text": [article(20, seed) for seed in range(3)]})
    frame.batchsum.summarize("text", api_key=KEY, base_url=svc.url, rpm=0, budget=budget, progress=False)
    assert {entry["door"] for _, entry in budget.published} == {"pandas"}
    from batchsum.widgets import FrameApp

    app = FrameApp(frame, api_key=KEY, base_url=svc.url)
    assert app._spec(rpm=60).door == "notebook"
    assert RunSpec.from_kwargs(api_key=KEY).door == "python"
