"""The DataFrame app (``batchsum.widget(df)``): the column, the request controls and the rate, Run
and Cancel; the run goes on a background thread while its ``RunView`` shows it."""

from __future__ import annotations

import asyncio
import html
import itertools
import os
from typing import Any

import ipywidgets as w
import pandas as pd

from ..data.results import check_columns, join_results
from ..engine.tally import BatchStats
from ..run.background import BackgroundRun
from ..run.budget_keys import key_company
from ..run.run import Run
from ..run.spec import RunSpec, check_option, document_options
from ..service import contract
from ..service.errors import BatchsumError
from ..service.retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from ..service.settings import DEFAULT_BUDGET_WAIT, DEFAULT_MAX_WAIT, Rate, describe_rate
from .controls import STYLE, App, field, grid
from .run_view import RunView

__all__ = ["FrameApp"]

# The options the app hands to every run as they were given (the controls give the others).
_APP_OPTIONS = ("mode", "percentage", "type", "api_key", "base_url", "local", "timeout", "max_retries", "encoding")
_RUN_OPTIONS = (
    "output_column",
    "concurrency",
    "limiter",
    "budget",
    "journal",
    "store",
    "refresh",
    "store_scope",
    "progress",
    "max_wait",
    "budget_wait",
    "long_texts",
    "max_requests",
    "sample",
    "share",
    "report",
    "keys",
    "quota",
)


class FrameApp(App):
    """A DataFrame: pick the column and parameters, Run and Cancel; a live chart of the run, the
    state in words, and the rows as they finish in a paged table. The finished DataFrame is
    ``.result`` (with the run in ``.result.attrs["batchsum"]``); Cancel keeps the rows that finished."""

    @document_options
    def __init__(
        self,
        frame: pd.DataFrame,
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
        progress: bool = False,
        long_texts: str = "skip",
        max_wait: float = DEFAULT_MAX_WAIT,
        budget_wait: float = DEFAULT_BUDGET_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
        keys: str | os.PathLike[str] | None = None,
        quota: str | None = None,
    ) -> None:
        """The app for ``frame``: the request controls start at ``mode``, ``percentage`` and ``type``,
        "Per minute" at ``rpm`` (``$BATCHSUM_RPM`` or 60; 0 with the local service); the other
        options are the run's, as for ``df.batchsum.summarize``. ``progress``: a tqdm bar as well as
        the app's own."""
        self.frame = frame
        options = locals()
        spec = RunSpec.from_options(options)  # every option checked before anything is drawn
        self._run_options: dict[str, Any] = {name: options[name] for name in _RUN_OPTIONS}
        self._output_column = spec.output_column
        rate = describe_rate(spec.rpm, spec.auto)
        self._default_rpm = f"{rate:g}" if isinstance(rate, float) else rate
        super().__init__(**{name: options[name] for name in _APP_OPTIONS})

    def _build(self) -> None:
        frame = self.frame
        text_columns = _text_columns(frame)
        self.column = w.Dropdown(options=text_columns or list(frame.columns))
        self.rpm = w.Text(value=self._default_rpm, layout=w.Layout(width="12em"))
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.cancel_button = w.Button(description="Cancel", icon="stop", disabled=True)
        self.view = RunView(frame)
        self.progress, self.status = self.view.progress, self.view.status
        self.chart, self.table = self.view.chart, self.view.table
        self.result: pd.DataFrame | None = None
        self.error: BaseException | None = None
        self._current: Run | None = None  # the run under way
        self.run_button.on_click(lambda _: self.run())
        self.cancel_button.on_click(lambda _: self.cancel())
        self.box = w.VBox(
            [
                w.HTML(STYLE),
                grid(
                    field("Column", self.column, "The column holding the texts."),
                    *self._request_fields(),
                    field(
                        "Per minute",
                        self.rpm,
                        "Requests per minute your plan allows (0 = no limit), or auto to find it (auto:N: at most N).",
                    ),
                    [w.HTML(""), w.HBox([self.run_button, self.cancel_button])],
                    field("Progress", self.progress),
                ),
                self.status,
                self.chart.widget,
                self.view.others,
                self.table.box,
            ],
            layout=w.Layout(width="100%", max_width="1000px"),
        )
        self.box.add_class("batchsum-app")
        self.box.add_class("batchsum-frame-app")

    def run(self) -> None:
        """What Run does: summarize the chosen column on a background thread."""
        self.result, self.error, self.view.rows = None, None, []
        try:
            check_columns(self.frame.columns, self.column.value, self._output_column)
            spec = self._spec(rpm=_rate_field(self.rpm.value), **self._run_options)
        except BatchsumError as exc:
            self.error = exc
            self.status.value = f"<span class='batchsum-error'>{html.escape(str(exc))}</span>"
            return
        self.run_button.disabled, self.cancel_button.disabled = True, False
        self.status.value = "<i>Starting…</i>"
        self.view.kind = spec.params.type.value if spec.params.type else None
        texts = self.frame[self.column.value].tolist()
        self._run = BackgroundRun(lambda: self._work(texts, spec))

    def cancel(self) -> None:
        """Stop sending; requests on the wire finish and every finished row is kept."""
        if self._run is not None:
            self._run.cancel()
        self.cancel_button.disabled = True

    async def _work(self, texts: list[Any], spec: RunSpec) -> None:
        stats = BatchStats(total=len(texts))
        cancelled = False
        ticker = asyncio.ensure_future(self._tick(stats))
        try:
            async with Run(spec, stats=stats, on_result=self.view.draw) as run:
                self._current = run
                async for result in run.stream(texts):
                    self.view.rows.append(result)
        except asyncio.CancelledError:  # Cancel: the engine has kept what finished
            cancelled = True
        except BatchsumError as exc:
            self.error = exc
        finally:
            ticker.cancel()
            self._current = None
        self.result = join_results(self.frame.iloc[: len(self.view.rows)], self.view.rows, self._output_column)
        self.result.attrs["batchsum"] = stats.record()
        self.view.finish(stats, self.result, self.error, cancelled, len(self.frame))
        self.run_button.disabled, self.cancel_button.disabled = False, True

    async def _tick(self, stats: BatchStats) -> None:
        """Redraw while no row finishes (the state, not a frozen bar), and how much of the key others use."""
        for second in itertools.count():
            await asyncio.sleep(1.0)
            self.view.draw(stats, force=True)
            if second % 2 == 0 and self._current is not None:
                self.view.company(await key_company(self._current))


def _text_columns(frame: pd.DataFrame) -> list[Any]:
    """Columns holding strings, the wordiest first (judged on a sample)."""
    sample = frame.head(200)
    scored = []
    for column in frame.columns:
        values = [v for v in sample[column].tolist() if isinstance(v, str)]
        if values:
            scored.append((-sum(contract.count_words(v) for v in values) / len(values), str(column), column))
    return [column for *_, column in sorted(scored)]


def _rate_field(value: str) -> Rate:
    """The "Per minute" field as the run takes it: a number, or ``auto`` / ``auto:N`` as typed, checked
    by the option's one check."""
    rate: Rate = check_option("rpm", value, text=True)
    return rate
