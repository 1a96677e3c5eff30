"""The engine: rows in, one result per row out, in input order (``stream``; the parts of a run in its
``_`` modules), how a batch runs (``options``), a request's identity (``fingerprints``), the dry run
(``plan``), what it counts of a run (``tally``, ``timeline``), a run's keys (``keys``: ``KeyLane``, a
client and a pacer per key), and the plan of texts over the service's limit (``long_texts``, pure: the
engine sends).

``from batchsum.engine import summarize_stream`` names what ``stream`` exports. They are loaded on
first use, so that ``batchsum.engine.long_texts`` imports alone, without the engine, and ``stream``
can import ``long_texts`` from this package without importing itself back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .stream import (
        BatchPlan,
        RowBlock,
        RunOptions,
        fingerprint,
        plan_batch,
        rows_of,
        stream_results,
        summarize_stream,
        text_fingerprint,
    )

__all__ = [
    "RunOptions",
    "RowBlock",
    "fingerprint",
    "text_fingerprint",
    "summarize_stream",
    "stream_results",
    "rows_of",
    "BatchPlan",
    "plan_batch",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(".stream", __name__), name)
    globals()[name] = value
    return value
