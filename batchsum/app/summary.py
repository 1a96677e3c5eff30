"""How a summary reads in the apps: as HTML (headings, a list, a quote), its start cut at a word,
and a button that copies it in the browser."""

from __future__ import annotations

import html
import json

__all__ = ["copy_button", "excerpt", "render_summary"]


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


def copy_button(text: str) -> str:
    """A button that copies ``text`` to the clipboard, in the browser (the kernel cannot)."""
    payload = html.escape(json.dumps(text), quote=True)
    return (
        f"<button class='batchsum-copy jupyter-button' data-text=\"{payload}\" "
        'onclick="navigator.clipboard.writeText(JSON.parse(this.dataset.text)).then('
        "() => { this.textContent = 'Copied'; })\">Copy</button>"
    )


def excerpt(text: str, limit: int = 140) -> str:
    """The start of ``text`` cut at a word, with an ellipsis when cut."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return flat[:limit].rsplit(" ", 1)[0] + "…"
