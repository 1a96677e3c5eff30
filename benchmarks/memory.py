"""Peak memory of `batchsum summarize` on a large generated dataset, Parquet and CSV side by side,
against reading the CSV whole with pandas. Run by hand:

    python benchmarks/memory.py --rows 200000

Writes ROWS unique texts (about 450 bytes each: 200,000 rows are about 90 MB of text) to a
temporary Parquet file and the same rows to a CSV file; for each, starts `batchsum serve` in one
process (no limit) and runs `batchsum summarize` (Parquet to Parquet, CSV to CSV) in another, both
pairs at once, and reports each CLI process's peak resident memory (from wait4) and throughput.
The texts stream through in record batches; the output is written as it goes. The baseline is
`pd.read_csv` of the whole file plus one summary column, what the accessor needs at the least.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

VOCABULARY = (
    "the council said a new bridge over the river would open next spring after years of delay and "
    "residents welcomed the plan although some warned that traffic in the old town could grow while "
    "shops near the harbour expect more visitors during the summer festival and the museum"
).split()


def write_input(path: Path, rows: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    total = 0
    with pq.ParquetWriter(path, pa.schema([("id", pa.int64()), ("text", pa.string())])) as writer:
        for start in range(0, rows, 10_000):
            texts = []
            for i in range(start, min(rows, start + 10_000)):
                words = [f"item{i}"] + [rng.choice(VOCABULARY) for _ in range(rng.randint(60, 90))]
                sentences = [" ".join(words[k : k + 15]).capitalize() + "." for k in range(0, len(words), 15)]
                texts.append(" ".join(sentences))
            total += sum(len(t.encode()) for t in texts)
            writer.write_table(pa.table({"id": list(range(start, start + len(texts))), "text": texts}))
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_csv(parquet: Path, csv: Path) -> None:
    """The same rows as CSV, written batch by batch."""
    import pyarrow.csv as pcsv

    with pq.ParquetFile(parquet) as source, pcsv.CSVWriter(csv, source.schema_arrow) as writer:
        for batch in source.iter_batches(10_000):
            writer.write_batch(batch)


PANDAS_BASELINE = """
import resource, sys
import pandas as pd
frame = pd.read_csv(sys.argv[1])
frame["summary"] = frame["text"].str[:200]  # what the accessor's result adds, at least
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def run_cli(source: Path, output: Path, concurrency: int) -> subprocess.Popen[bytes]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "batchsum.cli", "serve", "--port", str(port), "--rpm", "0", "--key", "bench"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(2)
    env = {
        **os.environ,
        "BATCHSUM_API_KEY": "bench",
        "BATCHSUM_BASE_URL": f"http://127.0.0.1:{port}",
        "BATCHSUM_BUDGET": "none",
    }
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "batchsum.cli",
            "summarize",
            str(source),
            "-o",
            str(output),
            "--column",
            "text",
            "--rpm",
            "0",
            "--concurrency",
            str(concurrency),
            "--quiet",
        ],
        env=env,
        stderr=subprocess.PIPE,
    )
    cli.server = server  # type: ignore[attr-defined]
    return cli


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="rows to generate")
    parser.add_argument("--concurrency", type=int, default=16, help="the CLI's --concurrency")
    parser.add_argument("--formats", nargs="+", default=["parquet", "csv"], choices=["parquet", "csv"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        size = write_input(folder / "in.parquet", args.rows)
        write_csv(folder / "in.parquet", folder / "in.csv")
        print(
            f"input: {args.rows} rows, {size / 1e6:.0f} MB of text; "
            f"{(folder / 'in.parquet').stat().st_size / 1e6:.0f} MB as Parquet, "
            f"{(folder / 'in.csv').stat().st_size / 1e6:.0f} MB as CSV"
        )
        baseline = subprocess.run(
            [sys.executable, "-c", PANDAS_BASELINE, str(folder / "in.csv")], capture_output=True, text=True, check=True
        )
        print(f"pandas.read_csv of the whole file plus a summary column: peak RSS {float(baseline.stdout):.0f} MB")
        started = time.monotonic()
        runs = {
            fmt: run_cli(folder / f"in.{fmt}", folder / f"out.{fmt}", args.concurrency) for fmt in ("parquet", "csv")
        }
        try:
            for fmt, cli in runs.items():
                _, status, usage = os.wait4(cli.pid, 0)
                elapsed = time.monotonic() - started
                assert cli.stderr is not None
                print(cli.stderr.read().decode().strip())
                print(
                    f"{fmt} -> {fmt}: exit {os.waitstatus_to_exitcode(status)}; peak RSS of the CLI "
                    f"{usage.ru_maxrss / 1024:.0f} MB; {elapsed:.0f}s, {args.rows / elapsed:.0f} rows/s"
                )
        finally:
            for cli in runs.values():
                cli.server.terminate()  # type: ignore[attr-defined]
                cli.server.wait()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
