"""The commands that show what runs left behind: ``batchsum report`` (a run report), ``journal``
(what a journal holds), ``limits`` (the rate limits the budget remembers; ``--forget``) and
``store`` (the answer store: entries by service and age; removed, its retention and size cap set)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from ..service import contract
from ..service.errors import InputError, redact_location
from ..service.location import Location
from ..service.settings import ENV_API_KEY
from .console import EXIT_OK, EXIT_USAGE, Stop

__all__ = ["journal_command", "limits_command", "report_command", "store_command", "AGES"]

AGES = ((86400, "< 1 day"), (7 * 86400, "< 7 days"), (30 * 86400, "< 30 days"), (None, "older"))


def report_command(args: argparse.Namespace) -> int:
    import json

    from ..run.report import describe_report

    try:
        with open(args.path, encoding="utf-8") as file:
            report = json.load(file)
        print(describe_report(report))
    except OSError as exc:
        raise InputError(f"cannot read the run report {args.path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{args.path} is not a batchsum run report ({type(exc).__name__}: {exc})") from None
    return EXIT_OK


def limits_command(args: argparse.Namespace) -> int:
    """``batchsum limits``: what the budget remembers of keys' limits; ``--forget`` removes them."""
    import datetime

    from ..pacing.auto.key_record import LIMIT, QUOTA, QUOTA_SPENT
    from ..pacing.auto.limit import Found
    from ..pacing.budgets.budget import ProcessBudget, open_budget
    from ..service.settings import budget_spec, check_base_url, key_hash_from_environment

    budget = open_budget(budget_spec(args.budget), "")
    if isinstance(budget, ProcessBudget):
        print("the budget 'none' remembers nothing: there are no limits to list")
        return EXIT_OK
    mine = key_hash_from_environment()
    marked = _marked_keys(args)  # the keys of --keys FILE (or $BATCHSUM_API_KEYS), by hash: where each came from
    if args.this_key and mine is None:
        raise Stop(
            EXIT_USAGE,
            f"error: --this-key needs ${ENV_API_KEY}; for several keys, --keys FILE (or $BATCHSUM_API_KEYS) marks each",
        )
    service = contract.service_identity(check_base_url(args.service)) if args.service else None

    async def look() -> tuple[list[Any], int]:
        """The entries chosen, and how many of them were forgotten (with --forget): one connection."""
        try:
            chosen = [
                e
                for e in await budget.remembered()
                if e.name in (LIMIT, QUOTA, QUOTA_SPENT)
                and (service is None or e.service == service)
                and (not args.this_key or e.key_hash == mine)
            ]
            gone = 0
            # With its limits and quotas go the key's proof, and its budget's pace, counts and search.
            for key_hash, at in {(e.key_hash, e.service) for e in chosen} if args.forget else ():
                await budget.forget(key_hash, at)
                gone += sum(1 for e in chosen if (e.key_hash, e.service) == (key_hash, at))
            return chosen, gone
        finally:
            await budget.aclose()

    found, gone = asyncio.run(look())
    for entry in found:
        when = datetime.datetime.fromtimestamp(entry.at).astimezone().strftime("%Y-%m-%d %H:%M %Z")
        this = " (this key)" if entry.key_hash == mine else ""
        this += f" ({marked[entry.key_hash]})" if entry.key_hash in marked else ""
        if entry.name == LIMIT:
            limit = Found.from_json(entry.value, entry.at)
            shown = f"{limit.rpm:g}/min, {limit.describe()}" if limit is not None else "unreadable"
        else:
            shown = _quota_shown(entry.name, entry.value, when)
        print(f"{entry.service}  {shown}  key {entry.key_hash}{this}")
    if not found:
        print(f"no limits remembered in {budget.where}" + (" for that choice" if service or args.this_key else ""))
    elif args.forget:
        print(f"forgot {gone} remembered limits and quotas; --rpm auto searches again for those keys")
    return EXIT_OK


def _marked_keys(args: argparse.Namespace) -> dict[str, str]:
    """The hashes of the keys ``--keys FILE`` names (else ``$BATCHSUM_API_KEYS``), each with its source."""
    from ..service.key_plans import ENV_API_KEYS, resolve_keys
    from ..service.settings import environment

    if getattr(args, "keys", None) is None and not environment().get(ENV_API_KEYS, "").strip():
        return {}
    plans = resolve_keys(None, args.keys) if args.keys is not None else resolve_keys(None, None)
    return {plan.hash: plan.source for plan in plans}


def _quota_shown(name: str, value: str, when: str) -> str:
    """A remembered quota as ``batchsum limits`` lists it."""
    import json

    from ..pacing.auto.key_record import QUOTA_SPENT
    from ..pacing.budgets.quota import Spent, utc, window_name

    if name == QUOTA_SPENT:
        spent = Spent.from_json(value)
        return f"quota spent: {spent.describe()} (seen {when})" if spent is not None else "unreadable"
    try:
        data = json.loads(value)
        quota = f"{window_name(data.get('window'))} quota" + (f" of {data['limit']}" if data.get("limit") else "")
        left = f", about {data['remaining']} left" if data.get("remaining") is not None else ""
        until = f" until {utc(data['reset_at'])}" if data.get("reset_at") else ""
    except (ValueError, TypeError, KeyError, AttributeError):
        return "unreadable"
    return f"{quota}, stated by the service {when}{left}{until}"


