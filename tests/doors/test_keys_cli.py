"""A team's keys through the command line, against the local service over loopback (a limit of its
own per key, a plan that expires after N requests, a quota stated in the list form or answered 429
with a Retry-After of a day): the run spreads its requests over the keys, each key spaced on its own;
a refused key leaves with one line and the others finish the job; a quota spent stops the run with
every row kept and the same command continues it; no piece of a key anywhere."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchsum.local import Account, Faults, LocalService
from batchsum.service.settings import key_hash
from tests.support import budget_ledger, stderr_until, ticks_before

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "run-report.schema.json").read_text())
KEYS = {"team-key-one-0123456789abc": 600, "team-key-two-0123456789abc": 900, "team-key-three-0123456789a": 1500}


def texts(n: int, seed: int = 0) -> list[str]:
    return [f"Team text {seed}-{i} has enough words in it to be worth a summary of its own here." for i in range(n)]


def batchsum_cli(*argv: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchsum", *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def setting(service: LocalService, tmp_path: Path, n: int, *, keys: dict[str, int] | None = None, seed: int = 0):
    """The input (``n`` texts), a key file of ``keys`` (key -> its limit a minute), the environment."""
    pq.write_table(pa.table({"text": texts(n, seed)}), tmp_path / "in.parquet")
    path = tmp_path / "keys.txt"
    path.write_text("".join(f"{key} {rpm}\n" for key, rpm in (keys or {}).items()))
    os.chmod(path, 0o600)
    env = {**os.environ, "BATCHSUM_BASE_URL": service.url, "PYTHONPATH": str(ROOT)}
    return env


def pieces(secret: str, width: int = 10) -> set[str]:
    return {secret[i : i + width] for i in range(len(secret) - width + 1)}


def no_piece_of(keys, *texts: str) -> bool:
    return not any(piece in text for key in keys for piece in pieces(key) for text in texts)


def files_text(folder: Path) -> str:
    """Every file the run wrote under ``folder`` (outputs, journals, reports) and in the cache folder
    (the machine's budget, with the keys' records), as text; not the key file itself."""
    cache = Path(os.environ["XDG_CACHE_HOME"])
    paths = [p for root in (folder, cache) for p in root.rglob("*") if p.is_file() and p.name != "keys.txt"]
    assert any(p.name == "budget.sqlite" for p in paths)
    return "".join(path.read_bytes().decode("latin-1") for path in paths)


def assert_spacing_per_key(service: LocalService, limits: dict[str, int]) -> None:
    """Each key's starts as the machine's budget spaced them (its ledger): the key's own plan in any
    window. At the service a loaded machine adds the send delays' spread (docs/pacing.md)."""
    for key, rpm in limits.items():
        ledger = budget_ledger("machine", key, service.url)
        for width in (1.0, 10.0, 60.0):
            most = max(ledger.started(t, t + width) for t in ticks_before(ledger.now, 120))
            assert 0 < most <= math.ceil(rpm * width / 60) + 1, (key, width, most)


@pytest.fixture
def team(tmp_path_factory):
    accounts = {key: Account(rpm=rpm) for key, rpm in KEYS.items()}
    with LocalService(list(KEYS), accounts=accounts, faults=Faults(latency=0.05, latency_spread=0.1)) as service:
        yield service


