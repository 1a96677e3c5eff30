"""What a run hands to the next on the key's budget under ``--rpm auto``: the search in progress or
the limit known, as plain JSON (``AutoLimit.state``), and its taking on by another run, following it
or leading it on.

Invariant: nothing in the state is a secret or a key; a run takes on a state only as far as its own cap
allows, and a run taking the lead over tries a level again from the highest one proven; what another
run found or was told by its service is ``followed`` here, never this run's ``found`` or ``stated``
(``sources.Source.followed``).
"""

from __future__ import annotations

import json
import math
from typing import Any, Protocol

from .search import Search, search_data, search_from
from .sources import CAPPED, Source
from .strikes import Strikes

__all__ = ["published", "taken_on"]


class Held(Protocol):
    """What a run holds of the key's limit (``limit.AutoLimit``)."""

    cap: float
    value: float | None
    origin: Source
    heard: float | None
    standing: str
    since: float
    probe_level: float
    probe_refused: int
    strikes: Strikes
    search: Search | None


def _time(value: float) -> float | None:
    return None if math.isinf(value) else value


def published(auto: Held) -> str:
    """What a successor needs to take the search (or the limit) on, as JSON."""
    data: dict[str, Any] = {
        "cap": auto.cap,
        "value": auto.value,
        "source": auto.origin.data(),
        "standing": auto.standing,
        "since": _time(auto.since),
        "probe_level": auto.probe_level,
        "strikes": auto.strikes.times,
        "watermark": _time(auto.strikes.watermark),
        "probe_refused": auto.probe_refused,
        "search": None if auto.search is None else search_data(auto.search),
    }
    return json.dumps(data)


def taken_on(auto: Held, text: str | None, *, resume: bool = False) -> bool:
    """Take on the state another run published (a search in progress, or the limit it knows);
    whether it could be read. The cap stays ``auto``'s own. ``resume``: this run takes the lead over,
    and a level being tried is tried again from the highest one proven (the key may have been quiet
    since), its quiet (and its probes' ten minutes) beginning at its first look."""
    if not text:
        return False
    try:
        data = json.loads(text)
        value = None if data["value"] is None else float(data["value"])
        search = None if data["search"] is None else search_from(data["search"], auto.cap)
        standing, probe_level = str(data["standing"]), float(data["probe_level"])
        origin = Source.from_data(data["source"]).followed(heard=auto.heard, value=value)
        since = -math.inf if data["since"] is None else float(data["since"])
        watermark = -math.inf if data["watermark"] is None else float(data["watermark"])
        strikes = Strikes([float(t) for t in data["strikes"]], watermark)
    except (ValueError, TypeError, KeyError):
        return False
    if value is not None and value > auto.cap:  # this run's own cap holds it lower
        origin = Source(CAPPED, origin.how, origin.at, auto.cap)
    auto.standing, auto.origin, auto.probe_level, auto.since, auto.strikes = (
        standing,
        origin,
        probe_level,
        since,
        strikes,
    )
    auto.value, auto.search = (None if value is None else min(auto.cap, value)), search
    if standing == "capped" and value is not None and value < auto.cap:
        # Another run's cap held the key there: it admitted that much; search on from it.
        search = auto.search = Search(auto.cap, level=value)
        auto.value, auto.origin = None, Source.searching()
    if search is not None:
        search.level = min(auto.cap, search.lo if resume and search.lo > 0 else search.level)
        if resume:
            search.since = -math.inf  # its stretch begins at this run's first look
    if resume:
        auto.since, auto.strikes = -math.inf, Strikes()
        auto.standing = "settled" if auto.standing == "probe" else auto.standing
    return True
