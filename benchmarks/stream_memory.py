"""Peak memory of the streamed doors on 200,000 rows, side by side in one run. Run by hand:

    python -m benchmarks.stream_memory                    # Polars and Spark, 200,000 rows (~15 min)
    python -m benchmarks.stream_memory --doors polars --rows 50000

The same generated input as ``benchmarks/memory.py`` (about 450 bytes of text a row), one local
service in its own process (``batchsum serve``, no limit), answers kept in memory (``budget="none"``,
no journal), the rows summarized one after another in fresh processes:

- ``polars``: ``pl.scan_parquet(f).sink_parquet(out)`` without batchsum (the baseline), then
  ``pl.scan_parquet(f).batchsum.summarize("text").sink_parquet(out)``: the process's peak RSS.
- ``spark``: the CLI on the same file (``batchsum summarize``: its peak RSS), then
  ``batchsum.spark.summarize`` on a ``local[1]`` session with the whole file in ONE partition, written
  to Parquet: the Python worker's peak RSS (sampled every 50 ms; the JVM's memory is not counted).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil

from benchmarks.memory import free_port, write_input

POLARS_BASELINE = """
import resource, sys
import polars as pl
pl.scan_parquet(sys.argv[1]).sink_parquet(sys.argv[2])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""

POLARS_BATCHSUM = """
import resource, sys
import polars as pl
import batchsum.polars
lazy = pl.scan_parquet(sys.argv[1]).batchsum.summarize(
    "text", rpm=0, concurrency=16, budget="none", progress=False, api_key="bench", base_url=sys.argv[3]
)
lazy.sink_parquet(sys.argv[2])
out = pl.scan_parquet(sys.argv[2]).select(pl.len(), (pl.col("summary_status") == "ok").sum()).collect()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, out.row(0))
"""

SPARK = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
import batchsum.spark
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.memory", "2g").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
sdf = spark.read.parquet(sys.argv[1]).coalesce(1)
out = batchsum.spark.summarize(sdf, "text", rpm=0, concurrency=16, budget="machine", progress=False,
                               api_key="bench", base_url=sys.argv[3], journal=sys.argv[2] + ".journal.sqlite")
out.write.mode("overwrite").parquet(sys.argv[2])
print("rows", spark.read.parquet(sys.argv[2]).filter("summary_status = 'ok'").count())
spark.stop()
"""


def serve() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "batchsum", "serve", "--port", str(port), "--rpm", "0", "--key", "bench"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(3)
    return server, f"http://127.0.0.1:{port}"


def python_peak(script: str, *args: str) -> tuple[float, str]:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    first, _, rest = done.stdout.strip().partition(" ")
    return float(first), rest


class WorkerPeak(threading.Thread):
    """The peak RSS of Spark's Python workers (the daemon's forked children), sampled."""

    def __init__(self, parent: int) -> None:
        super().__init__(daemon=True)
        self.parent, self.peak, self.done = parent, 0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                for process in psutil.Process(self.parent).children(recursive=True):
                    try:
                        line = " ".join(process.cmdline())
                        if "pyspark.daemon" in line and "pyspark.daemon" in " ".join(process.parent().cmdline()):
                            self.peak = max(self.peak, process.memory_info().rss)
                    except psutil.Error:
                        continue
            except psutil.Error:
                return
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows to generate")
    parser.add_argument("--doors", nargs="+", default=["polars", "spark"], choices=["polars", "spark"])
    args = parser.parse_args()
    server, url = serve()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            size = write_input(folder / "in.parquet", args.rows)
            print(f"input: {args.rows} rows, {size / 1e6:.0f} MB of text")
            source = str(folder / "in.parquet")
            if "polars" in args.doors:
                base, _ = python_peak(POLARS_BASELINE, source, str(folder / "copy.parquet"))
                started = time.monotonic()
                peak, counts = python_peak(POLARS_BATCHSUM, source, str(folder / "polars.parquet"), url)
                seconds = time.monotonic() - started
                print(f"polars scan -> sink, no batchsum: peak RSS {base:.0f} MB")
                print(
                    f"polars scan -> batchsum -> sink: peak RSS {peak:.0f} MB ({peak - base:+.0f} MB), "
                    f"{seconds:.0f} s, (rows, ok) {counts}"
                )
            if "spark" in args.doors:
                env = {**os.environ, "BATCHSUM_API_KEY": "bench", "BATCHSUM_BASE_URL": url, "BATCHSUM_BUDGET": "none"}
                command = [sys.executable, "-m", "batchsum", "summarize", source, "-o", str(folder / "cli.parquet")]
                command += ["--column", "text", "--rpm", "0", "--concurrency", "16", "--quiet"]
                cli = subprocess.Popen(command, env=env)
                _, status, usage = os.wait4(cli.pid, 0)
                cli_peak = usage.ru_maxrss / 1024
                print(f"CLI parquet -> parquet: exit {os.waitstatus_to_exitcode(status)}, peak RSS {cli_peak:.0f} MB")
                spark = subprocess.Popen(
                    [sys.executable, "-c", textwrap.dedent(SPARK), source, str(folder / "spark.parquet"), url],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                watcher = WorkerPeak(spark.pid)
                watcher.start()
                out, _ = spark.communicate()
                watcher.done.set()
                worker = watcher.peak / 2**20
                print(
                    f"Spark, one partition of {args.rows} rows: Python worker peak RSS {worker:.0f} MB "
                    f"({worker - cli_peak:+.0f} MB against the CLI); {out.strip().splitlines()[-1]}"
                )
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
