"""A distributed job's stop, from its driver (Dask, Spark, Ray): none of those engines can interrupt a
running task, so the driver posts the stop on each of its keys' budgets (``post``), and every worker's
run hears it on its next budget call and stops (``JobStopped``: nothing new starts, the answers on
the wire are awaited and kept). A door posts it when the driver's own wait on the job ends without
its result (Ray's execution failed: its consumer interrupted; Spark's job cancelled), never for a
job nobody was waiting on: this module keeps no list of jobs.

Each stop's cause is its own (when, and a token): a worker's run takes a stop already posted when it
first called the budget for an earlier computation of the same lazy plan (same run id), and leaves it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable

from ..pacing.budgets.budget import Budget, open_budget
from ..service.errors import one_line
from ..service.location import Location
from .background import run_in_worker
from .logs import log
from .spec import RunSpec

__all__ = ["post", "post_specs", "cause", "INTERRUPTED"]

INTERRUPTED = "the driver was interrupted (SIGINT)"  # the cause of a stop posted for Ctrl-C in the driver's wait


def cause(why: str) -> str:
    """A stop's cause: ``why``, when (UTC) and a token, so that no two stops read the same."""
    return f"{why} at {time.strftime('%H:%M:%S', time.gmtime())} UTC [{os.urandom(2).hex()}]"


def _identities(spec: RunSpec) -> list[str]:
    """The identity (a hash of base URL and key) of each of the job's keys: the budgets it paces on."""
    from ..service.client import Client

    keys: list[str | None] = [plan.key.reveal() for plan in spec.keys] or [None]
    identities = []
    for key in keys:
        kwargs = spec.client.client_kwargs()
        if key is not None:
            kwargs["api_key"] = key
        with Client(**kwargs) as client:
            identities.append(client.identity)
    return identities


def post(spec: RunSpec, why: str) -> None:
    """Post the stop of the job ``spec`` names on each of its keys' budgets, with the cause ``why``
    (``cause()``); a budget out of reach is said in one line (its workers' runs go on)."""
    post_specs([spec], why)


async def _running(budget: Budget, run_id: str) -> bool:
    return any(entry.run_id == run_id for entry in await budget.runs())


async def _post_one(spec: RunSpec, why: str, running_only: bool) -> None:
    run_id = spec.run_id
    assert run_id is not None, "prepare_shared names the job"
    try:
        for identity in _identities(spec):
            budget = open_budget(spec.budget, identity)
            try:
                if not running_only or await _running(budget, run_id):
                    await budget.post_stop(run_id, why)
            finally:
                await budget.aclose()
    except Exception as exc:  # noqa: BLE001 - a budget out of reach (BudgetError) or anything else: said, the others go on
        where = spec.budget.shown if isinstance(spec.budget, Location) else repr(spec.budget)
        log.warning(
            "batchsum: could not post the stop of job %s on %s: %s",
            run_id,
            where,
            one_line(exc),
            extra={"event": "stop"},
        )


def post_specs(specs: Iterable[RunSpec], why: str, *, running_only: bool = False) -> None:
    """Post the stop of each job ``specs`` name, all at once (a budget out of reach costs its tries
    once, not once a job); one that cannot be posted is said in one line and keeps none of the others
    from theirs. ``running_only``: only on a key where a run of the job is on the budget's registry now
    (a job that finished is left be)."""

    async def every() -> None:
        await asyncio.gather(*(_post_one(spec, why, running_only) for spec in specs))

    run_in_worker(every)
