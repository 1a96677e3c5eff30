"""``batchsum top`` against real runs: two ``batchsum summarize`` processes on one key (one with
``--share 0.5``) against the local service's per-key limit of 600/min, on the machine's budget and on
a real redis-server with runs from two hosts; ``top --once --json`` 40 s in agrees with what the
service counted, 20 times in a row without a 429; the view at 80 columns; the metrics a Prometheus
would scrape agree with the JSON; reading writes nothing, also a budget file it may not write; no piece
of a key anywhere."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchsum.cli import main
from batchsum.pacing.budgets.budget import Report, SQLiteBudget, default_budget_path
from batchsum.pacing.budgets.exchange import Member
from batchsum.service.settings import key_hash
from tests.support import KEY, article, wait_for

ROOT = Path(__file__).resolve().parents[2]
LATE = 3.0  # how much later than its commit on the budget a start may reach the service on a loaded machine
SCHEMA = json.loads((ROOT / "docs" / "top.schema.json").read_text())
SERVICE = "http://127.0.0.1:9"


def pieces(secret: str, width: int = 8) -> set[str]:
    return {secret[i : i + width] for i in range(len(secret) - width + 1)}


def no_piece_of_the_key(text: str) -> bool:
    return not any(piece in text for piece in pieces(KEY))


def cli(*argv: str, env: dict[str, str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchsum", *argv], env=env, capture_output=True, text=True, timeout=timeout, **kwargs
    )


# -- two real runs on one key ---------------------------------------------------------------------


def start_run(tmp_path: Path, name: str, seed: int, env: dict[str, str], *flags: str) -> tuple[subprocess.Popen, Path]:
    """``batchsum summarize`` of 3000 texts of its own (the pace, not the input, ends it), in the background."""
    source, out = tmp_path / f"{name}.parquet", tmp_path / f"{name}-out.parquet"
    pq.write_table(pa.table({"text": [article(20, seed * 100_000 + i) for i in range(3000)]}), source)
    log = (tmp_path / f"{name}.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "batchsum", "summarize", str(source), "-o", str(out), "--column", "text", "--quiet"]
        + ["--rpm", "600", *flags],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return process, out


def stop_runs(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    for process in processes:
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def admitted(svc, since: float, until: float) -> int:
    """What the service admitted for the key in [since, until] (its clock: this process's monotonic)."""
    return sum(1 for at in list(svc.state.admitted_by_key.get(KEY, [])) if since <= at <= until)


def top_json(env: dict[str, str], *flags: str) -> tuple[dict, float, float, str]:
    """One ``top --once --json``: the view, when it was asked and answered (the service's clock), its text."""
    asked = time.monotonic()
    done = cli("top", "--once", "--json", *flags, env=env)
    answered = time.monotonic()
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), asked, answered, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("where", ["machine", "redis"])
def test_two_runs_on_one_key_are_seen_40_s_in_as_the_service_counted_them(where, svc, tmp_path, request):
    svc.state.rpm = 600  # the key's limit at the service: a sliding minute
    env = {**os.environ, "BATCHSUM_API_KEY": KEY, "BATCHSUM_BASE_URL": svc.url, "PYTHONPATH": str(ROOT)}
    hosts = [None, None]
    if where == "redis":
        url = request.getfixturevalue("redis_url")
        __import__("redis").Redis.from_url(url).flushdb()
        env["BATCHSUM_BUDGET"] = url
        hosts = ["host-a", "host-b"]  # two machines: two processes naming other hosts
    began = time.monotonic()
    runs = [
        start_run(tmp_path, name, seed, {**env, **({"BATCHSUM_HOST": host} if host else {})}, *flags)
        for (name, seed, flags), host in zip((("full", 1, ()), ("half", 2, ("--share", "0.5"))), hosts)
    ]
    processes = [process for process, _ in runs]
    try:

        def both_listed() -> bool:
            keys = top_json(env)[0]["keys"]
            return bool(keys) and len(keys[0]["runs"]) == 2

        wait_for(both_listed, what="both runs listed", every=0.2)
        time.sleep(max(0.0, began + 40 - time.monotonic()))
        calls = [top_json(env) for _ in range(20)]
        assert all(process.poll() is None for process in processes), "a run ended before the last look"
        wait_for(
            lambda: time.monotonic() > calls[0][2] + LATE, what="the starts committed by the first look", every=0.2
        )
    finally:
        stop_runs(*processes)

    view, asked, answered, text = calls[0]
    jsonschema.validate(view, SCHEMA)
    [key] = view["keys"]
    assert (key["key"], key["limit"], key["limit_source"]) == (key_hash(KEY), 600, "configured")
    # rate_1m: the key's starts in the trailing minute at the moment top read the budget (somewhere
    # between asked and answered), against what the service admitted in it. A start reaches the service
    # a little after it is committed on the budget, later on a loaded machine (the process that
    # committed it waits for a core): so the service's count is taken from the minute before the look
    # was asked (the fewest it can hold) to a few seconds after it answered (the most), within 15%.
    fewest, most = admitted(svc, answered - 60, asked), admitted(svc, asked - 60, answered + LATE)
    assert 0.85 * fewest <= key["rate_1m"] <= 1.15 * most, (key["rate_1m"], fewest, most)
    shown = sorted(key["runs"], key=lambda r: r["share"])
    assert [r["pid"] for r in shown] == [processes[1].pid, processes[0].pid]
    assert [r["output"] for r in shown] == [str(runs[1][1]), str(runs[0][1])]
    assert [(r["share"], r["door"], r["processes"]) for r in shown] == [(0.5, "cli", 1), (1.0, "cli", 1)]
    assert all(isinstance(r["rows_left"], int) and 0 < r["rows_left"] < 3000 and r["sent"] > 0 for r in shown)
    if where == "redis":
        assert [r["host"] for r in shown] == ["host-b", "host-a"]
    # Each run's entry is at most a publication old (a second; five when its pacer is quiet) when top
    # reads it, and its starts reach the service a little later: within 10% of what the service admitted.
    sent, fewest, most = (
        sum(r["sent"] for r in shown),
        admitted(svc, began, asked - 5),
        admitted(svc, began, answered + LATE),
    )
    assert 0.90 * fewest <= sent <= 1.10 * most, (shown, fewest, most)
    # Twenty looks in a row: every one the same shape, none writing, and the runs never refused.
    for later, *_ in calls:
        jsonschema.validate(later, SCHEMA)
        assert [len(k["runs"]) for k in later["keys"]] == [2]
    last = calls[-1][0]["keys"][0]
    assert last["rate_limited_1m"] == 0 and [r["rate_limited"] for r in last["runs"]] == [0, 0]
    assert svc.state.status_by_key.get(KEY, {}).get(429, 0) == 0
    assert all(no_piece_of_the_key(text) for *_, text in calls)
    seconds = sorted(b - a for _, a, b, _ in calls)
    print(f"\ntop --once --json on a {where} budget: median {seconds[10]:.2f} s, slowest {seconds[-1]:.2f} s")


