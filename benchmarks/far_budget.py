"""The pace with Redis a zone away (issue 47 item 4): processes on one key through a `redis://` budget
behind a proxy that adds a round trip to every call (``delay_proxy.py``), against the local service
strict at the plan in a sliding minute. Each cell: 429s, the most starts at the service in any 1/10/60
s against the plan's (ceil(rpm*w/60)), the time from the first arrival to the last against the ideal
((requests - 1) * 60 / rpm), the wall (start-up included), Redis calls and the workers' CPU per
request. By hand:

    python -m benchmarks.far_budget                                   # the full grid: 54 cells, about an hour
    python -m benchmarks.far_budget --processes 8 --delays 20 --rpm 3000 --store off --texts 375   # one cell
    python -m benchmarks.far_budget --simulate                        # past this machine, on the virtual clock

Grid: ``--processes`` (2 8 16) x ``--delays`` in ms (1 5 20) x ``--rpm`` (600 3000 6000) x ``--store``
(on: the answer store on the same Redis, through the proxy too; off: none). ``--seconds`` (60) sets
each cell's texts (rpm * seconds / 60 between the processes), or ``--texts`` per process. Every cell
has its own redis-server, proxy and service, so none sees another's state.

``--simulate``: the same budget logic (the real pacer and budget step on ``tests/virtual_clock.py``,
``tests/pacing/far_sim.py``) with 64 workers at 60,000 a minute and calls 20 ms away, and around it
(more workers, slower calls): the calls a second the budget takes, round trips per start, the spacing
at the service, the starts lost, the time against the ideal.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

WORKER = textwrap.dedent("""
    import asyncio, json, sys, time
    from batchsum.run import summarize_texts
    n, count, rpm, budget, store = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
    texts = [f"Process {n} text {i}: " + " ".join(["river council budget school market station"] * 4) + "."
             for i in range(count)]
    rows = asyncio.run(summarize_texts(texts, rpm=rpm, budget=budget, store=store, progress=False, max_retries=50))
    print(json.dumps({"cpu": time.process_time(), "ok": sum(r.status == "ok" for r in rows)}))
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def busiest(times: list[float], window: float) -> int:
    """The most of ``times`` in any half-open window of ``window`` seconds."""
    times = sorted(times)
    return max((bisect.bisect_left(times, t + window) - i for i, t in enumerate(times)), default=0)


