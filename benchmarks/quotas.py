"""Issue 52's must-shows for configured quotas, through `batchsum summarize` processes and DuckDB against
the local service (no limit of its own: what it admits is what the runs sent), each on a fresh key:

- `restore`: run A (`--quota 10/hour --max-wait 7200`, 15 texts) sends 10 and waits; its Redis budget
  is flushed (a restart without persistence); 12 s later run B (`--quota 10/hour --max-wait 5`, 10
  texts): what the service admitted in the hour, in all (10: A restored its count, B sent nothing);
  and the seconds from the flush until A's count was back on the budget (A's pacer is quiet: its
  entry's keep-alive hears the new epoch, every 5 s).
- `periods`: run A (10/hour) waits, Redis flushed, A's count back (or 30 s gone by); a run with
  `--quota 12/day` (at most 2), then `--quota 10/hour --max-wait 5` (0): every period of A's count
  restored.
- `wait`: a run waiting 30 s on its spent `--quota 10/hour` (30 texts at 600/min): how often it said
  it waits, and that it left the run, in those 30 s.
- `duckdb`: `SET threads = 4`, the default rate (60/min), a daily quota of 30 over 60 texts in four row
  groups, `--trials` fresh machine budgets: what the service admitted each time (30).

`--tree PATH` runs another checkout's batchsum (e.g. `git archive 5bbb965 | tar -x -C /tmp/before`)
for a before-and-after. By hand:

    python -m benchmarks.quotas                       # every part, about four minutes
    python -m benchmarks.quotas --parts duckdb --trials 5 --tree /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.outage import OwnRedis

ROOT = Path(__file__).resolve().parent.parent
WAITS = "quota spent; the run waits for"
LEAVES = "it leaves the run until then"


def texts(n: int, seed: int) -> list[str]:
    words = "river council budget school market station harbour bridge museum garden library festival".split()
    return [f"Case {seed}-{i}: " + " ".join(words[(i + j) % len(words)] for j in range(24)) + "." for i in range(n)]


class Setting:
    """A folder, the local service (one key of its own), and the environment a run is started in."""

    def __init__(self, folder: str, service_url: str, key: str, tree: Path, budget: str | None) -> None:
        self.folder, self.key = Path(folder), key
        self.env = {
            **os.environ,
            "BATCHSUM_API_KEY": key,
            "BATCHSUM_BASE_URL": service_url,
            "BATCHSUM_RPM": "600",
            "XDG_CACHE_HOME": f"{folder}/cache",
            "PYTHONPATH": str(tree),
        }
        if budget is not None:
            self.env["BATCHSUM_BUDGET"] = budget

    def argv(self, name: str, seed: int, n: int, *flags: str) -> list[str]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": texts(n, seed)}), self.folder / f"{name}.parquet")
        return [sys.executable, "-m", "batchsum", "summarize", f"{name}.parquet", "-o", f"{name}-out.parquet",
                "--column", "text", *flags]  # fmt: skip

    def start(self, name: str, seed: int, n: int, *flags: str) -> tuple[subprocess.Popen[str], list[str]]:
        """The run in the background, its stderr's lines gathered as they come."""
        process = subprocess.Popen(
            self.argv(name, seed, n, *flags), env=self.env, cwd=self.folder,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        lines: list[str] = []

        def read() -> None:
            assert process.stderr is not None
            lines.extend(process.stderr)

        threading.Thread(target=read, daemon=True).start()
        return process, lines

    def run(self, name: str, seed: int, n: int, *flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(name, seed, n, *flags), env=self.env, cwd=self.folder, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip


def until(condition, seconds: float = 120.0) -> float:
    """Wait for ``condition()``; the seconds it took."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > seconds:
            raise TimeoutError(f"gave up waiting after {seconds:g} s")
        time.sleep(0.05)
    return time.monotonic() - began


def counted(redis_url: str, key: str, base_url: str, period: str) -> int:
    """What the key's Redis budget counts in ``period`` (read with this checkout's budget)."""
    from batchsum import Client
    from batchsum.pacing.budgets.budget import RedisBudget

    with Client(api_key=key, base_url=base_url) as client:
        identity = client.identity

    async def read() -> int:
        budget = RedisBudget(redis_url, identity)
        try:
            return await budget.quota_used(period)
        finally:
            await budget.aclose()

    return asyncio.run(read())


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def waiting_then_flushed(args: argparse.Namespace, then: list[tuple[str, str]], pause: float) -> dict[str, object]:
    """Run A waits on its spent hourly quota of 10; Redis is flushed; ``pause`` seconds later (or, with
    ``pause`` < 0, once A's count is back) each of ``then`` (a name, its ``--quota``) runs in turn."""
    import redis

    from batchsum.local import LocalService
    from batchsum.service.key_plans import period_window

    key = f"bs-quota-bench-{os.urandom(6).hex()}"
    with tempfile.TemporaryDirectory() as folder, LocalService([key]) as service:
        own = OwnRedis(folder)
        own.start()
        try:
            setting = Setting(folder, service.url, key, args.tree, own.url)
            hour = period_window("hour", time.time())[0]
            a, lines = setting.start("a", 1, 15, "--quota", "10/hour", "--max-wait", "7200")
            until(lambda: any(WAITS in line for line in lines))
            sent = {"A": service.stats()["requests"]}
            redis.Redis.from_url(own.url).flushall()
            flushed = time.monotonic()
            back = None  # A's count back on the budget: after so many seconds (with a pause: within it)
            if pause < 0:  # up to 30 s: a checkout that never restores goes on without it
                try:
                    until(lambda: counted(own.url, key, service.url, hour) >= 10, 30.0)
                    back = time.monotonic() - flushed
                except TimeoutError:
                    pass
            else:
                time.sleep(pause)
                if counted(own.url, key, service.url, hour) >= 10:
                    back = time.monotonic() - flushed
            for seed, (name, quota) in enumerate(then, start=2):
                before = service.stats()["requests"]
                done = setting.run(f"r{seed}", seed, 10, "--quota", quota, "--max-wait", "5")
                sent[name] = service.stats()["requests"] - before
                sent[f"{name} exit"] = done.returncode
            stop(a)
            return {
                "sent": sent,
                "admitted in the hour": service.stats()["requests"],
                "A's count back (s)": None if back is None else round(back, 1),
                "an hour turned meanwhile": period_window("hour", time.time())[0] != hour,
                "A said it restored": any("are restored" in line for line in lines),
            }
        finally:
            own.stop()


def waiting_lines(args: argparse.Namespace) -> dict[str, object]:
    """A run that waits 30 s on its spent quota: how often it says so."""
    from batchsum.local import LocalService

    key = f"bs-quota-bench-{os.urandom(6).hex()}"
    with tempfile.TemporaryDirectory() as folder, LocalService([key]) as service:
        setting = Setting(folder, service.url, key, args.tree, None)
        run, lines = setting.start("w", 7, 30, "--quota", "10/hour", "--max-wait", "7200")
        until(lambda: any(WAITS in line or LEAVES in line for line in lines))
        time.sleep(args.wait)
        said = list(lines)
        stop(run)
        return {
            "seconds waited": args.wait,
            "said it waits": sum(WAITS in line for line in said),
            "said the key leaves": sum(LEAVES in line for line in said),
            "sent": service.stats()["requests"],
        }


DUCKDB_TRIAL = """
import os, sys, warnings
import batchsum
print(batchsum.__file__, file=sys.stderr)
import duckdb, pyarrow as pa, pyarrow.parquet as pq
import batchsum.duckdb
folder, url, key = sys.argv[1:4]
pq.write_table(pa.table({"text": [line for line in open(folder + "/texts.txt").read().splitlines()]}),
               folder + "/in.parquet", row_group_size=15)
con = duckdb.connect()
con.execute("SET threads = 4")
batchsum.duckdb.register(con, api_key=key, base_url=url, quota="30/day", progress=False)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    rows = con.execute("SELECT batchsum_summarize(text).status FROM '" + folder + "/in.parquet'").fetchall()
con.close()
print(sum(status == "ok" for (status,) in rows))
"""


def duckdb_trials(args: argparse.Namespace) -> dict[str, object]:
    """Fresh machine budgets (a cache folder each), threads = 4, the default rate, 30/day over 60 texts."""
    from batchsum.local import LocalService

    admitted, ok, seconds = [], [], []
    for trial in range(args.trials):
        key = f"bs-quota-bench-{os.urandom(6).hex()}"
        with tempfile.TemporaryDirectory() as folder, LocalService([key]) as service:
            Path(folder, "texts.txt").write_text("\n".join(texts(60, 100 + trial)))
            env = {**os.environ, "XDG_CACHE_HOME": f"{folder}/cache", "PYTHONPATH": str(args.tree)}
            env.pop("BATCHSUM_RPM", None)
            began = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-c", DUCKDB_TRIAL, folder, service.url, key], env=env, cwd=folder,
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            seconds.append(round(time.monotonic() - began, 1))
            ok.append(int((done.stdout.strip().splitlines() or ["-1"])[-1]))
            admitted.append(service.stats()["requests"])
    return {"admitted": admitted, "rows ok": ok, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["restore", "periods", "wait", "duckdb"])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--wait", type=float, default=30.0, help="seconds the `wait` part waits")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose batchsum the runs use")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out: dict[str, object] = {"tree": str(args.tree), "load": os.getloadavg()}
    if "restore" in args.parts:
        out["restore"] = waiting_then_flushed(args, [("B", "10/hour")], pause=12.0)
        print("restore", json.dumps(out["restore"]), flush=True)
    if "periods" in args.parts:
        out["periods"] = waiting_then_flushed(args, [("a day's 12", "12/day"), ("an hour's 10", "10/hour")], -1)
        print("periods", json.dumps(out["periods"]), flush=True)
    if "wait" in args.parts:
        out["wait"] = waiting_lines(args)
        print("wait", json.dumps(out["wait"]), flush=True)
    if "duckdb" in args.parts:
        out["duckdb"] = duckdb_trials(args)
        print("duckdb", json.dumps(out["duckdb"]), flush=True)
    out["load after"] = os.getloadavg()
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
