"""The notebook apps (ipywidgets): ``batchsum.widget()`` summarizes one text, ``batchsum.widget(df)``
runs a DataFrame column through the engine with live progress, a preview and a Cancel button.

Work runs on its own event loop in a background thread (``run.background.BackgroundRun``), so the
notebook stays responsive; ``app.wait()`` waits for it (tests).

The apps live by idea: ``text_app`` (one text), ``frame_app`` (a DataFrame, shown by
``run_view``), ``table`` (the rows of a run), ``controls`` (what both apps share) and ``summary``
(a summary as HTML); this module chooses the app and names them all.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

try:
    import ipywidgets  # noqa: F401  (every app is drawn with it)
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the widget needs the 'notebook' extra: pip install 'batchsum[notebook]'") from exc

from .controls import FORMATS as FORMATS
from .controls import MODES as MODES
from .controls import explain as explain
from .frame_app import FrameApp as FrameApp
from .summary import render_summary as render_summary
from .table import STATUSES as STATUSES
from .table import ResultTable as ResultTable
from .text_app import TextApp as TextApp

__all__ = ["TextApp", "FrameApp", "ResultTable", "make_widget", "explain", "render_summary"]


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
