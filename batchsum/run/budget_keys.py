"""The keys on a budget as ``batchsum top`` and ``batchsum.monitor()`` show them (``Watcher``): the budget
named as ``batchsum limits`` names it (``--budget``, the machine's by default), the keys labelled by
their line of ``--keys FILE`` (or as the key in ``$BATCHSUM_API_KEY``), chosen by service or key, read
without writing (``pacing.look.view``); and what a run sees of the other runs on its key (``key_company``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..pacing.look.view import UNKNOWN, BudgetView, KeyView, RunView, read_view
from ..service import contract
from ..service.errors import BudgetError
from ..service.key_plans import ENV_API_KEYS, resolve_keys
from ..service.location import Location
from ..service.settings import ENV_API_KEY, budget_spec, check_base_url, environment, key_hash_from_environment

if TYPE_CHECKING:
    from .run import Run

__all__ = [
    "Watcher",
    "as_json",
    "key_company",
    "HISTORY_SECONDS",
    "SCHEMA",
    # the view's names, for the layers above (pacing/look/view.py)
    "BudgetView",
    "KeyView",
    "RunView",
    "UNKNOWN",
]

HISTORY_SECONDS = 180.0  # what a budget keeps of its ledger: the monitor's first look reads all of it
SCHEMA = "batchsum-top/2"  # ``batchsum top --json``'s shape (docs/top.schema.json)


def _labels(keys: str | Path | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Key hash -> its label: the line of ``keys`` (else of ``$BATCHSUM_API_KEYS``) that holds it, and
    ``$BATCHSUM_API_KEY`` for the key there."""
    env = environment(environ)
    labels: dict[str, str] = {}
    if keys is not None or env.get(ENV_API_KEYS, "").strip():
        labels = {plan.hash: plan.source for plan in resolve_keys(None, keys, env)}
    mine = key_hash_from_environment(env)
    if mine is not None:
        labels.setdefault(mine, f"${ENV_API_KEY}")
    return labels


class Watcher:
    """What to show of a budget: ``budget`` as ``--budget`` takes it (None: ``$BATCHSUM_BUDGET``, else
    the machine's), only the keys at ``service`` (a base URL) or only ``this_key`` (``$BATCHSUM_API_KEY``'s),
    labelled from ``keys`` (a key file). ``BudgetError``: a budget that cannot be watched (``none``)."""

    def __init__(
        self,
        budget: str | None = None,
        *,
        service: str | None = None,
        this_key: bool = False,
        keys: str | Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        place = budget_spec(budget, environ)
        if not isinstance(place, Location) or place.process:
            raise BudgetError(
                "the budget 'none' lives inside each run's own process: nothing outside it can watch it; "
                "watch a budget runs share (machine, sqlite:///PATH or redis://HOST:PORT/DB)"
            )
        self.where, self.display = place.pinned(), place.place
        self.service = contract.service_identity(check_base_url(service)) if service else None
        self.mine = key_hash_from_environment(environ)
        if this_key and self.mine is None:
            raise BudgetError(
                f"--this-key needs ${ENV_API_KEY}; for several keys, --keys FILE (or ${ENV_API_KEYS}) labels each"
            )
        self.this_key = this_key
        self.labels = _labels(keys, environ)

    async def read(self, seconds: float = 70.0) -> BudgetView:
        """The keys active on the budget now, with ``seconds`` of their ledger (a chart's history)."""
        view = await read_view(self.where, self.display, seconds=seconds, labels=self.labels)
        keys = tuple(key for key in view.keys if self._chosen(key))
        return dataclasses.replace(view, keys=keys)

    def _chosen(self, key: KeyView) -> bool:
        return (self.service is None or key.service == self.service) and (not self.this_key or key.key == self.mine)


def as_json(view: BudgetView) -> dict[str, Any]:
    """``batchsum top --json``: one object (``docs/top.schema.json``)."""
    return {"schema": SCHEMA, **view.as_json()}


async def key_company(run: Run) -> dict[str, Any] | None:
    """How much of the run's first key the other runs on it use: their runs, their starts in the
    trailing minute and this run's (from the runs' registry); None when the budget has no registry
    (``none``) or cannot be read now."""
    try:
        entries = await run.budget.runs()
    except BudgetError:
        return None
    mine = [e for e in entries if e.run_id == run.run_id]
    others = [e for e in entries if e.run_id != run.run_id]

    def rate(found: list[Any]) -> int:
        return sum(int(e.data.get("rate_1m") or 0) for e in found)

    return {
        "runs": len({e.run_id for e in others}),
        "others_1m": rate(others),
        "own_1m": rate(mine),
        "limit": run.pacer.ceiling,
    }
