"""Issue 43's figures, through the CLI: paying once per text across jobs. Run by hand:

    python -m benchmarks.store                 # 1000 texts (~4 min)
    python -m benchmarks.store --texts 200     # shorter

One local service strict at exactly the plan (``--rpm``, default 600, a sliding minute), answering in
0.3-0.7 s, in this process; every job is a ``batchsum summarize`` process (the default store: the
machine's, in a cache folder of the benchmark's own), timed from start to exit:

1. job 1 summarizes ``--texts`` distinct texts into ``a.parquet``;
2. job 2, a different file of as many rows, half of them job 1's texts, into ``b.parquet`` (a new
   output, no ``--journal``): its dry run first (what it says it would send), then the job;
3. the pandas accessor in a new Python process over job 1's texts;
4. two processes over half as many texts no job has seen, into two outputs, started together.

Figures: requests at the service, 429s, rows not ok, texts answered twice, seconds; utilization
(admitted a minute, first to last admitted start, over the plan) for the jobs that send.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from batchsum.local import Faults, LocalService
from benchmarks.rate import texts

ROOT = Path(__file__).resolve().parents[1]


def utilization(admitted: list[float], rpm: float) -> float | None:
    if len(admitted) < 2:
        return None
    return round((len(admitted) - 1) / (admitted[-1] - admitted[0]) * 60 / rpm, 3)


class Bench:
    def __init__(self, folder: Path, rpm: int) -> None:
        self.folder = folder
        self.rpm = rpm
        self.service = LocalService(rpm=rpm, limit_kind="sliding", faults=Faults(latency=0.3, latency_spread=0.4))
        self.service.start()
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "XDG_CACHE_HOME": str(folder / "cache"),
            "BATCHSUM_API_KEY": self.service.key,
            "BATCHSUM_BASE_URL": self.service.url,
        }

    def cli(self, *argv: str) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "batchsum.cli", "summarize", *argv, "--column", "text", "--quiet"]
        return subprocess.Popen(
            command + ["--rpm", str(self.rpm)],
            env=self.env,
            cwd=self.folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def measure(self, name: str, start: Any) -> dict[str, Any]:
        """Run ``start()`` (the processes of one step) and read the service's counts for it."""
        self.service.state.reset_stats()
        begun = time.monotonic()
        processes = start()
        outputs = [p.communicate(timeout=3600) for p in processes]
        seconds = time.monotonic() - begun
        codes = [p.returncode for p in processes]
        stats = self.service.state.stats()
        admitted = sorted(self.service.state.admitted)
        return {
            "step": name,
            "exit codes": codes,
            "requests": stats["requests"],
            "429s": stats["by_status"].get("429", 0),
            "answered twice": stats["answered_twice"],
            "utilization": utilization(admitted, self.rpm),
            "seconds": round(seconds, 1),
            "stdout": [out.strip() for out, _ in outputs],
            "stderr": [err.strip()[-400:] for _, err in outputs],
        }

    def not_ok(self, *outputs: str) -> int:
        return sum(int((pd.read_parquet(self.folder / out)["summary_status"] != "ok").sum()) for out in outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--rpm", type=int, default=600)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    n = args.texts
    every = texts(n * 3)
    with tempfile.TemporaryDirectory(prefix="batchsum-store-") as scratch:
        folder = Path(scratch)
        pd.DataFrame({"text": every[:n]}).to_parquet(folder / "one.parquet")
        pd.DataFrame({"text": every[n // 2 : n] + every[n : n + n // 2]}).to_parquet(folder / "two.parquet")
        pd.DataFrame({"text": every[2 * n : 2 * n + n // 2]}).to_parquet(folder / "three.parquet")
        bench = Bench(folder, args.rpm)
        rows: list[dict[str, Any]] = []
        try:
            rows.append(
                bench.measure("job 1: one.parquet -> a.parquet", lambda: [bench.cli("one.parquet", "-o", "a.parquet")])
            )
            rows[-1]["rows not ok"] = bench.not_ok("a.parquet")
            dry = bench.measure("job 2 --dry-run", lambda: [bench.cli("two.parquet", "-o", "b.parquet", "--dry-run")])
            rows.append(dry)
            rows.append(
                bench.measure("job 2: two.parquet -> b.parquet", lambda: [bench.cli("two.parquet", "-o", "b.parquet")])
            )
            rows[-1]["rows not ok"] = bench.not_ok("b.parquet")
            code = (
                "import pandas as pd, batchsum\n"
                "out = pd.read_parquet('one.parquet').batchsum.summarize('text', progress=False)\n"
                "print(int((out['summary_status'] != 'ok').sum()), out.attrs['batchsum']['from_store'])\n"
            )
            pandas = bench.measure(
                "pandas accessor, a new process, job 1's texts",
                lambda: [
                    subprocess.Popen(
                        [sys.executable, "-c", code],
                        env=bench.env,
                        cwd=folder,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                ],
            )
            rows.append(pandas)
            rows.append(
                bench.measure(
                    "two processes together, the same new texts",
                    lambda: [bench.cli("three.parquet", "-o", f"c{i}.parquet") for i in range(2)],
                )
            )
            rows[-1]["rows not ok"] = bench.not_ok("c0.parquet", "c1.parquet")
        finally:
            bench.service.stop()
    for row in rows:
        print(f"\n== {row['step']}")
        for key, value in row.items():
            if key not in ("step", "stderr", "stdout"):
                print(f"  {key}: {value}")
        for out in row["stdout"]:
            if out:
                print("  stdout:", out.replace("\n", "\n          "))
        for err in row["stderr"]:
            if err:
                print("  stderr:", err.replace("\n", "\n          "))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
