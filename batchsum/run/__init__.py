"""The run: ``RunSpec``, every option checked once (``spec``; its stable path is
``batchsum.options``), ``Run`` and what front-ends need around it (``run``), what a run opens and
closes (``pieces``) and tells (``watch``: the events of ``logs``, the metrics of ``telemetry``, the
report of ``report``), the progress bar (``progress``), a spec bound to its service (``binding``)
or shared by many workers (``shared``), a dry run (``preview``), a dataset streamed into its output
(``dataset``), a run on a worker thread (``background``) and batches through one run (``batches``).

``from batchsum.run import Run`` names what ``run`` exports. They are loaded on first use, so that
``batchsum.run.spec`` (what every door imports to build a spec) loads without the engine: ``import
batchsum`` and the command line start without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .run import Run, bind, dry_run, local_service, prepare_shared, run_texts, summarize_texts, write_report

__all__ = ["Run", "bind", "prepare_shared", "summarize_texts", "run_texts", "dry_run", "local_service", "write_report"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(".run", __name__), name)
    globals()[name] = value
    return value
