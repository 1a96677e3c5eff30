"""Issue 47's figures for claims at the turn: two jobs over the same texts on two keys of different
rates, each a real ``batchsum summarize`` process, against one local service process. Run by hand:

    python -m benchmarks.two_jobs                  # 2000 texts, A at 60/min, B at 1200/min 4 s later (~2 min)
    python -m benchmarks.two_jobs --texts 200      # shorter

The service runs in a process of its own, strict at each key's rate (a sliding minute), answering
in 0.3-0.7 s; job A (its key at ``--slow``/min) starts first, job B (another key at ``--fast``/min)
``--delay`` seconds later, over the same file, each into its own output, sharing the machine's
answer store (in a cache folder of the benchmark's own) and each key its machine budget.

Figures: each job's seconds (from its own start, and B's from A's), rows ok, requests it sent (its
report), CPU seconds (user + system, from the process's resource usage); at the service: requests,
answers paid (200s), texts answered twice, 429s. The targets: B done within 130 s, every row ok in
both, at most 2010 paid, neither process over 20 s of CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.rate import texts

ROOT = Path(__file__).resolve().parents[1]
SLOW_KEY, FAST_KEY = "bench-slow-key-0123456789", "bench-fast-key-0123456789"

SERVICE = """
import sys
from batchsum.local import Faults, LocalService
from batchsum.local.state import Account

slow, fast, slow_rpm, fast_rpm = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
accounts = {slow: Account(rpm=slow_rpm), fast: Account(rpm=fast_rpm)}
with LocalService([slow, fast], accounts=accounts, faults=Faults(latency=0.3, latency_spread=0.4)) as service:
    print(service.url, service.state.admin_key, flush=True)
    sys.stdin.read()  # until the benchmark closes it
"""


class Service:
    """The local service in a process of its own: its address, and its counts (``/_local/stats``)."""

    def __init__(self, slow: int, fast: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVICE, SLOW_KEY, FAST_KEY, str(slow), str(fast)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert self.process.stdout is not None
        self.url, self.admin = self.process.stdout.readline().split()

    def stats(self) -> dict[str, Any]:
        request = urllib.request.Request(f"{self.url}/_local/stats", headers={"Authorization": f"Bearer {self.admin}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            found: dict[str, Any] = json.load(answer)
        return found

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(30)


def job(folder: Path, service: Service, key: str, rpm: int, output: str) -> subprocess.Popen[str]:
    """``batchsum summarize`` of the texts into ``output`` on ``key`` at ``rpm``, with its report."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "XDG_CACHE_HOME": str(folder / "cache"),
        "BATCHSUM_API_KEY": key,
        "BATCHSUM_BASE_URL": service.url,
    }
    command = [sys.executable, "-m", "batchsum.cli", "summarize", "in.parquet", "-o", output, "--column", "text"]
    command += ["--quiet", "--rpm", str(rpm), "--report", f"{output}.report.json"]
    return subprocess.Popen(command, env=env, cwd=folder, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str], started: float) -> dict[str, Any]:
    """Wait for ``process``: its exit code, seconds from its start, CPU seconds, the end of its stderr."""
    _, status, usage = os.wait4(process.pid, 0)
    ended = time.monotonic()
    process.returncode = os.waitstatus_to_exitcode(status)
    err = process.stderr.read() if process.stderr is not None else ""
    return {
        "exit code": process.returncode,
        "seconds": round(ended - started, 1),
        "ended": ended,
        "cpu seconds": round(usage.ru_utime + usage.ru_stime, 2),
        "stderr": err.strip()[-300:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--slow", type=int, default=60, help="job A's key's requests a minute")
    parser.add_argument("--fast", type=int, default=1200, help="job B's key's requests a minute")
    parser.add_argument("--delay", type=float, default=4.0, help="seconds between A's start and B's")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="batchsum-two-jobs-") as scratch:
        folder = Path(scratch)
        pd.DataFrame({"text": texts(args.texts)}).to_parquet(folder / "in.parquet")
        service = Service(args.slow, args.fast)
        try:
            begun = time.monotonic()
            a = job(folder, service, SLOW_KEY, args.slow, "a.parquet")
            time.sleep(args.delay)
            b_started = time.monotonic()
            b = job(folder, service, FAST_KEY, args.fast, "b.parquet")
            done_b = finish(b, b_started)
            done_a = finish(a, begun)
            stats = service.stats()
        finally:
            service.stop()
        rows: dict[str, Any] = {"texts": args.texts}
        for name, done, output in (("A", done_a, "a.parquet"), ("B", done_b, "b.parquet")):
            report = json.loads((folder / f"{output}.report.json").read_text())
            out = pd.read_parquet(folder / output)
            done["rows ok"] = int((out["summary_status"] == "ok").sum())
            done["sent"] = report["requests"]["sent"]
            done["reused"] = report["requests"]["reused"]
            rows[f"job {name}"] = done
        rows["B done, from A's start (s)"] = round(done_b["ended"] - begun, 1)
        rows["service"] = {
            "requests": stats["requests"],
            "paid (200s)": stats["by_status"].get("200", 0),
            "answered twice": stats["answered_twice"],
            "429s": stats["by_status"].get("429", 0),
        }
    for name, value in rows.items():
        if isinstance(value, dict):
            value.pop("ended", None)
            print(f"{name}:")
            for key, item in value.items():
                if item != "":
                    print(f"  {key}: {item}")
        else:
            print(f"{name}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
