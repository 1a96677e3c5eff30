"""A Redis outage mid-run (issue 47's must-show): one `batchsum summarize` of 600 texts at 600/min, its
budget and answer store on a Redis of its own, against the local service strict at 600/min in a
sliding minute. Redis is killed `--down-at` seconds after the first answer (its data gone) and started
again, empty, on the same port `--down-for` seconds later; then, in a second run, killed for good with
`--budget-wait 20`. By hand:

    python -m benchmarks.outage                       # both, about two minutes
    python -m benchmarks.outage --texts 200 --rpm 1200 --down-at 5 --down-for 5   # a short one

Reported: the exit code, the rows ok, 429s, texts answered twice, the most starts at the service in
any 1 s and 10 s against ceil(rpm*w/60)+1, the lines saying it waited for the budget; for the run
whose Redis never comes back, the seconds from the kill to its exit and its last line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.far_budget import busiest, free_port

ROOT = Path(__file__).resolve().parent.parent


class OwnRedis:
    def __init__(self, folder: str) -> None:
        self.exe = shutil.which("redis-server") or sys.exit("needs redis-server: apt-get install redis-server")
        self.folder, self.port = folder, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import redis

        argv = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen([*argv, "--dir", self.folder], stdout=subprocess.DEVNULL)
        for _ in range(400):
            try:
                redis.Redis(port=self.port).ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise SystemExit("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


def one_run(args: argparse.Namespace, *, comes_back: bool) -> dict[str, object]:
    import pandas as pd

    from batchsum.local import LocalService

    with tempfile.TemporaryDirectory() as folder:
        redis = OwnRedis(folder)
        redis.start()
        key = "bs-outage-bench-0123456789"
        texts = [
            f"Text {i}: " + " ".join(["river council budget school market station harbour"] * 4) + "."
            for i in range(args.texts)
        ]
        pd.DataFrame({"text": texts}).to_parquet(f"{folder}/in.parquet")
        wait = ["--budget-wait", str(args.budget_wait)] if not comes_back else []
        argv = [
            sys.executable,
            "-m",
            "batchsum.cli",
            "summarize",
            f"{folder}/in.parquet",
            "-o",
            f"{folder}/out.parquet",
        ]
        argv += ["--column", "text", "--rpm", str(args.rpm), "--budget", redis.url, "--quiet", *wait]
        with LocalService([key], rpm=int(args.rpm)) as service:
            env = {**os.environ, "BATCHSUM_API_KEY": key, "BATCHSUM_BASE_URL": service.url, "XDG_CACHE_HOME": folder}
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
            process = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
            while not service.state.admitted and process.poll() is None:
                time.sleep(0.01)
            time.sleep(args.down_at)
            redis.stop()
            killed = time.monotonic()
            if comes_back:
                time.sleep(args.down_for)
                redis.start()
            _, err = process.communicate()
            ended = time.monotonic()
            stats = service.state.stats()
            arrivals = sorted(service.state.admitted)
        redis.stop()
        ok = 0
        if Path(f"{folder}/out.parquet").exists():
            ok = int((pd.read_parquet(f"{folder}/out.parquet")["summary_status"] == "ok").sum())
    lines = err.strip().splitlines()
    return {
        "exit": process.returncode,
        "rows ok": ok,
        "429s": int(stats["by_status"].get("429", 0)),
        "answered twice": int(stats["answered_twice"]),
        "most in 1 s / 10 s": [busiest(arrivals, 1), busiest(arrivals, 10)],
        "allowed": [math.ceil(args.rpm * w / 60) + 1 for w in (1, 10)],
        "waiting lines": [line for line in lines if "waiting for the rate budget" in line],
        "seconds from the kill to the exit": round(ended - killed, 1),
        "first to last arrival (s)": round(arrivals[-1] - arrivals[0], 1) if arrivals else 0.0,
        "pauses at the service over 1 s (start, seconds)": [
            (round(a - arrivals[0], 1), round(b - a, 1)) for a, b in zip(arrivals, arrivals[1:]) if b - a > 1.0
        ],
        "last line": lines[-1] if lines else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=600)
    parser.add_argument("--rpm", type=float, default=600)
    parser.add_argument("--down-at", type=float, default=20.0, help="seconds after the first answer")
    parser.add_argument("--down-for", type=float, default=10.0)
    parser.add_argument("--budget-wait", type=float, default=20.0, help="the run whose Redis never comes back")
    parser.add_argument("--only", choices=["back", "gone"])
    args = parser.parse_args()
    if args.only in (None, "back"):
        print("Redis back, empty:", json.dumps(one_run(args, comes_back=True), indent=2))
    if args.only in (None, "gone"):
        print("Redis gone for good:", json.dumps(one_run(args, comes_back=False), indent=2))


if __name__ == "__main__":
    main()
