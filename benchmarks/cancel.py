"""A cancel stops the spending (issue 47): how long a stopped query or collect takes to end, and what
the service admitted after the stop. Run by hand, never in the tests:

    python -m benchmarks.cancel                     # every case, 3000 texts, stopped 6 s in
    python -m benchmarks.cancel --cases duckdb-interrupt --texts 600 --after 3

Each case runs in a process of its own against one local service (in this process, over loopback,
answers at once), with a cache folder of its own (the machine's budget and answer store), over
``--texts`` distinct texts in Parquet row groups of 100, at ``rpm=600``:

- ``duckdb-interrupt``: a query in a thread, ``batchsum.duckdb.interrupt(con)`` from the main thread
  ``--after`` seconds after the first request reached the service; ends: from the call to the query's end.
- ``duckdb-bare-interrupt``: the same with a bare ``con.interrupt()`` (what a user had before), for contrast;
  the chunks DuckDB handed to the function go on: the case is cut at ``--watch`` seconds.
- ``duckdb-sigint``: SIGINT to a process running the query (DuckDB's default threads); ends: from the
  signal to the process's exit.
- ``duckdb-sigint-background``: the same with ``SET external_threads = 0`` (the function never on the main
  thread: heard through the wakeup fd alone).
- ``duckdb-sigint-main``: the same with ``SET threads = 1`` (the function on the main thread).
- ``polars-sigint``: SIGINT to a process collecting ``pl.scan_parquet(...).batchsum.summarize("text")``.

Then the same query (or collect) again, unpaced, in a new process: the texts it sent (every one
the stopped run had not been answered) and the texts the service answered twice (0: nothing paid
again). Printed as a table; ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KEY = "bench-cancel-key-0123456789"

QUERY = """
import json, os, sys, threading, time
import duckdb
import batchsum.duckdb
path, settings, how, rpm = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
con = duckdb.connect()
if settings:
    con.execute(settings)
con.execute("SET enable_progress_bar = false")
batchsum.duckdb.register(con, base_url=os.environ["BATCHSUM_BASE_URL"], rpm=rpm, progress=False)
sql = f"SELECT s.status FROM (SELECT batchsum_summarize(text) AS s FROM '{path}')"
if how == "thread":  # stopped from this process's main thread when the parent says so (a line on stdin)
    ended = {}
    def query():
        try:
            con.execute(sql).fetchall()
        except Exception as exc:
            ended["error"] = type(exc).__name__
        ended["at"] = time.monotonic()
    worker = threading.Thread(target=query)
    worker.start()
    print("ready", flush=True)
    kind = sys.stdin.readline().strip()
    asked = time.monotonic()
    if kind == "bare":
        con.interrupt()
    else:
        batchsum.duckdb.interrupt(con)
    returned = time.monotonic()
    worker.join()
    print(json.dumps({"returned": returned - asked, "ended": ended["at"] - asked, "error": ended.get("error")}), flush=True)
    os._exit(0)  # a bare interrupt leaves the chunks running: the case ends here
try:
    try:
        print("ready", flush=True)
        rows = con.execute(sql).fetchall()
        print(json.dumps({"rows": len(rows)}), flush=True)
    except KeyboardInterrupt:
        print(json.dumps({"error": "KeyboardInterrupt"}), flush=True)
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__}), flush=True)
except KeyboardInterrupt:
    print(json.dumps({"error": "KeyboardInterrupt"}), flush=True)
"""

COLLECT = """
import json, os, sys
import polars as pl
import batchsum.polars
path, rpm = sys.argv[1], float(sys.argv[4])
lazy = pl.scan_parquet(path).batchsum.summarize("text", base_url=os.environ["BATCHSUM_BASE_URL"], rpm=rpm, progress=False)
try:
    try:
        print("ready", flush=True)
        print(json.dumps({"rows": lazy.collect().height}), flush=True)
    except KeyboardInterrupt:
        print(json.dumps({"error": "KeyboardInterrupt"}), flush=True)
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__}), flush=True)
except KeyboardInterrupt:
    print(json.dumps({"error": "KeyboardInterrupt"}), flush=True)
