"""The streaming path at scale (issues 24 and 48), side by side in one run: peak RSS and rows/s of a
first `batchsum summarize` run against a local service that answers at once; then, --repeat times
(3), interleaved: an in-process pyarrow read-and-write of the same file with a summary column added,
a rerun whose every answer is in the journal, and a new output over the same rows with a journal of
its own, answered from the machine's answer store (the whole command each time, start-up included);
the rerun's and the store-answered job's median wall time against the copy's median (targets 1.5x
and 2x); `batchsum --version`; and, with --pandas, the same for the pandas accessor on a frame. Run
by hand, never in the tests:

    python benchmarks/scale.py                      # 200,000 rows, 3 repetitions
    python benchmarks/scale.py --rows 200000 2000000 --pandas
    python benchmarks/scale.py --repeat 1           # a short run: one of each
    python benchmarks/scale.py --json > run.json    # one JSON object on stdout
    python benchmarks/scale.py --show run.json      # its table

Input: ROWS rows holding DISTINCT distinct texts of 40-120 words (seeded; each text repeats
ROWS/DISTINCT times, scattered over the file in a shuffled order), an int64 `id` and a 200-byte
`extra` string distinct per row, written as Parquet in chunks of 50,000 rows (never the whole file
in memory). Inputs are cached in --work (default: batchsum-scale in the temp folder) by rows,
distinct texts and seed; outputs and journals go to a scratch folder removed at the end.

Every batchsum run is its own process (`python -m batchsum.cli`, this checkout's package first on
the path) against one `batchsum serve --rpm 0 --test-controls` process per size, so a CLI's peak
RSS (ru_maxrss from wait4, KiB, shown as MB = MiB) excludes the service; its CPU seconds (user +
system, from the same wait4) are shown too, beside the copy's (`time.process_time` around the
work). Python's bytecode is cached for the children in a folder of the benchmark's own
(PYTHONPYCACHEPREFIX; PYTHONDONTWRITEBYTECODE dropped), as an installed package has its .pyc files:
the first commands compile batchsum's modules, the measured ones do not. Each is started by a small
launcher process, not by this one: a child's ru_maxrss starts at its parent's RSS at the fork, and
this process holds pyarrow (see LAUNCHER). The requests a rerun sent
are the service's own count (`/_local/stats`, before and after), and the journal's rows are counted
too. Outputs are checked: ROWS rows, every status `ok` (only the status column is read).

Baselines run in their own process each and time only the work (interpreter and imports left out),
as an in-process copy would: `pq.read_table` + a `summary` column (the text's first 200 characters,
`utf8_slice_codeunits`) + `pq.write_table` ("whole"), and the same batch by batch with
`iter_batches` (pre-buffering off: on, pyarrow holds the column chunks it read until the file is
closed) and a `ParquetWriter` ("stream"). The ratios are the medians' against the whole copy's
median. The input file sits in the page cache for every run (it was just written or read). On a
machine other work shares, read the CPU figures beside the wall times: a busy machine stretches
every wall time, the copy's included, and the ratio with them.

--pandas: a process reads the Parquet file into a frame, notes its RSS, resets the kernel's
high-water mark (/proc/self/clear_refs) and calls `df.batchsum.summarize("text", journal=...)`;
what the accessor adds is its peak minus the RSS with the frame loaded. A second process does the
same with the journal complete (a fresh process: no in-process cache). Its baseline is the same
read into pandas plus `df["summary"] = df["text"].str[:200]`; the ratio compares read + rerun with
read + that column.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import random
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
TARGET_RSS_MB = 250.0
TARGET_RERUN_RATIO = 1.5
TARGET_STORE_RATIO = 2.0  # a new output over the same rows, answered from the machine's store
CHUNK = 50_000
GENERATOR_VERSION = 1  # bump when the generated data changes, so cached inputs are not reused

VOCABULARY = """
council bridge river harbour museum school market station garden library hospital festival tram
budget plan report vote street square park road tunnel ferry port factory office farm forest
village town city region county district mayor minister engineer teacher student doctor nurse
driver worker resident visitor owner neighbour volunteer committee company union court police
repairs traffic weather flood storm summer winter spring autumn morning evening week month year
decade century opened closed delayed approved rejected proposed announced warned welcomed argued
expected reported found built repaired moved raised cut funded planned studied measured counted
new old large small quiet busy early late local public private central northern southern eastern
western annual weekly final first second third several many few most some every each other
the a an of in on at by for with from to after before during over under between about near
and but or while although because since so that which who when where this those these its their
""".split()


def make_texts(distinct: int, seed: int) -> list[str]:
    """DISTINCT texts of 40-120 words in sentences of 6-18 words, all different."""
    rng = random.Random(seed)
    texts: list[str] = []
    seen: set[str] = set()
    while len(texts) < distinct:
        words = [rng.choice(VOCABULARY) for _ in range(rng.randint(40, 120))]
        sentences, k = [], 0
        while k < len(words):
            n = rng.randint(6, 18)
            sentences.append(" ".join(words[k : k + n]).capitalize() + ".")
            k += n
        text = " ".join(sentences)
        if text not in seen:
            seen.add(text)
            texts.append(text)
    return texts


def input_path(work: Path, rows: int, distinct: int, seed: int) -> Path:
    """The cached input of this shape, written first when missing."""
    path = work / f"scale-v{GENERATOR_VERSION}-rows{rows}-distinct{distinct}-seed{seed}.parquet"
    if path.exists():
        return path
    work.mkdir(parents=True, exist_ok=True)
    note(f"writing {path.name} ...")
    started = time.monotonic()
    texts = pa.array(make_texts(distinct, seed), pa.string())
    rng = np.random.default_rng(seed)
    order = rng.permutation(np.arange(rows, dtype=np.int64) % distinct)  # each text rows/distinct times
    schema = pa.schema([("id", pa.int64()), ("text", pa.string()), ("extra", pa.string())])
    partial = path.with_suffix(".partial")
    with pq.ParquetWriter(partial, schema) as writer:
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            blob = rng.bytes(95 * n).hex()  # 190 hex characters a row, after a 10-digit row number
            extra = [f"{start + k:010d}{blob[190 * k : 190 * (k + 1)]}" for k in range(n)]
            ids = pa.array(np.arange(start, start + n, dtype=np.int64))
            chunk = pa.table([ids, texts.take(pa.array(order[start : start + n])), pa.array(extra)], schema=schema)
            writer.write_table(chunk)
    partial.rename(path)
    note(f"  {rows} rows, {path.stat().st_size / 1e6:.0f} MB, in {time.monotonic() - started:.0f} s")
    return path


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


_CACHES = tempfile.mkdtemp(prefix="batchsum-scale-caches-")
atexit.register(shutil.rmtree, _CACHES, ignore_errors=True)
_BYTECODE = os.path.join(_CACHES, "bytecode")  # every child's compiled modules, kept across children


def child_env(**extra: str) -> dict[str, str]:
    """This checkout's batchsum first on the path of every child process, a cache folder of its own
    (the machine budget and the answer store every run shares live there: a first run must not find
    an earlier run's answers), and the benchmark's bytecode cache (compiled once, as installed)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {
        **env,
        "PYTHONPATH": path,
        "XDG_CACHE_HOME": tempfile.mkdtemp(dir=_CACHES),
        "PYTHONPYCACHEPREFIX": _BYTECODE,
        **extra,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """`batchsum serve --rpm 0 --test-controls` in its own process (in ``env``: this checkout's by
    default); `requests()` is its count."""

    def __init__(self, scratch: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = scratch / f"serve-{self.port}.log"
        command = [sys.executable, "-m", "batchsum.cli", "serve", "--port", str(self.port)]
        command += ["--rpm", "0", "--key", "bench", "--test-controls"]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, env=env or child_env(), stdout=log, stderr=subprocess.STDOUT)
        self.admin_key = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for line in self.log.read_text().splitlines():
                if "admin key:" in line:
                    self.admin_key = line.rsplit(":", 1)[1].strip()
            if self.admin_key:
                try:
                    self.requests()
                    return
                except OSError:
                    pass
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"the local service did not start: {self.log.read_text()}")

    def stats(self) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/_local/stats", headers={"Authorization": f"Bearer {self.admin_key}"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            stats: dict[str, Any] = json.load(answer)
            return stats

    def requests(self) -> int:
        return int(self.stats()["requests"])

    def close(self) -> None:
        self.process.terminate()
        self.process.wait()


# A child's ru_maxrss (from wait4, or its own getrusage) starts at its parent's RSS at the fork: the
# kernel keeps the high-water mark of the memory a process had before exec. This benchmark's process
# holds pyarrow and numpy (about 100 MB), which would hide anything smaller in its children, so each
# measured command is started by this small launcher (a fresh interpreter importing only os, sys,
# json and time), and the processes that report themselves read VmHWM, which is their own.
LAUNCHER = """
import json, os, sys, time
report, command = sys.argv[1], sys.argv[2:]
started = time.monotonic()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(command[0], command)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
wall = time.monotonic() - started
with open(report, "w") as f:
    json.dump({"exit": os.waitstatus_to_exitcode(status), "wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime}, f)
"""


def run_measured(command: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run a command to its end through the launcher: exit code, wall time (fork to exit) and its own
    peak RSS (wait4's ru_maxrss)."""
    report = log.with_suffix(".json")
    with log.open("wb") as out:
        subprocess.run([sys.executable, "-c", LAUNCHER, str(report), *command], env=env, stdout=out, stderr=out)
    result: dict[str, Any] = json.loads(report.read_text())
    if result["exit"] != 0:
        result["log_tail"] = log.read_text(errors="replace")[-2000:]
        note(f"{' '.join(command[1:5])} exited {result['exit']}: {result['log_tail']}")
    return result


def statuses(path: Path) -> dict[str, int]:
    """The output's rows by status (only the status column read)."""
    column = pq.read_table(path, columns=["summary_status"]).column(0)
    return {str(row["values"]): int(row["counts"]) for row in pc.value_counts(column).to_pylist()}


def journal_rows(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        count: int = db.execute("SELECT count(*) FROM answers").fetchone()[0]
    return count


def check_output(result: dict[str, Any], output: Path, rows: int) -> None:
    found = statuses(output) if result["exit"] == 0 and output.exists() else {}
    result["statuses"] = found
    result["rows_ok"] = found.get("ok", 0)
    result["output_ok"] = sum(found.values()) == rows and found.get("ok", 0) == rows


def summarize_cli(inp: Path, out: Path, journal: Path, server: Server, args: argparse.Namespace) -> list[str]:
    command = [sys.executable, "-m", "batchsum.cli", "summarize", str(inp), "-o", str(out), "--column", "text"]
    command += ["--journal", str(journal), "--rpm", "0", "--quiet"]
    if args.concurrency:
        command += ["--concurrency", str(args.concurrency)]
    if args.budget:
        command += ["--budget", args.budget]
    return command


BASELINE = """
import sys, time
import pyarrow.compute as pc, pyarrow.dataset, pyarrow.parquet as pq  # imports before the clock
source, target, how = sys.argv[1:]
started, cpu = time.perf_counter(), time.process_time()
if how == "whole":
    table = pq.read_table(source)
    table = table.append_column("summary", pc.utf8_slice_codeunits(table.column("text"), 0, 200))
    pq.write_table(table, target)
    rows = table.num_rows
else:
    rows, writer = 0, None
    with pq.ParquetFile(source, pre_buffer=False) as reader:  # pre_buffer keeps the file's chunks: 880 MB at 2M
        for batch in reader.iter_batches():
            batch = batch.append_column("summary", pc.utf8_slice_codeunits(batch.column("text"), 0, 200))
            writer = writer or pq.ParquetWriter(target, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
    writer.close()
elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(elapsed, rows, peak / 1024, cpu)
"""

PANDAS = """
import gc, json, sys, time
def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}
def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
source, what, journal, url = sys.argv[1:]
import pandas as pd, pyarrow.parquet as pq
if what != "baseline":
    import batchsum  # noqa: F401 (registers df.batchsum)
imports = status()
started = time.perf_counter()
df = pq.read_table(source).to_pandas()
read_s = time.perf_counter() - started
gc.collect()
loaded = status()
reset_peak()
started = time.perf_counter()
if what == "baseline":
    df["summary"] = df["text"].str[:200]
    ok = len(df)
else:
    out = df.batchsum.summarize("text", journal=journal, progress=False, rpm=0, base_url=url, api_key="bench")
    ok = int((out["summary_status"] == "ok").sum()) if len(out) == len(df) else -1
work_s = time.perf_counter() - started
end = status()
print(json.dumps({
    "rows": len(df), "rows_ok": ok, "read_s": read_s, "work_s": work_s,
    "rss_after_imports_mb": imports["VmRSS"], "rss_frame_loaded_mb": loaded["VmRSS"],
    "peak_while_loading_mb": loaded["VmHWM"], "peak_during_work_mb": end["VmHWM"],
    "added_over_frame_mb": end["VmHWM"] - loaded["VmRSS"],
}))
"""


def baseline(inp: Path, scratch: Path, how: str) -> dict[str, Any]:
    target = scratch / f"baseline-{how}.parquet"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", BASELINE, str(inp), str(target), how], env=child_env(), capture_output=True, text=True
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    elapsed, rows, peak, cpu = done.stdout.split()
    target.unlink()
    return {
        "work_s": float(elapsed),
        "cpu_s": float(cpu),
        "process_wall_s": wall,
        "rows": int(rows),
        "peak_rss_mb": float(peak),
    }


def pandas_child(inp: Path, what: str, journal: Path, server: Server) -> dict[str, Any]:
    before = server.requests()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", PANDAS, str(inp), what, str(journal), server.url],
        env=child_env(BATCHSUM_BUDGET=os.environ.get("BATCHSUM_BUDGET", "machine")),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = time.monotonic() - started
    result["requests"] = server.requests() - before
    return result


def version_run(scratch: Path, repeats: int = 3) -> dict[str, Any]:
    runs = [
        run_measured([sys.executable, "-m", "batchsum.cli", "--version"], child_env(), scratch / "version.log")
        for _ in range(repeats)
    ]
    runs.sort(key=lambda r: r["wall_s"])
    middle = runs[len(runs) // 2]
    return {"wall_s": middle["wall_s"], "peak_rss_mb": middle["peak_rss_mb"], "runs": repeats}


def median_run(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run whose ``key`` is the median of the runs' (the lower middle of an even count), with every
    run's ``key`` beside it (``all``)."""
    chosen = dict(sorted(runs, key=lambda run: run[key])[(len(runs) - 1) // 2])
    chosen["all"] = [run[key] for run in runs]
    return chosen


def one_size(rows: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    inp = input_path(args.work, rows, args.distinct, args.seed)
    folder = scratch / f"rows{rows}"
    folder.mkdir()
    journal = folder / "cli.journal.sqlite"
    result: dict[str, Any] = {"rows": rows, "distinct": args.distinct, "input_mb": inp.stat().st_size / 1e6}
    server = Server(folder)
    try:
        env = child_env(BATCHSUM_BASE_URL=server.url, BATCHSUM_API_KEY="bench")

        def summarize(name: str, journal: Path) -> dict[str, Any]:
            """One measured `batchsum summarize` into NAME.parquet with JOURNAL (every run shares one
            cache folder: the machine's answer store the first run filled)."""
            before = server.requests()
            out = folder / f"{name}.parquet"
            done = run_measured(summarize_cli(inp, out, journal, server, args), env, folder / f"{name}.log")
            done["requests"] = server.requests() - before
            done["rows_per_s"] = rows / done["wall_s"]
            check_output(done, out, rows)
            done["journal_rows"] = journal_rows(journal) if journal.exists() else 0
            out.unlink(missing_ok=True)
            return done

        note(f"{rows} rows: first run ...")
        first = result["first"] = summarize("first", journal)
        copies: dict[str, list[dict[str, Any]]] = {"whole": [], "stream": []}
        reruns: list[dict[str, Any]] = []
        stored: list[dict[str, Any]] = []
        for repetition in range(args.repeat):
            note(f"{rows} rows: repetition {repetition + 1} of {args.repeat}: copy, rerun, store-answered job ...")
            copies["whole"].append(baseline(inp, folder, "whole"))
            reruns.append(summarize(f"rerun{repetition}", journal))
            own = folder / f"store{repetition}.journal.sqlite"  # a new output's journal, empty
            stored.append(summarize(f"store{repetition}", own))
            stored[-1]["journal_rows_before"] = 0
            copies["stream"].append(baseline(inp, folder, "stream"))
            for path in folder.glob(f"store{repetition}.journal.sqlite*"):
                path.unlink()
        rerun = result["rerun"] = median_run(reruns, "wall_s")
        rerun["journal_rows_before"] = first["journal_rows"]
        rerun["journal_rows_after"] = rerun.pop("journal_rows")
        store = result["store"] = median_run(stored, "wall_s")
        store["journal_rows_after"] = store.pop("journal_rows")
        for how in ("whole", "stream"):
            result[f"baseline_{how}"] = median_run(copies[how], "work_s")
        result["repeat"] = args.repeat
        whole = result["baseline_whole"]["work_s"]
        result["rerun_ratio"] = rerun["wall_s"] / whole
        result["rerun_ratio_stream"] = rerun["wall_s"] / result["baseline_stream"]["work_s"]
        result["store_ratio"] = store["wall_s"] / whole
        result["targets"] = {
            "first_peak_rss": first["peak_rss_mb"] <= TARGET_RSS_MB,
            "rerun_peak_rss": rerun["peak_rss_mb"] <= TARGET_RSS_MB,
            "rerun_ratio": result["rerun_ratio"] <= TARGET_RERUN_RATIO,
            "store_ratio": result["store_ratio"] <= TARGET_STORE_RATIO,
            "rerun_sent_nothing": all(run["requests"] == 0 for run in reruns),
            "store_sent_nothing": all(run["requests"] == 0 for run in stored),
            "outputs_complete": first["output_ok"] and all(run["output_ok"] for run in reruns + stored),
        }

        if args.pandas and rows == args.pandas_rows:
            result["pandas"] = pandas_runs(inp, folder, server)
    finally:
        server.close()
    return result


def pandas_runs(inp: Path, folder: Path, server: Server) -> dict[str, Any]:
    journal = folder / "pandas.journal.sqlite"
    note("pandas accessor: first run ...")
    first = pandas_child(inp, "first", journal, server)
    note("pandas accessor: rerun, every answer in the journal ...")
    rerun = pandas_child(inp, "rerun", journal, server)
    note("pandas baseline: read and assign a column ...")
    base = pandas_child(inp, "baseline", journal, server)
    return {
        "first": first,
        "rerun": rerun,
        "baseline": base,
        "rerun_ratio": (rerun["read_s"] + rerun["work_s"]) / (base["read_s"] + base["work_s"]),
    }


def machine() -> dict[str, Any]:
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    import pandas as pd

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": int(meminfo["MemTotal"].split()[0]) / 1024**2,
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
        "pandas": pd.__version__,
        "numpy": np.__version__,
        "kernel": platform.release(),
        "batchsum_commit": git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def git_commit() -> str:
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--", "batchsum"], capture_output=True, text=True
    )
    return done.stdout.strip() + (" (batchsum/ modified)" if dirty.stdout.strip() else "")


def yes(flag: bool) -> str:
    return "met" if flag else "NOT MET"


def table(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"machine: {m['nproc']} cores ({m['cpu']}), {m['ram_gib']:.1f} GiB RAM, load {m['load_average'][0]:.2f}; "
        f"Python {m['python']}, pyarrow {m['pyarrow']}, pandas {m['pandas']}; batchsum {m['batchsum_commit']}; {m['date']}",
        "",
        "| rows (distinct texts) | run | wall (median; each) | CPU | rows/s | peak RSS | requests | output |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def each(run: dict[str, Any]) -> str:
        return f" ({', '.join(f'{w:.2f}' for w in run['all'])})" if len(run.get("all", [])) > 1 else ""

    for size in report["sizes"]:
        label = f"{size['rows']:,} ({size['distinct']:,}), {size['input_mb']:.0f} MB"
        runs = (
            ("`summarize`, first run", size["first"]),
            ("`summarize`, rerun (journal complete)", size["rerun"]),
            ("`summarize`, new output answered from the store", size["store"]),
        )
        for name, run in runs:
            output = "all ok" if run["output_ok"] else f"exit {run['exit']}, {run['statuses']}"
            lines.append(
                f"| {label} | {name} | {run['wall_s']:.2f} s{each(run)} | {run['cpu_s']:.2f} s | "
                f"{run['rows_per_s']:,.0f} | {run['peak_rss_mb']:.0f} MB | {run['requests']:,} | {output} |"
            )
        for how in ("whole", "stream"):
            b = size[f"baseline_{how}"]
            lines.append(
                f"| {label} | pyarrow read + summary column + write ({how}) | {b['work_s']:.2f} s{each(b)} "
                f"(process {b['process_wall_s']:.2f} s) | {b['cpu_s']:.2f} s | {size['rows'] / b['work_s']:,.0f} | "
                f"{b['peak_rss_mb']:.0f} MB | — | — |"
            )
    v = report["version"]
    lines.append(f"| — | `batchsum --version` | {v['wall_s']:.2f} s | — | — | {v['peak_rss_mb']:.0f} MB | — | — |")
    lines.append("")
    for size in report["sizes"]:
        t, first, rerun, store = size["targets"], size["first"], size["rerun"], size["store"]
        lines.append(
            f"{size['rows']:,} rows ({size['repeat']} repetitions, medians): "
            f"rerun / pyarrow copy {size['rerun_ratio']:.2f}x ({yes(t['rerun_ratio'])}; target <= "
            f"{TARGET_RERUN_RATIO}x; {size['rerun_ratio_stream']:.2f}x the streamed copy); "
            f"store-answered job / copy {size['store_ratio']:.2f}x ({yes(t['store_ratio'])}; target <= "
            f"{TARGET_STORE_RATIO}x); peak RSS first run {first['peak_rss_mb']:.0f} MB "
            f"({yes(t['first_peak_rss'])}), rerun {rerun['peak_rss_mb']:.0f} MB ({yes(t['rerun_peak_rss'])}; "
            f"target <= {TARGET_RSS_MB:.0f} MB); rerun sent {rerun['requests']} requests and the store-answered "
            f"job {store['requests']} (service count; journal rows {rerun['journal_rows_before']:,} -> "
            f"{rerun['journal_rows_after']:,}; the new journal 0 -> {store['journal_rows_after']:,}); "
            f"first run sent {first['requests']:,} requests for {size['distinct']:,} distinct texts"
        )
    for size in report["sizes"]:
        if "pandas" not in size:
            continue
        p = size["pandas"]
        lines += [
            "",
            f"pandas accessor, {size['rows']:,}-row frame (same file, `pq.read_table(...).to_pandas()`):",
            "",
            "| run | read | work | RSS with the frame | peak during the work | added over the frame | requests |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, key in (
            ("`df.batchsum.summarize`, first run", "first"),
            ("`df.batchsum.summarize`, rerun (journal complete)", "rerun"),
            ('baseline: `df["summary"] = df["text"].str[:200]`', "baseline"),
        ):
            r = p[key]
            ok = "" if r["rows_ok"] == r["rows"] else f" ({r['rows_ok']} of {r['rows']} ok)"
            lines.append(
                f"| {name}{ok} | {r['read_s']:.2f} s | {r['work_s']:.2f} s | {r['rss_frame_loaded_mb']:.0f} MB | "
                f"{r['peak_during_work_mb']:.0f} MB | {r['added_over_frame_mb']:.0f} MB | {r['requests']} |"
            )
        lines.append(
            f"read + rerun / read + assign a column: {p['rerun_ratio']:.1f}x; peak while loading the frame "
            f"{p['rerun']['peak_while_loading_mb']:.0f} MB, after imports {p['rerun']['rss_after_imports_mb']:.0f} MB"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[200_000], help="rows, one size or several")
    parser.add_argument("--distinct", type=int, default=20_000, help="distinct texts among the rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "batchsum-scale")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repetitions of copy, rerun, store job")
    parser.add_argument("--concurrency", type=int, default=None, help="the CLI's --concurrency (default: its own)")
    parser.add_argument("--budget", default=None, help="the CLI's --budget (default: its own, machine)")
    parser.add_argument("--pandas", action="store_true", help="the pandas accessor too, on --pandas-rows")
    parser.add_argument("--pandas-rows", type=int, default=200_000)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    parser.add_argument("--show", type=Path, metavar="JSON", help="print the table of a saved --json run, and stop")
    args = parser.parse_args()
    if args.show:
        print(table(json.loads(args.show.read_text())))
        return
    if args.pandas and args.pandas_rows not in args.rows:
        args.rows.append(args.pandas_rows)
    report: dict[str, Any] = {"machine": machine()}
    args.work.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="run-", dir=args.work))
    try:
        report["version"] = version_run(scratch)
        report["sizes"] = [one_size(rows, args, scratch) for rows in sorted(args.rows)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(report, indent=2, default=str) if args.json else table(report))


if __name__ == "__main__":
    main()
