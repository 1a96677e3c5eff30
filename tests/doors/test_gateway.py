"""``batchsum gateway`` against the local service: a real gateway on uvicorn (in a thread, or the
command in a process of its own), real runs beside it, a real redis-server. JSON and form requests
answered as the service answers them; its error bodies handed on; a spent quota's 429 and a
request's deadline's 429, each with Retry-After; a 429 from the service pausing the key for every
client and run; a text paid once whoever asks; Redis stopped under load; a held key behind a token;
no start off loopback without a token; the key nowhere; ``top`` seeing the gateway; the key's pace
between gateways and a CLI run asserted on the budget's ledger; and live requests ahead of the batch
runs' reserved starts on both budgets."""

from __future__ import annotations

import datetime
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import jsonschema
import pandas as pd
import pytest

from batchsum.cli import main
from batchsum.cli.gateway import MAX_WAIT_HEADER, TOKEN_HEADER, Gateway, create_app, gateway_options
from batchsum.cli.parser import build_parser
from batchsum.local import Faults, LocalService
from batchsum.local.server import ThreadServer
from batchsum.pacing.budgets.spacing import max_starts
from tests.support import (
    BASIC_KEY,
    KEY,
    RedisServer,
    article,
    budget_ledger,
    free_port,
    stdout_until,
    ticks_before,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
PATH = "/api/user/summarize"
TOP_SCHEMA = json.loads((ROOT / "docs" / "top.schema.json").read_text())
REPORT_SCHEMA = json.loads((ROOT / "docs" / "run-report.schema.json").read_text())
TOKEN = "gateway-token-0123456789abcdef"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@contextmanager
def gateway(*flags: str) -> Iterator[str]:
    """A gateway of ``flags`` on uvicorn in a thread of this process (its lifespan opens and closes
    its runs): its address."""
    options = gateway_options(build_parser().parse_args(["gateway", "--port", "0", *flags]))
    server = ThreadServer(create_app(Gateway(options)), lifespan="on", name="batchsum-gateway").start()
    try:
        yield server.url
    finally:
        server.stop(60)


def ask(url: str, text: str, key: str = KEY, **headers: str) -> httpx.Response:
    return httpx.post(url + PATH, json={"text": text, "mode": 1}, headers={**auth(key), **headers}, timeout=120)


def cli_env(service: LocalService, key: str = KEY) -> dict[str, str]:
    return {**os.environ, "BATCHSUM_API_KEY": key, "BATCHSUM_BASE_URL": service.url}


def summarize_run(tmp_path: Path, service: LocalService, texts: list[str], *flags: str, key: str = KEY) -> dict:
    """``batchsum summarize`` of ``texts`` in a process of its own, on ``key``: its run report."""
    name = f"run{len(list(tmp_path.glob('run*.parquet')))}"
    pd.DataFrame({"text": texts}).to_parquet(tmp_path / f"{name}.parquet")
    argv = ["summarize", str(tmp_path / f"{name}.parquet"), "-o", str(tmp_path / f"{name}-out.parquet")]
    argv += ["--column", "text", "--quiet", "--report", str(tmp_path / f"{name}.json"), *flags]
    done = subprocess.run(
        [sys.executable, "-m", "batchsum", *argv],
        env=cli_env(service, key),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr
    return json.loads((tmp_path / f"{name}.json").read_text())


# -- the interface, as the service serves it ------------------------------------------------------


def test_json_and_form_requests_are_answered_as_the_service_answers_them(svc):
    fields = {"text": article(40, 1), "mode": 1, "percentage": 3, "type": "bullets"}
    direct = httpx.post(svc.url + PATH, json=fields, headers=auth(KEY)).json()
    with gateway("--upstream", svc.url, "--rpm", "6000") as url:
        by_json = httpx.post(url + PATH, json=fields, headers=auth(KEY), timeout=60)
        as_text = {name: str(value) for name, value in fields.items()}
        by_form = httpx.post(url + PATH, data=as_text | {"text": article(40, 2)}, headers=auth(KEY), timeout=60)
        parts = {name: (None, value) for name, value in as_text.items()} | {"text": (None, article(40, 3))}
        by_multipart = httpx.post(url + PATH, files=parts, headers=auth(KEY), timeout=60)
        document = httpx.get(url + "/openapi.json").json()
        index = httpx.get(url + "/").json()
    assert by_json.status_code == 200 and by_json.json() == direct
    for answer, seed in ((by_form, 2), (by_multipart, 3)):
        mine = httpx.post(svc.url + PATH, json=fields | {"text": article(40, seed)}, headers=auth(KEY)).json()
        assert answer.status_code == 200 and answer.json() == mine
    operation = document["paths"][PATH]["post"]
    assert {p["name"] for p in operation["parameters"]} == {MAX_WAIT_HEADER, TOKEN_HEADER}
    assert {"200", "401", "422", "429", "503"} <= set(operation["responses"])
    assert index["service"] == "batchsum gateway" and index["openapi"] == "/openapi.json"


def test_the_services_error_bodies_come_back_as_they_came(svc):
    """A wrong key's 401 and a plan's 401 are the service's, handed on; a request the service would
    refuse (a missing field, a short text, a bad mode) is refused with the body it would send, never
    sent; a 422 the service sends is handed on; a header that is not a number of seconds is a 422."""
    text = article(40, 7)
    cases = [
        ({"text": text, "mode": 1}, "test-key-wrong-0123456789"),
        ({"text": text, "mode": 2}, BASIC_KEY),
        ({"mode": 1}, KEY),
        ({"text": "four words only here", "mode": 1}, KEY),
        ({"text": text, "mode": 3}, KEY),
        ({"text": " ".join(["word"] * 5001), "mode": 1}, KEY),
    ]
    with gateway("--upstream", svc.url, "--rpm", "6000") as url:
        for fields, key in cases:
            direct = httpx.post(svc.url + PATH, json=fields, headers=auth(key), timeout=60)
            through = httpx.post(url + PATH, json=fields, headers=auth(key), timeout=60)
            assert (through.status_code, through.json()) == (direct.status_code, direct.json()), fields
        svc.state.reset_stats()
        svc.faults = Faults(script=deque(["422"]))
        refused = ask(url, article(40, 8))
        bad = ask(url, article(40, 9), **{MAX_WAIT_HEADER: "soon"})
    assert (refused.status_code, refused.json()) == (422, {"error": "Text exceeds word limit"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["header", MAX_WAIT_HEADER.lower()]
    assert svc.stats()["by_status"] == {"422": 1}  # the header's 422 was the gateway's: nothing sent


# -- queue, never refuse, within the client's patience --------------------------------------------


@pytest.mark.slow
def test_a_request_past_its_deadline_gets_a_429_saying_when_its_turn_would_come(svc):
    """At 30/min (a start every 2 s): the key's first request goes; the next, willing to wait 0.2 s,
    is answered 429 with Retry-After 2 (its turn), and never sent; the one after, with the gateway's
    patience, waits for its turn and is answered."""
    with gateway("--upstream", svc.url, "--rpm", "30") as url:
        assert ask(url, article(30, 1)).status_code == 200
        late = ask(url, article(30, 2), **{MAX_WAIT_HEADER: "0.2"})
        waited = ask(url, article(30, 3))
    assert late.status_code == 429 and late.headers["Retry-After"] == "2", late.headers
    assert late.json()["error"].startswith("Too Many Requests: the key's next turn")
    assert waited.status_code == 200
    assert svc.stats()["requests"] == 2  # the late one never went


def test_a_gateway_that_stops_answers_what_waits_at_once_and_sends_nothing_for_it(svc):
    """At 6/min (a start every 10 s) a request waits for its turn; the gateway is told to stop (as
    its signal handler tells it): the request is answered 503 with Retry-After at once, never sent."""
    options = gateway_options(
        build_parser().parse_args(["gateway", "--port", "0", "--upstream", svc.url, "--rpm", "6"])
    )
    door = Gateway(options)
    server = ThreadServer(create_app(door), lifespan="on", name="batchsum-gateway").start()
    try:
        assert ask(server.url, article(30, 1)).status_code == 200
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(ask, server.url, article(30, 2))
            wait_for(lambda: door.runs.waiting == 1, what="one request waiting")
            door.runs.stop()
            stopped = waiting.result()
    finally:
        server.stop(60)
    assert stopped.status_code == 503 and stopped.headers["Retry-After"] == "1"
    assert "the gateway is stopping" in stopped.json()["error"] and svc.stats()["requests"] == 1


def test_a_spent_quota_is_a_429_until_its_reset_and_the_gateways_requests_count_in_it(svc, tmp_path):
    with gateway("--upstream", svc.url, "--rpm", "6000", "--quota", "2/day") as url:
        assert [ask(url, article(30, i)).status_code for i in range(2)] == [200, 200]
        spent = ask(url, article(30, 3))
        midnight = datetime.datetime.now(datetime.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
        reset = (midnight + datetime.timedelta(days=1)).timestamp() - time.time()
    assert spent.status_code == 429 and "daily quota of 2" in spent.json()["error"]
    assert abs(int(spent.headers["Retry-After"]) - math.ceil(reset)) <= 5
    assert svc.stats()["requests"] == 2
    # A run on the key and the budget with the same quota finds it spent by the gateway's requests.
    report = summarize_run(tmp_path, svc, [article(30, 4)], "--quota", "2/day", "--rpm", "6000")
    assert (report["outcome"], report["cause"], report["requests"]["sent"]) == ("stopped", "quota", 0)


@pytest.mark.slow
def test_a_429_from_the_service_pauses_the_key_for_every_client_and_run_and_the_request_is_answered(svc, tmp_path):
    """The service answers a request 429 asking for 5 s: the request is answered once the pause
    ends, within its deadline; another client's request and a CLI run on the key, both asking during
    the pause, start only after it (the service's clock)."""
    with gateway("--upstream", svc.url, "--rpm", "600") as url:
        assert ask(url, article(30, 1)).status_code == 200  # the key proven: what follows is not its first request
        svc.state.reset_stats()
        svc.faults = Faults(script=deque(["429"]), retry_after=5)
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(ask, url, article(30, 2))
            wait_for(lambda: svc.stats()["by_status"].get("429") == 1, what="the service's 429")
            refused_at = svc.state.arrivals[0]
            other = pool.submit(ask, url, article(30, 3))
            report = summarize_run(tmp_path, svc, [article(30, 4), article(30, 5)], "--rpm", "600")
            answers = [first.result(), other.result()]
    assert [answer.status_code for answer in answers] == [200, 200]
    assert report["outcome"] == "finished" and report["requests"]["sent"] == 2
    assert svc.stats()["by_status"] == {"200": 4, "429": 1}
    assert min(svc.state.admitted_by_key[KEY]) >= refused_at + 5


@pytest.mark.slow
def test_rpm_auto_and_the_room_a_service_states_hold_through_the_gateway(tmp_path):
    """A key whose plan (300/min, counted in clock-aligned 10 s windows) the service states in its
    headers, through a gateway at ``--rpm auto``: every request answered, not one 429 from the service,
    and the gateway's report says the limit was stated."""
    key = "gateway-auto-key-0123456789"
    with LocalService([key], rpm=300, room_headers="ratelimit", limit_kind="clock-10s") as service:
        flags = ["--upstream", service.url, "--rpm", "auto", "--report", str(tmp_path / "gateway.json")]
        with gateway(*flags) as url, ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda i: ask(url, article(30, i), key=key).status_code, range(40)))
        stats = service.stats()
    report = json.loads((tmp_path / "gateway.json").read_text())
    assert statuses == [200] * 40 and stats["by_status"] == {"200": 40}
    [described] = report["keys"]
    assert (described["limit"], described["limit_source"]) == (300, "stated")


# -- pay once ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_text_is_paid_once_whether_the_gateway_or_a_run_asks_first(svc, tmp_path):
    with gateway("--upstream", svc.url, "--rpm", "6000") as url:
        through = ask(url, article(30, 1))
        report = summarize_run(tmp_path, svc, [article(30, 1)], "--rpm", "6000")
        assert report["requests"]["sent"] == 0 and report["requests"]["from_store"] == 1
        report = summarize_run(tmp_path, svc, [article(30, 2)], "--rpm", "6000")
        assert report["requests"]["sent"] == 1
        after_run = ask(url, article(30, 2))
    assert through.status_code == after_run.status_code == 200
    assert svc.stats()["requests"] == 2 and svc.stats()["answered_twice"] == 0


def test_a_key_the_service_never_accepted_is_served_nothing_from_the_store(svc):
    with gateway("--upstream", svc.url, "--rpm", "6000") as url:
        assert ask(url, article(30, 1)).status_code == 200
        wrong = ask(url, article(30, 1), key="test-key-wrong-0123456789")
    assert wrong.status_code == 401 and svc.stats()["by_status"] == {"200": 1, "401": 1}


# -- keys and access -------------------------------------------------------------------------------


def test_a_held_key_serves_only_clients_with_a_token_and_a_passed_key_can_need_one_too(svc, tmp_path, monkeypatch):
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"# the gateway's own\n{TOKEN}\n")
    tokens.chmod(0o600)
    monkeypatch.setenv("BATCHSUM_API_KEY", KEY)
    with gateway("--upstream", svc.url, "--rpm", "6000", "--hold-key", "--token-file", str(tokens)) as url:
        held = ask(url, article(30, 1), key=TOKEN)
        refused = [ask(url, article(30, 2), key=KEY), ask(url, article(30, 2), key="not-a-token-0123456789")]
    assert held.status_code == 200 and svc.stats()["requests"] == 1  # sent on the held key
    assert [r.status_code for r in refused] == [401, 401] and refused[0].json()[
        "message"
    ] == "incorrect API key provided"
    with gateway("--upstream", svc.url, "--rpm", "6000", "--token-file", str(tokens)) as url:
        without = ask(url, article(30, 3))
        passed = ask(url, article(30, 3), **{TOKEN_HEADER: TOKEN})
    assert (without.status_code, passed.status_code) == (401, 200) and svc.stats()["requests"] == 2
    tokens.chmod(0o644)
    assert main(["gateway", "--token-file", str(tokens), "--port", "0"]) == 2


@pytest.mark.parametrize("hold", [False, True])
def test_off_loopback_it_refuses_to_start_without_a_token_in_one_line(env, capsys, hold):
    code = main(["gateway", "--host", "0.0.0.0", "--port", "0", *(["--hold-key"] if hold else [])])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "without a token" in err and "--token-file" in err


@pytest.mark.parametrize("share", ["1.5", "-0.1", "half", "nan"])
def test_an_interactive_share_outside_0_to_1_is_one_line_naming_the_flag(env, capsys, share):
    code = main(["gateway", "--port", "0", "--interactive-share", share])
    err = capsys.readouterr().err
    first = err.splitlines()[0]  # (the next says where the flags are: --help)
    assert code == 2 and "--interactive-share" in first and "from 0 to 1" in first


# -- the command, top and the key ------------------------------------------------------------------


@pytest.mark.slow
def test_the_command_says_its_address_is_a_run_in_top_and_never_shows_a_key(svc, tmp_path):
    """The command in a process of its own (keys passed through, a token of its own): its first line,
    its requests (one with a wrong key, one without the token), ``top --once --json``, ``top``'s table
    and the metrics showing it as a run of door gateway, its report when SIGTERM ends it; no piece of
    a key or the token anywhere, the budget's file included."""
    wrong = "sk-wrong-key-0123456789abcdef"
    metrics = free_port()
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(TOKEN + "\n")
    tokens.chmod(0o600)
    argv = ["gateway", "--port", "0", "--rpm", "600", "--metrics-port", str(metrics), "--log-format", "json"]
    argv += ["--token-file", str(tokens)]
    process = subprocess.Popen(
        [sys.executable, "-m", "batchsum", *argv, "--report", str(tmp_path / "gateway.json")],
        env=cli_env(svc, key="not-this-one-0123456789"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        (line,) = stdout_until(process, "batchsum gateway on http://127.0.0.1:")
        url = line.split()[3]
        token = {TOKEN_HEADER: TOKEN}
        answers = [ask(url, article(30, i), **token).status_code for i in range(3)]
        answers += [
            ask(url, article(30, 9), key=wrong, **token).status_code,
            ask(url, "too short", **token).status_code,
        ]
        answers += [ask(url, article(30, 10)).status_code]  # without the gateway's token
        assert answers == [200, 200, 200, 401, 422, 401]
        view, shown = wait_for(lambda: gateways_in_top(svc), what="both gateways in top with their waits", every=0.2)
        table = subprocess.run(
            [sys.executable, "-m", "batchsum", "top", "--once"],
            env=cli_env(svc) | {"COLUMNS": "160"},
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        assert "gateway" in table and "QUEUE" in table and "WAIT" in table, table
        shown += table
        scraped = wait_for(
            lambda: scrape(metrics, "batchsum_run_wait_p95_seconds"), what="the waits in the metrics", every=0.2
        )
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    runs = [run for key in view["keys"] for run in key["runs"] if run["door"] == "gateway"]
    assert len(runs) == 2 and all(run["rows_left"] is None and run["eta_s"] is None for run in runs), runs
    assert all(run["queue"] == 0 for run in runs) and "batchsum_run_queue" in scraped
    report = json.loads((tmp_path / "gateway.json").read_text())
    jsonschema.validate(report, REPORT_SCHEMA)
    assert report["door"] == "gateway" and report["gateway"]["answered"] == 4 and report["partitions"] == 2
    budget = (Path(os.environ["XDG_CACHE_HOME"]) / "batchsum" / "budget.sqlite").read_bytes().decode("latin-1")
    seen = line + out + err + shown + scraped + json.dumps(report) + budget
    for secret in (KEY, wrong, TOKEN):
        assert not any(secret[i : i + 8] in seen for i in range(len(secret) - 7)), secret


def gateways_in_top(service: LocalService) -> tuple[dict, str] | None:
    """``top --once --json`` (valid by its schema) once it shows two gateway runs with their waits."""
    top = subprocess.run(
        [sys.executable, "-m", "batchsum", "top", "--once", "--json"],
        env=cli_env(service),
        capture_output=True,
        text=True,
        timeout=60,
    )
    view = json.loads(top.stdout)
    jsonschema.validate(view, TOP_SCHEMA)
    runs = [run for key in view["keys"] for run in key["runs"] if run["door"] == "gateway"]
    return (
        (view, top.stdout + top.stderr) if len(runs) == 2 and all(r["wait_p50_s"] is not None for r in runs) else None
    )


def scrape(port: int, needed: str) -> str | None:
    """The metrics served at ``port`` once they hold ``needed``."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return text if needed in text else None


# -- replicas, Redis, and the pace on the budget --------------------------------------------------


@pytest.mark.slow
def test_redis_stopped_under_load_is_a_pause_then_a_503_past_each_deadline(svc, tmp_path):
    """The gateway's budget (and store) on a Redis of the test's own, stopped while requests come:
    once the gateway finds it out (a request gets 503), nothing goes upstream; a request past its
    deadline gets 503 with Retry-After, and the requests within theirs are answered once Redis is
    back (empty: the budget's schema rebuilds what lived there)."""
    redis = RedisServer(tmp_path).start()
    try:
        flags = ["--upstream", svc.url, "--rpm", "600", "--budget", redis.url, "--budget-wait", "120"]
        with gateway(*flags) as url, ThreadPoolExecutor(8) as pool:
            assert all(r.status_code == 200 for r in pool.map(lambda i: ask(url, article(30, i)), range(8)))
            redis.stop()
            seed = iter(range(100, 200))
            wait_for(
                lambda: ask(url, article(30, next(seed)), **{MAX_WAIT_HEADER: "1"}).status_code == 503, what="a 503"
            )
            sent = svc.stats()["requests"]
            patient = [pool.submit(ask, url, article(30, 200 + i)) for i in range(6)]
            short = [ask(url, article(30, 300 + i), **{MAX_WAIT_HEADER: "1"}) for i in range(3)]
            assert svc.stats()["requests"] == sent  # nothing went upstream meanwhile
            redis.start()
            answered = [future.result() for future in patient]
    finally:
        redis.stop()
    assert all(r.status_code == 503 and int(r.headers["Retry-After"]) >= 1 for r in short), [r.text for r in short]
    assert all("rate budget cannot be reached" in r.json()["error"] for r in short)
    assert [r.status_code for r in answered] == [200] * 6


@pytest.mark.slow
@pytest.mark.parametrize("where", ["machine", "redis"])
def test_gateways_and_a_run_on_one_budget_hold_the_keys_pace_between_them(tmp_path, redis_url, where):
    """A CLI run of 60 texts at 1200/min and, beside it, clients sending 60 requests through the
    gateway (two gateways, replicas, on Redis) on the same key and budget: every request answered,
    and on the budget's ledger at most the plan's count in any 1 s and 10 s, the run's and the
    gateways' starts together."""
    key = f"gateway-pace-{where}-{os.getpid()}-{time.monotonic_ns()}"
    budget = "machine" if where == "machine" else redis_url
    replicas = 1 if where == "machine" else 2
    with LocalService([key]) as service, ExitStack() as stack:
        urls = [
            stack.enter_context(gateway("--upstream", service.url, "--rpm", "1200", "--budget", budget))
            for _ in range(replicas)
        ]
        assert ask(urls[0], article(30, 0), key=key).status_code == 200
        with ThreadPoolExecutor(6) as pool:
            asked = [pool.submit(ask, urls[i % replicas], article(30, 1000 + i), key) for i in range(60)]
            texts = [article(30, 2000 + i) for i in range(60)]
            report = summarize_run(tmp_path, service, texts, "--rpm", "1200", "--budget", budget, key=key)
            statuses = [future.result().status_code for future in asked]
        ledger = budget_ledger(budget, key, service.url)
    assert statuses == [200] * 60 and report["outcome"] == "finished" and report["requests"]["sent"] == 60
    assert ledger.started(ledger.now - 120, ledger.now + 1) == 121
    for width in (1.0, 10.0):
        most = max(ledger.started(t, t + width) for t in ticks_before(ledger.now, 120))
        assert most <= max_starts(1200, width) + 1, (width, most)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["machine", "redis"])
def test_a_live_request_goes_ahead_of_the_batch_runs_reserved_starts(redis_url, where):
    """Live before batch, on the machine's budget and on Redis: four batch runs on one key at 60/min
    (an interval of a second; each holds its next start reserved, a queue of four) and, through a
    gateway on the same budget (``--interactive-share 0.5``: a live start every two seconds), a
    client's live requests every few seconds. Each reaches the service ahead of the
    runs' reserved starts: at most one batch start at the service between its sending and its answer
    (in the queue it would wait for four). On Redis the first live request opens the lane (the runs
    then reserve each start just in time), so it is sent first and not counted. Every start is on
    the budget's ledger once, and the runs lose nothing: each ends with every text answered."""
    import asyncio

    import batchsum

    key = f"gateway-live-{where}-{os.getpid()}-{time.monotonic_ns()}"
    budget = "machine" if where == "machine" else redis_url
    flags = ("--rpm", "60", "--budget", budget, "--store", "none", "--interactive-share", "0.5")

    def batch_run(n: int) -> list:
        texts = [article(30, 100 * n + i) for i in range(6)]
        run = batchsum.summarize_texts(
            texts, api_key=key, base_url=service.url, rpm=60, budget=budget, store="none", progress=False
        )
        return asyncio.run(run)

    with LocalService([key]) as service, gateway("--upstream", service.url, *flags) as url:
        assert ask(url, article(30, 0), key=key).status_code == 200  # the key proven, the gateway's run open
        with ThreadPoolExecutor(4) as pool:
            runs = [pool.submit(batch_run, n) for n in range(1, 5)]
            wait_for(lambda: len(service.state.admitted) >= 4, what="the batch runs under way")
            assert ask(url, article(30, 1), key=key).status_code == 200  # the lane open
            between = []
            for i in range(3):
                time.sleep(2.5)  # the client's pace: a request every few seconds, within the lane's share
                sent = time.monotonic()
                answer = ask(url, article(30, 10 + i), key=key)
                answered = time.monotonic()
                assert answer.status_code == 200
                between.append(sum(sent <= t <= answered for t in list(service.state.admitted)) - 1)
            results = [future.result() for future in runs]
        ledger = budget_ledger(budget, key, service.url)
        admitted = len(service.state.admitted)
    assert max(between) <= 1, between
    assert all(r.status == "ok" for run in results for r in run) and sum(map(len, results)) == 24
    assert ledger.started(ledger.now - 120, ledger.now + 1) == admitted == 24 + 5
    for width in (1.0, 10.0):
        most = max(ledger.started(t, t + width) for t in ticks_before(ledger.now, 120))
        assert most <= max_starts(60, width) + 1, (width, most)