# -- a budget made by hand, as runs leave it --------------------------------------------------------


def published(budget, run_id: str, member: str, **fields) -> None:
    entry = {"host": "etl-7", "pid": 4242, "door": "cli", "rpm": 600, "source": "configured", "share": 1.0}
    entry.update(fields)
    __import__("asyncio").run(
        budget.reserve(0.0, Report(run=Member(run_id, member), entry=json.dumps(entry)), start=False)
    )


def busy_budget(budget) -> None:
    """A key with two runs that disagree on its limit, a job of two processes, a pause, a quota, a
    search under way and a dozen starts (two of them refused)."""
    import asyncio

    async def fill() -> None:
        await budget.check()
        await budget.recall(key_hash(KEY), SERVICE)
        for i in range(12):
            await budget.reserve(0.0, Report(refused=(0.0,) if i < 2 else ()))
        await budget.reserve(0.0, Report(pause_for=45.0, pause_reason="the service answered 429"), start=False)
        state = {"cap": 2000, "value": None, "source": "searching", "search": {"phase": "verify", "level": 540.0}}
        await budget.lead("lead-holder", json.dumps(state))

    asyncio.run(fill())
    long_output = "s3://***@warehouse/exports/" + "nightly-ticket-summaries/" * 6 + "2026-11-27.parquet"
    published(
        budget,
        "nightly-etl",
        "etl-7/4242/a",
        sent=4210,
        reused=380,
        rows_left=15790,
        rate_1m=290,
        eta_s=3267.0,
        output=long_output,
        quota="50000/day",
        started_at=time.time() - 900,
    )
    published(
        budget,
        "notebook-ana",
        "laptop/77/b",
        host="ana-laptop",
        pid=77,
        door="notebook",
        rpm=300,
        source="remembered (found 2026-11-25 14:02)",
        share=0.3,
        sent=120,
        rows_left=80,
        rate_1m=60,
        eta_s=80.0,
    )
    for n in range(2):
        published(
            budget,
            "spark-job-1",
            f"exec-{n}/9{n}/c",
            host=f"exec-{n}",
            pid=90 + n,
            door="spark",
            sent=50,
            rows_left=None,
            rate_1m=25,
        )


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """The machine's budget (in this test's cache folder) as runs left it, still open by one of them."""
    budget = SQLiteBudget(default_budget_path(), uuid.uuid4().hex, default=True)
    busy_budget(budget)
    monkeypatch.setenv("BATCHSUM_API_KEY", KEY)
    yield budget
    __import__("asyncio").run(budget.aclose())


