"""The notebook apps (ipywidgets): ``batchsum.widget()`` summarizes one text, ``batchsum.widget(df)``
runs a DataFrame column through the engine with live progress, a preview and a Cancel button.

Work runs on its own event loop in a background thread (``run.background.BackgroundRun``), so the
notebook stays responsive; ``app.wait()`` waits for it (tests).
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd

try:
    import ipywidgets as w
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the widget needs the 'notebook' extra: pip install 'batchsum[notebook]'") from exc

from ..data.csvsafe import neutralize_frame
from ..data.results import RowResult, check_columns, join_results
from ..run.background import BackgroundRun
from ..run.report import BatchStats
from ..run.run import Run, bind
from ..run.spec import DEFAULT_MAX_WAIT, RunSpec, check_params, check_rate, describe_rate, document_options
from ..service import contract
from ..service.client import AsyncClient
from ..service.errors import (
    BatchsumError,
)
from ..service.errors import explain as explain_error
from ..service.retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT

__all__ = ["TextApp", "FrameApp", "ResultTable", "make_widget", "explain", "render_summary"]

# "default" rather than None: a Dropdown shows a None value as no selection at all.
FORMATS = [
    ("Default", "default"),
    ("Headings & points", "summary_2"),
    ("Bullets", "bullets"),
    ("Best line", "best_line"),
]
MODES = [("Standard", 1), ("Advanced", 2)]


def explain(error: BaseException) -> str:
    """The error in plain words, with what to do about it (``errors.explain``, as a sentence)."""
    words = explain_error(error)
    return words[:1].upper() + words[1:] + "."


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


_STYLE = """<style>
.batchsum-app { max-width: 1000px; box-sizing: border-box; }
.batchsum-app .batchsum-help { color: var(--jp-ui-font-color2, #666); font-size: 90%; }
.batchsum-table { border-collapse: collapse; width: 100%; table-layout: fixed; font-size: 90%; }
.batchsum-table th, .batchsum-table td { border-bottom: 1px solid var(--jp-border-color2, #ddd);
  padding: 4px 6px; text-align: left; vertical-align: top; overflow-wrap: anywhere; }
.batchsum-table th { color: var(--jp-ui-font-color1, inherit); }
.batchsum-badge { display: inline-block; padding: 1px 8px; border-radius: 9px; color: #fff; font-size: 85%; }
.batchsum-badge.ok { background: #2e7d32; } .batchsum-badge.skipped { background: #6d6d6d; }
.batchsum-badge.failed { background: #c62828; }
.batchsum-table details summary { cursor: pointer; }
.batchsum-error { color: #e53935; }
</style>"""

_FULL = w.Layout(width="100%")


def _field(label: str, control: w.Widget, help_text: str = "") -> list[w.Widget]:
    """A row of the app's grid: a label, the control, and a line of help under it."""
    control.description = ""
    control.layout.width = "100%"
    cell: w.Widget = control
    if help_text:
        cell = w.VBox([control, w.HTML(f"<span class='batchsum-help'>{html.escape(help_text)}</span>")], layout=_FULL)
    return [w.HTML(f"<b>{html.escape(label)}</b>", layout=w.Layout(padding="4px 0 0 0")), cell]


def _grid(*rows: list[w.Widget]) -> w.GridBox:
    """Labels and controls lined up in two columns, as wide as the notebook column (never wider)."""
    return w.GridBox(
        [cell for row in rows for cell in row],
        layout=w.Layout(
            grid_template_columns="minmax(90px, max-content) minmax(0, 1fr)",
            grid_gap="6px 12px",
            width="100%",
            max_width="1000px",
        ),
    )


class _App:
    """What both apps share: the request controls (set from ``mode``, ``percentage``, ``type``) and
    the connection settings, made into a ``RunSpec`` at every click."""

    def __init__(
        self,
        *,
        mode: Any = 1,
        percentage: Any = contract.PERCENTAGE_DEFAULT,
        type: Any = None,
        api_key: str | None = None,
        base_url: str | None = None,
        local: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        encoding: str = "json",
    ) -> None:
        params = check_params(mode, percentage, type)  # validated before anything is drawn
        self._connection: dict[str, Any] = {"api_key": api_key, "base_url": base_url, "local": local}
        self._client_options: dict[str, Any] = {"timeout": timeout, "max_retries": max_retries, "encoding": encoding}
        self.mode = w.ToggleButtons(options=MODES, value=int(params.mode))
        self.length = w.IntSlider(value=params.percentage, min=contract.PERCENTAGE_MIN, max=contract.PERCENTAGE_MAX)
        self.format = w.Dropdown(options=FORMATS, value=params.type.value if params.type else "default")
        self._run: BackgroundRun | None = None
        self.box: w.Box
        self._build()

    def _build(self) -> None:
        """Make the app's own controls and its box."""
        raise NotImplementedError

    def _spec(self, **options: Any) -> RunSpec:
        """The run as the controls and the settings say now."""
        kind = None if self.format.value == "default" else self.format.value
        return RunSpec.from_kwargs(
            self.mode.value, self.length.value, kind, **self._connection, **self._client_options, **options
        )

    def _request_fields(self) -> list[list[w.Widget]]:
        return [
            _field(
                "Model", self.mode, "Standard: the smaller, faster model. Advanced: the full model (premium plans)."
            ),
            _field("Length", self.length, "1 shortest to 6 longest."),
            _field("Format", self.format, "Default: a plain summary; headings & points, bullets, or the best line."),
        ]

    def wait(self, timeout: float | None = 60) -> None:
        """Wait for the work started by the last click (for tests and scripts)."""
        if self._run is not None:
            self._run.wait(timeout)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.box._repr_mimebundle_(**kwargs)


def _copy_button(text: str) -> str:
    """A button that copies ``text`` to the clipboard, in the browser (the kernel cannot)."""
    payload = html.escape(json.dumps(text), quote=True)
    return (
        f"<button class='batchsum-copy jupyter-button' data-text=\"{payload}\" "
        'onclick="navigator.clipboard.writeText(JSON.parse(this.dataset.text)).then('
        "() => { this.textContent = 'Copied'; })\">Copy</button>"
    )


class TextApp(_App):
    """One text: a word count that says whether it fits, model, length, format, Summarize (only for
    a text the service would take); the summary labelled, with a Copy button. Options as ``_App``."""

    def _build(self) -> None:
        self.text = w.Textarea(placeholder="Paste a text of 10 to 5000 words", rows=10, layout=w.Layout(width="100%"))
        self.count = w.HTML()
        self.button = w.Button(description="Summarize", button_style="primary", icon="compress")
        self.result = w.HTML()
        self.message = w.HTML()
        self.summary: str | None = None
        self.error: BaseException | None = None
        self.text.observe(lambda _: self._count(), names="value")
        self.button.on_click(lambda _: self.summarize())
        self._busy = False
        self._count()
        self.box = w.VBox(
            [
                w.HTML(_STYLE),
                _grid(
                    _field("Text", w.VBox([self.text, self.count], layout=_FULL)),
                    *self._request_fields(),
                    [w.HTML(""), self.button],
                ),
                self.message,
                self.result,
            ],
            layout=w.Layout(width="100%", max_width="1000px"),
        )
        self.box.add_class("batchsum-app")
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
        self.count.value = f"<span class='batchsum-count' style='color:{color}'>{words} words: {note}</span>"
        self.button.disabled = self._busy or not ok
        self.button.tooltip = "" if ok else f"The service takes {contract.MIN_WORDS} to {contract.MAX_WORDS} words"

    def summarize(self) -> None:
        """What the button does: summarize on a background thread and show the result."""
        self._busy = True
        self.button.disabled = True
        self.message.value = "<i>Summarizing…</i>"
        self.result.value = ""
        self.summary, self.error = None, None
        try:
            spec = bind(self._spec())
        except BatchsumError as exc:
            self._failed(exc)
            return
        self._run = BackgroundRun(lambda: self._work(self.text.value, spec))

    def _failed(self, exc: BaseException) -> None:
        self.error = exc
        self.message.value = f"<span class='batchsum-error'>{html.escape(explain(exc), quote=False)}</span>"
        self._busy = False
        self._count()

    async def _work(self, text: str, spec: RunSpec) -> None:
        kind = spec.params.type.value if spec.params.type else None
        try:
            async with AsyncClient(**spec.client.client_kwargs()) as client:
                self.summary = await client.summarize(text, *spec.params)
            self.result.value = (
                f"<div class='batchsum-result'><b>Summary</b> {_copy_button(self.summary)}"
                f"{render_summary(self.summary, kind)}</div>"
            )
            self.message.value = ""
        except BatchsumError as exc:
            self._failed(exc)
            return
        self._busy = False
        self._count()


STATUSES = [("All", "all"), ("OK", "ok"), ("Skipped", "skipped"), ("Failed", "failed")]


def _excerpt(text: str, limit: int = 140) -> str:
    """The start of ``text`` cut at a word, with an ellipsis when cut."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return flat[:limit].rsplit(" ", 1)[0] + "…"


class ResultTable:
    """The rows of a run, a page at a time: the chosen id column, the status as a badge, the message
    in its own column, a summary's start that opens to the whole summary; a filter by status;
    buttons that save the result as Parquet or CSV. A summary longer than its start is a closed
    ``<details>``: closed, it shows the start; opened, the whole summary once (the start gives way
    to "hide"); a short summary is shown whole, with nothing to open."""

    PAGE_ROWS = 15
    # The start and the whole summary are never shown together: an opened summary reads once.
    STYLE = (
        "<style>"
        ".batchsum-table details[open] > summary .batchsum-excerpt,"
        " .batchsum-table details:not([open]) > summary .batchsum-hide { display: none; }"
        " .batchsum-table .batchsum-hide { color: var(--jp-ui-font-color2, #666); font-size: 90%; }"
        "</style>"
    )

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame
        self.rows: list[RowResult] = []
        self.kind: str | None = None
        self.result: pd.DataFrame | None = None
        self.page = 0
        columns = [(str(c), c) for c in frame.columns]
        # "" rather than None: a Dropdown shows a None value as no selection at all.
        self.id_column = w.Dropdown(options=[("Row number", ""), *columns], value="")
        self.filter = w.ToggleButtons(options=STATUSES, value="all")
        self.previous = w.Button(description="Previous", icon="chevron-left", layout=w.Layout(width="auto"))
        self.next = w.Button(description="Next", icon="chevron-right", layout=w.Layout(width="auto"))
        self.where = w.HTML()
        self.table = w.HTML(layout=_FULL)
        self.path = w.Text(value="summaries", layout=w.Layout(width="100%"))
        self.save_parquet = w.Button(
            description="Save Parquet",
            icon="download",
            disabled=True,
            layout=w.Layout(width="auto", min_width="max-content"),
        )
        self.save_csv = w.Button(
            description="Save CSV",
            icon="download",
            disabled=True,
            layout=w.Layout(width="auto", min_width="max-content"),
        )
        self.saved = w.HTML()
        self.id_column.observe(lambda _: self.draw(), names="value")
        self.filter.observe(lambda _: self.turn(0, absolute=True), names="value")
        self.previous.on_click(lambda _: self.turn(-1))
        self.next.on_click(lambda _: self.turn(1))
        self.save_parquet.on_click(lambda _: self.save("parquet"))
        self.save_csv.on_click(lambda _: self.save("csv"))
        self.box = w.VBox(
            [
                _grid(
                    _field("Show", self.filter),
                    _field("Id column", self.id_column),
                    _field(
                        "Save as",
                        w.HBox([self.path, self.save_parquet, self.save_csv], layout=_FULL),
                        "A file name; .parquet or .csv is added.",
                    ),
                ),
                self.saved,
                w.HBox([self.previous, self.where, self.next], layout=w.Layout(align_items="center", grid_gap="8px")),
                self.table,
            ],
            layout=_FULL,
        )
        self.box.add_class("batchsum-results")

    def show(self, rows: list[RowResult], kind: str | None, result: pd.DataFrame | None = None) -> None:
        self.rows, self.kind, self.result = rows, kind, result
        self.save_parquet.disabled = self.save_csv.disabled = result is None
        self.draw()

    def matching(self) -> list[int]:
        wanted = self.filter.value
        return [i for i, row in enumerate(self.rows) if wanted == "all" or row.status == wanted]

    def turn(self, step: int, *, absolute: bool = False) -> None:
        self.page = step if absolute else self.page + step
        self.draw()

    def draw(self) -> None:
        chosen = self.matching()
        pages = max(1, -(-len(chosen) // self.PAGE_ROWS))
        self.page = min(max(0, self.page), pages - 1)
        shown = chosen[self.page * self.PAGE_ROWS : (self.page + 1) * self.PAGE_ROWS]
        self.previous.disabled = self.page == 0
        self.next.disabled = self.page >= pages - 1
        self.where.value = f"page {self.page + 1} of {pages} · {len(chosen)} rows"
        ids = self.frame[self.id_column.value] if self.id_column.value != "" else None
        head = "<tr><th style='width:14%'>{}</th><th style='width:11%'>status</th><th>summary</th><th style='width:24%'>message</th></tr>"
        body = []
        for i in shown:
            row = self.rows[i]
            ident = html.escape(str(ids.iloc[i])) if ids is not None else str(i)
            badge = f"<span class='batchsum-badge {row.status}'>{row.status}</span>"
            summary = ""
            if row.summary:
                start, whole = _excerpt(row.summary), render_summary(row.summary, self.kind)
                summary = (
                    whole
                    if start == " ".join(row.summary.split())  # nothing more to open
                    else (
                        f"<details><summary><span class='batchsum-excerpt'>{html.escape(start)}</span>"
                        f"<span class='batchsum-hide'>hide</span></summary>{whole}</details>"
                    )
                )
            message = html.escape(row.message or "") + (f" <code>{html.escape(row.error)}</code>" if row.error else "")
            body.append(
                f"<tr class='batchsum-row'><td>{ident}</td><td>{badge}</td><td>{summary}</td><td>{message}</td></tr>"
            )
        label = html.escape(str(self.id_column.value)) if self.id_column.value != "" else "row"
        self.table.value = f"{self.STYLE}<table class='batchsum-table'>{head.format(label)}{''.join(body)}</table>"

    def save(self, format: str) -> Path | None:
        """Write the result next to the notebook (``Save Parquet`` / ``Save CSV``)."""
        if self.result is None:
            return None
        name = self.path.value.strip() or "summaries"
        path = Path(name if name.endswith(f".{format}") else f"{name}.{format}").resolve()
        try:
            if format == "parquet":
                self.result.to_parquet(path)
            else:
                added = [c for c in self.result.columns if c not in self.frame.columns]  # the run's columns
                neutralize_frame(self.result, added).to_csv(path, index=False)
        except (OSError, ValueError) as exc:
            self.saved.value = (
                f"<span class='batchsum-error'>Could not save {html.escape(str(path))}: {html.escape(str(exc))}</span>"
            )
            return None
        self.saved.value = f"Saved {len(self.result)} rows to <code>{html.escape(str(path))}</code>."
        return path


class FrameApp(_App):
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
        api_key: str | None = None,
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
        progress: bool = False,
        long_texts: str = "skip",
        max_wait: float = DEFAULT_MAX_WAIT,
        max_requests: int | None = None,
        sample: int | None = None,
        share: float = 1.0,
        report: str | os.PathLike[str] | None = None,
    ) -> None:
        """The app for ``frame``: the request controls start at ``mode``, ``percentage`` and ``type``,
        "Per minute" at ``rpm`` (``$BATCHSUM_RPM`` or 60; 0 with the local service); the other
        options are the run's, as for ``df.batchsum.summarize``. ``progress``: a tqdm bar as well as
        the app's own."""
        self.frame = frame
        spec = RunSpec.from_options(locals())  # every option checked before anything is drawn
        self._run_options: dict[str, Any] = {
            "output_column": output_column,
            "concurrency": concurrency,
            "limiter": limiter,
            "budget": budget,
            "journal": journal,
            "progress": progress,
            "max_wait": max_wait,
            "long_texts": long_texts,
            "max_requests": max_requests,
            "sample": sample,
            "share": share,
            "report": report,
        }
        self._output_column = spec.output_column
        rate = describe_rate(spec.rpm, spec.auto)
        self._default_rpm = f"{rate:g}" if isinstance(rate, float) else rate
        super().__init__(
            mode=mode,
            percentage=percentage,
            type=type,
            api_key=api_key,
            base_url=base_url,
            local=local,
            timeout=timeout,
            max_retries=max_retries,
            encoding=encoding,
        )

    def _build(self) -> None:
        from .chart import RunChart

        frame = self.frame
        text_columns = _text_columns(frame)
        self.column = w.Dropdown(options=text_columns or list(frame.columns))
        self.rpm = w.Text(value=self._default_rpm, layout=w.Layout(width="12em"))
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.cancel_button = w.Button(description="Cancel", icon="stop", disabled=True)
        self.progress = w.IntProgress(value=0, min=0, max=max(1, len(frame)), layout=w.Layout(width="100%"))
        self.status = w.HTML(layout=_FULL)
        self.chart = RunChart()
        self.table = ResultTable(frame)
        self.result: pd.DataFrame | None = None
        self.error: BaseException | None = None
        self._kind: str | None = None
        self._rows: list[RowResult] = []
        self._last_draw = 0.0
        self._last_chart = 0.0
        self.run_button.on_click(lambda _: self.run())
        self.cancel_button.on_click(lambda _: self.cancel())
        self.box = w.VBox(
            [
                w.HTML(_STYLE),
                _grid(
                    _field("Column", self.column, "The column holding the texts."),
                    *self._request_fields(),
                    _field(
                        "Per minute",
                        self.rpm,
                        "Requests per minute your plan allows (0 = no limit), or auto to find it (auto:N: at most N).",
                    ),
                    [w.HTML(""), w.HBox([self.run_button, self.cancel_button])],
                    _field("Progress", self.progress),
                ),
                self.status,
                self.chart.widget,
                self.table.box,
            ],
            layout=w.Layout(width="100%", max_width="1000px"),
        )
        self.box.add_class("batchsum-app")
        self.box.add_class("batchsum-frame-app")

    def run(self) -> None:
        """What Run does: summarize the chosen column on a background thread."""
        self.result, self.error, self._rows = None, None, []
        try:
            check_columns(self.frame.columns, self.column.value, self._output_column)
            spec = self._spec(rpm=_rate_field(self.rpm.value), **self._run_options)
        except BatchsumError as exc:
            self.error = exc
            self.status.value = f"<span class='batchsum-error'>{html.escape(str(exc))}</span>"
            return
        self.run_button.disabled, self.cancel_button.disabled = True, False
        self.status.value = "<i>Starting…</i>"
        self._kind = spec.params.type.value if spec.params.type else None
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
            async with Run(spec, stats=stats, on_result=self._draw) as run:
                async for result in run.stream(texts):
                    self._rows.append(result)
        except asyncio.CancelledError:  # Cancel: the engine has kept what finished
            cancelled = True
        except BatchsumError as exc:
            self.error = exc
        finally:
            ticker.cancel()
        done = len(self._rows)
        self.result = join_results(self.frame.iloc[:done], self._rows, self._output_column)
        self.result.attrs["batchsum"] = stats.record()
        self._draw(stats, force=True)
        self.table.show(self._rows, self._kind, self.result)
        if self.error is not None:
            note = f"<span class='batchsum-error'>{html.escape(explain(self.error), quote=False)}</span> "
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
        words = [
            f"{stats.done}/{total} rows",
            f"ok {stats.ok}",
            f"skipped {stats.skipped}",
            f"failed {stats.failed}",
            f"429s {stats.rate_limited}",
            f"ETA {eta}",
        ]
        line = " · ".join(words) + (f" · {state.describe()}" if state is not None else "")
        changes = stats.pacer.changes[-1:] if stats.pacer is not None else []
        self.status.value = html.escape(line, quote=False) + "".join(
            f"<br><span class='batchsum-help'>{html.escape(str(change))}</span>" for change in changes
        )
        if stats.timeline is not None and (force or now - self._last_chart >= 1.0 or stats.done == stats.total):
            self._last_chart = now
            self.chart.update(stats.timeline.to_dict(), stats.total)
            self.table.show(self._rows, self._kind)


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
    app: TextApp | FrameApp
    if data is None:
        app = TextApp(**options)
    elif isinstance(data, pd.DataFrame):
        app = FrameApp(data, **options)
    else:
        raise TypeError(f"batchsum.widget() takes a pandas DataFrame or nothing, not {type(data).__name__}")
    return app


def _rate_field(value: str) -> float | str:
    """The "Per minute" field as the run takes it: a number, or ``auto`` / ``auto:N`` as typed."""
    rate, auto = check_rate(value, "rpm", text=True)
    return value.strip() if auto else rate
