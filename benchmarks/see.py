"""Seeing the key (issue 49): what a run's entry in its key's runs' registry costs the run, and how soon
`batchsum top` answers.

    python -m benchmarks.see                                   # both parts, 5 repetitions
    python -m benchmarks.see --parts publish --repeat 1 --requests 300   # a short proof that it works
    python -m benchmarks.see --parts calls --calls 5000 --repeat 3
    python -m benchmarks.see --parts top --runs 200 --redis redis://127.0.0.1:6379/15

Parts:

- publish: the client CPU (user + sys, from wait4, house.py's launcher) of one `batchsum summarize`
  process sending --requests (3000) distinct texts at --rpm (30000: paced, so every start is a call to
  the machine's budget, each stamped by the run's presence) against a `batchsum serve --rpm 0` in its
  own process (its CPU is not counted), divided by the requests the service counted; with the run's
  entry published (as shipped) and without (the run layer's `open_entry` replaced by a presence that
  never describes the run: what a run cost before issue 49, less even its minimal entry). The two are
  interleaved in each repetition (without, with, without, with, ...) so the machine's noise falls on
  both; the medians and the ratio with / without (at most 1.05: the issue's "at most 5% more").
- calls: the same cost without the command around it, in this process on the CPU clock (steadier on a
  busy machine): --calls (20000) calls to a SQLite budget, each committing a start and stamped by a
  run's presence, on a clock moving 2 ms a call (30000/min: an entry due every 500 calls) with the run's
  entry (`run.entry.Entry`) and without (a presence that never describes the run), interleaved, the
  median of --repeat; the ratio with / without.
- top: the wall time of `batchsum top --once --json` (the whole command, start-up included) on the
  machine's budget holding one key with --runs (50) runs on it and a minute of starts, the median and
  the slowest of --tops (20) calls; with --redis URL, on that Redis too (its database is flushed).

Run by hand, never in the tests; --json writes every repetition's figures too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import scale
from benchmarks.house import LAUNCHER, SLACK

# The command both variants run: batchsum's command line, in-process after the variant's setup.
WITH = "import sys\nfrom batchsum.cli import main\nsys.exit(main(sys.argv[1:]))\n"
WITHOUT = (
    "import sys\n"
    "import batchsum.run.pieces as pieces\n"
    "from batchsum.pacing.budgets.presence import Presence, member_of\n"
    "class Quiet(Presence):  # a run on the key that never publishes its entry\n"
    "    lane = None\n"
    "pieces.open_entry = lambda stack, run_id, *args, **kwargs: Quiet(member_of(run_id))\n"
    "from batchsum.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
VARIANTS = {"without": WITHOUT, "with": WITH}


def measured(command: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    report = log.with_suffix(".json")
    with log.open("wb") as out:
        subprocess.run([sys.executable, "-c", LAUNCHER, str(report), *command], env=env, stdout=out, stderr=out)
    result: dict[str, Any] = json.loads(report.read_text())
    if result["exit"] != 0:
        raise RuntimeError(f"{command[:4]} exited {result['exit']}: {log.read_text(errors='replace')[-2000:]}")
    return result


def publish_once(variant: str, inp: Path, service: scale.Server, scratch: Path, args: argparse.Namespace) -> float:
    """One measured run: its CPU per request, ms."""
    folder = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=scratch))
    env = scale.child_env(BATCHSUM_BASE_URL=service.url, BATCHSUM_API_KEY="bench")  # a fresh budget and store
    out = folder / "out.parquet"
    command = [sys.executable, "-c", VARIANTS[variant], "summarize", str(inp), "-o", str(out), "--column", "text"]
    command += ["--journal", str(folder / "journal.sqlite"), "--rpm", str(args.rpm), "--quiet"]
    before = service.requests()
    done = measured(command, env, folder / "run.log")
    requests = service.requests() - before
    statuses = scale.statuses(out)
    shutil.rmtree(folder)
    if requests != args.requests or statuses != {"ok": args.requests}:
        raise RuntimeError(f"{variant}: {requests} requests, {statuses}")
    return 1000 * done["cpu_s"] / requests


def publish_part(scratch: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    inp = scale.input_path(args.work, args.requests, args.requests, args.seed)
    service = scale.Server(scratch)
    runs: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        for rep in range(args.repeat):
            for variant in VARIANTS:
                scale.note(f"publish, repetition {rep + 1}/{args.repeat}: {variant} ...")
                runs[variant].append(publish_once(variant, inp, service, scratch, args))
    finally:
        service.close()
    return runs


def calls_once(variant: str, scratch: Path, args: argparse.Namespace) -> float:
    """CPU seconds per budget call, µs, with or without the run's entry."""
    from batchsum.engine.tally import BatchStats
    from batchsum.pacing.budgets.budget import SQLiteBudget
    from batchsum.pacing.budgets.exchange import Report
    from batchsum.pacing.budgets.presence import Presence, member_of
    from batchsum.run.entry import Entry
    from batchsum.run.spec import RunSpec

    clock = [0.0]
    budget = SQLiteBudget(Path(tempfile.mkdtemp(dir=scratch)) / "budget.sqlite", uuid.uuid4().hex)
    if variant == "with":
        spec = RunSpec.from_kwargs(api_key="bench", base_url="http://127.0.0.1:9", rpm=args.rpm)
        presence: Presence = Entry(
            "run", budget, spec, BatchStats(total=args.calls), shared=False, clock=lambda: clock[0]
        )
    else:
        presence = Presence(member_of("run"), None, clock=lambda: clock[0])

    async def calls() -> float:
        await budget.check()
        started = time.process_time()
        for _ in range(args.calls):
            clock[0] += 60.0 / args.rpm
            await budget.reserve(0.0, presence.stamp(Report()))
        spent = time.process_time() - started
        await budget.aclose()
        return 1e6 * spent / args.calls

    return asyncio.run(calls())


