"""Issue 52's cases 2 and 5, through the CLI (each job a ``batchsum summarize`` process, the machine's
budget and store in a cache folder of the benchmark's own, or ``--redis URL``'s). Run by hand:

    python -m benchmarks.lookup                       # both (~1.5 min)
    python -m benchmarks.lookup --parts share --texts 40 --redis redis://127.0.0.1:6379/0

``trust`` (case 2): a premium key, proven in mode 2 (a one-row run first), runs mode 2 over ``--texts``
(20) texts against a service answering in 6 s; 3 s later a basic key (its plan refuses mode 2) runs
the same texts, same store, mode 2. Then the basic key again, after the premium run has finished.
Figures: each basic run's exit code, its last line, rows ok in its output (when it wrote one), rows
the store served it (its report's ``from_store``); the service's 401s.

``share`` (case 5): ``--rpm 120 --share 0.5`` over ``--texts`` (40) texts: the dry run's projected
time (its "takes at least XmYYs"), then the run's: its report's seconds and the process's wall time;
their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
PREMIUM, BASIC = "bench-premium-0123456789", "bench-basic-0123456789"


class Bench:
    def __init__(self, folder: Path, redis: str | None) -> None:
        self.folder = folder
        self.service = LocalService([PREMIUM, f"{BASIC}:basic"])
        self.service.start()
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "XDG_CACHE_HOME": str(folder / "cache"),
            "BATCHSUM_BASE_URL": self.service.url,
        }
        if redis:
            self.env["BATCHSUM_BUDGET"] = redis

    def cli(self, key: str, *argv: str) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "batchsum.cli", "summarize", *argv, "--column", "text", "--quiet"]
        return subprocess.Popen(
            command,
            env={**self.env, "BATCHSUM_API_KEY": key},
            cwd=self.folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def done(
        self, process: subprocess.Popen[str], output: str | None = None, report: str | None = None
    ) -> dict[str, Any]:
        out, err = process.communicate(timeout=600)
        lines = [line for line in (out + err).splitlines() if line.strip()]
        found: dict[str, Any] = {"exit": process.returncode, "last line": lines[-1] if lines else ""}
        if output is not None and (self.folder / output).exists():
            found["rows ok"] = int((pd.read_parquet(self.folder / output)["summary_status"] == "ok").sum())
        if report is not None and (self.folder / report).exists():
            data = json.loads((self.folder / report).read_text())
            found["from the store"] = data["requests"]["from_store"]
            found["report seconds"] = data["seconds"]
        return found


def trust(bench: Bench, n: int) -> dict[str, Any]:
    pd.DataFrame({"text": texts(n)}).to_parquet(bench.folder / "t.parquet")
    pd.DataFrame({"text": texts(n + 1)[n:]}).to_parquet(bench.folder / "proof.parquet")
    mode = ["--mode", "2", "--rpm", "600"]
    assert bench.done(bench.cli(PREMIUM, "proof.parquet", "-o", "proof.out.parquet", *mode))["exit"] == 0
    bench.service.faults = Faults(latency=6.0)
    premium = bench.cli(PREMIUM, "t.parquet", "-o", "premium.parquet", *mode)
    time.sleep(3.0)
    beside = bench.cli(BASIC, "t.parquet", "-o", "basic.parquet", *mode, "--report", "basic.json")
    figures = {"basic beside": bench.done(beside, "basic.parquet", "basic.json")}
    figures["premium"] = bench.done(premium, "premium.parquet")
    after = bench.cli(BASIC, "t.parquet", "-o", "basic-after.parquet", *mode, "--report", "basic-after.json")
    figures["basic after"] = bench.done(after, "basic-after.parquet", "basic-after.json")
    figures["401s at the service"] = bench.service.state.stats()["by_status"].get("401", 0)
    return figures


def share(bench: Bench, n: int) -> dict[str, Any]:
    pd.DataFrame({"text": [f"Shared {text}" for text in texts(n)]}).to_parquet(bench.folder / "s.parquet")
    pace = ["--rpm", "120", "--share", "0.5"]
    dry = bench.cli(PREMIUM, "s.parquet", "-o", "s.out.parquet", *pace, "--dry-run")
    out, _ = dry.communicate(timeout=120)
    line = next(line for line in out.splitlines() if line.startswith("would send:"))
    minutes, seconds = re.search(r"takes at least (\d+)m(\d+)s", line).groups()  # type: ignore[union-attr]
    projected = int(minutes) * 60 + int(seconds)
    begun = time.monotonic()
    run = bench.done(
        bench.cli(PREMIUM, "s.parquet", "-o", "s.out.parquet", *pace, "--report", "s.json"), "s.out.parquet", "s.json"
    )
    wall = time.monotonic() - begun
    return {
        "dry run": line,
        "projected seconds": projected,
        "run": run,
        "run wall seconds": round(wall, 1),
        "projected / report seconds": round(projected / run["report seconds"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=["trust", "share"], default=["trust", "share"])
    parser.add_argument("--texts", type=int, default=None, help="20 for trust, 40 for share")
    parser.add_argument("--redis", default=None, help="a Redis for the budget and the store (default: the machine's)")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="batchsum-lookup-") as scratch:
        bench = Bench(Path(scratch), args.redis)
        try:
            if "trust" in args.parts:
                results["trust"] = trust(bench, args.texts or 20)
            if "share" in args.parts:
                bench.service.faults = Faults()
                results["share"] = share(bench, args.texts or 40)
        finally:
            bench.service.stop()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
