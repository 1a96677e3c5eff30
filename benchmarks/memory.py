"""Peak memory of `batchsum summarize` on a large generated Parquet file. Run by hand:

    python benchmarks/memory.py --rows 200000

Writes ROWS unique texts (about 450 bytes each: 200,000 rows are about 90 MB of text) to a
temporary Parquet file, starts `batchsum serve` in one process (no limit) and runs
`batchsum summarize` in another, and reports the CLI process's peak resident memory (from wait4)
and its throughput. The texts stream through in record batches; the output is written as it goes.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="rows to generate")
    parser.add_argument("--concurrency", type=int, default=16, help="the CLI's --concurrency")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.parquet"
        size = write_input(source, args.rows)
        print(f"input: {args.rows} rows, {size / 1e6:.0f} MB of text, {source.stat().st_size / 1e6:.0f} MB on disk")
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "batchsum.cli", "serve", "--port", str(port), "--rpm", "0", "--key", "bench"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(2)
            env = {**os.environ, "BATCHSUM_API_KEY": "bench", "BATCHSUM_BASE_URL": f"http://127.0.0.1:{port}"}
            started = time.monotonic()
            cli = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "batchsum.cli",
                    "summarize",
                    str(source),
                    "-o",
                    str(Path(tmp) / "out.parquet"),
                    "--column",
                    "text",
                    "--rpm",
                    "0",
                    "--concurrency",
                    str(args.concurrency),
                    "--quiet",
                ],
                env=env,
                stderr=subprocess.PIPE,
            )
            _, status, usage = os.wait4(cli.pid, 0)
            elapsed = time.monotonic() - started
            print(cli.stderr.read().decode().strip())
            print(
                f"exit {os.waitstatus_to_exitcode(status)}; peak RSS of the CLI: {usage.ru_maxrss / 1024:.0f} MB; "
                f"{elapsed:.0f}s, {args.rows / elapsed:.0f} rows/s"
            )
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
