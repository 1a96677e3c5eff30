"""The one-text app (``batchsum.widget()``): a text with its word count, the request controls,
Summarize, and the summary to read and copy."""

from __future__ import annotations

import html

import ipywidgets as w

from ..run.background import BackgroundRun
from ..run.run import bind
from ..run.spec import RunSpec
from ..service import contract
from ..service.client import AsyncClient
from ..service.errors import BatchsumError
from .controls import FULL, STYLE, App, explain, field, grid
from .summary import copy_button, render_summary

__all__ = ["TextApp"]


class TextApp(App):
    """One text: a word count that says whether it fits, model, length, format, Summarize (only for
    a text the service would take); the summary labelled, with a Copy button. Options as ``App``."""

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
                w.HTML(STYLE),
                grid(
                    field("Text", w.VBox([self.text, self.count], layout=FULL)),
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
                f"<div class='batchsum-result'><b>Summary</b> {copy_button(self.summary)}"
                f"{render_summary(self.summary, kind)}</div>"
            )
            self.message.value = ""
        except BatchsumError as exc:
            self._failed(exc)
            return
        self._busy = False
        self._count()
