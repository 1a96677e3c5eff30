"""What is read of a key's budget, or reckoned from it, without pacing anything: ``batchsum top``,
``batchsum limits``, ``batchsum.monitor()`` and a dry run read here, and nothing here writes a budget.

This wing imports ``budgets/`` and ``auto/``; nothing else in ``pacing/`` imports it.

- ``readonly``: every key's budget in a place, read without writing it: the SQLite file read-only
  beside its writers, Redis in plain reads; one key's state from either (``KeyState``).
- ``view``: what a budget shows of its keys and their runs (``KeyView``, ``RunView``): limit and
  source, starts, 429s, pause, quotas, a search under way.
- ``forecast``: what a key can do now (``key_now``) and a job projected on its keys (``project``):
  the rule a run applies when every key is out, and the dry run's.
"""
