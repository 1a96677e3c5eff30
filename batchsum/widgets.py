"""The notebook apps (ipywidgets): ``batchsum.widget()`` summarizes one text, ``batchsum.widget(df)``
runs a DataFrame column through the engine with live progress, a preview and a Cancel button.

Work runs on its own event loop in a background thread (``pandas_ext.BackgroundRun``), so the
notebook stays responsive; ``app.wait()`` waits for it (tests).
"""

from __future__ import annotations

import asyncio
import html
import time
from typing import Any

import pandas as pd

try:
    import ipywidgets as w
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the widget needs the 'notebook' extra: pip install 'batchsum[notebook]'") from exc

from . import contract
from .client import AsyncClient
from .engine import BatchStats, RowResult
from .errors import (
    APIConnectionError,
    APITimeoutError,
    AuthenticationError,
    BatchsumError,
    ConfigurationError,
    InvalidTextError,
    NotPremiumError,
    RateLimitError,
    ServerError,
    TextTooLongError,
    TextTooShortError,
    UnprocessableEntityError,
)
from .pandas_ext import BackgroundRun, DataFrameAccessor, local_service, summarize_texts

__all__ = ["TextApp", "FrameApp", "make_widget", "explain", "render_summary"]

# "default" rather than None: a Dropdown shows a None value as no selection at all.
FORMATS = [
    ("Default", "default"),
    ("Headings & points", "summary_2"),
    ("Bullets", "bullets"),
    ("Best line", "best_line"),
]
MODES = [("Standard", 1), ("Advanced", 2)]


def explain(error: BaseException) -> str:
    """The error in plain words, with what to do about it."""
    if isinstance(error, AuthenticationError):
        return (
            "The service did not accept the API key. Check BATCHSUM_API_KEY (the key is on the "
            "'My Account' page of the service)."
        )
    if isinstance(error, NotPremiumError):
        return (
            "Your plan does not allow this request: 'Advanced' needs a premium plan, or the plan has "
            "expired. Try 'Standard', or renew the plan."
        )
    if isinstance(error, (TextTooShortError,)) or (
        isinstance(error, InvalidTextError) and error.reason is contract.SkipReason.TOO_SHORT
    ):
        return f"The text is too short: the service needs at least {contract.MIN_WORDS} words."
    if isinstance(error, TextTooLongError) or (
        isinstance(error, InvalidTextError) and error.reason is contract.SkipReason.TOO_LONG
    ):
        return f"The text is too long: the service takes at most {contract.MAX_WORDS} words."
    if isinstance(error, InvalidTextError):
        return "There is no text to summarize yet."
    if isinstance(error, RateLimitError):
        return (
            "Rate limited: your plan's requests per minute are used up. Wait a minute and try "
            "again (batchsum already retried)."
        )
    if isinstance(error, APITimeoutError):
        return "The service did not answer in time. It may be overloaded; try again in a moment."
    if isinstance(error, (ServerError, APIConnectionError)):
        return f"The service is down or unreachable right now ({error}). Try again in a moment."
    if isinstance(error, UnprocessableEntityError):
        return f"The service refused the request: {error.message}"
    if isinstance(error, ConfigurationError):
        return str(error)
    return f"Something went wrong: {error}"


def render_summary(summary: str, kind: str | None) -> str:
    """HTML for reading: headings as headings, bullet lines as a list, the best line as a quote."""
    if kind == "best_line":
        return f"<blockquote class='batchsum-summary'>{html.escape(summary)}</blockquote>"
    parts: list[str] = []
    items: list[str] = []

    def close_list() -> None:
        if items:
            parts.append("<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>")
            items.clear()

    for line in summary.splitlines():
        stripped = line.strip()
        if not stripped:
            close_list()
        elif stripped.startswith("#"):
            close_list()
            parts.append(f"<h4>{html.escape(stripped.lstrip('#').strip())}</h4>")
        elif stripped[:1] in "-*•":
            items.append(html.escape(stripped[1:].strip()))
        else:
            close_list()
            parts.append(f"<p>{html.escape(stripped)}</p>")
    close_list()
    return "<div class='batchsum-summary'>" + "".join(parts) + "</div>"


