"""The key's budget: the one place every run on a key shares, wherever it lives, and what it keeps.

A pacer asks its budget for each start and tells it what it saw; the budget answers for every process
and machine on the key at once. Nothing here imports the rest of ``pacing/``: the pacer, the limit's
search and the read-only view all stand on this wing.

- ``exchange``: what a pacer and its budget say to each other: the ``Budget`` protocol, the report a
  pacer pushes, the slot it gets back, a run's share, the search's lead, the runs' registry.
- ``spacing``: the one spacing rule (starts never closer than the pace's interval) and its constants.
- ``gcra``: the budget's state and its one atomic step (GCRA with commits), the same on every back-end.
- ``budget``: ``open_budget`` (which budget a setting names), its checks, and the budget of this
  process alone (``ProcessBudget``).
- ``sqlite_budget``: the budget of every process on this machine, in a SQLite file (the default).
- ``sqlite_file``: that file: its schema, its transactions on its own thread, what it remembers.
- ``redis_budget``: the budget of every machine, one Lua script on Redis' clock.
- ``redis_scripts``: the Redis budget's Lua scripts, each the twin of a step of ``gcra``/``sqlite_budget``.
- ``ledger``: the key's starts, clean answers and 429s per tenth of a second, every process together.
- ``outage``: a budget that cannot be reached mid-run, waited for with a backoff up to ``budget_wait``.
- ``quota``: a key's quotas longer than a minute: counted on the budget, stated by the service, spent.
- ``owed``: what a pacer has to tell its budget and has not told yet (its pause, pace, starts, 429s).
- ``presence``: a run seen on its key's budget: its entry in the runs' registry and its job's stop.
"""
