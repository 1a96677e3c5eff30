"""Where the limit in force came from, in one vocabulary for the run report, ``batchsum limits``, the
progress line, the logs and the docs (``Source``: its ``kind`` and, for a person, its ``detail``).

- ``configured``: ``--rpm N``, or a key file's rate;
- ``stated``: this run's answers' rate-limit headers state it;
- ``remembered``: the key's record (when, and how it was found);
- ``found``: this run's search (or its strikes, or a probe) found it;
- ``followed``: another run's search on the key found it (or its service stated it), taken from the
  state the run leading the key's search published;
- ``capped``: ``auto:N``'s cap is the limit in force;
- ``searching``: no limit known yet (the search goes on).

How a remembered or followed limit was known at its origin (``Found.how`` in the key's record):
``found`` (a search), ``found in part`` (a search that ended with its run), ``lowered`` (the service
admitted less over a full window of refusals), ``probed`` (a probe above it was admitted), ``stated``
(the service's headers).

Invariant: a source says only what this run saw or took over: ``stated`` and ``found`` are this run's
own; what another run saw is ``followed`` (or ``remembered``, through the key's record).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Source",
    "CONFIGURED",
    "STATED",
    "REMEMBERED",
    "FOUND",
    "FOLLOWED",
    "CAPPED",
    "SEARCHING",
    "KINDS",
    "BY_SEARCH",
    "IN_PART",
    "LOWERED",
    "PROBED",
    "BY_HEADERS",
    "known",
]

CONFIGURED, STATED, REMEMBERED, FOUND, FOLLOWED, CAPPED, SEARCHING = (
    "configured",
    "stated",
    "remembered",
    "found",
    "followed",
    "capped",
    "searching",
)
KINDS = (CONFIGURED, STATED, REMEMBERED, FOUND, FOLLOWED, CAPPED, SEARCHING)

# How a limit was known at its origin (the key's record keeps it with the limit).
BY_SEARCH, IN_PART, LOWERED, PROBED, BY_HEADERS = "found", "found in part", "lowered", "probed", "stated"


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at))


def known(how: str, at: float) -> str:
    """How a limit was known and when, for a person: ``found 2026-11-26 14:02 by a search``."""
    when = _when(at)
    return {
        BY_SEARCH: f"found {when} by a search",
        IN_PART: f"found in part {when} by a search its run ended",
        LOWERED: f"lowered {when}: the service admitted less over a full window of refusals",
        PROBED: f"raised {when}: a probe above the limit was admitted",
        BY_HEADERS: f"stated by the service {when}",
    }.get(how, f"{how} {when}")


@dataclass(frozen=True)
class Source:
    """Where a limit came from: ``kind`` (one of ``KINDS``); how it was known at its origin and when
    (``how``, ``at``: Unix time), for a limit found, remembered or followed; the ``cap`` of a capped
    one; the ``level`` a search was trying."""

    kind: str
    how: str | None = None
    at: float | None = None
    cap: float | None = None
    level: float | None = None

    @classmethod
    def configured(cls) -> Source:
        return cls(CONFIGURED)

    @classmethod
    def searching(cls, level: float | None = None) -> Source:
        return cls(SEARCHING, level=level)

    def detail(self) -> str:
        """The source for a person, in a few words."""
        origin = known(self.how, self.at) if self.how is not None and self.at is not None else None
        if self.kind == CONFIGURED:
            return "configured (--rpm, or the key file's rate)"
        if self.kind == STATED:
            return "stated by the service"
        if self.kind == REMEMBERED:
            return f"{origin}, remembered for the key" if origin else "remembered for the key"
        if self.kind == FOUND:
            return f"{origin}, in this run" if origin else "found by this run's search"
        if self.kind == FOLLOWED:
            return (
                f"{origin}; followed from another run on the key" if origin else "followed from another run on the key"
            )
        if self.kind == CAPPED:
            cap = f"the cap (auto:{self.cap:g})" if self.cap is not None else "the cap"
            return f"{cap}; the key's record: {origin}" if origin else cap
        trying = f": trying {self.level:.0f}/min" if self.level is not None else ""
        return f"searching{trying}"

    def __str__(self) -> str:
        return self.detail()

    def followed(self, *, heard: float | None = None, value: float | None = None) -> Source:
        """This source as another run takes it over from the published state: what that run found,
        followed, or was told by its service is ``followed`` (``stated`` when this run's own answers
        ``heard`` the same ``value``); the key's record stays ``remembered``; a search, ``searching``."""
        if self.kind in (FOUND, FOLLOWED):
            return Source(FOLLOWED, self.how, self.at)
        if self.kind == STATED:
            if heard is not None and value is not None and math.isclose(heard, value):
                return Source(STATED, BY_HEADERS, self.at)
            return Source(FOLLOWED, BY_HEADERS, self.at if self.at is not None else time.time())
        return self

    def data(self) -> dict[str, Any]:
        """As plain JSON (the search's published state carries it)."""
        return {k: v for k, v in (("kind", self.kind), ("how", self.how), ("at", self.at), ("cap", self.cap)) if v}

    @classmethod
    def from_data(cls, data: Any) -> Source:
        """``data()`` read back; anything else (a state an older version published: its source was a
        line of text) is another run's limit, followed."""
        if not isinstance(data, dict) or data.get("kind") not in KINDS:
            return cls(FOLLOWED)
        how, at, cap = data.get("how"), data.get("at"), data.get("cap")
        return cls(
            str(data["kind"]),
            str(how) if isinstance(how, str) else None,
            float(at) if isinstance(at, (int, float)) else None,
            float(cap) if isinstance(cap, (int, float)) else None,
        )
