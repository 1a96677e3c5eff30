"""The controls both notebook apps share: model, length and format with the connection settings,
made into a ``RunSpec`` at every click (``App``); the grid they are laid out in; an error in words.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as w

from ..run.background import BackgroundRun
from ..run.spec import RunSpec
from ..service import contract
from ..service.errors import explain as explain_error
from ..service.retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from ..service.settings import check_params

__all__ = ["FORMATS", "FULL", "MODES", "STYLE", "App", "explain", "field", "grid"]

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


STYLE = """<style>
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

FULL = w.Layout(width="100%")


def field(label: str, control: w.Widget, help_text: str = "") -> list[w.Widget]:
    """A row of the app's grid: a label, the control, and a line of help under it."""
    control.description = ""
    control.layout.width = "100%"
    cell: w.Widget = control
    if help_text:
        cell = w.VBox([control, w.HTML(f"<span class='batchsum-help'>{html.escape(help_text)}</span>")], layout=FULL)
    return [w.HTML(f"<b>{html.escape(label)}</b>", layout=w.Layout(padding="4px 0 0 0")), cell]


def grid(*rows: list[w.Widget]) -> w.GridBox:
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


class App:
    """What both apps share: the request controls (set from ``mode``, ``percentage``, ``type``) and
    the connection settings, made into a ``RunSpec`` at every click."""

    def __init__(
        self,
        *,
        mode: Any = 1,
        percentage: Any = contract.PERCENTAGE_DEFAULT,
        type: Any = None,
        api_key: str | list[str] | None = None,
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
        ).replace(door="notebook")

    def _request_fields(self) -> list[list[w.Widget]]:
        return [
            field("Model", self.mode, "Standard: the smaller, faster model. Advanced: the full model (premium plans)."),
            field("Length", self.length, "1 shortest to 6 longest."),
            field("Format", self.format, "Default: a plain summary; headings & points, bullets, or the best line."),
        ]

    def wait(self, timeout: float | None = 60) -> None:
        """Wait for the work started by the last click (for tests and scripts)."""
        if self._run is not None:
            self._run.wait(timeout)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.box._repr_mimebundle_(**kwargs)
