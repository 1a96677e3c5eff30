"""A team's keys and quotas (issue 42), through the command line against the local service over
loopback, each key strict at its own limit in a sliding minute, answers 0.3-0.7 s. Run by hand:

    python -m benchmarks.keys                       # every part (~10 min)
    python -m benchmarks.keys --parts team expire   # some of them
    python -m benchmarks.keys --litellm /tmp/llmvenv/bin/python   # with LiteLLM's router beside

Parts:
- ``team``: three keys at 120, 180 and 300 a minute in a key file, 600 distinct texts: rows ok, 429s,
  seconds (the summed limits need 60.3 s), and the most starts of each key in any 1, 10 and 60 s
  against ceil(rpm*w/60)+1.
- ``expire``: the same, the 180 key's plan expiring after its 50th request (401 "you are not premium
  for this request"): exit code, rows ok, that key's 401s, texts answered twice, the line, no piece
  of a key in stderr, the report, the output, the journal or the budget.
- ``quota``: one key at 600 a minute with a quota of 300 a day stated in the list form, 1000 texts;
  and the same quota unstated (a 429 with a Retry-After to the day's end): exit code, ok, not_sent,
  429s, seconds from the 300th answer to the run's end, the stop line.
- ``compare``: the three keys in one run against three single-key runs side by side (``--texts``,
  default 1800, three minutes at the summed limits, split in three, one run per key, started together), and LiteLLM's Router over the same keys (its
  usage-based routing with each key's rpm; through an OpenAI-style shim of the service) when
  ``--litellm PYTHON`` names a Python that has litellm: seconds, 429s, utilization of the summed limits.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchsum.local import Account, Faults, LocalService
from batchsum.service.settings import key_hash

ROOT = Path(__file__).resolve().parents[1]
TEAM = {"bench-key-one-0123456789": 120, "bench-key-two-0123456789": 180, "bench-key-three-012345678": 300}
LATENCY = Faults(latency=0.3, latency_spread=0.4, seed=7)


def texts(n: int, seed: int = 0) -> list[str]:
    return [
        f"Team benchmark text {seed}-{i} has enough words in it to be worth a summary of its own." for i in range(n)
    ]


def most_in_any_window(times: list[float], width: float) -> int:
    times, most, first = sorted(times), 0, 0
    for last, at in enumerate(times):
        while times[first] <= at - width:
            first += 1
        most = max(most, last - first + 1)
    return most


def folder_with(rows: list[str], keys: dict[str, int] | None = None) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="bench-keys-"))
    pq.write_table(pa.table({"text": rows}), folder / "in.parquet")
    if keys:
        (folder / "keys.txt").write_text("".join(f"{key} {rpm}\n" for key, rpm in keys.items()))
        os.chmod(folder / "keys.txt", 0o600)
    return folder


def cli(folder: Path, service: LocalService, *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    environ = {
        **os.environ,
        "BATCHSUM_BASE_URL": service.url,
        "XDG_CACHE_HOME": str(folder / "cache"),
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    command = [sys.executable, "-m", "batchsum", "summarize", "in.parquet", "-o", "out.parquet", "--column", "text"]
    return subprocess.Popen(
        [*command, "--quiet", "--report", "run.json", *argv],
        cwd=folder,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], started: float) -> dict[str, Any]:
    out, err = process.communicate(timeout=1200)
    return {"code": process.returncode, "seconds": round(time.monotonic() - started, 1), "stderr": err}


def spacing(service: LocalService, limits: dict[str, int]) -> dict[str, list[str]]:
    """Each key's most starts in any 1, 10 and 60 s, against ceil(rpm*w/60)+1."""
    out = {}
    for key, rpm in limits.items():
        times = service.state.admitted_by_key.get(key, [])
        out[key_hash(key)] = [
            f"{most_in_any_window(times, w)}/{math.ceil(rpm * w / 60) + 1}" for w in (1.0, 10.0, 60.0)
        ]
    return out


