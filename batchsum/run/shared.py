"""A spec that many workers can open at once (``prepare_shared``: Dask partitions, Spark tasks, Ray
actors), and who sends for a distributed door (``Workers``): one rule for every door's budget."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..data.journal import SharedJournal
from ..data.scopes import open_store
from ..data.stores import StoreError
from ..pacing.budgets.budget import Budget, ProcessBudget, SQLiteBudget, check_budget, open_budget
from ..service.errors import BudgetError, InvalidParameterError
from ..service.location import BUDGET, NO_STORE, Location
from .binding import bind
from .logs import log
from .spec import RunSpec

__all__ = ["Workers", "prepare_shared"]


def _identity(spec: RunSpec) -> str:
    """The key's identity at its service (a hash), as ``AsyncClient.identity`` computes it."""
    from ..service.client import Client

    with Client(**spec.client.client_kwargs()) as client:
        return client.identity


@dataclasses.dataclass(frozen=True)
class Workers:
    """Who sends for a distributed door: how many processes, on how many hosts, and ``described``
    in the door's own words ("this Dask cluster runs partitions in 2 worker processes")."""

    processes: int
    hosts: int
    described: str


def _refuse_unshared(budget: Budget, spec: str, workers: Workers) -> None:
    """One rule for every distributed door: a budget the workers cannot share is refused, with what
    to pass instead (a process budget when more than one process sends, a machine budget when they
    are on more than one host)."""
    if isinstance(budget, ProcessBudget) and (workers.processes > 1 or workers.hosts > 1):
        raise BudgetError(
            f"budget {spec!r} paces each process alone, and {workers.described}: together they would send that many "
            "times your plan's rate. Pass budget='machine' (workers on this machine) or budget='redis://HOST:PORT/DB' "
            "(workers on several machines)"
        )
    if isinstance(budget, SQLiteBudget) and workers.hosts > 1:
        raise BudgetError(
            f"budget {spec!r} is shared only by the processes of one machine, and the workers are on "
            f"{workers.hosts} hosts: pass budget='redis://HOST:PORT/DB'"
        )


def prepare_shared(spec: RunSpec, workers: Callable[[], Workers | None] | None = None) -> RunSpec:
    """A spec that many workers can open at once (Dask partitions, Spark tasks, Ray actors), checked
    here, once, before anything is sent: the local service started, the budget reachable and one the
    ``workers`` can share (asked after the budget answered; None: this process alone), the machine
    budget and the machine's answer store named by their files (the same on every worker, whatever
    their cache folder), the store opened once (made, and the old stores taken in), the shared
    journal created, and the job named (one ``run_id`` and one ``started`` for all its workers)."""
    from .background import run_in_worker

    spec = bind(spec)
    identity = _identity(spec)
    budget = open_budget(spec.budget, identity)
    run_in_worker(lambda: check_budget(budget))
    who = workers() if workers is not None else None
    if who is not None:
        _refuse_unshared(budget, spec.budget.shown if isinstance(spec.budget, Location) else repr(budget), who)
    changes: dict[str, Any] = {"run_id": spec.run_id or uuid.uuid4().hex[:16]}  # one share for all the workers
    changes["started"] = spec.started or time.time()  # under refresh, what the job's partitions bought is theirs
    if isinstance(budget, SQLiteBudget):
        changes["budget"] = Location.at(budget.path, BUDGET)
    changes["store"] = _shared_store(spec, identity, who)
    if spec.journal is not None:
        SharedJournal(spec.journal).close()  # created here, once, before the workers open it
    return spec.replace(**changes)


def _shared_store(spec: RunSpec, identity: str, workers: Workers | None) -> Location:
    """The store every worker opens: the machine's by its file; opened here once. One that cannot be
    opened is said in one line and the workers go on without it; ``none`` is refused when the
    workers are several processes (each would keep its own answers, and pay for another's texts),
    and a store on one machine's disk (``machine``, ``sqlite:///PATH``) when they are on several
    hosts (each host's workers would claim in a file of their own, and pay for another's texts)."""
    several = workers is not None and (workers.processes > 1 or workers.hosts > 1)
    if workers is not None and workers.hosts > 1 and spec.store.on_disk:
        raise InvalidParameterError(
            f"invalid store {spec.store.shown!r} here: the workers are on {workers.hosts} hosts, and a store on one "
            "machine's disk is not shared between them (their claims cannot see each other, so they would pay "
            "twice for a text); pass store='redis://HOST:PORT/DB' (the default with a redis:// budget)"
        )
    if spec.store.none:
        if several and spec.journal is None:
            assert workers is not None
            raise InvalidParameterError(
                f"invalid store 'none' here: {workers.described}, and without a store each would keep its own "
                "answers, paying again for a text another worker was answered; leave the default (the machine's "
                "or the cluster's store), or pass store='sqlite:///PATH' for a store of this job's own"
            )
        return spec.store
    where = spec.store.pinned()
    try:
        open_store(where, spec.client.service, identity).close()
    except StoreError as exc:
        log.warning("batchsum: %s; the workers go on without it", exc, extra={"event": "store"})
        return NO_STORE
    return where