def test_the_terminal_view_fits_80_columns_and_says_everything_a_person_needs(machine, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["top", "--once"]) == 0
    shown = capsys.readouterr().out
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    text = " ".join(line.strip() for line in lines)
    for words in (
        f"key {key_hash(KEY)} ($BATCHSUM_API_KEY)",
        "runs disagree on the limit: 300/min (remembered) for 1 run; 600/min (configured) for 2 runs",
        "started 12 in the last 10 s (of 50 allowed), 12 in the last 60 s (of 300: 4%) · 2 429s",
        "paused until",
        "the service answered 429",
        "daily quota of 50000 (configured)",
        "search under way: verify at 540/min",
        "nightly-etl",
        "notebook-ana",
        "spark-job-1",
        "unknown",  # the Spark job's rows left
    ):
        assert words in text, words
    assert no_piece_of_the_key(shown)
    monkeypatch.setenv("COLUMNS", "160")  # wider: every column, the output whole
    assert main(["top", "--once"]) == 0
    wide = capsys.readouterr().out
    assert "2026-11-27.parquet" in wide and "REUSED" in wide and max(map(len, wide.splitlines())) <= 160


def test_top_json_is_one_object_of_the_documented_shape(machine, capsys):
    assert main(["top", "--once", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    jsonschema.validate(view, SCHEMA)
    [key] = view["keys"]
    assert key["label"] == "$BATCHSUM_API_KEY" and key["limit_source"] == "disagree" and key["limit"] == 300
    job = next(r for r in key["runs"] if r["run_id"] == "spark-job-1")
    assert (job["processes"], job["pid"], job["rows_left"], job["host"]) == (2, None, "unknown", "exec-0, exec-1")
    assert key["search"] == {"phase": "verify", "level": 540.0, "cap": 2000.0}


def test_the_keys_are_chosen_and_labelled_as_limits_chooses_and_labels_them(machine, tmp_path, capsys, monkeypatch):
    keys = tmp_path / "keys.txt"
    keys.write_text(f"another-key-0123456789abcdef 60\n{KEY} 600\n")
    os.chmod(keys, 0o600)
    assert main(["top", "--once", "--json", "--keys", str(keys)]) == 0
    assert json.loads(capsys.readouterr().out)["keys"][0]["label"] == "keys.txt line 2"
    assert main(["top", "--once", "--json", "--service", "http://127.0.0.1:8"]) == 0
    assert json.loads(capsys.readouterr().out)["keys"] == []
    monkeypatch.setenv("BATCHSUM_API_KEY", "some-other-key-0123456789")
    assert main(["top", "--once", "--json", "--this-key"]) == 0
    assert json.loads(capsys.readouterr().out)["keys"] == []
    assert main(["top", "--once", "--budget", "none"]) == 2
    assert "nothing outside it can watch it" in capsys.readouterr().err


def test_a_budget_not_made_yet_is_an_empty_view_and_stays_unmade(tmp_path, capsys):
    path = tmp_path / "nothing-yet.sqlite"
    assert main(["top", "--once", "--budget", f"sqlite://{path}"]) == 0
    assert "no key is in use" in capsys.readouterr().out and not path.exists()


def snapshot(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def unprivileged() -> list[str]:
    """A prefix that runs a command without the power to write what its mode forbids (root ignores
    modes: it gives up the capabilities that let it)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("needs setpriv (util-linux) to read as root without root's power to write")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner"]


@pytest.mark.parametrize("writer", ["open", "gone"])
def test_a_budget_file_it_may_not_write_is_read_and_reading_writes_nothing(writer, tmp_path):
    folder = tmp_path / "budgets"
    folder.mkdir()
    path = folder / "budget.sqlite"
    budget = SQLiteBudget(path, uuid.uuid4().hex)
    busy_budget(budget)
    if writer == "gone":
        __import__("asyncio").run(budget.aclose())  # its log folded into the file and removed
    for file in folder.iterdir():
        file.chmod(0o444)
    folder.chmod(0o555)
    before = snapshot(folder)
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [
                *unprivileged(),
                sys.executable,
                "-m",
                "batchsum",
                "top",
                "--once",
                "--json",
                "--budget",
                f"sqlite://{path}",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        [key] = json.loads(done.stdout)["keys"]
        assert sorted(r["run_id"] for r in key["runs"]) == ["nightly-etl", "notebook-ana", "spark-job-1"]
        after = snapshot(folder)
    finally:
        folder.chmod(0o755)
        if writer == "open":
            __import__("asyncio").run(budget.aclose())
    assert sorted(after) == sorted(before)  # no file made
    assert {k: v for k, v in after.items() if not k.endswith("-shm")} == {
        k: v for k, v in before.items() if not k.endswith("-shm")
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """The metrics at ``port`` as {(name, labels): value}, batchsum's only."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if not line.startswith("batchsum_"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, _, labels = name_labels.partition("{")
        pairs = frozenset(
            tuple(p.split("=", 1))
            for p in labels.rstrip("}").replace('"', "").split(",")
            if p and not p.startswith("otel_")
        )
        out[(name, pairs)] = float(value)
    return out, text


def test_the_metrics_a_prometheus_scrapes_are_the_figures_of_the_json(machine, tmp_path):
    pytest.importorskip("opentelemetry.exporter.prometheus")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "batchsum", "top", "--json", "--metrics-port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = json.loads(process.stdout.readline())
        metrics, text = scrape(port)
        second = json.loads(process.stdout.readline())
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0  # Ctrl-C is how a person leaves top
    key = key_hash(KEY)

    def agrees(view: dict) -> bool:
        [shown] = view["keys"]
        expected = {
            ("batchsum_key_limit_per_min", frozenset({("batchsum_key", key)})): shown["limit"],
            ("batchsum_key_starts_1m", frozenset({("batchsum_key", key)})): shown["rate_1m"],
            ("batchsum_key_starts_10s", frozenset({("batchsum_key", key)})): shown["starts_10s"],
            ("batchsum_key_rate_limited_1m", frozenset({("batchsum_key", key)})): shown["rate_limited_1m"],
            ("batchsum_key_runs", frozenset({("batchsum_key", key)})): len(shown["runs"]),
        }
        for quota in shown["quotas"]:
            labels = frozenset({("batchsum_key", key), ("batchsum_quota", quota["name"])})
            expected[("batchsum_key_quota_left", labels)] = quota["left"]
        for run in shown["runs"]:
            labels = frozenset({("batchsum_key", key), ("batchsum_run", run["run_id"])})
            expected[("batchsum_run_sent", labels)] = run["sent"]
            expected[("batchsum_run_share", labels)] = run["share"]
            expected[("batchsum_run_limit_per_min", labels)] = run["rpm"]
            expected[("batchsum_run_processes", labels)] = run["processes"]
            if run["rows_left"] != "unknown":
                expected[("batchsum_run_rows_left", labels)] = run["rows_left"]
        return all(metrics.get(name) == value for name, value in expected.items())

    assert agrees(first) or agrees(second), metrics
    assert no_piece_of_the_key(text) and "warehouse" not in text and "s3://" not in text
    # The example dashboard asks for these metrics by name: each is one top serves.
    dashboard = (ROOT / "examples" / "grafana-dashboard.json").read_text()
    asked = set(re.findall(r"batchsum_(?:key|run)_\w+", dashboard)) - {"batchsum_key", "batchsum_run"}
    served = {name for name, _ in metrics}
    assert asked and asked <= served, asked - served


def test_limits_forget_clears_the_keys_runs_from_the_view(machine, capsys):
    import asyncio

    asyncio.run(machine.remember(key_hash(KEY), SERVICE, {"limit": json.dumps({"rpm": 600, "how": "found"})}))
    assert main(["top", "--once", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["keys"][0]["runs"]) == 3
    assert main(["limits", "--forget"]) == 0
    capsys.readouterr()
    assert main(["top", "--once", "--json"]) == 0
    keys = json.loads(capsys.readouterr().out)["keys"]
    assert [key["runs"] for key in keys] in ([], [[]])  # the runs and the search gone with the rest


def test_a_redis_user_that_may_only_read_sees_what_any_other_sees(redis_url, capsys, monkeypatch):
    """A monitoring account: a Redis user with ``+@read`` alone (no script, no ``TIME``; made with
    ``ACL SETUSER`` on the test's redis-server) runs ``top --once --json``: it exits 0 with the key
    listed, and shows the figures a user with every right shows."""
    import asyncio

    import redis

    from batchsum.pacing.budgets.budget import RedisBudget

    admin = redis.Redis.from_url(redis_url)
    admin.flushdb()
    user, password = f"viewer-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+@read"])
    try:
        viewer = redis_url.replace("redis://", f"redis://{user}:{password}@", 1)
        with pytest.raises(redis.exceptions.NoPermissionError):  # the account may not run the old view's script
            redis.Redis.from_url(viewer).eval("return redis.call('TIME')", 0)
        budget = RedisBudget(redis_url, uuid.uuid4().hex)
        busy_budget(budget)
        asyncio.run(budget.aclose())
        monkeypatch.setenv("BATCHSUM_API_KEY", KEY)
        shown = {}
        for who, url in (("viewer", viewer), ("admin", redis_url)):
            assert main(["top", "--once", "--json", "--budget", url]) == 0, who
            shown[who] = json.loads(capsys.readouterr().out)
    finally:
        admin.acl_deluser(user)
    [key] = shown["viewer"]["keys"]
    assert (
        key["key"] == key_hash(KEY) and key["rate_1m"] == 12 and key["rate_limited_1m"] == 2 and len(key["runs"]) == 3
    )
    assert shown["viewer"]["keys"] == shown["admin"]["keys"]
    assert password not in json.dumps(shown["viewer"])
