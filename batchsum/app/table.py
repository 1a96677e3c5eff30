"""The rows of a run in the DataFrame app: a page at a time, filtered by status, named by an id
column, and saved as Parquet or CSV next to the notebook."""

from __future__ import annotations

import html
from pathlib import Path

import ipywidgets as w
import pandas as pd

from ..data.csvsafe import neutralize_frame
from ..data.results import RowResult
from .controls import FULL, field, grid
from .summary import excerpt, render_summary

__all__ = ["STATUSES", "ResultTable"]

STATUSES = [("All", "all"), ("OK", "ok"), ("Skipped", "skipped"), ("Failed", "failed")]


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
        self.table = w.HTML(layout=FULL)
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
                grid(
                    field("Show", self.filter),
                    field("Id column", self.id_column),
                    field(
                        "Save as",
                        w.HBox([self.path, self.save_parquet, self.save_csv], layout=FULL),
                        "A file name; .parquet or .csv is added.",
                    ),
                ),
                self.saved,
                w.HBox([self.previous, self.where, self.next], layout=w.Layout(align_items="center", grid_gap="8px")),
                self.table,
            ],
            layout=FULL,
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
                start, whole = excerpt(row.summary), render_summary(row.summary, self.kind)
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