def team() -> dict[str, Any]:
    accounts = {key: Account(rpm=rpm) for key, rpm in TEAM.items()}
    with LocalService(list(TEAM), accounts=accounts, faults=LATENCY) as service:
        folder = folder_with(texts(600), TEAM)
        started = time.monotonic()
        run = finish(cli(folder, service, "--keys", "keys.txt"), started)
        out = pq.read_table(folder / "out.parquet").column("summary_status").to_pylist()
        stats = service.stats()
        return {
            "code": run["code"],
            "ok": out.count("ok"),
            "429s": stats["by_status"].get("429", 0),
            "seconds": run["seconds"],
            "per key (most starts in 1/10/60 s vs allowed)": spacing(service, TEAM),
            "requests per key": {key_hash(k): len(v) for k, v in service.state.admitted_by_key.items()},
        }


def no_piece(keys: list[str], folder: Path, *texts: str) -> bool:
    written = [p.read_bytes().decode("latin-1") for p in folder.rglob("*") if p.is_file() and p.name != "keys.txt"]
    pieces = {key[i : i + 10] for key in keys for i in range(len(key) - 9)}
    return not any(piece in text for piece in pieces for text in (*texts, *written))


def expire() -> dict[str, Any]:
    accounts = {key: Account(rpm=rpm) for key, rpm in TEAM.items()}
    two = list(TEAM)[1]
    accounts[two].expires_after = 50
    with LocalService(list(TEAM), accounts=accounts, faults=LATENCY) as service:
        folder = folder_with(texts(600, 1), TEAM)
        started = time.monotonic()
        run = finish(cli(folder, service, "--keys", "keys.txt"), started)
        out = pq.read_table(folder / "out.parquet").column("summary_status").to_pylist()
        stats = service.stats()
        report = json.loads((folder / "run.json").read_text())
        lines = [line for line in run["stderr"].splitlines() if key_hash(two) in line]
        return {
            "code": run["code"],
            "ok": out.count("ok"),
            "seconds": run["seconds"],
            "401s of the expired key": service.state.status_by_key.get(two, {}).get(401, 0),
            "texts answered twice": stats["answered_twice"],
            "the line": lines,
            "the report's refusal": [k["refusal"] for k in report["keys"] if k["refusal"]],
            "no piece of a key anywhere": no_piece(list(TEAM), folder, run["stderr"]),
        }


class Answered:
    """When each 200 left the service (to time the stop from the quota's last answer)."""

    def __init__(self, service: LocalService) -> None:
        self.times: list[float] = []
        state, record = service.state, service.state.record

        def recording(status: int, fields: Any = None, key: Any = None) -> None:
            if status == 200:
                self.times.append(time.monotonic())
            record(status, fields, key)

        state.record = recording  # type: ignore[method-assign]


def quota(stated: bool) -> dict[str, Any]:
    key = "bench-key-quota-0123456789"
    account = Account(rpm=600, quota=300, state_quota=stated)
    with LocalService([key], accounts={key: account}, faults=LATENCY) as service:
        answered = Answered(service)
        folder = folder_with(texts(1000, 2))
        started = time.monotonic()
        run = finish(cli(folder, service, env={"BATCHSUM_API_KEY": key, "BATCHSUM_RPM": "600"}), started)
        ended = time.monotonic()
        out = pq.read_table(folder / "out.parquet").to_pydict()
        return {
            "code": run["code"],
            "ok": out["summary_status"].count("ok"),
            "not_sent": out["summary_error"].count("not_sent"),
            "429s": service.stats()["by_status"].get("429", 0),
            "seconds from the 300th answer to the end": round(ended - answered.times[299], 2)
            if len(answered.times) >= 300
            else None,
            "seconds": run["seconds"],
            "the stop line": run["stderr"].strip().splitlines()[-1],
        }


def shim(service: LocalService) -> tuple[str, Any]:
    """An OpenAI-style ``/v1/chat/completions`` in front of the local service (each caller's key
    passed through), for LiteLLM's router; (its URL, its server)."""
    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(base_url=service.url, timeout=60)

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        text = body["messages"][-1]["content"]
        answer = await client.post(
            "/api/user/summarize",
            json={"text": text, "mode": 1},
            headers={"Authorization": request.headers.get("authorization", "")},
        )
        if answer.status_code != 200:
            error = {"error": {"message": answer.text, "type": "rate_limit_error", "code": answer.status_code}}
            retry = {"Retry-After": answer.headers["retry-after"]} if "retry-after" in answer.headers else {}
            return JSONResponse(error, status_code=answer.status_code, headers=retry)
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": "summarize",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": answer.json()["result"]},
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}/v1", server


