"""batchsum.ray on two CPUs, over a Parquet read (issue 41), this checkout beside another. Run by hand:

    python -m benchmarks.ray_cpus                              # this checkout, 400 texts
    python -m benchmarks.ray_cpus --before /tmp/old            # and the package in /tmp/old
    python -m benchmarks.ray_cpus --source csv --texts 200

Each cell is a fresh process: ``ray.init(num_cpus=2)``, a local service strict at exactly the plan
(``--rpm``, default 600, a sliding minute) answering in 0.3-0.7 s, a real redis-server (the budget and
the answers, ``budget="redis://..."``), ``ray.data.read_parquet`` (or ``read_csv``) of ``--texts``
distinct texts with an ``id``, and ``batchsum.ray.summarize(ds, "text", rpm=600, budget=...)`` with
the default ``workers`` and ``batch_rows``, consumed by ``take_all``. A cell that sends no request
in ``--stall`` seconds (default 300) is stopped and reported as stalled.

Figures: rows ok in their own row (the id's text, in input order), texts paid once (the service's
count of distinct texts answered, and texts answered twice), 429s, utilization (admitted a minute
from the first to the last admitted start, over the plan), and seconds from the call to the last row
(Ray's start-up and the actors' included).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

CELL = """
import json, os, sys, threading, time
import pandas as pd
import ray
source, texts, rpm, redis_url, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
stall = float(sys.argv[6])
from benchmarks.rate import texts as make_texts
import batchsum.ray
from batchsum.local import Faults, LocalService

folder = os.path.dirname(out)
data = pd.DataFrame({"id": range(texts), "text": make_texts(texts)})
path = os.path.join(folder, "in." + source)
data.to_parquet(path, row_group_size=50) if source == "parquet" else data.to_csv(path, index=False)
ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
ray.data.DataContext.get_current().enable_progress_bars = False
with LocalService(rpm=int(rpm), faults=Faults(latency=0.3, latency_spread=0.4, seed=11)) as service:
    ds = ray.data.read_parquet(path) if source == "parquet" else ray.data.read_csv(path)
    started = time.monotonic()
    result = batchsum.ray.summarize(ds, "text", rpm=rpm, api_key=service.key, base_url=service.url,
                                    budget=redis_url, progress=False)

    def watchdog():
        time.sleep(stall)
        if service.state.stats()["requests"] == 0:
            json.dump({"stalled": f"no request in {stall:.0f} s"}, open(out, "w"))
            os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()
    rows = result.take_all()
    seconds = time.monotonic() - started
    stats = service.stats()
    admitted = sorted(service.state.admitted)
in_row = sum(1 for i, row in enumerate(rows)
             if row["id"] == i and row["text"] == data.text[i] and row["summary_status"] == "ok")
span = admitted[-1] - admitted[0] if len(admitted) > 1 else float("nan")
json.dump({"rows": len(rows), "ok in their row": in_row, "distinct paid": stats["answered_unique"],
           "paid twice": stats["answered_twice"], "429s": stats["by_status"].get("429", 0),
           "utilization": (len(admitted) - 1) / span * 60 / rpm, "seconds": seconds}, open(out, "w"))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Redis:
    """A real redis-server on a free loopback port, flushed before each cell."""

    def __init__(self, folder: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("needs redis-server (apt-get install redis-server)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        command = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            [*command, "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(0.5)

    def flush(self) -> None:
        import redis

        redis.Redis.from_url(self.url).flushall()

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def cell(tree: Path, args: argparse.Namespace, redis: Redis, folder: Path) -> dict[str, Any]:
    """One cell in a fresh process with ``tree``'s batchsum first on the path (its working folder
    is ``folder``, so that no other batchsum shadows it)."""
    redis.flush()
    out = folder / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(REPO)])}
    command = [sys.executable, "-c", CELL, args.source, str(args.texts), str(args.rpm), redis.url, str(out)]
    done = subprocess.run([*command, str(args.stall)], env=env, cwd=folder, capture_output=True, text=True)
    if not out.exists():
        return {"failed": done.stderr[-600:]}
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=400)
    parser.add_argument("--rpm", type=float, default=600)
    parser.add_argument("--source", choices=["parquet", "csv"], default="parquet")
    parser.add_argument("--stall", type=float, default=300, help="seconds without a request before a cell stops")
    parser.add_argument("--before", type=Path, help="also run the package in this folder")
    args = parser.parse_args()
    trees = [("this checkout", REPO)] + ([("before", args.before)] if args.before else [])
    work = Path(tempfile.mkdtemp(prefix="ray-cpus-"))
    redis = Redis(work)
    print(f"{args.texts} texts, read_{args.source}, ray.init(num_cpus=2), default workers, {args.rpm:g}/min strict")
    try:
        for name, tree in trees:
            folder = work / name.replace(" ", "-")
            folder.mkdir()
            print(f"{name}: {json.dumps(cell(tree, args, redis, folder))}", flush=True)
    finally:
        redis.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