"""

CASES: dict[str, tuple[str, str, str]] = {  # name: (script, DuckDB settings, how it is stopped)
    "duckdb-interrupt": (QUERY, "", "interrupt"),
    "duckdb-bare-interrupt": (QUERY, "", "bare"),
    "duckdb-sigint": (QUERY, "", "sigint"),
    "duckdb-sigint-background": (QUERY, "SET threads = 4; SET external_threads = 0", "sigint"),
    "duckdb-sigint-main": (QUERY, "SET threads = 1", "sigint"),
    "polars-sigint": (COLLECT, "", "sigint"),
}


def texts_file(folder: Path, count: int, seed: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.support import article

    path = folder / f"texts-{seed}.parquet"
    pq.write_table(pa.table({"text": [article(20, seed=seed + i) for i in range(count)]}), path, row_group_size=100)
    return path


def run_case(
    name: str, service: Any, folder: Path, count: int, after: float, watch: float, seed: int
) -> dict[str, Any]:
    script, settings, how = CASES[name]
    cache = folder / f"cache-{name}"
    env = dict(
        os.environ,
        XDG_CACHE_HOME=str(cache),
        BATCHSUM_API_KEY=KEY,
        BATCHSUM_BASE_URL=service.url,
        PYTHONPATH=str(ROOT),
    )
    path = texts_file(folder, count, seed)
    service.state.reset_stats()
    how_run = "thread" if how in ("interrupt", "bare") else "main"
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(path), settings, how_run, "600"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        # SIGINT as a terminal delivers it, even when this benchmark runs in the background of a
        # non-interactive shell (which starts it with SIGINT ignored, and children inherit that).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert child.stdout is not None and child.stdin is not None
    child.stdout.readline()  # ready
    while service.state.stats()["requests"] < 1:
        time.sleep(0.01)
    time.sleep(after)
    at = service.state.stats()["requests"]
    stopped = time.monotonic()
    if how == "sigint":
        child.send_signal(signal.SIGINT)
    else:
        child.stdin.write(("bare" if how == "bare" else "interrupt") + "\n")
        child.stdin.flush()
    row: dict[str, Any] = {"case": name, "texts": count, "sent_before_stop": at}
    try:
        child.wait(watch)
        row["ends_s"] = round(time.monotonic() - stopped, 2)
        line = child.stdout.read().strip().splitlines()
        said = json.loads(line[-1]) if line else {}
        if "ended" in said:
            row["ends_s"] = round(said["ended"], 2)
            row["interrupt_returned_s"] = round(said["returned"], 2)
        row["error"] = said.get("error")
    except subprocess.TimeoutExpired:
        row["ends_s"] = f"> {watch:g} (cut)"
        child.kill()
        child.wait()
    time.sleep(1)  # anything still coming would show here
    row["admitted_after_stop"] = service.state.stats()["requests"] - at
    # The same again, unpaced, in a new process: it pays only for what the stopped run had not.
    first = service.state.stats()
    again = subprocess.run(
        [sys.executable, "-c", script, str(path), "", "main", "0"], env=env, capture_output=True, text=True, timeout=600
    )
    second = service.state.stats()
    row["again_rows"] = json.loads(again.stdout.strip().splitlines()[-1]).get("rows")
    row["again_sent"] = second["requests"] - first["requests"]
    row["answered_twice"] = second["answered_twice"]
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--texts", type=int, default=3000)
    parser.add_argument("--after", type=float, default=6.0, help="seconds after the first request to stop")
    parser.add_argument("--watch", type=float, default=30.0, help="seconds to wait for a stopped case to end")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from batchsum.local import LocalService

    rows = []
    with tempfile.TemporaryDirectory() as scratch, LocalService([KEY]) as service:
        for number, name in enumerate(args.cases):
            rows.append(
                run_case(name, service, Path(scratch), args.texts, args.after, args.watch, 100000 * (number + 1))
            )
            print(json.dumps(rows[-1]), flush=True)
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("| " + " | ".join("---" for _ in columns) + " |")
    for row in rows:
        print("| " + " | ".join(str(row.get(column, "")) for column in columns) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