@pytest.mark.slow
def test_three_keys_in_a_key_file_share_out_the_run_each_at_its_own_limit(team, tmp_path):
    env = setting(team, tmp_path, 300, keys=KEYS)
    done = batchsum_cli(
        "summarize", "in.parquet", "-o", "out.parquet", "--column", "text", "--keys", "keys.txt",
        "--report", "run.json", "--log-format", "json", env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = pq.read_table(tmp_path / "out.parquet").to_pydict()
    assert out["summary_status"] == ["ok"] * 300
    stats = team.stats()
    assert stats["by_status"] == {"200": 300} and stats["answered_twice"] == 0
    assert_spacing_per_key(team, KEYS)
    report = json.loads((tmp_path / "run.json").read_text())
    jsonschema.validate(report, SCHEMA)
    assert report["schema"] == "batchsum-run-report/4"
    assert [k["hash"] for k in report["keys"]] == [key_hash(k) for k in KEYS]
    assert [k["source"] for k in report["keys"]] == ["keys.txt line 1", "keys.txt line 2", "keys.txt line 3"]
    assert [k["limit"] for k in report["keys"]] == [600, 900, 1500]
    assert sum(k["requests"] for k in report["keys"]) == 300 and report["utilization"]["plan_rpm"] == 3000
    assert all(k["rate_limited"] == 0 and k["refusal"] is None for k in report["keys"])
    events = [json.loads(line) for line in done.stderr.splitlines()]
    start, end = (next(e for e in events if e["event"] == name) for name in ("start", "end"))
    assert [k["hash"] for k in start["keys"]] == [key_hash(k) for k in KEYS] and end["keys"] == report["keys"]
    assert no_piece_of(KEYS, done.stdout, done.stderr, files_text(tmp_path))


@pytest.mark.slow
def test_a_key_whose_plan_expires_mid_run_leaves_with_one_line_and_the_others_finish(team, tmp_path):
    two = list(KEYS)[1]
    team.state.accounts[two].expires_after = 50
    env = setting(team, tmp_path, 400, keys=KEYS, seed=1)
    done = batchsum_cli(
        "summarize", "in.parquet", "-o", "out.parquet", "--column", "text", "--keys", "keys.txt", "--report", "run.json",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert pq.read_table(tmp_path / "out.parquet").column("summary_status").to_pylist() == ["ok"] * 400
    stats = team.stats()
    assert stats["answered_twice"] == 0 and stats["answered_unique"] == 400  # nothing paid twice
    assert 1 <= team.state.status_by_key[two][401] <= 16  # at most what was in flight on it
    assert "keys: " in done.stderr and f"{key_hash(two)} refused" in done.stderr  # the progress line says each key's
    lines = [line for line in done.stderr.splitlines() if key_hash(two) in line and line.startswith("batchsum:")]
    assert len(lines) == 1 and "you are not premium for this request" in lines[0] and "2 keys" in lines[0]
    report = json.loads((tmp_path / "run.json").read_text())
    refused = [k for k in report["keys"] if k["refusal"]]
    assert [k["hash"] for k in refused] == [key_hash(two)] and refused[0][
        "refusal"
    ] == "you are not premium for this request"
    assert report["outcome"] == "finished"
    assert no_piece_of(KEYS, done.stdout, done.stderr, files_text(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("stated", [True, False], ids=["stated in the list form", "a Retry-After of a day"])
def test_a_daily_quota_spent_stops_the_run_with_every_row_and_the_same_command_continues(tmp_path, stated):
    key = "team-key-quota-0123456789"
    account = Account(rpm=1200, quota=100, state_quota=stated)
    with LocalService([key], accounts={key: account}, faults=Faults(latency=0.05, latency_spread=0.1)) as service:
        env = {**setting(service, tmp_path, 250), "BATCHSUM_API_KEY": key, "BATCHSUM_RPM": "1200"}
        command = ("summarize", "in.parquet", "-o", "out.parquet", "--column", "text", "--report", "run.json")
        done = batchsum_cli(*command, env=env, cwd=tmp_path)
        assert done.returncode == 1, done.stderr
        out = pq.read_table(tmp_path / "out.parquet").to_pydict()
        assert out["summary_status"].count("ok") == 100 and out["summary_error"].count("not_sent") == 150
        report = json.loads((tmp_path / "run.json").read_text())
        assert report["requests"]["rate_limited"] <= 3 and report["outcome"] == "stopped"
        stop = done.stderr.strip().splitlines()[-1]
        assert ("daily quota of 100" if stated else "asking to wait") in stop
        assert "UTC" in stop and "The same command continues once a quota resets" in stop
        # The key's record knows the quota spent: the same command before the reset sends nothing,
        # and its dry run says so.
        dry = batchsum_cli(*command, "--dry-run", env=env, cwd=tmp_path).stdout
        assert "the run would not send on it before then" in dry, dry
        assert "short: the quotas leave about 0 of the 150 requests; a run would send nothing and stop" in dry
        again = batchsum_cli(*command, env=env, cwd=tmp_path)
        assert again.returncode == 1 and service.stats()["requests"] == 100 + report["requests"]["rate_limited"]
        listed = batchsum_cli("limits", env=env, cwd=tmp_path).stdout
        assert "quota spent" in listed and key_hash(key) in listed
        # The quota resets (here: at once, and forgotten), and the same command continues.
        account.quota_used, account.quota_opened = 0, None
        assert batchsum_cli("limits", "--forget", env=env, cwd=tmp_path).returncode == 0
        more = batchsum_cli(*command, env=env, cwd=tmp_path)
        assert more.returncode == 1  # 100 more, then the quota again
        out = pq.read_table(tmp_path / "out.parquet").to_pydict()
        assert out["summary_status"].count("ok") == 200 and service.stats()["answered_twice"] == 0


@pytest.mark.slow
def test_a_configured_quota_spent_binds_only_the_runs_that_set_it(tmp_path):
    """``--quota 5/day`` spent stops that run; the same key in a run with no quota, or a larger one,
    sends what it needs: a run is bound only by the quota it sets, and the budget counts what every
    run on the key paid, with a quota or without."""
    key = "team-key-conf-0123456789abc"
    with LocalService([key], accounts={key: Account(rpm=1200)}, faults=Faults(latency=0.02)) as service:
        env = {**setting(service, tmp_path, 20), "BATCHSUM_API_KEY": key, "BATCHSUM_RPM": "1200"}
        command = ("summarize", "in.parquet", "--column", "text")
        dry = batchsum_cli(*command, "-o", "one.parquet", "--quota", "5/day", "--dry-run", env=env, cwd=tmp_path)
        assert "about 5 left in this key's daily quota" in dry.stdout
        capped_dry = batchsum_cli(
            *command, "-o", "one.parquet", "--quota", "5/day", "--max-requests", "5", "--dry-run", env=env, cwd=tmp_path
        )
        assert "quota:" not in capped_dry.stdout  # a run capped at what the quota leaves is not short
        assert (
            "quota:            short: the quotas leave about 5 of the 20 requests; a run would send about 5"
            in dry.stdout
        )
        capped = batchsum_cli(*command, "-o", "one.parquet", "--quota", "5/day", env=env, cwd=tmp_path)
        assert capped.returncode == 1 and "daily quota of 5 (configured)" in capped.stderr
        assert service.stats()["requests"] == 5
        dry = batchsum_cli(*command, "-o", "one.parquet", "--quota", "5/day", "--dry-run", env=env, cwd=tmp_path)
        assert dry.returncode == 0 and "would send:       15 requests" in dry.stdout
        assert "short: the quotas leave about 0 of the 15 requests; a run would send nothing and stop" in dry.stdout
        free = batchsum_cli(*command, "-o", "two.parquet", env=env, cwd=tmp_path)
        assert free.returncode == 0, free.stderr
        assert service.stats()["requests"] == 20  # the 5 answered come from the store
        # What the run with no quota paid is counted on the key's budget all the same.
        dry = batchsum_cli(*command, "-o", "five.parquet", "--quota", "30/day", "--dry-run", env=env, cwd=tmp_path)
        assert "about 10 left in this key's daily quota of 30" in dry.stdout, dry.stdout
        assert "quota spent" not in batchsum_cli("limits", env=env, cwd=tmp_path).stdout
        larger = batchsum_cli(*command, "-o", "three.parquet", "--quota", "1000/day", env=env, cwd=tmp_path)
        assert larger.returncode == 0, larger.stderr
        again = batchsum_cli(*command, "-o", "four.parquet", "--quota", "5/day", "--refresh", env=env, cwd=tmp_path)
        assert again.returncode == 1 and service.stats()["requests"] == 20  # still 5 of 5 used today


@pytest.mark.parametrize("rpm_flag", [[], ["--rpm", "auto"]], ids=["no --rpm", "--rpm auto"])
def test_the_dry_run_of_a_one_key_file_is_at_that_keys_own_limit(team, tmp_path, rpm_flag):
    key, rpm = next(iter(KEYS.items()))
    env = setting(team, tmp_path, 61, keys={key: rpm})
    done = batchsum_cli(
        "summarize", "in.parquet", "-o", "out.parquet", "--column", "text", "--keys", "keys.txt", "--dry-run",
        *rpm_flag, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"at {rpm} requests/min that takes at least 0m06s" in done.stdout  # 60 after the first, at 600/min
    assert team.stats()["requests"] == 0


def test_a_key_file_others_may_read_is_refused_before_anything_is_sent(team, tmp_path):
    env = setting(team, tmp_path, 5, keys=KEYS)
    os.chmod(tmp_path / "keys.txt", 0o644)
    done = batchsum_cli(
        "summarize", "in.parquet", "-o", "out.parquet", "--column", "text", "--keys", "keys.txt", env=env, cwd=tmp_path
    )
    assert done.returncode == 2 and "chmod 600" in done.stderr and team.stats()["requests"] == 0
    assert no_piece_of(KEYS, done.stderr) and not (tmp_path / "out.parquet").exists()


def test_the_dry_run_names_each_key_its_limit_and_the_time_at_their_summed_limits(team, tmp_path):
    env = setting(team, tmp_path, 90, keys=KEYS)
    done = batchsum_cli(
        "summarize", "in.parquet", "-o", "out.parquet", "--column", "text", "--keys", "keys.txt", "--dry-run",
        "--quota", "5000/day", env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "at 3000 requests/min" in done.stdout and "keys:             3" in done.stdout
    for n, (key, rpm) in enumerate(KEYS.items(), 1):
        line = next(line for line in done.stdout.splitlines() if line.startswith(f"key {key_hash(key)}"))
        assert f"keys.txt line {n}" in line and f"{rpm}/min" in line and "about 5000 left" in line
    assert team.stats()["requests"] == 0 and no_piece_of(KEYS, done.stdout, done.stderr)


# -- issue 48: the dry run says what the run does; paid is what the service billed -----------------------


@pytest.mark.slow
def test_after_an_hourly_quota_is_spent_the_dry_run_says_a_long_max_wait_waits_and_a_short_one_stops(tmp_path):
    """An hourly quota the service states, spent by a run (which stopped: its reset is about an hour
    away, beyond the default max_wait of 30 minutes). The dry run with ``--max-wait 7200`` says the
    run waits until the reset, and the run does (it says so, and is interrupted while it waits,
    having sent nothing); with ``--max-wait 60``, that it stops, and the run stops at once."""
    import signal

    key = "team-key-hourly-0123456789"
    account = Account(rpm=1200, quota=20, quota_window=3600, state_quota=True)
    with LocalService([key], accounts={key: account}, faults=Faults(latency=0.02)) as service:
        env = {**setting(service, tmp_path, 30), "BATCHSUM_API_KEY": key, "BATCHSUM_RPM": "1200"}
        command = ("summarize", "in.parquet", "-o", "out.parquet", "--column", "text")
        first = batchsum_cli(*command, env=env, cwd=tmp_path)
        assert first.returncode == 1 and "hourly quota of 20" in first.stderr, first.stderr
        paid = service.stats()["requests"]
        assert service.stats()["by_status"]["200"] == 20
        long = batchsum_cli(*command, "--dry-run", "--max-wait", "7200", env=env, cwd=tmp_path).stdout
        assert (
            "quota:            every key's quota is spent now: a run waits for the hourly quota of 20 (stated by the "
            "service) to reset at " in long
        ), long
        assert "within max_wait 7200 s), then sends" in long and "of it waiting for a quota to reset" in long
        short = batchsum_cli(*command, "--dry-run", "--max-wait", "60", env=env, cwd=tmp_path).stdout
        assert "short: the quotas leave about 0 of the 10 requests; a run would send nothing and stop (exit 1)" in short
        assert "longer than max_wait (60 s)" in short, short
        stopped = batchsum_cli(*command, "--max-wait", "60", "--report", "short.json", env=env, cwd=tmp_path)
        assert stopped.returncode == 1 and service.stats()["requests"] == paid
        report = json.loads((tmp_path / "short.json").read_text())
        jsonschema.validate(report, SCHEMA)
        assert (report["outcome"], report["cause"], report["requests"]["paid"]) == ("stopped", "quota", 0)
        waiting = subprocess.Popen(
            [sys.executable, "-m", "batchsum", *command, "--max-wait", "7200", "--log-format", "json"],
            env=env, cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            lines = stderr_until(waiting, "the run waits for")
            said = next(json.loads(line)["message"] for line in lines if "the run waits for" in line)
            assert "hourly quota of 20 (stated by the service)" in said and "within max_wait 7200 s" in said
            waiting.send_signal(signal.SIGINT)
            assert waiting.wait(timeout=120) == 130
        finally:
            waiting.kill()
            waiting.wait()
        assert service.stats()["requests"] == paid  # it waited: nothing was sent before the reset


@pytest.mark.slow
def test_two_keys_one_with_its_configured_quota_spent_the_dry_run_times_the_job_at_the_others_rate(team, tmp_path):
    """Key A (600/min, ``quota=5/day``) spent by a run of its own, key B (900/min): the dry run of
    both times 91 requests at 900 requests/min (it said 1500 before A was spent), and the run sends
    every one on B."""
    a, b = list(KEYS)[:2]
    env = setting(team, tmp_path, 10)
    for name, lines in (("a.txt", [f"{a} 600 quota=5/day"]), ("keys.txt", [f"{a} 600 quota=5/day", f"{b} 900"])):
        (tmp_path / name).write_text("".join(line + "\n" for line in lines))
        os.chmod(tmp_path / name, 0o600)
    pq.write_table(pa.table({"text": texts(91, seed=5)}), tmp_path / "more.parquet")
    job = ("summarize", "more.parquet", "-o", "more-out.parquet", "--column", "text", "--keys", "keys.txt")
    before = batchsum_cli(*job, "--dry-run", env=env, cwd=tmp_path).stdout
    assert "at 1500 requests/min" in before, before
    # --max-wait 60: a stop at the quota, not a wait for its reset, even near UTC midnight.
    spent = batchsum_cli(
        "summarize", "in.parquet", "-o", "a.parquet", "--column", "text", "--keys", "a.txt", "--max-wait", "60",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert spent.returncode == 1 and team.state.status_by_key[a][200] == 5, spent.stderr
    dry = batchsum_cli(*job, "--dry-run", env=env, cwd=tmp_path).stdout
    assert "would send:       91 requests; at 900 requests/min that takes at least 0m06s" in dry, dry
    assert "about 0 left in this key's daily quota of 5" in dry
    done = batchsum_cli(*job, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert team.state.status_by_key[a][200] == 5 and sum(team.state.status_by_key[a].values()) == 5  # none on A
    assert team.state.status_by_key[b][200] == 91


def revoked_run(team, tmp_path: Path, n: int, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict, str]:
    """Three keys, the second's plan revoked after 15 requests (401 "you are not premium"), a run of
    ``n`` texts: (the command, its report, the revoked key)."""
    two = list(KEYS)[1]
    team.state.accounts[two].expires_after = 15
    env = setting(team, tmp_path, n, keys=KEYS, seed=3)
    done = batchsum_cli(
        "summarize", "in.parquet", "-o", "out.parquet", "--column", "text", "--keys", "keys.txt",
        "--report", "run.json", *extra, env=env, cwd=tmp_path,
    )  # fmt: skip
    report = json.loads((tmp_path / "run.json").read_text())
    jsonschema.validate(report, SCHEMA)
    return done, report, two


@pytest.mark.slow
def test_three_keys_one_revoked_mid_run_the_reports_paid_is_what_the_service_answered(team, tmp_path):
    """Counted at the service: ``paid`` is its 200s (it said 151 for 150 answered), ``used_rate``
    every request but none of its 429s (there are none), the revoked key's refusals sent again on
    the others are the retries."""
    done, report, two = revoked_run(team, tmp_path, 150)
    assert done.returncode == 0, done.stderr
    stats, refusals = team.stats(), team.state.status_by_key[two][401]
    assert refusals >= 1 and report["outcome"] == "finished" and report["cause"] is None
    assert report["requests"]["paid"] == stats["by_status"]["200"] == 150
    assert report["requests"]["sent"] == stats["requests"] == 150 + refusals
    assert report["requests"]["used_rate"] == 150 + refusals and report["requests"]["retried"] == refusals
    assert report["utilization"]["paid_per_minute"] <= report["utilization"]["used_per_minute"]
    shown = batchsum_cli("report", "run.json", env=os.environ.copy(), cwd=tmp_path).stdout
    assert f"{150 + refusals} sent, 150 paid, {150 + refusals} used the rate" in shown


@pytest.mark.slow
def test_three_keys_one_revoked_mid_run_max_requests_holds_what_the_service_billed(team, tmp_path):
    done, report, two = revoked_run(team, tmp_path, 120, "--max-requests", "60")
    assert done.returncode == 1 and team.state.status_by_key[two][401] >= 1
    assert team.stats()["by_status"]["200"] == report["requests"]["paid"] == 60  # the 401s were given back
    assert (report["outcome"], report["cause"]) == ("stopped", "request_cap")


@pytest.mark.slow
def test_three_keys_one_revoked_mid_run_a_configured_quota_counts_what_the_service_billed(team, tmp_path):
    """``--quota 20/day`` on each key: the revoked key's refusals are given back on its budget, so a
    dry run after says 5 left of its day (15 billed), and every key sent at most its quota."""
    done, report, two = revoked_run(team, tmp_path, 100, "--quota", "20/day", "--max-wait", "60")  # a stop, not a wait
    assert done.returncode == 1 and (report["outcome"], report["cause"]) == ("stopped", "quota")
    by_key = {key: team.state.status_by_key[key] for key in KEYS}
    assert [by_key[key][200] for key in KEYS] == [20, 15, 20] and by_key[two][401] >= 1
    assert report["requests"]["paid"] == 55
    env = setting(team, tmp_path, 100, keys=KEYS, seed=3)
    dry = batchsum_cli(
        "summarize", "in.parquet", "-o", "again.parquet", "--column", "text", "--keys", "keys.txt", "--quota", "20/day",
        "--dry-run", env=env, cwd=tmp_path,
    ).stdout  # fmt: skip
    line = next(line for line in dry.splitlines() if line.startswith(f"key {key_hash(two)}"))
    assert "about 5 left in this key's daily quota of 20" in line, dry
