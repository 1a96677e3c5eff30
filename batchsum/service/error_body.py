"""What an error answer says (message, type, body), in any shape the service or a proxy may send:
shape A ``{"error"}``, shape B ``{"type", "message"}``, FastAPI's ``{"detail"}``, HTML, nothing, cut JSON."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .redact import redact, redact_value

__all__ = ["read_error_body"]

_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_TAGS = re.compile(r"<[^>]+>")
_REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _detail_text(detail: Any) -> str:
    """FastAPI's ``detail``: a string, or a list of ``{"loc": [...], "msg": "..."}``."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, Mapping):
                loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
                msg = str(item.get("msg", "invalid"))
                parts.append(f"{loc}: {msg}" if loc else msg)
            else:
                parts.append(str(item))
        return "Validation Error: " + "; ".join(parts) if parts else "Validation Error"
    return json.dumps(detail)


def read_error_body(
    status_code: int, content: bytes, content_type: str = "", secrets: Iterable[str] = ()
) -> tuple[str, str | None, Any]:
    """(message, error type, body) from an error answer of any shape the service or a proxy may send.

    ``secrets`` (the API key: a service or proxy may echo the Authorization header) are taken out
    of the raw text before it is parsed, cut or escaped, and again out of what is made of it."""
    secrets = tuple(secrets)
    message, error_type, body = _read_error_body(
        status_code, redact(content.decode("utf-8", errors="replace"), secrets), content_type
    )
    return redact(message, secrets), error_type, redact_value(body, secrets)


def _read_error_body(status_code: int, text: str, content_type: str) -> tuple[str, str | None, Any]:
    reason = _REASONS.get(status_code, f"HTTP {status_code}")
    text = text.strip()
    if not text:
        return f"{reason} (empty body)", None, None
    looks_html = "html" in content_type.lower() or text[:1] == "<"
    if not looks_html:
        try:
            body = json.loads(text)
        except ValueError:
            return f"{reason} (unreadable body: {_one_line(text, 80)!r})", None, text
        if isinstance(body, Mapping):
            error_type = body.get("type") if isinstance(body.get("type"), str) else None
            if isinstance(body.get("message"), str):  # shape B
                return body["message"], error_type, body
            if "error" in body:  # shape A, sometimes with a nested object
                error = body["error"]
                if isinstance(error, Mapping):
                    return str(error.get("message", json.dumps(error))), error.get("type"), body
                return str(error), error_type, body
            if "detail" in body:  # FastAPI
                return _detail_text(body["detail"]), error_type, body
        return f"{reason}: {_one_line(json.dumps(body), 120)}", None, body
    title = _TITLE.search(text)
    page = html.unescape(title.group(1) if title else _TAGS.sub(" ", text))
    return f"{reason} (HTML page from the server or a proxy: {_one_line(page, 80)!r})", None, text
