"""The stable path of the notebook apps: ``batchsum.widgets``. The code lives in
``batchsum.app.widgets``; these are the same objects, under the names it exports. Needs the
``notebook`` extra."""

from .app.widgets import (
    FrameApp,
    ResultTable,
    TextApp,
    explain,
    make_widget,
    render_summary,
)

__all__ = [
    "TextApp",
    "FrameApp",
    "ResultTable",
    "make_widget",
    "explain",
    "render_summary",
]
