"""What a run would do, sending nothing and creating no file (``dry_run``): rows to send, skip and
reuse, the least time, the paid requests needed, the limit under auto and the budget it joins."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from ..data.journal import Journal
from ..data.results import Answer
from ..data.scopes import look_at_store
from ..data.stores import StoreError
from ..engine.plan import BatchPlan, plan_batch
from ..pacing import KeyRecord
from ..pacing.budget import Budget, open_budget
from ..pacing.quota import utc, window_name
from ..service.client import AsyncClient
from ..service.errors import BudgetError, ConfigurationError
from ..service.keys import KeyPlan
from ..service.settings import AUTO_MAX_RPM, describe_rate
from .binding import spec_key_hash
from .pieces import store_scope
from .spec import RunSpec

__all__ = ["dry_run", "estimate", "summed_rate"]


async def _budget_lines(spec: RunSpec) -> tuple[str, KeyRecord | None, list[str], list[_Left]]:
    """Which budget a run would join, how many starts it had in the last minute (others' runs), and
    whether the run's first request would go alone; and the key's record at its service. With several
    keys, a line for each (its hash, source, limit, first request, quota) besides."""
    if spec.client.local:
        return (
            (
                "budget:           the local service's own fresh key: no other run uses it\n"
                "first request:    alone: the local service's own key is new"
            ),
            None,
            [],
            [],
        )
    lines, lefts, first_record, first_seen = [], [], None, None
    for plan in spec.keys or (None,):
        kwargs = spec.client.client_kwargs()
        if plan is not None:
            kwargs["api_key"] = plan.key.reveal()
        async with AsyncClient(**kwargs) as client:
            budget = open_budget(spec.budget, client.identity)
            try:
                seen = await budget.look()
                key = plan.hash if plan is not None else spec_key_hash(spec)
                record = await KeyRecord.recall(budget, key, spec.client.service)
                quota = await _quota_left(spec, plan, budget, record)
            finally:
                await budget.aclose()
        if first_record is None:
            first_record, first_seen, where = record, seen, budget.where
        rpm, auto = plan.limit(spec.rpm, spec.auto) if plan is not None else (spec.rpm, spec.auto)
        limit = describe_rate(rpm, auto)
        shown = f"{limit:g}/min" if isinstance(limit, float) else limit
        source = f" ({plan.source})" if plan is not None else ""
        lefts.append(quota)
        lines.append(
            f"key {key}{source}: {shown}; first request {record.describe(spec.params.mode)}; "
            f"{seen.starts} started on its budget in the last minute by other runs"
            + (f"; {quota.words}" if quota.words else "")
        )
    assert first_record is not None and first_seen is not None
    pause = (
        f"; paused {first_seen.paused_for:.0f} s more: {first_seen.pause_reason}" if first_seen.paused_for > 0 else ""
    )
    if len(lines) > 1:
        return (
            (
                f"budget:           {where}, one for each key\n"
                f"first request:    each key's first request goes alone, every key's at once (a wrong key costs one "
                "request per key), unless the key is proven"
            ),
            first_record,
            lines,
            lefts,
        )
    return (
        (
            f"budget:           {where}; {first_seen.starts} requests started on it in the last minute "
            f"by other runs with this key{pause}\n"
            f"first request:    {first_record.describe(spec.params.mode)}"
        ),
        first_record,
        lines,
        lefts,
    )


@dataclass(frozen=True)
class _Left:
    """What a key's quota leaves, as a dry run reads it: its words for the key's line, and about how
    many requests (None: no quota known) until when (a Unix time)."""

    words: str = ""
    left: int | None = None
    until: float = 0.0


async def _quota_left(spec: RunSpec, plan: KeyPlan | None, budget: Budget, record: KeyRecord) -> _Left:
    """What is known of the key's quota: spent until when, about how many left until when, or none."""
    spent = record.quota_spent()
    if spent is not None:
        return _Left(f"its {spent.describe()}: the run would not send on it before then", 0, spent.until)
    quota = plan.quota if plan is not None and plan.quota is not None else spec.quota
    if quota is not None:
        period, _, end = quota.window(time.time())
        left = max(0, quota.limit - await budget.quota_used(period))
        return _Left(f"about {left} left in this key's {quota.name} until {utc(end)}", left, end)
    stated = record.quota()
    if stated is not None and stated.get("remaining") is not None:
        name = f"{window_name(stated.get('window'))} quota" + (f" of {stated['limit']}" if stated.get("limit") else "")
        words = f"about {stated['remaining']} left in this key's {name} until {utc(stated['reset_at'])} (stated)"
        return _Left(words, int(stated["remaining"]), float(stated["reset_at"]))
    return _Left()


def _short_of(lefts: list[_Left], most: int) -> str:
    """The line a dry run adds when what every key's quota leaves is less than the job needs: the run
    would send that much and stop (exit 1), to continue after a reset; "" when it is not short."""
    if not lefts or any(left.left is None for left in lefts):
        return ""
    room = sum(left.left or 0 for left in lefts)
    if room >= most:
        return ""
    reset = utc(min(left.until for left in lefts))
    sends = f"would send about {room} and stop" if room else "would send nothing and stop"
    return (
        f"\nquota:            short: the quotas leave about {room} of the {most} requests; a run {sends} (exit 1); "
        f"the same command continues once a quota resets (the first at {reset})"
    )


def _limit_line(spec: RunSpec, record: KeyRecord | None) -> tuple[str, float | None]:
    """Under ``rpm="auto"``: the limit a run would start from (remembered for the key, or unknown),
    and the rate to estimate with (None: unknown)."""
    found = record.limit() if record is not None else None
    if found is None:
        cap = "" if spec.rpm >= AUTO_MAX_RPM else f" (at most {spec.rpm:g}/min)"
        return (
            f"limit:            not known yet for this key at this service{cap}: the run searches for it "
            "(a few 429s the first time, none failing a row) and remembers it for a week"
        ), None
    rpm = min(found.rpm, spec.rpm)
    return f"limit:            {rpm:g}/min, remembered ({found.describe()}) for this key at this service", rpm


class _Looked:
    """The answer store as a dry run reads it (None: none to read), and the line that says so: one
    that fails while it is read (Redis gone, a command the user may not run) is read no more, as a
    run leaves it, and its line says so."""

    def __init__(self, store: Any, line: str) -> None:
        self.store = store
        self._line = line
        self.failed: StoreError | None = None

    def get(self, key: str) -> Answer | None:
        if self.store is None or self.failed is not None:
            return None
        try:
            found: Answer | None = self.store.get(key)
        except StoreError as exc:
            self.failed = exc
            return None
        return found

    def put(self, key: str, answer: Answer) -> None:
        raise StoreError("a dry run writes nothing")

    @property
    def line(self) -> str:
        if self.failed is None:
            return self._line
        return f"store:            not usable ({self.failed}); a run goes on with its journal alone"


def _stores(spec: RunSpec, stack: ExitStack) -> tuple[Journal | None, _Looked]:
    """The journal (when it exists) and the answer store (when it can be read), opened to look only
    (nothing is created or written), with a line about the store; none with ``refresh``."""
    if spec.refresh:
        return None, _Looked(
            None, "store:            not looked at: --refresh asks the service again for every request"
        )
    journal = None
    if spec.journal is not None and os.path.exists(spec.journal):
        journal = stack.enter_context(Journal(spec.journal, readonly=True))
        journal.serve(spec.client.service)
    if spec.store == "none":
        return journal, _Looked(None, "store:            none (the journal alone)")
    hashes = [plan.hash for plan in spec.keys] or [h for h in (spec.client.key_hash,) if h is not None]
    scope = store_scope(spec, hashes) if hashes else ("-" if spec.store_scope == "key" else "")  # "-": no key's
    try:
        store = look_at_store(spec.store, spec.client.service, scope)
    except StoreError as exc:
        return journal, _Looked(None, f"store:            not usable ({exc}); a run goes on with its journal alone")
    if store is None:
        return journal, _Looked(None, "store:            empty (not made yet)")
    stack.callback(store.close)
    return journal, _Looked(store, f"store:            {store.where}")


def summed_rate(spec: RunSpec) -> float | None:
    """The rate a run's requests go at, requests a minute: its keys' limits summed (each key's line
    of a key file, else ``rpm``); None where one is searched for (``auto``)."""
    if not spec.keys:
        return None if spec.auto else spec.rpm
    rates = [plan.limit(spec.rpm, spec.auto) for plan in spec.keys]
    return None if any(auto for _, auto in rates) else sum(rpm for rpm, _ in rates)


def estimate(spec: RunSpec, texts: Iterable[Any]) -> BatchPlan:
    """What a run of ``spec`` over ``texts`` would send, reuse and skip (``BatchPlan``), sending
    nothing and creating no file."""
    with ExitStack() as stack:
        journal, store = _stores(spec, stack)
        return plan_batch(texts, params=spec.params, store=journal, shared=store, long_texts_policy=spec.long_texts)


def dry_run(spec: RunSpec, texts: Iterable[Any]) -> str:
    """What a run of ``spec`` over ``texts`` would do, sending nothing and creating no file: rows to
    send, skip, reuse (from the journal, when it exists, and the answer store), the least time, and
    the budget it joins."""
    with ExitStack() as stack:
        journal, store = _stores(spec, stack)
        batch = plan_batch(texts, params=spec.params, store=journal, shared=store, long_texts_policy=spec.long_texts)
    record: KeyRecord | None = None
    keys: list[str] = []
    lefts: list[_Left] = []
    try:
        budget, record, keys, lefts = asyncio.run(_budget_lines(spec))
    except BudgetError as exc:
        budget = f"budget:           not usable ({exc})"
    except ConfigurationError as exc:
        budget = f"budget:           not known ({exc})"
    limit, rate = _limit_line(spec, record) if spec.auto else ("", spec.rpm)
    if spec.keys:  # each key at its line's rate: summed, unless one is searched for
        summed = summed_rate(spec)
        if summed is not None:
            limit, rate = "", summed
        elif len(spec.keys) > 1 or not spec.auto:
            rate = None
    plan = batch.describe(rate, first=max(1, len(spec.keys)))
    most = batch.to_send + batch.reduce_max
    bound = " (at most; long texts' reduce requests are a bound)" if batch.reduce_max else ""
    needed = f"requests needed:  {most} paid requests for the whole job{bound} (more only for retries)"
    if spec.max_requests is not None:
        runs = -(-most // spec.max_requests) if most else 0
        needed += f"; at max_requests {spec.max_requests}: {runs} run{'s' if runs != 1 else ''}"
    if spec.sample is not None:
        needed += f"; a sample sends at most {min(spec.sample, batch.rows)}"
    if len(keys) == 1 and lefts[0].words:
        needed += "; " + lefts[0].words
    sends = min(most, spec.max_requests if spec.max_requests is not None else most, spec.sample or most)
    plan = f"{plan}\n{needed}{_short_of(lefts, sends)}"
    if limit:
        plan = f"{plan}\n{limit}"
    if len(keys) > 1:
        plan += (
            f"\nkeys:             {len(keys)}, the requests spread over them by free capacity (the time above is "
            "at their summed limits, each key's lone first request going at once)\n" + "\n".join(keys)
        )
    return f"{plan}\n{store.line}\n{budget}"