class _App:
    """What both apps share: the request controls and the connection settings."""

    def __init__(
        self, *, api_key: str | None = None, base_url: str | None = None, local: bool = False, **client_options: Any
    ) -> None:
        self._connection = {"api_key": api_key, "base_url": base_url, "local": local}
        self._client_options = client_options
        self.mode = w.ToggleButtons(options=MODES, value=1, description="Model")
        self.length = w.IntSlider(
            value=contract.PERCENTAGE_DEFAULT,
            min=contract.PERCENTAGE_MIN,
            max=contract.PERCENTAGE_MAX,
            description="Length",
        )
        self.format = w.Dropdown(options=FORMATS, value="default", description="Format")
        self._run: BackgroundRun | None = None
        self.box: w.Box

    def _settings(self) -> dict[str, Any]:
        if self._connection["local"]:
            service = local_service()
            return {"api_key": service.key, "base_url": service.url}
        return {"api_key": self._connection["api_key"], "base_url": self._connection["base_url"]}

    def wait(self, timeout: float | None = 60) -> None:
        """Wait for the work started by the last click (for tests and scripts)."""
        if self._run is not None:
            self._run.wait(timeout)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.box._repr_mimebundle_(**kwargs)


class TextApp(_App):
    """One text: a word count that says whether it fits, model, length, format, Summarize."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.text = w.Textarea(placeholder="Paste a text of 10 to 5000 words", rows=10, layout=w.Layout(width="100%"))
        self.count = w.HTML()
        self.button = w.Button(description="Summarize", button_style="primary", icon="compress")
        self.result = w.HTML()
        self.message = w.HTML()
        self.summary: str | None = None
        self.error: BaseException | None = None
        self.text.observe(lambda _: self._count(), names="value")
        self.button.on_click(lambda _: self.summarize())
        self._count()
        self.box = w.VBox(
            [self.text, self.count, self.mode, self.length, self.format, self.button, self.message, self.result]
        )
        self.box.add_class("batchsum-text-app")

    def _count(self) -> None:
        words = contract.count_words(self.text.value)
        if words < contract.MIN_WORDS:
            note, ok = f"needs at least {contract.MIN_WORDS}", False
        elif words > contract.MAX_WORDS:
            note, ok = f"over the limit of {contract.MAX_WORDS}", False
        else:
            note, ok = "within 10..5000", True
        color = "#2e7d32" if ok else "#c62828"
        self.count.value = f"<span style='color:{color}'>{words} words: {note}</span>"

    def summarize(self) -> None:
        """What the button does: summarize on a background thread and show the result."""
        self.button.disabled = True
        self.message.value = "<i>Summarizing…</i>"
        self.result.value = ""
        request = (self.text.value, self.mode.value, self.length.value, self.format.value)
        self._run = BackgroundRun(lambda: self._work(*request))

    async def _work(self, text: str, mode: int, length: int, kind: str | None) -> None:
        self.summary, self.error = None, None
        try:
            async with AsyncClient(**self._settings(), **self._client_options) as client:
                self.summary = await client.summarize(text, mode, length, kind)
            self.result.value = render_summary(self.summary, kind)
            self.message.value = ""
        except BatchsumError as exc:
            self.error = exc
            self.message.value = (
                f"<span class='batchsum-error' style='color:#c62828'>{html.escape(explain(exc), quote=False)}</span>"
            )
        finally:
            self.button.disabled = False


class FrameApp(_App):
    """A DataFrame: pick the column and parameters, Run and Cancel, live progress and preview.
    The finished DataFrame is ``.result``; Cancel keeps the rows that finished."""

    def __init__(
        self,
        frame: pd.DataFrame,
        *,
        rpm: float | None = None,
        concurrency: int | None = None,
        output_column: str = "summary",
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.frame = frame
        text_columns = _text_columns(frame)
        self.column = w.Dropdown(options=text_columns or list(frame.columns), description="Column")
        default_rpm = rpm if rpm is not None else (0 if options.get("local") else 60)
        self.rpm = w.BoundedFloatText(value=default_rpm, min=0, max=100_000, description="Per minute")
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.cancel_button = w.Button(description="Cancel", icon="stop", disabled=True)
        self.progress = w.IntProgress(value=0, min=0, max=max(1, len(frame)), description="0%")
        self.status = w.HTML()
        self.preview = w.HTML()
        self.result: pd.DataFrame | None = None
        self.error: BaseException | None = None
        self._concurrency = concurrency
        self._output_column = output_column
        self._rows: list[RowResult] = []
        self._last_draw = 0.0
        self.run_button.on_click(lambda _: self.run())
        self.cancel_button.on_click(lambda _: self.cancel())
        self.box = w.VBox(
            [
                w.HBox([self.column, self.mode]),
                w.HBox([self.length, self.format, self.rpm]),
                w.HBox([self.run_button, self.cancel_button, self.progress]),
                self.status,
                self.preview,
            ]
        )
        self.box.add_class("batchsum-frame-app")

    def run(self) -> None:
        """What Run does: summarize the chosen column on a background thread."""
        self.result, self.error, self._rows = None, None, []
        try:
            DataFrameAccessor(self.frame)._column(self.column.value, self._output_column)
        except BatchsumError as exc:
            self.error = exc
            self.status.value = f"<span class='batchsum-error' style='color:#c62828'>{html.escape(str(exc))}</span>"
            return
        self.run_button.disabled, self.cancel_button.disabled = True, False
        self.status.value = "<i>Starting…</i>"
        request = (self.column.value, self.mode.value, self.length.value, self.format.value, self.rpm.value)
        self._run = BackgroundRun(lambda: self._work(*request))

    def cancel(self) -> None:
        """Stop sending; requests on the wire finish and every finished row is kept."""
        if self._run is not None:
            self._run.cancel()
        self.cancel_button.disabled = True

    async def _work(self, column: Any, mode: int, length: int, kind: str | None, rpm: float) -> None:
        stats = BatchStats(total=len(self.frame))
        settings = {**self._settings(), **self._client_options}
        cancelled = False
        ticker = asyncio.ensure_future(self._tick(stats))
        try:
            await summarize_texts(
                self.frame[column].tolist(),
                mode,
                length,
                kind,
                rpm=rpm,
                concurrency=self._concurrency,
                progress=False,
                stats=stats,
                on_result=self._draw,
                results=self._rows,
                **settings,
            )
        except asyncio.CancelledError:  # Cancel: the engine has kept what finished
            cancelled = True
        except BatchsumError as exc:
            self.error = exc
        finally:
            ticker.cancel()
        done = len(self._rows)
        accessor = DataFrameAccessor(self.frame.iloc[:done])
        self.result = accessor._join(self._rows, self._output_column)
        self._draw(stats, force=True)
        if self.error is not None:
            note = f"<span class='batchsum-error' style='color:#c62828'>{html.escape(explain(self.error), quote=False)}</span> "
            self.status.value = note + f"{done} rows finished are in <code>.result</code>."
        elif cancelled:
            self.status.value = (
                f"Cancelled after {done} of {len(self.frame)} rows; they are in <code>.result</code>. "
                "Run again to continue: finished answers are reused."
            )
        self.run_button.disabled, self.cancel_button.disabled = False, True

    async def _tick(self, stats: BatchStats) -> None:
        """Redraw while no row finishes (a pause after a 429, slow answers): the state, not a frozen bar."""
        while True:
            await asyncio.sleep(1.0)
            self._draw(stats, force=True)

    def _draw(self, stats: BatchStats, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_draw < 0.25 and stats.done != stats.total:
            return
        self._last_draw = now
        total = stats.total or 1
        self.progress.value = stats.done
        self.progress.description = f"{100 * stats.done // total}%"
        state = stats.pacer_state()
        rate = stats.done / stats.elapsed if stats.elapsed > 0 else 0
        if state is not None and state.pace:  # rows still to send go at the pace, whatever came before
            rate = min(rate, state.pace / 60) if rate else state.pace / 60
        eta = f"{(total - stats.done) / rate:.0f}s" if rate and stats.done < total else "—"
        self.status.value = html.escape(
            f"{stats.done}/{total} rows · ok {stats.ok} · skipped {stats.skipped} · failed {stats.failed} · "
            f"429s {stats.rate_limited} · ETA {eta}" + (f" · {state.describe()}" if state is not None else ""),
            quote=False,
        )
        recent = self._rows[-5:]
        if recent:
            start = len(self._rows) - len(recent)
            rows = "".join(
                f"<tr><td>{start + i}</td><td>{r.status}</td><td>{html.escape((r.summary or r.message or '')[:160])}</td></tr>"
                for i, r in enumerate(recent)
            )
            self.preview.value = (
                f"<table class='batchsum-preview'><tr><th>row</th><th>status</th><th>summary</th></tr>{rows}</table>"
            )


def _text_columns(frame: pd.DataFrame) -> list[Any]:
    """Columns holding strings, the wordiest first (judged on a sample)."""
    sample = frame.head(200)
    scored = []
    for column in frame.columns:
        values = [v for v in sample[column].tolist() if isinstance(v, str)]
        if values:
            scored.append((-sum(contract.count_words(v) for v in values) / len(values), str(column), column))
    return [column for *_, column in sorted(scored)]


def make_widget(data: Any = None, **options: Any) -> TextApp | FrameApp:
    """``TextApp`` for no data, ``FrameApp`` for a DataFrame."""
    if data is None:
        return TextApp(**options)
    if isinstance(data, pd.DataFrame):
        return FrameApp(data, **options)
    raise TypeError(f"batchsum.widget() takes a pandas DataFrame or nothing, not {type(data).__name__}")
