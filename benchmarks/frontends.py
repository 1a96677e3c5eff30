"""Front-ends side by side on the same rows against a strict 600/min plan: rows/s and utilization of
the plan (the start rate the service admitted, first to last admitted request, over rpm), and 429s.
Run by hand:

    python benchmarks/frontends.py --rows 300 --rpm 600

Each front-end gets its own local service (600 per key in any sliding minute, answers after 0.2 s)
and its own texts, one after the other in one run, so the figures compare. Spark runs on local[2]
with 4 partitions sharing the machine budget; its session starts before the clock does not: the
wall time includes Spark's job start-up, as a user's would.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import pandas as pd

import batchsum
from batchsum.local import Faults, LocalService
from batchsum.pandas_ext import clear_cache


def texts(n: int, tag: str) -> list[str]:
    words = "river council budget school market station harbour bridge museum garden".split()
    return [f"{tag}{i} " + " ".join(words[(i + j) % len(words)] for j in range(40)) + "." for i in range(n)]


def pandas_run(rows: list[str], service: LocalService, rpm: float) -> None:
    pd.DataFrame({"text": rows}).batchsum.summarize(
        "text", api_key=service.key, base_url=service.url, rpm=rpm, progress=False, budget="none"
    )


def polars_run(rows: list[str], service: LocalService, rpm: float) -> None:
    import polars as pl

    import batchsum.polars  # noqa: F401

    pl.DataFrame({"text": rows}).batchsum.summarize(
        "text", api_key=service.key, base_url=service.url, rpm=rpm, progress=False, budget="none"
    )


def spark_run(rows: list[str], service: LocalService, rpm: float) -> None:
    import os
    import sys

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import batchsum.spark

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sdf = spark.createDataFrame(pd.DataFrame({"text": rows})).repartition(4)
    batchsum.spark.summarize(sdf, "text", api_key=service.key, base_url=service.url, rpm=rpm).collect()


FRONT_ENDS: dict[str, Callable[[list[str], LocalService, float], None]] = {
    "pandas accessor": pandas_run,
    "Polars namespace": polars_run,
    "Spark, 4 partitions": spark_run,
}


def measure(name: str, run: Callable[[list[str], LocalService, float], None], n: int, rpm: float) -> dict[str, object]:
    clear_cache()
    with LocalService(rpm=int(rpm), faults=Faults(latency=0.2)) as service:
        started = time.monotonic()
        run(texts(n, name.split()[0]), service, rpm)
        wall = time.monotonic() - started
        admitted = sorted(service.state.admitted)
        by_status = service.stats()["by_status"]
    span = admitted[-1] - admitted[0] if len(admitted) > 1 else 0.0
    return {
        "front_end": name,
        "rows": n,
        "rows_per_s": round(n / wall, 2),
        "utilization": round((len(admitted) - 1) / span * 60 / rpm, 3) if span else None,
        "429s": by_status.get("429", 0),
        "wall_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300, help="rows per front-end (default 300)")
    parser.add_argument("--rpm", type=float, default=600, help="the plan and the service's limit (default 600)")
    args = parser.parse_args()
    assert batchsum  # the accessors are registered
    for name, run in FRONT_ENDS.items():
        print(json.dumps(measure(name, run, args.rows, args.rpm)))


if __name__ == "__main__":
    main()
