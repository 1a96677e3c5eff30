"""batchsum.ray against Ray Data's own HTTP request stage, side by side in one run. Run by hand:

    python -m benchmarks.ray_data                  # 600 texts a cell, 4 workers (~10 min)
    python -m benchmarks.ray_data --texts 300      # shorter

One local Ray (``--cpus``, default 4) and, per cell, a local service of its own, strict at exactly the
plan (``--rpm``, default 600, a sliding minute), answering in 0.3-0.7 s. Clients, each with 4 workers:

- ``batchsum.ray``: ``summarize(ds, "text", rpm=600, workers=4)``, the machine budget (its default).
- ``ray.data.llm qps=10``: ``build_processor(HttpRequestProcessorConfig(qps=10, concurrency=4,
  max_retries=5))``, the plan's 10 a second given to each worker, as its per-worker ``qps`` invites.
- ``ray.data.llm qps=2``: the plan divided among the 4 workers (``qps`` is a whole number: 2, not 2.5).

Each client runs twice: undisturbed, and with one worker process SIGKILLed once 100 requests reached
the service (Ray restarts it and retries its batch). Figures: utilization (admitted a minute from the
first to the last admitted start, over the plan), 429s, rows not ok, texts paid twice, seconds.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import pandas as pd
import psutil
import ray
import ray.data

import batchsum.ray
from batchsum.local import Faults, LocalService
from benchmarks.rate import texts

WORKERS = 4


def _workers() -> list[int]:
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if "MapWorker" in " ".join(process.cmdline()):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


class _Killer:
    def __init__(self, service: LocalService, after: int | None) -> None:
        self.service, self.after, self.killed = service, after, False

    def poll(self) -> None:
        if self.killed or self.after is None or self.service.state.stats()["requests"] < self.after:
            return
        pids = _workers()
        if pids:
            os.kill(pids[0], 9)
            self.killed = True


def run_batchsum(service: LocalService, ds: ray.data.Dataset, rpm: float) -> list[dict[str, Any]]:
    out = batchsum.ray.summarize(
        ds,
        "text",
        rpm=rpm,
        api_key=service.key,
        base_url=service.url,
        progress=False,
        workers=WORKERS,
        batch_rows=50,
        journal=os.path.join(tempfile.mkdtemp(), "answers.sqlite"),
    )
    return [{"ok": row["summary_status"] == "ok"} for row in out.iter_rows()]


def run_ray_llm(service: LocalService, ds: ray.data.Dataset, qps: int) -> list[dict[str, Any]]:
    from ray.data.llm import HttpRequestProcessorConfig, build_processor

    config = HttpRequestProcessorConfig(
        url=f"{service.url}/api/user/summarize",
        headers={"Authorization": f"Bearer {service.key}"},
        qps=qps,
        concurrency=WORKERS,
        batch_size=50,
        max_retries=5,
    )
    processor = build_processor(
        config,
        preprocess=lambda row: {"payload": {"text": row["text"], "mode": 1, "percentage": 4}},
        postprocess=lambda row: {"ok": bool(row.get("http_response"))},
    )
    try:
        return [{"ok": row["ok"]} for row in processor(ds).iter_rows()]
    except Exception as exc:  # noqa: BLE001 - a row that ran out of retries fails the whole job
        print(f"    the job failed: {str(exc).splitlines()[0][:160]}")
        return []


def cell(client: str, rows: list[str], rpm: float, kill_after: int | None) -> dict[str, Any]:
    faults = Faults(latency=0.3, latency_spread=0.4, seed=11)
    with LocalService(rpm=int(rpm), faults=faults) as service:
        frame = pd.DataFrame({"text": rows})  # in 12 blocks, as a Parquet read gives
        ds = ray.data.from_pandas([frame.iloc[start : start + 50] for start in range(0, len(frame), 50)])
        killer = _Killer(service, kill_after)
        import threading

        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                killer.poll()
                time.sleep(0.01)

        threading.Thread(target=watch, daemon=True).start()
        started = time.monotonic()
        if client == "batchsum.ray":
            results = run_batchsum(service, ds, rpm)
        else:
            results = run_ray_llm(service, ds, int(client.rsplit("=", 1)[1]))
        seconds = time.monotonic() - started
        done.set()
        stats = service.stats()
        admitted = sorted(service.state.admitted)
    span = admitted[-1] - admitted[0] if len(admitted) > 1 else float("nan")
    return {
        "client": client,
        "killed": killer.killed,
        "utilization": (len(admitted) - 1) / span * 60 / rpm,
        "429s": stats["by_status"].get("429", 0),
        "not ok": len(rows) - sum(1 for row in results if row["ok"]),
        "paid twice": stats["answered_twice"],
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=600, help="texts per cell (distinct)")
    parser.add_argument("--rpm", type=float, default=600, help="the plan, and the service's strict limit")
    parser.add_argument("--cpus", type=int, default=4, help="CPUs for the local Ray")
    args = parser.parse_args()
    ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    rows = texts(args.texts)
    print(f"{args.texts} texts, {args.rpm:g}/min strict sliding window, 0.3-0.7 s answers, {WORKERS} workers")
    print(f"{'client':<22} {'kill':>5} {'util':>6} {'429s':>5} {'not ok':>7} {'twice':>6} {'seconds':>8}")
    for kill_after in (None, 100):
        for client in ("batchsum.ray", "ray.data.llm qps=10", "ray.data.llm qps=2"):
            row = cell(client, rows, args.rpm, kill_after)
            print(
                f"{row['client']:<22} {'yes' if row['killed'] else 'no':>5} {row['utilization']:>6.3f} "
                f"{row['429s']:>5} {row['not ok']:>7} {row['paid twice']:>6} {row['seconds']:>8.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
