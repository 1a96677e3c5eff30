"""What a run would do, sending nothing and creating no file (``dry_run``): rows to send, skip and
reuse (the store's answers as the run's keys would be served them: ``data.scopes.Trust``), the time
it takes at what each key can do now (``look_at_key``: a key whose quota is spent adds nothing until
its reset; the run's share of it) with the waits for quotas the run would wait for and the stop where
it would stop (``pacing.look.forecast.project``, by the rule the run keeps), the paid requests needed, the
limit under auto and the budget it joins."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from ..data.journal import Journal
from ..data.results import Answer
from ..data.scopes import Scopes, Trust, look_at_store
from ..data.stores import StoreError
from ..engine.plan import BatchPlan, plan_batch
from ..pacing import KeyRecord
from ..pacing.budgets.budget import Budget, Slot, open_budget
from ..pacing.budgets.quota import utc, window_name
from ..pacing.look.forecast import KeyNow, Projection, QuotaLeft, key_now, project
from ..service.client import AsyncClient
from ..service.errors import BudgetError, ConfigurationError
from ..service.key_plans import KeyPlan
from ..service.settings import AUTO_MAX_RPM, describe_rate
from .answer_scopes import store_scope
from .binding import spec_key_hash
from .spec import RunSpec

__all__ = [
    "dry_run",
    "estimate",
    "forecast",
    "read_keys",
    "look_at_key",
    "sends",
    "summed_rate",
    "KeyLook",
    "KeysRead",
    "Forecast",
]


@dataclass(frozen=True)
class KeyLook:
    """What a dry run reads of one key on its budget, writing nothing: its hash, its record at the
    service, the budget's state (``seen``: starts in the last minute by other runs) and where it is,
    what the key can do now (``now``), and what its quotas leave in words (``words``)."""

    key: str
    record: KeyRecord
    seen: Slot
    where: str
    now: KeyNow
    words: str


async def look_at_key(
    spec: RunSpec, plan: KeyPlan | None, budget: Budget, wall: Callable[[], float] = time.time
) -> KeyLook:
    """What ``spec``'s run could do on one key (``plan``; None: the spec's one key), read from its
    ``budget``: its rate (configured, or under auto the limit its record remembers), each quota and
    what it leaves until its reset (configured: the budget's count; stated: what the record last
    heard), a quota its record knows spent; as ``pacing.look.forecast.key_now`` says it."""
    now = wall()
    seen = await budget.look()
    key = plan.hash if plan is not None else spec_key_hash(spec)
    service = spec.client.service
    record = KeyRecord(budget, key, service, await budget.recall(key, service), clock=wall)
    rpm, auto = plan.limit(spec.rpm, spec.auto) if plan is not None else (spec.rpm, spec.auto)
    found = record.limit() if auto else None
    rate = (min(found.rpm, rpm) if found is not None else None) if auto else rpm
    quotas, words = [], []
    spent = record.quota_spent()
    if spent is not None:
        words.append(f"its {spent.describe()}: the run would not send on it before then")
    configured = plan.quota if plan is not None and plan.quota is not None else spec.quota
    if configured is not None:
        period, _, end = configured.window(now)
        left = max(0, configured.limit - await budget.quota_used(period))
        quotas.append(QuotaLeft(f"{configured.name} (configured)", left, end, configured.limit, configured.period))
        if spent is None:
            words.append(f"about {left} left in this key's {configured.name} until {utc(end)}")
    stated = record.quota()
    if stated is not None and stated.get("remaining") is not None:
        name = f"{window_name(stated.get('window'))} quota" + (f" of {stated['limit']}" if stated.get("limit") else "")
        left, reset = int(stated["remaining"]), float(stated["reset_at"])
        window = stated.get("window") if stated.get("limit") else None
        quotas.append(QuotaLeft(f"{name} (stated by the service)", left, reset, stated.get("limit"), window))
        if spent is None:
            words.append(f"about {left} left in this key's {name} until {utc(reset)} (stated)")
    out = (spent.until, spent.name) if spent is not None else None
    return KeyLook(
        key,
        record,
        seen,
        budget.where,
        key_now(key, rate, now, share=spec.share, quotas=quotas, out=out),
        "; ".join(words),
    )


async def _look_at_keys(spec: RunSpec) -> list[KeyLook]:
    """Each key of ``spec`` as a dry run reads it (``look_at_key``), its budget opened and closed."""
    looks = []
    for plan in spec.keys or (None,):
        kwargs = spec.client.client_kwargs()
        if plan is not None:
            kwargs["api_key"] = plan.key.reveal()
        async with AsyncClient(**kwargs) as client:
            budget = open_budget(spec.budget, client.identity)
            try:
                looks.append(await look_at_key(spec, plan, budget))
            finally:
                await budget.aclose()
    return looks


def _budget_lines(spec: RunSpec, looks: Sequence[KeyLook]) -> tuple[str, list[str]]:
    """Which budget a run would join, how many starts it had in the last minute (others' runs), and
    whether the run's first request would go alone. With several keys, a line for each (its hash,
    source, limit, first request, quota) besides."""
    if spec.client.local:
        return (
            "budget:           the local service's own fresh key: no other run uses it\n"
            "first request:    alone: the local service's own key is new"
        ), []
    lines = []
    for plan, look in zip(spec.keys or (None,), looks):
        rpm, auto = plan.limit(spec.rpm, spec.auto) if plan is not None else (spec.rpm, spec.auto)
        limit = describe_rate(rpm, auto)
        shown = f"{limit:g}/min" if isinstance(limit, float) else limit
        source = f" ({plan.source})" if plan is not None else ""
        lines.append(
            f"key {look.key}{source}: {shown}; first request {look.record.describe(spec.params.mode)}; "
            f"{look.seen.starts} started on its budget in the last minute by other runs"
            + (f"; {look.words}" if look.words else "")
        )
    first = looks[0]
    if len(lines) > 1:
        return (
            f"budget:           {first.where}, one for each key\n"
            f"first request:    each key's first request goes alone, every key's at once (a wrong key costs one "
            "request per key), unless the key is proven"
        ), lines
    seen = first.seen
    pause = f"; paused {seen.paused_for:.0f} s more: {seen.pause_reason}" if seen.paused_for > 0 else ""
    return (
        f"budget:           {first.where}; {seen.starts} requests started on it in the last minute "
        f"by other runs with this key{pause}\n"
        f"first request:    {first.record.describe(spec.params.mode)}"
    ), lines


def _unread_keys(spec: RunSpec, now: float) -> list[KeyNow]:
    """The keys as the spec alone says them, when their budgets cannot be read: each at its
    configured rate (None under auto), its quotas not known."""
    plans: Sequence[KeyPlan | None] = spec.keys or (None,)
    keys = []
    for plan in plans:
        rpm, auto = plan.limit(spec.rpm, spec.auto) if plan is not None else (spec.rpm, spec.auto)
        keys.append(key_now(plan.hash if plan is not None else "key", None if auto else rpm, now, share=spec.share))
    return keys


def _quota_line(projection: Projection, max_wait: float) -> str:
    """The line a dry run adds when the keys' quotas decide the run: where it waits for a reset
    (within ``max_wait``), or where it stops (exit 1), as the run decides; "" when they do not."""
    requests, sent = projection.requests, projection.sent
    if projection.stops:
        assert projection.stop_at is not None
        sends = f"would send about {sent} and stop" if sent else "would send nothing and stop"
        line = f"\nquota:            short: the quotas leave about {sent} of the {requests} requests; a run {sends} (exit 1)"
        if projection.back is None:
            return line
        after = projection.back - projection.stop_at
        return (
            f"{line}: the first quota back, the {projection.why}, resets at {utc(projection.back)}, "
            f"{_duration(after)} after the run would stop, longer than max_wait ({max_wait:g} s); the same command "
            f"continues once a quota resets (or waits for it with a max_wait of {math.ceil(after)} s or more)"
        )
    if not projection.waits:
        return ""
    first = projection.waits[0]
    wait = f"waits for the {first.why} to reset at {utc(first.until)} ({_duration(first.until - first.start)}, within max_wait {max_wait:g} s)"
    if first.sent:
        line = f"the quotas leave about {first.sent} of the {requests} requests before a reset: a run sends those, {wait}, and goes on"
    else:
        line = f"every key's quota is spent now: a run {wait}, then sends"
    more = len(projection.waits) - 1
    if more:
        line += f" ({more} more wait{'s' if more != 1 else ''} for a reset after it, {_duration(projection.waited)} of waiting in all)"
    return f"\nquota:            {line}; the time above counts the waiting"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


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
    """The answer store as a dry run reads it (None: none to read), through the scopes' one lookup
    (``Scopes.stored``: what the run's keys may be served, ``trust``), and the line that says so: one
    that fails while it is read (Redis gone, a command the user may not run) is read no more, as a
    run leaves it, and its line says so."""

    def __init__(self, store: Any, line: str, trust: Trust | None = None) -> None:
        self.scopes = Scopes(None, store, trust=trust) if store is not None else None
        self._line = line
        self.failed: StoreError | None = None

    def get(self, key: str) -> Answer | None:
        if self.scopes is None or self.failed is not None:
            return None
        try:
            return self.scopes.stored([key]).get(key)
        except StoreError as exc:
            self.failed = exc
            return None

    def put(self, key: str, answer: Answer) -> None:
        raise StoreError("a dry run writes nothing")

    @property
    def line(self) -> str:
        if self.failed is None:
            return self._line
        return f"store:            not usable ({self.failed}); a run goes on with its journal alone"


def _stores(spec: RunSpec, stack: ExitStack, trust: Trust) -> tuple[Journal | None, _Looked]:
    """The journal (when it exists) and the answer store (when it can be read), opened to look only
    (nothing is created or written), with a line about the store; none with ``refresh``. ``trust``:
    which of the store's answers the run would be served (its keys in its mode)."""
    if spec.refresh:
        return None, _Looked(
            None, "store:            not looked at: --refresh asks the service again for every request"
        )
    journal = None
    if spec.journal is not None and os.path.exists(spec.journal):
        journal = stack.enter_context(Journal(spec.journal, readonly=True))
        journal.serve(spec.client.service)
    if spec.store.none:
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
    line = f"store:            {store.where}"
    if not trust.serves:
        line += (
            f"; its mode-{spec.params.mode} answers count as to send: no key of this run is proven in mode "
            f"{spec.params.mode} yet (its first request goes to the service; once answered, the run takes the rest "
            "from the store)"
        )
    return journal, _Looked(store, line, trust)


def summed_rate(spec: RunSpec) -> float | None:
    """The rate a run's requests go at by its options alone, requests a minute: its keys' limits
    summed (each key's line of a key file, else ``rpm``); None where one is searched for (``auto``).
    What the keys can do now (a quota spent) is ``forecast``'s."""
    if not spec.keys:
        return None if spec.auto else spec.rpm
    rates = [plan.limit(spec.rpm, spec.auto) for plan in spec.keys]
    return None if any(auto for _, auto in rates) else sum(rpm for rpm, _ in rates)


def estimate(spec: RunSpec, texts: Iterable[Any], keys: KeysRead) -> BatchPlan:
    """What a run of ``spec`` over ``texts`` would send, reuse and skip (``BatchPlan``), sending
    nothing and creating no file; the store's answers as its ``keys`` (``read_keys``) would be served them."""
    return _planned(spec, texts, keys)[0]


def _planned(spec: RunSpec, texts: Iterable[Any], keys: KeysRead) -> tuple[BatchPlan, str]:
    """``estimate``, and the dry run's line about the store (as it stood once read)."""
    with ExitStack() as stack:
        journal, store = _stores(spec, stack, keys.trust(spec))
        plan = plan_batch(texts, params=spec.params, store=journal, shared=store, long_texts_policy=spec.long_texts)
        return plan, store.line


def sends(spec: RunSpec, batch: BatchPlan) -> int:
    """The requests a run of ``batch`` sends at most: every one it needs (long texts' reduce requests
    at their bound), within ``max_requests`` and ``sample``."""
    most = batch.to_send + batch.reduce_max
    return min(most, spec.max_requests if spec.max_requests is not None else most, spec.sample or most)


@dataclass(frozen=True)
class KeysRead:
    """``spec``'s keys as a dry run reads them (``read_keys``), once: each as ``look_at_key`` reads
    it (``looks``; empty: their budgets could not be read, or the local service's fresh key), and why
    a budget could not be read (``problem``, a line of the dry run)."""

    looks: list[KeyLook]
    problem: str = ""

    def trust(self, spec: RunSpec) -> Trust:
        """Which of the store's answers a run on these keys would be served at its start."""
        return Trust.of(spec.params.mode, [look.record for look in self.looks])


def read_keys(spec: RunSpec) -> KeysRead:
    """Each key of ``spec`` read once (``look_at_key``), writing nothing; none for the local service's."""
    if spec.client.local:
        return KeysRead([])
    try:
        return KeysRead(asyncio.run(_look_at_keys(spec)))
    except BudgetError as exc:
        return KeysRead([], f"budget:           not usable ({exc})")
    except ConfigurationError as exc:
        return KeysRead([], f"budget:           not known ({exc})")


@dataclass(frozen=True)
class Forecast:
    """What a run of ``spec`` does on its keys as they are now: ``projections`` one per plan given
    (``pacing.look.forecast.project``), from the keys read (``looks``; empty: their budgets could not be
    read, or the local service's key: each key at its configured rate), and why a budget could not
    be read (``problem``, a line of the dry run)."""

    projections: list[Projection]
    looks: list[KeyLook]
    problem: str = ""


def forecast(spec: RunSpec, batches: Sequence[BatchPlan], keys: KeysRead) -> Forecast:
    """What runs of ``spec`` over each of ``batches`` would do on its ``keys`` now (``read_keys``:
    each key's rate and share, a quota spent taking it out until the reset): each batch's requests
    projected as the run goes (waits for a reset within ``max_wait``, a stop beyond it)."""
    now = time.time()
    held = [look.now for look in keys.looks] or _unread_keys(spec, now)
    projections = [project(held, sends(spec, batch), now, spec.max_wait) for batch in batches]
    return Forecast(projections, keys.looks, keys.problem)


def dry_run(spec: RunSpec, texts: Iterable[Any]) -> str:
    """What a run of ``spec`` over ``texts`` would do, sending nothing and creating no file: rows to
    send, skip, reuse (from the journal, when it exists, and the answer store, as the run's keys
    would be served it), the time it takes at what each key can do now (its share; quota waits
    included), where a quota would stop it, and the budget it joins."""
    held = read_keys(spec)
    batch, store_line = _planned(spec, texts, held)
    seen = forecast(spec, [batch], held)
    projection, looks = seen.projections[0], seen.looks
    budget, keys = (seen.problem, []) if seen.problem else _budget_lines(spec, looks)
    limit = ""
    if spec.auto and summed_rate(spec) is None and len(spec.keys) <= 1:
        limit = _limit_line(spec, looks[0].record if looks else None)[0]
    plan = batch.describe(
        projection.rate,
        first=max(1, len(spec.keys)),
        seconds=projection.seconds,
        waited=projection.waited,
        stops_after=projection.sent if projection.stops else None,
    )
    most = batch.to_send + batch.reduce_max
    bound = " (at most; long texts' reduce requests are a bound)" if batch.reduce_max else ""
    needed = f"requests needed:  {most} paid requests for the whole job{bound} (more only for answers lost on the way)"
    if spec.max_requests is not None:
        runs = -(-most // spec.max_requests) if most else 0
        needed += f"; at max_requests {spec.max_requests}: {runs} run{'s' if runs != 1 else ''}"
    if spec.sample is not None:
        needed += f"; a sample sends at most {min(spec.sample, batch.rows)}"
    if len(keys) == 1 and looks[0].words:
        needed += "; " + looks[0].words
    plan = f"{plan}\n{needed}{_quota_line(projection, spec.max_wait)}"
    if limit:
        plan = f"{plan}\n{limit}"
    if len(keys) > 1:
        plan += (
            f"\nkeys:             {len(keys)}, the requests spread over them by free capacity (the time above is "
            "at the summed limits of the keys that can send, each key's lone first request going at once)\n"
            + "\n".join(keys)
        )
    return f"{plan}\n{store_line}\n{budget}"
