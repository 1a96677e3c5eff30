"""The option-taking methods every DataFrame accessor shares (pandas, Dask, Polars): one explicit
signature per shape, written once. An accessor inherits the shapes it offers and supplies what is
its own: ``_summarize(column, spec)`` (and ``_asummarize`` for the async ones), which turns its
input into rows and the results back into its frame. ``column`` is None for a Series accessor.

The keywords are the options of ``RunSpec.from_kwargs``, with its defaults (a test checks); their
help is ``run.spec.OPTIONS``, appended to each docstring.
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

from .run.spec import RunSpec, document_options
from .service import contract
from .service.retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from .service.settings import DEFAULT_BUDGET_WAIT, DEFAULT_MAX_WAIT

__all__ = ["ColumnSummarize", "ColumnSummarizeAsync", "ValuesSummarize", "ValuesSummarizeAsync"]

FrameT = TypeVar("FrameT")


class ColumnSummarize(Generic[FrameT]):
    """``frame.batchsum.summarize("text", ...)``."""

    door = "python"  # the front-end, as the runs' registry shows it (each accessor names its own)

    def _summarize(self, column: Hashable, spec: RunSpec) -> FrameT:
        raise NotImplementedError

    @document_options
    def summarize(
        self,
        column: Hashable,
        mode: Any = 1,
        percentage: Any = contract.PERCENTAGE_DEFAULT,
        type: Any = None,
        *,
        output_column: str = "summary",
        api_key: str | list[str] | None = None,
        base_url: str | None = None,
        local: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        encoding: str = "json",
        rpm: float | None = None,
        concurrency: int | None = None,
        limiter: Any = None,
        budget: Any = None,
        journal: str | os.PathLike[str] | None = None,
        store: str | None = None,
        refresh: bool = False,
        store_scope: str = "service",
        progress: bool = True,
        long_texts: str = "skip",
        max_wait: float = DEFAULT_MAX_WAIT,
        budget_wait: float = DEFAULT_BUDGET_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
        keys: str | os.PathLike[str] | None = None,
        quota: str | None = None,
    ) -> FrameT:
        """Every column of the frame, then the result columns (``summary``, ``summary_status``,
        ``summary_error``, ``summary_message``, ``summary_http_status``, ``summary_attempts``,
        ``summary_requests``), one result per row in order; see the accessor's class for what is its
        own. Raises, before anything is sent: ``InputError`` (the column), ``InvalidParameterError``,
        ``ConfigurationError`` (key, URL), ``BudgetError``; and ``AuthenticationError`` /
        ``NotPremiumError`` when the service refuses the key or the plan."""
        return self._summarize(column, RunSpec.from_options(locals()).replace(door=self.door))


class ColumnSummarizeAsync(Generic[FrameT]):
    """``await frame.batchsum.asummarize("text", ...)``, in the running event loop."""

    door = "python"  # the front-end, as the runs' registry shows it (each accessor names its own)

    async def _asummarize(self, column: Hashable, spec: RunSpec) -> FrameT:
        raise NotImplementedError

    @document_options
    async def asummarize(
        self,
        column: Hashable,
        mode: Any = 1,
        percentage: Any = contract.PERCENTAGE_DEFAULT,
        type: Any = None,
        *,
        output_column: str = "summary",
        api_key: str | list[str] | None = None,
        base_url: str | None = None,
        local: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        encoding: str = "json",
        rpm: float | None = None,
        concurrency: int | None = None,
        limiter: Any = None,
        budget: Any = None,
        journal: str | os.PathLike[str] | None = None,
        store: str | None = None,
        refresh: bool = False,
        store_scope: str = "service",
        progress: bool = True,
        long_texts: str = "skip",
        max_wait: float = DEFAULT_MAX_WAIT,
        budget_wait: float = DEFAULT_BUDGET_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
        keys: str | os.PathLike[str] | None = None,
        quota: str | None = None,
    ) -> FrameT:
        """``summarize``, awaited in the running event loop."""
        return await self._asummarize(column, RunSpec.from_options(locals()).replace(door=self.door))


class ValuesSummarize(Generic[FrameT]):
    """``series.batchsum.summarize(...)``: the result columns on the Series' index."""

    door = "python"  # the front-end, as the runs' registry shows it (each accessor names its own)

    def _summarize(self, column: Hashable, spec: RunSpec) -> FrameT:
        raise NotImplementedError

    @document_options
    def summarize(
        self,
        mode: Any = 1,
        percentage: Any = contract.PERCENTAGE_DEFAULT,
        type: Any = None,
        *,
        output_column: str = "summary",
        api_key: str | list[str] | None = None,
        base_url: str | None = None,
        local: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        encoding: str = "json",
        rpm: float | None = None,
        concurrency: int | None = None,
        limiter: Any = None,
        budget: Any = None,
        journal: str | os.PathLike[str] | None = None,
        store: str | None = None,
        refresh: bool = False,
        store_scope: str = "service",
        progress: bool = True,
        long_texts: str = "skip",
        max_wait: float = DEFAULT_MAX_WAIT,
        budget_wait: float = DEFAULT_BUDGET_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
        keys: str | os.PathLike[str] | None = None,
        quota: str | None = None,
    ) -> FrameT:
        """The result columns for every value, one row each, in order (see ``summarize`` of the
        DataFrame accessor for what they are and what is raised)."""
        return self._summarize(None, RunSpec.from_options(locals()).replace(door=self.door))


class ValuesSummarizeAsync(Generic[FrameT]):
    """``await series.batchsum.asummarize(...)``, in the running event loop."""

    door = "python"  # the front-end, as the runs' registry shows it (each accessor names its own)

    async def _asummarize(self, column: Hashable, spec: RunSpec) -> FrameT:
        raise NotImplementedError

    @document_options
    async def asummarize(
        self,
        mode: Any = 1,
        percentage: Any = contract.PERCENTAGE_DEFAULT,
        type: Any = None,
        *,
        output_column: str = "summary",
        api_key: str | list[str] | None = None,
        base_url: str | None = None,
        local: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        encoding: str = "json",
        rpm: float | None = None,
        concurrency: int | None = None,
        limiter: Any = None,
        budget: Any = None,
        journal: str | os.PathLike[str] | None = None,
        store: str | None = None,
        refresh: bool = False,
        store_scope: str = "service",
        progress: bool = True,
        long_texts: str = "skip",
        max_wait: float = DEFAULT_MAX_WAIT,
        budget_wait: float = DEFAULT_BUDGET_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
        keys: str | os.PathLike[str] | None = None,
        quota: str | None = None,
    ) -> FrameT:
        """``summarize``, awaited in the running event loop."""
        return await self._asummarize(None, RunSpec.from_options(locals()).replace(door=self.door))
