"""The pace of a batch: when each attempt may start and how many may be on the wire. One rule holds
everywhere: consecutive starts on a key's budget are never closer than the interval of the pace in
force, counted from when each really went out, so any w seconds hold at most ceil(rpm*w/60) starts;
only room the service states (and has not contradicted) may go faster, and at most ten times the plan.

The pieces, each with its invariant in its docstring:

- ``spacing``: the rule's constants (the jitter margin, the room's speed-up) and ``max_starts``;
  the budget (``budget.py``) keeps the rule for every process sharing a key (reserve, then commit;
  on a far budget, the next starts reserved ahead: ``ahead.py``).
- ``pause``: the shared 429 pause and the ramp after it (only ever wider spacing).
- ``evidence``: AIMD, the pace lowered only on evidence of a limit and climbing back while clean.
- ``room``: room the service states, who may spend it, and its distrust after a contradicting 429.
- ``in_flight``: how many attempts may be under way (rate x latency, with headroom).
- ``record``: what the key's budget remembers of the key at its service (a proven key skips the lone
  first request; a contradicted statement is not trusted again).
- ``paces``: the pace in force, its ceiling, and the log of its changes.
- ``turn``: the schedule of starts (reserve on the budget, wait, commit; ``ahead``: a far budget's,
  reserved a few at a time); ``outage``: a budget out mid-run, waited for; ``sharing``: what a pacer
  and the other users of its budget tell each other; ``answers``: what a pacer learns from answers.
- ``limit``, ``search``, ``lead``: ``--rpm auto``, the key's limit found once for every run on it
  (one leads the search, the others follow), judged by the key's ``ledger``.
- ``pacer``: ``Pacer``, which composes them for a batch.
- ``budget`` (with ``exchange``, ``gcra``, ``sqlite_budget``, ``redis_budget``): the key's budget.
"""

from .in_flight import DEFAULT_MAX_IN_FLIGHT, START_IN_FLIGHT, UNPACED_IN_FLIGHT, InFlight
from .pacer import Limiter, PaceChange, PaceLog, Pacer, PacerState
from .record import PROOF_SECONDS, KeyRecord
from .spacing import JITTER_MARGIN, ROOM_SPEEDUP, interval_of, max_starts

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
