"""batchsum: summarize text in bulk through a rate-limited summarization API.

``Client`` / ``AsyncClient`` for one summary per call; ``summarize_texts`` and the pandas accessor
``df.batchsum.summarize(...)`` for many; ``batchsum`` on the command line for Arrow datasets;
``RunSpec`` and ``Run``, the run layer every front-end is a thin door onto.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._imports import after_import
from .data.results import RowResult, result_dtypes
from .errors import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BatchsumError,
    ConfigurationError,
    InputError,
    InvalidParameterError,
    InvalidTextError,
    NotPremiumError,
    QuotaSpent,
    RateLimitError,
    RequestCapReached,
    ServerError,
    TextTooLongError,
    TextTooShortError,
    UnprocessableEntityError,
)
from .options import RunSpec
from .service.contract import Mode, SummaryType
from .service.version import __version__ as __version__

if TYPE_CHECKING:
    from .run.run import Run, summarize_texts
    from .service.client import AsyncClient, Client

# Loaded on first use, so that ``import batchsum`` (and the command line) stays light.
_LAZY = {
    "Client": "service.client",
    "AsyncClient": "service.client",
    "Run": "run.run",
    "summarize_texts": "run.run",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'batchsum' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def _register_pandas() -> None:
    from . import pandas_ext  # noqa: F401  (registers df.batchsum / series.batchsum)


after_import("pandas", _register_pandas)


__all__ = [
    "Client",
    "AsyncClient",
    "summarize_texts",
    "RunSpec",
    "Run",
    "RowResult",
    "result_dtypes",
    "widget",
    "plot_run",
    "monitor",
    "Mode",
    "SummaryType",
    "BatchsumError",
    "ConfigurationError",
    "InputError",
    "InvalidParameterError",
    "InvalidTextError",
    "APIError",
    "APIConnectionError",
    "APITimeoutError",
    "APIResponseValidationError",
    "APIStatusError",
    "AuthenticationError",
    "NotPremiumError",
    "RequestCapReached",
    "QuotaSpent",
    "UnprocessableEntityError",
    "TextTooShortError",
    "TextTooLongError",
    "RateLimitError",
    "ServerError",
]


def plot_run(result: object) -> object:
    """The chart of a finished run (requests per minute against the limit and the pace, 429s,
    pauses, rows done): ``batchsum.plot_run(out)`` for what an accessor returned, or a run report
    (its dict, or the path of its file, ``report=`` / ``--report``). Needs the ``notebook`` extra
    (bqplot)."""
    from .app.chart import plot_run as draw

    return draw(result)


def widget(data: object = None, **options: object) -> object:
    """The notebook app: ``batchsum.widget()`` for one text, ``batchsum.widget(df)`` for a DataFrame.
    Needs the ``notebook`` extra (ipywidgets)."""
    from .app.widgets import make_widget

    return make_widget(data, **options)


def monitor(
    budget: str | None = None, *, service: str | None = None, this_key: bool = False, keys: str | None = None
) -> object:
    """The keys on a budget, live in a notebook (the options of ``batchsum top``): each key's starts per
    10 s against its limit over the last 15 minutes, each run's part stacked, 429s and pauses marked,
    and its runs in a table; it reads the budget every second (never writing it) until closed. Needs
    the ``notebook`` extra."""
    from .app.monitor import KeyMonitor

    return KeyMonitor(budget, service=service, this_key=this_key, keys=keys)