def journal_command(args: argparse.Namespace) -> int:
    import datetime

    from ..data.journal import Journal

    path = Path(args.path)
    with Journal(path, readonly=True) as journal:
        counts = journal.counts()
        meta = journal.meta()
        last = journal.last_write()
    size = path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(path.name + "-*") if p.is_file())
    when = datetime.datetime.fromtimestamp(last).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z") if last else "never"
    by_status = ", ".join(f"{status} {n}" for status, n in sorted(counts.items())) or "none"
    print(f"journal:    {path}")
    print(f"answers:    {sum(counts.values())} ({by_status})")
    print(f"size:       {size / 1024:.1f} KiB")
    print(f"last write: {when}")
    print(f"output:     {redact_location(meta.get('output', 'not recorded'))}")
    print(
        "safe to delete once its output is complete and you will not rerun the command: it only spares "
        "paying again for answers already received"
    )
    return EXIT_OK


def _open_upkeep(where: Location) -> Any:
    """The upkeep of the store ``where`` names, or None when it is a machine's not made yet."""
    from ..data.scopes import store_path

    if where.redis:
        from ..data.redis_store import RedisUpkeep

        return RedisUpkeep(where)
    from ..data.store_upkeep import MachineUpkeep

    path = store_path(where)
    return MachineUpkeep(path) if path.exists() else None


def _mib(size: int | None) -> str:
    if size is None:
        return "Redis' own"
    return f"{size / 1024:.0f} KiB" if size < 1 << 20 else f"{size / (1 << 20):.1f} MiB"


def store_command(args: argparse.Namespace) -> int:
    """``batchsum store``: the answer store's size and entries by service and age; ``--remove`` with
    ``--older-than``, ``--service`` or ``--all``; ``--retention`` and ``--max-size`` set."""
    import time

    from ..data.stores import StoreError
    from ..service.settings import budget_spec, check_base_url, store_spec

    where = store_spec(args.store, budget_spec(None))
    if where.none:
        print("the store 'none' keeps nothing: answers stay in each output's journal")
        return EXIT_OK
    choice = args.older_than is not None or args.service is not None or args.all
    if args.remove and not choice:
        raise Stop(EXIT_USAGE, "error: --remove needs --older-than AGE, --service URL or --all")
    if choice and not args.remove:
        raise Stop(EXIT_USAGE, "error: --older-than, --service and --all choose what --remove removes: add --remove")
    if args.all and (args.older_than is not None or args.service is not None):
        raise Stop(
            EXIT_USAGE, "error: --all removes every answer: give it alone, or --older-than and --service without it"
        )
    service = args.service
    if service is not None and service != contract.LOCAL_SERVICE:
        service = contract.service_identity(check_base_url(service))
    try:
        upkeep = _open_upkeep(where)
        if upkeep is None:
            print(f"no answer store yet at {where}: the first run makes it")
            return EXIT_OK
        try:
            if args.retention is not None or args.max_size is not None:
                upkeep.configure(retention_days=args.retention, max_bytes=args.max_size)
            if args.remove:
                before = time.time() - args.older_than * 86400 if args.older_than is not None else None
                gone = upkeep.remove(before=before, service=service)
                print(f"removed {gone} answers from {upkeep.where}; a run asks the service again for those")
            settings, entries = upkeep.settings(), upkeep.inventory()
        finally:
            upkeep.close()
    except StoreError as exc:  # nothing is sent: the store is out of reach or refuses, said in one line
        raise Stop(EXIT_USAGE, f"error: {exc}") from None
    cap = "" if settings["max_bytes"] is None else f" (cap {_mib(settings['max_bytes'])})"
    print(f"store:      {upkeep.where}")
    print(f"size:       {_mib(settings['bytes'])}{cap}; answers kept {settings['retention_days']} days")
    print(f"answers:    {len(entries)}")
    print(_inventory(entries, time.time()))
    return EXIT_OK


def _inventory(entries: list[tuple[str, float]], now: float) -> str:
    """Answers by service and age, a line per service."""
    by: dict[str, list[int]] = {}
    for service, written in entries:
        counts = by.setdefault(service, [0] * len(AGES))
        age = now - written
        counts[next(i for i, (limit, _) in enumerate(AGES) if limit is None or age < limit)] += 1
    width = max([len("service"), *map(len, by)])
    lines = [f"{'service':<{width}}  {'answers':>8}" + "".join(f"  {name:>9}" for _, name in AGES)]
    for service, counts in sorted(by.items()):
        lines.append(f"{service:<{width}}  {sum(counts):>8}" + "".join(f"  {n:>9}" for n in counts))
    return "\n".join(lines)