def calls_part(scratch: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for rep in range(args.repeat):
        for variant in VARIANTS:
            scale.note(f"calls, repetition {rep + 1}/{args.repeat}: {variant} ...")
            runs[variant].append(calls_once(variant, scratch, args))
    return runs


async def _fill(budget: Any, runs: int) -> None:
    """One key with a minute of starts and ``runs`` runs on it, as runs leave a budget."""
    from batchsum.pacing.budgets.exchange import Member, Report

    await budget.check()
    await budget.recall("0123456789ab", "https://api.example")
    for _ in range(600):
        await budget.reserve(0.0)
    for n in range(runs):
        entry = {"host": f"host-{n % 7}", "pid": 1000 + n, "door": "cli", "rpm": 600, "source": "configured"}
        entry.update(share=1.0, sent=n, reused=0, rate_limited=0, rows_left=100, rate_1m=n, eta_s=10.0)
        entry.update(output=f"/data/exports/run-{n}/out.parquet", started_at=time.time())
        await budget.reserve(0.0, Report(run=Member(f"run-{n:04d}", f"m{n}"), entry=json.dumps(entry)), start=False)


def top_part(scratch: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    from batchsum.pacing.budgets.budget import RedisBudget, SQLiteBudget

    places: dict[str, Any] = {"machine": None}
    if args.redis:
        places["redis"] = args.redis
    found: dict[str, list[float]] = {}
    for name, where in places.items():
        env = scale.child_env()
        if where is None:
            path = Path(env["XDG_CACHE_HOME"]) / "batchsum" / "budget.sqlite"
            path.parent.mkdir(parents=True, exist_ok=True)
            budget: Any = SQLiteBudget(path, uuid.uuid4().hex)
        else:
            import redis

            redis.Redis.from_url(where).flushdb()
            env["BATCHSUM_BUDGET"] = where
            budget = RedisBudget(where, uuid.uuid4().hex)
        asyncio.run(_fill(budget, args.runs))
        found[name] = []
        for call in range(args.tops):
            scale.note(f"top, {name}: call {call + 1}/{args.tops} ...")
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "batchsum", "top", "--once", "--json"], env=env, capture_output=True, text=True
            )
            found[name].append(time.monotonic() - started)
            shown = json.loads(done.stdout)["keys"] if done.returncode == 0 else []
            if [len(key["runs"]) for key in shown] != [args.runs]:
                raise RuntimeError(f"top on {name}: {done.stderr or shown}")
        asyncio.run(budget.aclose())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=["publish", "calls", "top"], default=["publish", "calls", "top"])
    parser.add_argument("--repeat", type=int, default=5, help="publish: repetitions, the variants interleaved in each")
    parser.add_argument("--requests", type=int, default=3000, help="publish: distinct texts, one request each")
    parser.add_argument("--rpm", type=int, default=30000, help="publish: the pace (every start a budget call)")
    parser.add_argument("--calls", type=int, default=20000, help="calls: budget calls in each measure")
    parser.add_argument("--runs", type=int, default=50, help="top: runs on the key")
    parser.add_argument("--tops", type=int, default=20, help="top: calls")
    parser.add_argument("--redis", default=None, metavar="URL", help="top: also on this Redis (flushed)")
    parser.add_argument("--seed", type=int, default=49)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "batchsum-scale")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args()
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="see-", dir=args.work))
    load, wall = os.getloadavg()[0], time.time()
    report: dict[str, Any] = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    lines = []
    try:
        if "publish" in args.parts:
            runs = report["publish"] = publish_part(scratch, args)
            medians = {name: statistics.median(values) for name, values in runs.items()}
            ratio = medians["with"] / medians["without"]
            lines += [
                f"publish: client CPU per request at {args.rpm}/min, {args.requests} requests, median of {args.repeat}",
                "",
                "| entry | CPU per request | every repetition |",
                "| --- | --- | --- |",
                *(
                    f"| {name} | {medians[name]:.3f} ms | {', '.join(f'{v:.3f}' for v in runs[name])} |"
                    for name in VARIANTS
                ),
                "",
                f"with / without: {ratio:.3f} ({'within' if ratio <= SLACK else 'OVER'} {SLACK:.2f})",
            ]
        if "calls" in args.parts:
            runs = report["calls"] = calls_part(scratch, args)
            medians = {name: statistics.median(values) for name, values in runs.items()}
            ratio = medians["with"] / medians["without"]
            lines += [
                "",
                f"calls: CPU per budget call (SQLite), {args.calls} calls at {args.rpm}/min, median of {args.repeat}",
                "",
                "| entry | CPU per call | every repetition |",
                "| --- | --- | --- |",
                *(
                    f"| {name} | {medians[name]:.1f} µs | {', '.join(f'{v:.1f}' for v in runs[name])} |"
                    for name in VARIANTS
                ),
                "",
                f"with / without: {ratio:.3f} ({'within' if ratio <= SLACK else 'OVER'} {SLACK:.2f})",
            ]
        if "top" in args.parts:
            tops = report["top"] = top_part(scratch, args)
            lines += ["", f"top --once --json, {args.runs} runs on the key, {args.tops} calls:", ""]
            lines += [
                f"- {name}: median {statistics.median(values):.2f} s, slowest {max(values):.2f} s"
                for name, values in tops.items()
            ]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    machine = (
        f"{os.cpu_count()} cores, load {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
        f"Python {platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M', time.gmtime(wall))} UTC"
    )
    report["machine"] = machine
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(machine)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