def compare(litellm_python: str | None, n: int) -> dict[str, Any]:
    total = sum(TEAM.values())
    results: dict[str, Any] = {}
    accounts = {key: Account(rpm=rpm) for key, rpm in TEAM.items()}
    with LocalService(list(TEAM), accounts=accounts, faults=LATENCY) as service:
        folder = folder_with(texts(n, 3), TEAM)
        started = time.monotonic()
        run = finish(cli(folder, service, "--keys", "keys.txt"), started)
        results["batchsum, 3 keys in one run"] = {
            "seconds": run["seconds"],
            "429s": service.stats()["by_status"].get("429", 0),
            "utilization of the summed limits": round(n / run["seconds"] * 60 / total, 3),
        }
    accounts = {key: Account(rpm=rpm) for key, rpm in TEAM.items()}
    with LocalService(list(TEAM), accounts=accounts, faults=LATENCY) as service:
        started = time.monotonic()
        runs = []
        for part, (key, rpm) in enumerate(TEAM.items()):
            folder = folder_with(texts(n, 4)[part::3])
            runs.append(cli(folder, service, env={"BATCHSUM_API_KEY": key, "BATCHSUM_RPM": str(rpm)}))
        ended: dict[int, float] = {}

        def wait(number: int, process: subprocess.Popen[str]) -> None:
            process.communicate(timeout=3600)
            ended[number] = round(time.monotonic() - started, 1)

        waiters = [threading.Thread(target=wait, args=(i, p)) for i, p in enumerate(runs)]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join()
        seconds = [ended[i] for i in range(len(runs))]
        results[f"batchsum, 3 single-key runs side by side ({n // 3} texts each)"] = {
            "seconds": max(seconds),
            "each run's seconds (120, 180, 300/min)": seconds,
            "429s": service.stats()["by_status"].get("429", 0),
            "utilization of the summed limits": round(n / max(seconds) * 60 / total, 3),
        }
    if litellm_python:
        accounts = {key: Account(rpm=rpm) for key, rpm in TEAM.items()}
        with LocalService(list(TEAM), accounts=accounts, faults=LATENCY) as service:
            url, server = shim(service)
            keys = ",".join(f"{key}={rpm}" for key, rpm in TEAM.items())
            done = subprocess.run(
                [
                    litellm_python,
                    str(ROOT / "benchmarks" / "litellm_router.py"),
                    *("--url", url, "--keys", keys, "--texts", str(n)),
                ],
                capture_output=True,
                text=True,
                timeout=1800,
            )
            server.should_exit = True
            try:
                figures = json.loads(done.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                figures = {"error": done.stderr[-2000:]}
            stats = service.stats()
            results["LiteLLM Router (usage-based-routing-v2, each key's rpm)"] = {
                **figures,
                "429s": stats["by_status"].get("429", 0),
                "utilization of the summed limits": round(n / figures["seconds"] * 60 / total, 3)
                if "seconds" in figures
                else None,
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["team", "expire", "quota", "compare"])
    parser.add_argument("--litellm", default=None, metavar="PYTHON", help="a Python with litellm installed")
    parser.add_argument("--texts", type=int, default=1800, help="texts of the compare part (default 1800: 3 minutes)")
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    if "team" in args.parts:
        figures["team"] = team()
        print(json.dumps({"team": figures["team"]}, indent=1), flush=True)
    if "expire" in args.parts:
        figures["expire"] = expire()
        print(json.dumps({"expire": figures["expire"]}, indent=1), flush=True)
    if "quota" in args.parts:
        figures["quota stated"] = quota(True)
        figures["quota unstated"] = quota(False)
        print(json.dumps({k: figures[k] for k in ("quota stated", "quota unstated")}, indent=1), flush=True)
    if "compare" in args.parts:
        figures["compare"] = compare(args.litellm, args.texts)
        print(json.dumps({"compare": figures["compare"]}, indent=1), flush=True)


if __name__ == "__main__":
    main()
