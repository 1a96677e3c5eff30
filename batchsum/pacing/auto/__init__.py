"""``--rpm auto``: the key's limit when nobody says it, found once for every run on the key, and the
key's record that remembers it from run to run.

The limit comes from what the service states, else what the record remembers, else a search that
climbs while answers come back clean and settles under what the service shows when it refuses. The
search reads the key's ledger (``budgets.ledger``), so every process on the key is judged together.
This wing imports only ``budgets/``; the pacer's part in the search (leading it or following it) is
``pacing/search_lead.py``.

- ``limit``: the limit in force under ``--rpm auto`` (``AutoLimit``): stated, remembered or searched,
  and ``Found``, a limit with how and when it was known.
- ``search``: the search itself, as plain data: climb, verify, bisect, confirm.
- ``strikes``: refusals at a known limit's pace, told apart: a storm changes nothing; two strikes (a
  refusal after even sending, twice close together) show what the service admits.
- ``minute_window``: what a minute's window (sliding, fixed, or on the clock) held when it refused.
- ``handover``: what a run hands the next under ``--rpm auto`` (the search or the limit, plain JSON).
- ``sources``: where the limit in force came from, in one vocabulary: configured, stated,
  remembered, found, followed, capped.
- ``key_record``: what the key's budget remembers of a key at its service from run to run
  (``KeyRecord``): the limit found, when the key was answered or refused, stated room contradicted,
  its quotas. It stands here because the limit it remembers is this wing's ``Found``.
"""
