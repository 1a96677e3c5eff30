"""LiteLLM's Router over a team's keys, for ``benchmarks/keys.py``: run with a Python that has litellm
installed (it is no dependency of batchsum), against an OpenAI-style shim of the local service that
``keys.py`` starts (each key's Authorization passed through, so each key keeps its own limit).

    python benchmarks/litellm_router.py --url http://127.0.0.1:PORT/v1 --keys K1=120,K2=180,K3=300 --texts 600

Prints one JSON line: seconds, requests sent, how many came back ok, router errors ("no deployment
available", retried after a pause as a user's loop would), failures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of the price list: no network here


def texts(n: int) -> list[str]:
    return [f"Team benchmark text {i} has enough words in it to be worth a summary of its own." for i in range(n)]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--keys", required=True, help="KEY=RPM,KEY=RPM,...")
    parser.add_argument("--texts", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--strategy", default="usage-based-routing-v2")
    args = parser.parse_args()
    import litellm
    from litellm import Router

    litellm.suppress_debug_info = True
    deployments = []
    for pair in args.keys.split(","):
        key, rpm = pair.split("=")
        deployments.append(
            {
                "model_name": "summarize",
                "litellm_params": {"model": "openai/summarize", "api_base": args.url, "api_key": key, "rpm": int(rpm)},
                "rpm": int(rpm),
            }
        )
    router = Router(model_list=deployments, routing_strategy=args.strategy, num_retries=3, retry_after=1)
    slots = asyncio.Semaphore(args.concurrency)
    counts = {"ok": 0, "no_deployment": 0, "failed": 0}

    async def one(text: str) -> None:
        async with slots:
            for _ in range(600):  # a user's loop: when no deployment is free, wait a moment and ask again
                try:
                    await router.acompletion(model="summarize", messages=[{"role": "user", "content": text}])
                    counts["ok"] += 1
                    return
                except Exception as exc:  # noqa: BLE001 - the router's own errors vary by version
                    if "No deployments available" in str(exc) or "RouterRateLimitError" in type(exc).__name__:
                        counts["no_deployment"] += 1
                        await asyncio.sleep(1.0)
                        continue
                    counts["failed"] += 1
                    return

    started = time.monotonic()
    await asyncio.gather(*(one(text) for text in texts(args.texts)))
    print(json.dumps({"seconds": round(time.monotonic() - started, 2), **counts}))


if __name__ == "__main__":
    asyncio.run(main())