class Redis:
    """A redis-server of the benchmark's own, and a delaying proxy in front of it."""

    def __init__(self, folder: str, delay: float) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("needs redis-server: apt-get install redis-server")
        self.port = free_port()
        argv = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.server = subprocess.Popen([*argv, "--dir", folder], stdout=subprocess.DEVNULL)
        import redis

        self.client = redis.Redis(port=self.port)
        for _ in range(400):
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        proxy = [sys.executable, str(ROOT / "benchmarks" / "delay_proxy.py"), "--to", f"127.0.0.1:{self.port}"]
        self.proxy = subprocess.Popen([*proxy, "--delay", str(delay)], stdout=subprocess.PIPE, text=True)
        assert self.proxy.stdout is not None
        self.url = f"redis://127.0.0.1:{int(self.proxy.stdout.readline())}/0"

    def operations(self) -> int:
        """Commands Redis ran, those inside its scripts included (its load)."""
        stats = self.client.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")

    def cpu(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def close(self) -> int:
        """Stop both; the commands the clients sent through the proxy (their calls: round trips)."""
        self.proxy.terminate()
        told = self.proxy.communicate()[0].split()
        self.server.terminate()
        self.server.wait()
        return int(told[-1]) if told else 0


def cell(
    processes: int, delay_ms: float, rpm: float, store: bool, texts: int, per_second_too: bool = False
) -> dict[str, Any]:
    """One cell of the grid, measured (``per_second_too``: each second's arrivals on stderr)."""
    from batchsum.local import LocalService

    with tempfile.TemporaryDirectory() as folder:
        redis = Redis(folder, delay_ms / 1000)
        key = "bs-far-budget-0123456789"
        service = LocalService([key], rpm=int(rpm)).start()
        env = {**os.environ, "BATCHSUM_API_KEY": key, "BATCHSUM_BASE_URL": service.url, "XDG_CACHE_HOME": folder}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        operations_before, cpu_before = redis.operations(), redis.cpu()
        started = time.monotonic()
        argv = [sys.executable, "-c", WORKER]
        workers = [
            subprocess.Popen(
                [*argv, str(n), str(texts), str(rpm), redis.url, redis.url if store else "none"],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for n in range(processes)
        ]
        told = [json.loads(w.communicate()[0].strip().splitlines()[-1]) for w in workers]
        wall = time.monotonic() - started
        operations, redis_cpu = redis.operations() - operations_before, redis.cpu() - cpu_before
        arrivals = sorted(service.state.admitted)
        stats = service.state.stats()
        if per_second_too:  # each second's arrivals, to see where a cell's time went
            first = arrivals[0] if arrivals else 0.0
            per_second = [0] * (int(arrivals[-1] - first) + 1 if arrivals else 0)
            for at in arrivals:
                per_second[int(at - first)] += 1
            print(per_second, file=sys.stderr)
        service.stop()
        calls = redis.close()
    total = processes * texts
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    ideal = (total - 1) * 60 / rpm
    return {
        "processes": processes,
        "delay_ms": delay_ms,
        "rpm": rpm,
        "store": "on" if store else "off",
        "requests": total,
        "ok": sum(t["ok"] for t in told),
        "429s": int(stats["by_status"].get("429", 0)),
        "paid_twice": int(stats["answered_twice"]),
        "most": [busiest(arrivals, w) for w in (1, 10, 60)],
        "allowed": [math.ceil(rpm * w / 60) for w in (1, 10, 60)],
        "span": round(span, 1),
        "ideal": round(ideal, 1),
        "ratio": round(span / ideal, 3) if ideal else None,
        "wall": round(wall, 1),
        "redis_calls_per_request": round(calls / total, 2),
        "redis_operations_per_request": round(operations / total, 1),
        "cpu_ms_per_request": round(sum(t["cpu"] for t in told) / total * 1000, 2),
        "redis_cpu_ms_per_request": round(redis_cpu / total * 1000, 3),
    }


def grid(args: argparse.Namespace) -> None:
    print(
        "| processes | delay | rpm | store | 429s | most in 1/10/60 s (plan) | first to last | ideal | ratio | wall "
        "| Redis calls / request (operations) | CPU ms / request (workers; Redis) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for processes in args.processes:
        for delay in args.delays:
            for rpm in args.rpm:
                for store in args.store:
                    texts = args.texts or max(1, round(rpm * args.seconds / 60 / processes))
                    r = cell(processes, delay, rpm, store == "on", texts, args.per_second)
                    most = "/".join(map(str, r["most"])) + " (" + "/".join(map(str, r["allowed"])) + ")"
                    print(
                        f"| {processes} | {delay:g} ms | {rpm:g} | {r['store']} | {r['429s']} | {most} | {r['span']} s "
                        f"| {r['ideal']} s | {r['ratio']} | {r['wall']} s | {r['redis_calls_per_request']} "
                        f"({r['redis_operations_per_request']}) "
                        f"| {r['cpu_ms_per_request']}; {r['redis_cpu_ms_per_request']} |",
                        flush=True,
                    )
                    if args.json:
                        with open(args.json, "a") as out:
                            out.write(json.dumps(r) + "\n")


def step_cost(count: int = 2000) -> float:
    """Seconds of Redis CPU one reservation ahead takes (``STEP``, the key's last minute full of
    starts at 1000 a second), measured on a redis-server of its own."""
    import asyncio

    from batchsum.pacing.budgets.budget import RedisBudget, Report
    from batchsum.pacing.budgets.exchange import Member

    with tempfile.TemporaryDirectory() as folder:
        redis = Redis(folder, 0.0)

        async def measure() -> float:
            budget = RedisBudget(f"redis://127.0.0.1:{redis.port}/0", "cost")
            for second in range(60):  # the key's last minute: 1000 starts a second, told by age
                ages = tuple(60 - second - i / 1000 for i in range(0, 1000, 10))
                await budget.reserve(0.0, Report(started=ages), start=False)
            before = redis.cpu()
            run = Member("run", "host/1/abc")
            for _ in range(count):
                await budget.reserve(0.001, Report(started=(0.01,), answered=(0.3,), run=run), ahead=1, lead=0.01)
            await budget.aclose()
            return (redis.cpu() - before) / count

        try:
            return asyncio.run(measure())
        finally:
            redis.close()


def simulate(args: argparse.Namespace) -> None:
    """The budget logic on the virtual clock, past what this machine can run for real; each case's
    calls a second priced at the Redis CPU one call takes here (``step_cost``)."""
    sys.path.insert(0, str(ROOT))
    from tests.pacing import far_sim

    cost = step_cost()
    print(f"One reservation ahead: {cost * 1e6:.0f} µs of Redis CPU (the key's last minute full)\n")
    print(
        "| workers | rpm | round trip | wake-up lag | requests | budget calls / s | calls / start "
        "| Redis CPU (of one core) | most in 1 s (plan) | lost | ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    cases = [(64, 60_000, 0.02, 0.0), (64, 60_000, 0.05, 0.0), (64, 60_000, 0.1, 0.0), (256, 60_000, 0.02, 0.0)]
    cases += [(64, 120_000, 0.02, 0.0), (64, 60_000, 0.02, 0.0002), (64, 60_000, 0.02, 0.002)]
    cases += [(8, 3000, 0.02, 0.0), (8, 3000, 0.02, 0.005), (8, 3000, 0.02, 0.03), (16, 6000, 0.02, 0.0)]
    for workers, rpm, rtt, lag in cases:
        each = max(1, int(rpm * args.sim_seconds / 60 / workers))
        late = (lambda rng, lag=lag: rng.uniform(0.0, lag)) if lag else None
        outcome = far_sim.simulate(workers, each, rpm, rtt=rtt, jitter=rtt / 10, latency=0.3, lag=late)
        ideal = (workers * each - 1) * 60 / rpm
        span = outcome.span()
        per_second = outcome.calls / span
        print(
            f"| {workers} | {rpm:,} | {rtt * 1000:g} ms | {f'0-{lag * 1000:g} ms' if lag else 'none'} "
            f"| {workers * each} | {per_second:,.0f} | {outcome.calls / (workers * each):.2f} | {per_second * cost:.0%} "
            f"| {busiest(outcome.arrivals, 1)} ({math.ceil(rpm / 60)}) | {outcome.lost} | {span / ideal:.3f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 8, 16])
    parser.add_argument("--delays", type=float, nargs="+", default=[1, 5, 20], help="ms added to each round trip")
    parser.add_argument("--rpm", type=float, nargs="+", default=[600, 3000, 6000])
    parser.add_argument("--store", nargs="+", choices=["on", "off"], default=["on", "off"])
    parser.add_argument("--seconds", type=float, default=60.0, help="each cell's length at the plan")
    parser.add_argument("--texts", type=int, default=None, help="texts per process (instead of --seconds)")
    parser.add_argument("--json", help="append each cell's figures to this file, one JSON a line")
    parser.add_argument("--per-second", action="store_true", help="each cell's arrivals per second, on stderr")
    parser.add_argument("--simulate", action="store_true", help="the virtual-clock simulation instead of the grid")
    parser.add_argument("--sim-seconds", type=float, default=20.0, help="each simulated case's length at the plan")
    args = parser.parse_args()
    if args.simulate:
        simulate(args)
    else:
        grid(args)
    print(json.dumps({"date": time.strftime("%Y-%m-%d")}))


if __name__ == "__main__":
    main()
