"""Long texts: 100 documents over the service's limit, split and reduced, against a strict 600/min
plan on the local service; requests and wall time beside the ideal (requests / rpm). Run by hand:

    python benchmarks/long_texts.py --docs 100 --rpm 600

Each document is the example year of weekly notes (examples/support-year.txt, 11,201 words) with its
own first line, so no two share a part (a run over identical documents would send one document's
requests once). The dry run's counts are printed beside what the run sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import batchsum
from batchsum.engine import plan_batch, summarize_stream
from batchsum.local import LocalService
from batchsum.run.report import BatchStats

YEAR = (Path(__file__).resolve().parents[1] / "examples" / "support-year.txt").read_text(encoding="utf-8")


def documents(n: int) -> list[str]:
    paragraphs = YEAR.split("\n\n")
    # Every paragraph gets the document's number, so no part of one document is a part of another.
    return ["\n\n".join(f"{p} (Copy {i}.)" for p in paragraphs) for i in range(n)]


async def run(service: LocalService, docs: list[str], rpm: float) -> BatchStats:
    stats = BatchStats(total=len(docs))
    async with batchsum.AsyncClient(service.key, service.url, timeout=120) as client:
        async for _ in summarize_stream(docs, client, rpm=rpm, stats=stats, long_texts="split"):
            pass
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=100, help="documents (default 100)")
    parser.add_argument("--rpm", type=float, default=600, help="the plan and the service's limit (default 600)")
    args = parser.parse_args()
    docs = documents(args.docs)
    plan = plan_batch(docs, long_texts_policy="split")
    with LocalService(rpm=int(args.rpm)) as service:
        started = time.monotonic()
        stats = asyncio.run(run(service, docs, args.rpm))
        wall = time.monotonic() - started
        by_status = service.stats()["by_status"]
    requests = stats.sent
    ideal = requests / args.rpm * 60
    print(
        json.dumps(
            {
                "documents": args.docs,
                "ok": stats.ok,
                "requests": requests,
                "parts": stats.sent_by_kind["part"],
                "reduces": stats.sent_by_kind["reduce"],
                "dry_run_parts": plan.parts,
                "dry_run_reduce_max": plan.reduce_max,
                "429s": by_status.get("429", 0),
                "wall_s": round(wall, 1),
                "ideal_s": round(ideal, 1),
                "wall_over_ideal": round(wall / ideal, 3),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
