"""Pay once per text across every job: the answer store of the machine (by default) shared by every
run of the user, through the CLI, pandas, lazy Polars and two processes at once; what changes an
answer never shares an entry; ``--refresh``, ``--store none``, ``batchsum store``; a store that
cannot be opened; a killed holder; claims that hold while the wall clock is stepped either way."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

import batchsum
from batchsum.cli import main
from batchsum.data import leases
from batchsum.data.machine_store import MachineStore, default_store_path
from batchsum.data.results import Answer
from batchsum.engine.fingerprints import text_fingerprint
from batchsum.local import Faults, LocalService
from batchsum.run.run import run_texts
from batchsum.run.spec import RunSpec
from batchsum.service import contract
from tests.support import KEY, article, wait_for, wait_for_count

ROOT = Path(__file__).parents[2]


def texts(start: int, stop: int) -> list[str]:
    return [article(30, seed=i) for i in range(start, stop)]


def parquet(path: Path, rows: list[str]) -> str:
    pd.DataFrame({"id": range(len(rows)), "text": rows}).to_parquet(path, index=False)
    return str(path)


def summarize(*argv: str) -> int:
    """The command, unpaced unless it says (the session's service has no limit)."""
    pace = [] if "--rpm" in argv else ["--rpm", "0"]
    return main(["summarize", *argv, "--column", "text", "--quiet", *pace])


def stored(service: str) -> MachineStore:
    return MachineStore(default_store_path(), service)


def test_a_second_job_over_overlapping_texts_pays_only_the_new_ones(env, tmp_path, capsys):
    assert summarize(parquet(tmp_path / "one.parquet", texts(0, 20)), "-o", str(tmp_path / "a.parquet")) == 0
    assert env.stats()["requests"] == 20
    two = parquet(tmp_path / "two.parquet", texts(10, 30))  # 10 of job 1's texts, 10 new; a new output
    capsys.readouterr()
    assert summarize(two, "-o", str(tmp_path / "b.parquet"), "--dry-run") == 0
    plan = capsys.readouterr().out
    assert "would send:       10 requests" in plan and "already answered: 10 rows (10 in the store)" in plan
    assert f"store:            this machine ({default_store_path()})" in plan
    report = tmp_path / "b.json"
    assert summarize(two, "-o", str(tmp_path / "b.parquet"), "--report", str(report)) == 0
    assert env.stats()["requests"] == 30  # 10 more
    assert "10 sent, 10 reused (10 from the store)" in capsys.readouterr().err
    out = pd.read_parquet(tmp_path / "b.parquet")
    assert (out["summary_status"] == "ok").all() and out["summary"].str.len().gt(0).all()
    run = json.loads(report.read_text())
    assert run["requests"]["from_store"] == 10 and run["options"]["store"] == "machine"
    import jsonschema

    jsonschema.validate(run, json.loads((ROOT / "docs" / "run-report.schema.json").read_text()))
    with batchsum.data.journal.Journal(tmp_path / "b.parquet.journal.sqlite", readonly=True) as journal:
        assert len(journal) == 20  # the store's answers copied in: the journal holds its output's every answer


@pytest.mark.slow
def test_the_pandas_accessor_in_a_new_process_pays_nothing_for_a_jobs_texts(env, tmp_path):
    assert summarize(parquet(tmp_path / "one.parquet", texts(0, 12)), "-o", str(tmp_path / "a.parquet")) == 0
    code = (
        "import pandas as pd, batchsum, sys\n"
        "out = pd.read_parquet(sys.argv[1]).batchsum.summarize('text', progress=False)\n"
        "print((out['summary_status'] == 'ok').sum(), out.attrs['batchsum']['from_store'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "one.parquet")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.stdout.split() == ["12", "12"], done.stderr
    assert env.stats()["requests"] == 12


def _cli(tmp_path: Path, source: str, output: str, *more: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "batchsum.cli", "summarize", source, "-o", output, "--column", "text", "--quiet", *more],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_two_processes_starting_the_same_job_together_pay_once(env, tmp_path):
    env.faults = Faults(latency=0.05, latency_spread=0.1)
    source = parquet(tmp_path / "in.parquet", texts(0, 40))
    runs = [_cli(tmp_path, source, str(tmp_path / f"out{n}.parquet"), "--rpm", "1200") for n in range(2)]
    errors = [run.communicate(timeout=120)[1] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], errors
    stats = env.stats()
    assert stats["requests"] == 40 and stats["answered_twice"] == 0, stats
    for n in range(2):
        assert (pd.read_parquet(tmp_path / f"out{n}.parquet")["summary_status"] == "ok").all()
    assert sum(int(e.split(" reused (")[1].split()[0]) for e in errors if " reused (" in e) >= 1  # the other's answers


@pytest.mark.slow
def test_what_changes_the_answer_never_shares_an_entry(env, tmp_path):
    rows = texts(0, 5)
    spec = RunSpec.from_kwargs(progress=False, rpm=0)
    for changes in ({}, {"mode": 2}, {"percentage": 5}, {"type": "bullets"}):
        results = asyncio_run(run_texts(RunSpec.from_kwargs(progress=False, rpm=0, **changes), rows))
        assert all(r.status == "ok" for r in results)
    assert env.stats()["requests"] == 20  # four parameter sets, each paid once
    with LocalService([KEY]) as other:  # another service answers the same request again
        asyncio_run(run_texts(spec.replace(client=spec.client.__class__(spec.client.api_key, other.url)), rows))
        assert other.stats()["requests"] == 5
    asyncio_run(run_texts(RunSpec.from_kwargs(progress=False, rpm=0, api_key="another-key-0123456789"), rows))
    assert env.stats()["requests"] == 20  # another key at the same service: the same answers


def asyncio_run(coroutine):  # noqa: ANN001, ANN201 - a short helper
    import asyncio

    return asyncio.run(coroutine)


def test_refresh_asks_again_and_the_new_answer_replaces_the_stored_one(env, tmp_path):
    source = parquet(tmp_path / "in.parquet", texts(0, 6))
    assert summarize(source, "-o", str(tmp_path / "a.parquet")) == 0
    service = contract.service_identity(env.url)
    key = text_fingerprint(contract.parse_params(1, contract.PERCENTAGE_DEFAULT, None))(texts(0, 1)[0])
    store = stored(service)
    store.put(key, Answer("a stale summary", "ok", None, None, 200, 1))
    assert summarize(source, "-o", str(tmp_path / "b.parquet")) == 0
    assert env.stats()["requests"] == 6 and pd.read_parquet(tmp_path / "b.parquet")["summary"][0] == "a stale summary"
    assert summarize(source, "-o", str(tmp_path / "c.parquet"), "--refresh") == 0
    assert env.stats()["requests"] == 12  # every request sent again
    assert store.get(key).summary != "a stale summary"  # replaced
    assert pd.read_parquet(tmp_path / "c.parquet")["summary"][0] == store.get(key).summary


@pytest.mark.slow
def test_refresh_pays_once_for_a_text_that_repeats_in_the_run(svc):
    from batchsum.run.run import Run

    text = article(30, seed=777)
    key = text_fingerprint(contract.parse_params(1, contract.PERCENTAGE_DEFAULT, None))(text)

    def written() -> float:
        if not default_store_path().exists():
            return 0.0
        with sqlite3.connect(default_store_path()) as db:
            row = db.execute("SELECT MAX(written) FROM answers WHERE fingerprint=?", (key,)).fetchone()
        return row[0] or 0.0

    async def run(refresh: bool, journal: Path | None = None) -> list[str]:
        begun = time.time()

        async def rows():
            yield text
            kept = lambda: written() >= begun  # noqa: E731  (the first answered and kept: the repeat is looked up, not joined)
            await asyncio.to_thread(wait_for, kept, what="the first answer kept")  # the loop runs on
            yield text

        spec = RunSpec.from_kwargs(api_key=KEY, base_url=svc.url, progress=False, refresh=refresh, journal=journal)
        async with Run(spec) as opened:
            return [result.status async for result in opened.stream(rows())]

    assert asyncio.run(asyncio.wait_for(run(False), 60)) == ["ok", "ok"] and svc.stats()["requests"] == 1
    assert asyncio.run(asyncio.wait_for(run(True), 60)) == ["ok", "ok"]
    assert svc.stats()["requests"] == 2  # what the store held is asked again, once
    assert asyncio.run(asyncio.wait_for(run(True, Path(os.environ["XDG_CACHE_HOME"]) / "j.sqlite"), 60)) == ["ok"] * 2
    assert svc.stats()["requests"] == 3  # with a journal as its own scope, the same


@pytest.mark.slow
def test_refresh_pays_once_per_text_in_the_partitions_of_a_job(svc):
    from batchsum.run.shared import prepare_shared

    text = article(30, seed=778)
    before = RunSpec.from_kwargs(api_key=KEY, base_url=svc.url, progress=False)
    asyncio.run(run_texts(before, [text]))  # in the store before the job
    spec = prepare_shared(RunSpec.from_kwargs(api_key=KEY, base_url=svc.url, progress=False, refresh=True))
    for _ in range(2):  # two partitions, one after the other
        assert asyncio.run(run_texts(spec, [text], shared=True))[0].status == "ok"
    assert svc.stats()["requests"] == 2  # asked again once for the job, not once per partition


@pytest.mark.slow
@pytest.mark.parametrize("where", ["machine", "redis"])
def test_the_partitions_of_a_job_without_a_journal_pay_once_for_a_refusal(svc, where, request):
    """A Dask, Spark or Ray job with no journal: the store is its partitions' only scope, and keeps
    the job's refusals (for that job alone, for a day), so a 422 is paid for once in the job."""
    from batchsum.run.shared import prepare_shared

    budget = request.getfixturevalue("redis_url") if where == "redis" else None
    svc.faults = Faults(script=["422", "422"])
    text = article(30, seed=4242)

    def job() -> list[str]:
        spec = prepare_shared(RunSpec.from_kwargs(api_key=KEY, base_url=svc.url, progress=False, budget=budget))
        assert spec.store.text == (budget or f"sqlite://{default_store_path()}")
        # two partitions, one after the other
        return [asyncio.run(run_texts(spec, [text], shared=True))[0].error for _ in range(2)]

    assert job() == ["unprocessable", "unprocessable"]
    assert svc.stats()["requests"] == 1
    assert job() == ["unprocessable", "unprocessable"]  # another job asks again: never shared beyond the job
    assert svc.stats()["requests"] == 2


def test_a_worker_whose_store_cannot_be_opened_keeps_its_answers_in_its_process(svc, tmp_path):
    (tmp_path / "a-file").write_text("")  # the store's folder is a file: it cannot be opened on this worker
    spec = RunSpec.from_kwargs(
        api_key=KEY, base_url=svc.url, progress=False, store=f"sqlite://{tmp_path}/a-file/answers.sqlite"
    ).replace(run_id="one-job")
    svc.faults = Faults(script=["422"])
    text = article(30, seed=4343)
    results = [asyncio.run(run_texts(spec, [text], shared=True))[0].error for _ in range(2)]
    assert results == ["unprocessable", "unprocessable"] and svc.stats()["requests"] == 1


def test_a_store_on_one_machines_disk_is_refused_for_workers_on_several_hosts(svc, redis_url, tmp_path):
    from batchsum.errors import InvalidParameterError
    from batchsum.run.shared import Workers, prepare_shared

    def spec(store: str | None) -> RunSpec:
        return RunSpec.from_kwargs(api_key=KEY, base_url=svc.url, progress=False, budget=redis_url, store=store)

    def two_hosts() -> Workers:
        return Workers(4, 2, "this cluster runs partitions in 4 worker processes")

    own = tmp_path / "answers.sqlite"
    for store in ("machine", f"sqlite://{own}"):
        with pytest.raises(InvalidParameterError) as caught:
            prepare_shared(spec(store), two_hosts)
        message = str(caught.value)
        assert "\n" not in message and f"invalid store {store!r}" in message and "2 hosts" in message
        assert "store='redis://HOST:PORT/DB'" in message
    assert not own.exists() and not default_store_path().exists()  # refused before anything was opened
    assert prepare_shared(spec(None), two_hosts).store.text == redis_url  # the default: the budget's Redis
    one_host = prepare_shared(spec("machine"), lambda: Workers(2, 1, "2 worker processes"))
    assert one_host.store.text == f"sqlite://{default_store_path()}"
    assert svc.stats()["requests"] == 0


def test_a_dry_run_whose_redis_store_fails_while_read_says_so_in_its_store_line(env, redis_url, tmp_path, capsys):
    """A Redis user who may not run MGET: the store opens, and fails as the dry run reads it. The
    dry run says so in its store line, as a run would leave the store, never a traceback, never the
    password."""
    import redis

    raw = redis.Redis.from_url(redis_url)
    user, password = f"no-mget-{os.urandom(3).hex()}", "pw-no-mget-4242"
    raw.acl_setuser(
        user, enabled=True, passwords=[f"+{password}"], keys=["*"], channels=["*"], commands=["+@all", "-mget"]
    )
    try:
        store = redis_url.replace("redis://", f"redis://{user}:{password}@")
        source = parquet(tmp_path / "in.parquet", texts(0, 3))
        assert summarize(source, "-o", str(tmp_path / "a.parquet"), "--store", store, "--dry-run") == 0
        out = capsys.readouterr()
        line = next(line for line in out.out.splitlines() if line.startswith("store:"))
        assert "not usable" in line and "no permissions to run the 'mget' command" in line and "***@" in line
        assert "would send:       3 requests" in out.out
        assert password not in out.out + out.err and "Traceback" not in out.err
        assert env.stats()["requests"] == 0
    finally:
        raw.acl_deluser(user)
        raw.close()


def test_store_none_is_the_output_journal_alone_and_makes_no_store(env, tmp_path, monkeypatch):
    source = parquet(tmp_path / "in.parquet", texts(0, 5))
    assert summarize(source, "-o", str(tmp_path / "a.parquet"), "--store", "none") == 0
    monkeypatch.setenv("BATCHSUM_STORE", "none")
    assert summarize(source, "-o", str(tmp_path / "b.parquet")) == 0
    assert env.stats()["requests"] == 10 and not default_store_path().exists()
    assert summarize(source, "-o", str(tmp_path / "b.parquet")) == 0  # its own journal still answers
    assert env.stats()["requests"] == 10


@pytest.mark.slow
def test_a_store_that_cannot_be_opened_is_one_warning_line_and_the_run_goes_on(env, tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    source = parquet(tmp_path / "in.parquet", texts(0, 5))
    run = _cli(tmp_path, source, str(tmp_path / "a.parquet"), "--budget", "none")
    _, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    lines = [line for line in err.splitlines() if "answer store" in line]
    assert len(lines) == 1 and "goes on with its journal alone" in lines[0], err
    assert (pd.read_parquet(tmp_path / "a.parquet")["summary_status"] == "ok").all()


@pytest.mark.slow
def test_a_killed_process_leaves_no_claim_that_holds_anyone_up(env, tmp_path):
    env.faults = Faults(latency=30)  # every request hangs: the claims are held when it dies
    source = parquet(tmp_path / "in.parquet", texts(0, 8))
    run = _cli(tmp_path, source, str(tmp_path / "a.parquet"), "--rpm", "0")

    def claimed() -> bool:  # a text is claimed at its turn: the claims are those on the wire
        try:
            with sqlite3.connect(f"file:{default_store_path()}?mode=ro", uri=True) as db:  # made by the run
                return db.execute("SELECT COUNT(*) FROM claims").fetchone()[0] >= 4 and env.state.in_progress >= 4
        except sqlite3.Error:  # not made yet
            return False

    wait_for(claimed, what="4 texts claimed and on the wire", every=0.05)
    run.send_signal(signal.SIGKILL)
    run.wait()
    env.faults = Faults()
    with sqlite3.connect(default_store_path()) as db:
        held = [key.split(" ")[1] for (key,) in db.execute("SELECT fingerprint FROM claims")]
    assert len(held) >= 4
    store = stored(contract.service_identity(env.url))
    assert all(store.claim(key) for key in held)  # its holder is surely gone: taken over at once
    for key in held:
        store.release(key)
    assert summarize(source, "-o", str(tmp_path / "b.parquet")) == 0
    assert (pd.read_parquet(tmp_path / "b.parquet")["summary_status"] == "ok").all()


def test_batchsum_store_shows_removes_and_sets_the_store(env, tmp_path, capsys):
    assert summarize(parquet(tmp_path / "in.parquet", texts(0, 4)), "-o", str(tmp_path / "a.parquet")) == 0
    service = contract.service_identity(env.url)
    capsys.readouterr()
    assert main(["store"]) == 0
    shown = capsys.readouterr().out
    assert f"store:      this machine ({default_store_path()})" in shown and "answers:    4" in shown
    assert "answers kept 90 days" in shown
    line = next(line for line in shown.splitlines() if line.startswith(service))
    assert line.split()[1:3] == ["4", "4"]  # all of them under a day old
    assert main(["store", "--remove"]) == 2  # which ones: said
    assert main(["store", "--all"]) == 2 and "add --remove" in capsys.readouterr().err  # never removed by surprise
    assert main(["store", "--remove", "--older-than", "1d"]) == 0 and "removed 0 answers" in capsys.readouterr().out
    assert main(["store", "--retention", "30d", "--max-size", "200MB"]) == 0
    assert "answers kept 30 days" in capsys.readouterr().out
    assert main(["store", "--remove", "--service", env.url]) == 0 and "removed 4 answers" in capsys.readouterr().out
    assert main(["store", "--remove", "--all", "--older-than", "1d"]) == 2  # which ones: never both
    assert "--all removes every answer" in capsys.readouterr().err
    assert main(["store", "--remove", "--all"]) == 0
    assert main(["store", "--store", "none"]) == 0
    named = tmp_path / "team.sqlite"  # a store the user names is a file, not this machine's store
    assert (
        summarize(
            parquet(tmp_path / "in.parquet", texts(0, 2)),
            "-o",
            str(tmp_path / "c.parquet"),
            "--store",
            f"sqlite://{named}",
        )
        == 0
    )
    capsys.readouterr()
    assert main(["store", "--store", f"sqlite://{named}"]) == 0
    assert f"store:      the file {named}" in capsys.readouterr().out


def test_lazy_frames_collected_together_claim_their_texts(env, tmp_path):
    pl = pytest.importorskip("polars")
    import batchsum.polars  # noqa: F401

    rows = texts(0, 40)
    pl.DataFrame({"text": rows}).write_parquet(tmp_path / "in.parquet")
    first = pl.scan_parquet(tmp_path / "in.parquet").batchsum.summarize("text", progress=False, rpm=0)
    second = pl.scan_parquet(tmp_path / "in.parquet").batchsum.summarize("text", progress=False, rpm=0)
    env.faults = Faults(latency=0.05)
    one, two = pl.collect_all([first, second])
    assert env.stats()["requests"] == 40
    assert (one["summary_status"] == "ok").all() and (two["summary_status"] == "ok").all()
    third = pl.scan_parquet(tmp_path / "in.parquet").batchsum.summarize("text", progress=False, rpm=0, store="none")
    fourth = pl.scan_parquet(tmp_path / "in.parquet").batchsum.summarize("text", progress=False, rpm=0, store="none")
    three, four = pl.collect_all([third, fourth])  # no store: the process's scratch store, with claims
    assert env.stats()["requests"] == 80
    assert (three["summary_status"] == "ok").all() and (four["summary_status"] == "ok").all()


class _SteppedWall:
    """The wall clock of ``leases.now``, stepped 30 s forward and then 5 minutes back mid-run."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> tuple[float, float]:
        return time.monotonic(), time.time() + self.offset


@pytest.mark.slow
def test_claims_hold_with_the_wall_clock_stepped_forward_and_back_mid_run(env, tmp_path, monkeypatch):
    """Two runs over the same texts at once (a request takes two seconds or more: claims are held while
    the other asks), the wall clock stepped 30 s forward and then 5 minutes back: each text paid
    once, and neither run waits out a lease."""
    wall = _SteppedWall()
    monkeypatch.setattr(leases, "now", wall)
    judged = leases.lapsed
    lapses: list[bool] = []

    def lapsed(*args, **kwargs):  # every judgement of another holder's lease, kept
        verdict = judged(*args, **kwargs)
        lapses.append(verdict)
        return verdict

    monkeypatch.setattr(leases, "lapsed", lapsed)
    env.faults = Faults(latency=2.0, latency_spread=0.5)
    rows = texts(0, 16)
    spec = RunSpec.from_kwargs(progress=False, rpm=0, budget="none")
    outcomes: list[list[object]] = []

    def one_run() -> None:
        outcomes.append(asyncio_run(run_texts(spec, rows)))

    runs = [threading.Thread(target=one_run) for _ in range(2)]
    for run in runs:
        run.start()
    wait_for_count(env, 4)
    wall.offset = 30.0  # NTP steps the clock forward while claims are held
    wait_for_count(env, 8)  # claims taken and looked at on the stepped clock
    wall.offset = 30.0 - 300.0  # then five minutes back
    for run in runs:
        run.join(120)
    assert len(outcomes) == 2 and all(r.status == "ok" for results in outcomes for r in results)
    stats = env.stats()
    assert stats["requests"] == 16 and stats["answered_twice"] == 0, stats
    assert not any(lapses)  # no lease of the other run was judged lapsed: none was waited out


def test_the_progress_line_says_how_many_rows_the_store_answered():
    from batchsum.engine.tally import BatchStats
    from batchsum.run.progress import ProgressBar

    stats = BatchStats(total=10, ok=10, reused=8, from_store=8)
    assert ProgressBar.describe(stats).startswith("ok 10 · from the store 8 · skipped 0")
    assert "from the store" not in ProgressBar.describe(BatchStats(total=10, ok=10))
    assert "8 reused (8 from the store)" in stats.account()
