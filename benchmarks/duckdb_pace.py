"""DuckDB: ``SELECT batchsum_summarize(text) FROM 'in.parquet'`` against a strict plan, beside the
function a user writes without batchsum, in one run. Run by hand:

    python -m benchmarks.duckdb_pace                 # 1000 texts (~6 min)
    python -m benchmarks.duckdb_pace --texts 300     # shorter

A local service strict at exactly the plan (``--rpm``, default 600, a sliding minute), answering in
0.3-0.7 s, a fresh one per client; DuckDB's default threads; ``--texts`` distinct texts in a Parquet
file. Clients:

- ``batchsum.duckdb``: ``register(con, rpm=600)``; the query, then the same query again.
- a plain scalar Python UDF calling ``batchsum.Client.summarize`` per row (a prompt per row, as
  DuckDB's LLM extensions do: no pace, retries on 429 with backoff).

Figures: rows ok, requests, 429s, utilization (admitted a minute from the first to the last admitted
start, over the plan), the most starts in any window of 1, 2, 10 and 60 s against ceil(rpm*w/60)+1,
seconds; for batchsum, the requests of the query run again.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

import batchsum
import batchsum.duckdb
from batchsum.local import Faults, LocalService
from benchmarks.rate import texts

WINDOWS = (1, 2, 10, 60)


def busiest(times: list[float], window: float) -> int:
    return max((bisect.bisect_right(times, t + window - 1e-9) - i for i, t in enumerate(times)), default=0)


def service(rpm: int) -> LocalService:
    return LocalService(rpm=rpm, limit_kind="sliding", faults=Faults(latency=0.3, latency_spread=0.4)).start()


def figures(svc: LocalService, rows: list[Any], rpm: int, seconds: float) -> dict[str, Any]:
    stats = svc.state.stats()
    admitted = sorted(svc.state.admitted)
    span = admitted[-1] - admitted[0] if len(admitted) > 1 else 0.0
    return {
        "rows ok": sum(1 for status in rows if status == "ok"),
        "rows": len(rows),
        "requests": stats["requests"],
        "429s": stats["by_status"].get("429", 0),
        "utilization": round((len(admitted) - 1) / span * 60 / rpm, 3) if span else None,
        "most in w / allowed": {w: f"{busiest(admitted, w)}/{math.ceil(rpm * w / 60) + 1}" for w in WINDOWS},
        "seconds": round(seconds, 1),
    }


def run_batchsum(path: Path, rpm: int) -> dict[str, Any]:
    svc = service(rpm)
    try:
        con = duckdb.connect()
        batchsum.duckdb.register(con, api_key=svc.key, base_url=svc.url, rpm=rpm, progress=False)
        query = f"SELECT s.status FROM (SELECT batchsum_summarize(text) AS s FROM '{path}')"
        begun = time.monotonic()
        rows = [status for (status,) in con.execute(query).fetchall()]
        out = figures(svc, rows, rpm, time.monotonic() - begun)
        svc.state.reset_stats()
        again = con.execute(query).fetchall()
        out["again: requests"] = svc.state.stats()["requests"]
        out["again: rows ok"] = sum(1 for (status,) in again if status == "ok")
        con.close()
        return out
    finally:
        svc.stop()


def run_plain(path: Path, rpm: int) -> dict[str, Any]:
    svc = service(rpm)
    client = batchsum.Client(svc.key, svc.url, max_retries=20, timeout=120)

    def summarize(text: str) -> str:
        try:
            return client.summarize(text) and "ok"
        except batchsum.APIError as exc:
            return exc.code

    try:
        con = duckdb.connect()
        con.create_function("plain_summarize", summarize, ["VARCHAR"], "VARCHAR", side_effects=True)
        begun = time.monotonic()
        rows = [status for (status,) in con.execute(f"SELECT plain_summarize(text) FROM '{path}'").fetchall()]
        out = figures(svc, rows, rpm, time.monotonic() - begun)
        con.close()
        return out
    finally:
        client.close()
        svc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--rpm", type=int, default=600)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="batchsum-duckdb-") as scratch:
        import os

        os.environ["XDG_CACHE_HOME"] = os.path.join(scratch, "cache")  # a store and a budget of its own
        path = Path(scratch) / "in.parquet"
        pq.write_table(pa.table({"text": texts(args.texts)}), path)
        results = {
            "batchsum.duckdb": run_batchsum(path, args.rpm),
            "plain Python UDF, a request per row": run_plain(path, args.rpm),
        }
    print(f"DuckDB {duckdb.__version__}, {args.texts} texts, {args.rpm}/min (sliding), answers 0.3-0.7 s")
    for name, figures_ in results.items():
        print(f"\n== {name}")
        for key, value in figures_.items():
            print(f"  {key}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
