"""The pace of a batch: when each attempt may start and how many may be on the wire. One rule holds
everywhere: consecutive starts on a key's budget are never closer than the interval of the pace in
force, counted from when each really went out, so any w seconds hold at most ceil(rpm*w/60) starts;
only room the service states (and has not contradicted) may go faster, and at most ten times the plan.

The pacer and its pieces stand here; three wings hold the rest, each named in its own ``__init__``:

- ``budgets/``: the key's budget wherever it lives (this process, a SQLite file, Redis), the one
  spacing rule it keeps for every process on the key, and what a pacer tells it.
- ``auto/``: ``--rpm auto``, the key's limit found once for every run on it, and the key's record.
- ``look/``: what is read of a budget without pacing anything (``top``, ``limits``, a dry run).

Each wing imports only the wings below it: the root imports ``auto/`` and ``budgets/``, ``look/``
imports ``auto/`` and ``budgets/``, ``auto/`` imports ``budgets/``, and ``budgets/`` none of them.

The pieces here, each with its invariant in its docstring:

- ``pacer``: ``Pacer``, which composes them for a batch.
- ``turn``: the schedule of starts: a start reserved on the budget, waited for, committed.
- ``ahead``: a far budget's (Redis) turns: the next starts reserved a few at a time, each taken at
  its time or not at all.
- ``paces``: the pace in force, its ceiling, and the log of its changes.
- ``pause``: the shared 429 pause and the ramp after it (only ever wider spacing).
- ``in_flight``: how many attempts may be under way (rate x latency, with headroom).
- ``evidence``: what the service has shown of its limit: AIMD, the pace lowered only on evidence of a
  limit and climbing back while clean.
- ``stated_room``: room the service states in its headers, who may spend it, and its distrust after a
  contradicting 429.
- ``sharing``: what a pacer and the other runs on its key tell each other through the budget (a
  pause, a pace), and a budget that came back empty given again what the run holds of it.
- ``search_lead``: a pacer's part in its key's one ``--rpm auto`` search: the run holding the lead
  moves the limit, the others follow it.
- ``lessons``: what a pacer learns from each answer: a 429, rate-limit headers, a clean answer.
"""

from .auto.key_record import PROOF_SECONDS, KeyRecord
from .budgets.spacing import JITTER_MARGIN, ROOM_SPEEDUP, interval_of, max_starts
from .in_flight import DEFAULT_MAX_IN_FLIGHT, START_IN_FLIGHT, UNPACED_IN_FLIGHT, InFlight
from .pacer import Limiter, PaceChange, PaceLog, Pacer, PacerState

__all__ = [
    "Pacer",
    "InFlight",
    "Limiter",
    "PaceChange",
    "PaceLog",
    "PacerState",
    "KeyRecord",
    "PROOF_SECONDS",
    "JITTER_MARGIN",
    "ROOM_SPEEDUP",
    "DEFAULT_MAX_IN_FLIGHT",
    "START_IN_FLIGHT",
    "UNPACED_IN_FLIGHT",
    "interval_of",
    "max_starts",
]
