"""``--rpm auto`` by hand: what finding a limit costs, side by side with a run told the right ``--rpm``.

    python benchmarks/auto.py                       # the CLI scenario, then the search at 60, 600, 3000
    python benchmarks/auto.py --only search --limits 600

The CLI scenario (``batchsum summarize``, the whole command timed, start-up included): a local
service strict at a sliding 240 a minute that states nothing, answers in 0.3-0.7 s; run 1, 500 texts
with ``--rpm auto`` on a fresh machine budget; run 2, 300 more texts right after on the same budget
(the limit remembered). Then the search: for each limit, a run of 3.5 minutes' texts with
``--rpm auto`` and one told ``--rpm`` = the limit, each against its own service: wall time, 429s, and
the limit in force at the end.
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

import pandas as pd

from batchsum.local import Faults, LocalService
from benchmarks.rate import texts


def cli(service: LocalService, rows: list[str], rpm: str, folder: Path, name: str, cache: Path) -> dict:
    source, out, report = folder / f"{name}.parquet", folder / f"{name}-out.parquet", folder / f"{name}.json"
    pd.DataFrame({"text": rows}).to_parquet(source)
    env = {
        **os.environ,
        "BATCHSUM_API_KEY": service.key,
        "BATCHSUM_BASE_URL": service.url,
        "XDG_CACHE_HOME": str(cache),
    }
    argv = [
        "summarize",
        str(source),
        "-o",
        str(out),
        "--column",
        "text",
        "--rpm",
        rpm,
        "--quiet",
        "--report",
        str(report),
    ]
    before = service.stats()["by_status"].get("429", 0)
    started = time.monotonic()
    subprocess.run([str(Path(sys.executable).parent / "batchsum"), *argv], env=env, check=True)
    wall = time.monotonic() - started
    done = json.loads(report.read_text())
    ok = int((pd.read_parquet(out)["summary_status"] == "ok").sum())
    return {
        "rows": len(rows),
        "ok": ok,
        "wall": wall,
        "429s": service.stats()["by_status"].get("429", 0) - before,
        "limit": done["pace"]["limit"],
        "source": done["pace"]["limit_source"],
        "of_plan": done["utilization"].get("of_plan"),
    }


def scenario() -> None:
    faults = Faults(latency=0.3, latency_spread=0.4, seed=3)
    with tempfile.TemporaryDirectory() as tmp, LocalService(rpm=240, faults=faults) as service:
        folder, cache = Path(tmp), Path(tmp) / "cache"
        first = cli(service, texts(500), "auto", folder, "run1", cache)
        ideal = 500 / 240 * 60
        print(f"run 1: {first} -> {first['wall'] / ideal:.3f}x of 500/240 min ({ideal:.0f} s)", flush=True)
        second = cli(service, texts(800)[500:], "auto", folder, "run2", cache)
        print(f"run 2: {second} -> {300 / second['wall'] * 60 / 240:.3f} of 240/min over the whole command", flush=True)


def search(limits: list[int]) -> None:
    print("| limit | told --rpm: wall, 429s | --rpm auto: wall, 429s, limit at the end |")
    print("| --- | --- | --- |")
    for limit in limits:
        rows = texts(int(limit * 3.5))
        cells = []
        for rpm in (str(limit), "auto"):
            faults = Faults(latency=0.3, latency_spread=0.4, seed=5)
            with tempfile.TemporaryDirectory() as tmp, LocalService(rpm=limit, faults=faults) as service:
                r = cli(service, rows, rpm, Path(tmp), "run", Path(tmp) / "cache")
            cells.append(r)
        told, auto = cells
        print(
            f"| {limit}/min | {told['wall']:.0f} s, {told['429s']} | {auto['wall']:.0f} s "
            f"({auto['wall'] / told['wall']:.2f}x), {auto['429s']}, {auto['limit']} ({auto['source']}) |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["cli", "search"], default=None, help="one part only")
    parser.add_argument("--limits", type=int, nargs="+", default=[60, 600, 3000], help="limits to search for")
    args = parser.parse_args()
    if args.only in (None, "cli"):
        scenario()
    if args.only in (None, "search"):
        search(args.limits)


if __name__ == "__main__":
    main()
