"""The exception tree, and the mapping from an HTTP answer to the exception it means.

    BatchsumError
    ├── ConfigurationError             no key, a key over plain http to a remote host, a bad base URL
    ├── InputError                     (also a ValueError) a missing column, an unreadable file, ...
    │   └── BrokenInputError           an input that broke after rows were read: the run stops there
    ├── JournalError                   the journal cannot be written or read: the run stops
    ├── BudgetError                    the shared rate budget cannot be used (unreachable, bad URL)
    ├── InvalidParameterError          (also a ValueError) refused locally, nothing was sent
    │   └── InvalidTextError           the text is outside the word limits; .reason: empty|too_short|too_long
    └── APIError                       something went wrong talking to the service
        ├── APIConnectionError         connection refused, dropped, reset       code "connection_error"
        │   └── APITimeoutError        no answer in time                        code "timeout"
        ├── APIResponseValidationError a 200 whose body is not {"result": str}  code "bad_response"
    │                              (.transient: cut short or undecodable, retried; else permanent)
        └── APIStatusError             any non-200 answer; .status_code .message .type .body
            ├── AuthenticationError    401 incorrect API key provided           code "invalid_api_key"
            ├── NotPremiumError        401 you are not premium for this request code "not_premium"
            ├── UnprocessableEntityError 422 invalid parameters                 code "unprocessable"
            │   ├── TextTooShortError  422 the text is too short
            │   └── TextTooLongError   422 the text exceeds the word limit
            ├── RateLimitError         429; .retry_after in seconds or None      code "rate_limited"
            └── ServerError            5xx, HTML error pages from proxies       code "server_error"

Every ``APIError`` has a ``code`` (the per-row error code of batch results) and ``attempts``.
Error bodies come in many shapes (interface shape A ``{"error"}``, shape B ``{"type", "message"}``,
FastAPI's ``{"detail"}``, an HTML page, nothing, truncated JSON); ``error_from_response`` reads them all.

Redaction lives here too, once. ``redact`` takes secrets (the API key) out of a text in whole or in
part, whatever shape the text gives them (raw, JSON or percent or HTML escaped, split by white space,
cut short); it runs on an answer's raw text before anything parses, cuts or escapes it, and again on
every text made from it. ``redact_location`` takes credentials (user and password, presigned query
parameters) out of an input or output location before it is shown or stored.
"""

from __future__ import annotations

import functools
import html
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

from .contract import SkipReason
from .rate_headers import RateStatement

__all__ = [
    "BatchsumError",
    "ConfigurationError",
    "InputError",
    "BrokenInputError",
    "JournalError",
    "BudgetError",
    "RequestCapReached",
    "InvalidParameterError",
    "InvalidTextError",
    "APIError",
    "APIConnectionError",
    "APITimeoutError",
    "APIResponseValidationError",
    "APIStatusError",
    "AuthenticationError",
    "NotPremiumError",
    "UnprocessableEntityError",
    "TextTooShortError",
    "TextTooLongError",
    "RateLimitError",
    "ServerError",
    "error_from_response",
    "read_error_body",
    "redact",
    "redact_value",
    "redact_location",
    "location_secrets",
    "REDACTED",
    "FRAGMENT",
    "explain",
    "one_line",
]


class BatchsumError(Exception):
    """Root of every error batchsum raises on purpose."""


class ConfigurationError(BatchsumError):
    """The client cannot be used as configured (no key, insecure URL, ...). Nothing was sent."""


class InputError(BatchsumError, ValueError):
    """The input cannot be used: a missing column, an unreadable or non-Parquet file, a bad path."""


class BrokenInputError(InputError):
    """An input that could be opened broke while it was read (a corrupt row group after good ones):
    the run stops as any stop does, keeping what was answered and writing the rows finished so far."""


class JournalError(BatchsumError):
    """The journal cannot be written (disk full, I/O error) or read (damaged): the run stops, answers
    already received are kept in memory and in the output, and nothing new is sent."""


class RequestCapReached(BatchsumError):
    """The run sent the paid requests its cap allows (``max_requests``): it stops as any stop does
    (nothing new starts, answers on the wire are kept, every row gets a record, the unsent ones
    ``failed`` with ``not_sent``); the same run again continues where it stopped."""

    def __init__(self, cap: int, remaining: int | None = None) -> None:
        self.cap = cap
        self.remaining = remaining
        super().__init__(self._text())

    def _text(self) -> str:
        left = f"; {self.remaining} rows remain" if self.remaining is not None else ""
        return f"the request cap of {self.cap} paid requests was reached{left}"

    def with_remaining(self, remaining: int) -> RequestCapReached:
        """The same stop, now that the rows left unsent are counted."""
        self.remaining = remaining
        self.args = (self._text(),)
        return self


class BudgetError(BatchsumError):
    """The rate budget cannot be used: an unknown URL scheme, an unreachable Redis, a cache folder
    that cannot be written. Raised before anything is sent; mid-run it stops the run (answers kept)."""


class InvalidParameterError(BatchsumError, ValueError):
    """A parameter the interface does not allow. Raised before anything is sent."""


class InvalidTextError(InvalidParameterError):
    """The text is empty or outside the word limits; ``reason`` is a ``SkipReason``."""

    def __init__(self, reason: SkipReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class APIError(BatchsumError):
    """Talking to the service failed. ``code`` names the kind; ``attempts`` how many were made."""

    code = "api_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.attempts = 1
        self.rate_limit: RateStatement | None = None  # what the answer's rate-limit headers state, if anything


class APIConnectionError(APIError):
    """The connection failed or was dropped before a whole answer arrived."""

    code = "connection_error"


class APITimeoutError(APIConnectionError):
    """No answer within the timeout."""

    code = "timeout"


class APIResponseValidationError(APIError):
    """The service said 200 but the body is not the ``{"result": "..."}`` the interface promises.

    ``transient``: the body was cut short or could not be decoded, so trying again may succeed. A
    well-formed answer that breaks the contract (no ``result``, not a text, too large) is not
    transient: it was paid for, and asking again would pay again for the same answer.
    """

    code = "bad_response"

    def __init__(self, message: str, *, body: str | None = None, transient: bool = True) -> None:
        super().__init__(message)
        self.body = body
        self.transient = transient


class APIStatusError(APIError):
    """The service answered with a non-200 status."""

    code = "http_error"

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        type: str | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.type = type
        self.body = body

    def __str__(self) -> str:
        return f"{self.status_code}: {self.message}"


class AuthenticationError(APIStatusError):
    """401: the API key is invalid or missing. Get the key from the service's "My Account" page."""

    code = "invalid_api_key"


class NotPremiumError(APIStatusError):
    """401: the plan does not allow this request (e.g. mode 2) or has expired."""

    code = "not_premium"


class UnprocessableEntityError(APIStatusError):
    """422: the service refused the parameters or the text."""

    code = "unprocessable"


class TextTooShortError(UnprocessableEntityError):
    """422: the text has fewer words than the service needs."""


class TextTooLongError(UnprocessableEntityError):
    """422: the text exceeds the service's word limit."""


class RateLimitError(APIStatusError):
    """429: the plan's per-minute limit was exceeded. ``retry_after``: seconds to wait, if the service said."""

    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class ServerError(APIStatusError):
    """5xx: the service (or a proxy in front of it) failed. Transient: retried."""

    code = "server_error"


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


def error_from_response(
    status_code: int,
    headers: Mapping[str, str],
    content: bytes,
    *,
    retry_after: float | None = None,
    secrets: Iterable[str] = (),
) -> APIStatusError:
    """The exception a non-200 answer means, with the service's own words as its message.

    ``retry_after`` (seconds, already parsed from the headers) goes on a ``RateLimitError``;
    ``secrets`` are redacted from the answer before it is read (see ``read_error_body``).
    """
    content_type = headers.get("content-type", "")
    message, error_type, body = read_error_body(status_code, content, content_type, secrets)
    kwargs: dict[str, Any] = {"status_code": status_code, "type": error_type, "body": body}
    lowered = message.lower()
    if status_code == 401:
        if "premium" in lowered or "plan" in lowered or "expired" in lowered:
            return NotPremiumError(message, **kwargs)
        return AuthenticationError(message, **kwargs)
    if status_code == 422:
        if "exceed" in lowered or "too long" in lowered:
            return TextTooLongError(message, **kwargs)
        if "greater" in lowered or "too short" in lowered or "at least" in lowered:
            return TextTooShortError(message, **kwargs)
        return UnprocessableEntityError(message, **kwargs)
    if status_code == 429:
        return RateLimitError(message, retry_after=retry_after, **kwargs)
    if status_code >= 500:
        return ServerError(message, **kwargs)
    return APIStatusError(message, **kwargs)


# -- redaction -----------------------------------------------------------------------------------

REDACTED = "[redacted]"
FRAGMENT = 8
"""Any run of this many characters of a secret is taken out (the promise is that no 10 are left:
two spare, so that an escape added later, such as a repr's backslash, cannot complete a piece)."""

# A secret may reach a text escaped: JSON (\u0041, \/), a repr (\x41), percent (%41) or HTML (&#65;)
# encoding, or split by white space (raw or escaped). Each such unit stands for one character.
_ESCAPE = (
    r"\\u[0-9a-fA-F]{4}|\\x[0-9a-fA-F]{2}|\\[\\/\"'bfnrt]|%[0-9a-fA-F]{2}"
    r"|&#[0-9]{1,7};|&#[xX][0-9a-fA-F]{1,6};|&[A-Za-z]{2,8};"
)
_UNIT = re.compile(_ESCAPE + r"|.", re.DOTALL)
_CHAR = re.compile(r".", re.DOTALL)
_ESCAPES = re.compile(_ESCAPE)
_SIMPLE_ESCAPES = {"\\": "\\", "/": "/", '"': '"', "'": "'", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _decode_unit(unit: str) -> str:
    """The character a unit stands for ("" for white space); the unit itself when it is none."""
    if len(unit) == 1:
        return "" if unit.isspace() else unit
    if unit[0] == "\\":
        if unit[1] in "ux":
            decoded = chr(int(unit[2:], 16))
        else:
            decoded = _SIMPLE_ESCAPES[unit[1]]
    elif unit[0] == "%":
        decoded = chr(int(unit[1:], 16))
    elif unit[0] == "&":
        try:
            decoded = html.unescape(unit)
        except (ValueError, OverflowError):  # pragma: no cover - html.unescape replaces bad references
            return unit
        if len(decoded) != 1:  # not a reference to one character: plain text
            return unit
    else:
        return "".join(unit.split())  # a run of white space
    return "" if decoded.isspace() or decoded in "\b\f" else decoded


@functools.lru_cache(maxsize=64)
def _windows(secrets: tuple[str, ...]) -> tuple[tuple[int, frozenset[str]], ...]:
    """For each secret, as texts are compared (escapes decoded, white space taken out) and as it
    is (a secret holding "%41" or "\\n" is looked for both ways): the length of the pieces looked
    for and the set of its pieces of that length."""
    prepared = []
    for secret in secrets:
        for form in {"".join(secret.split()), _flatten(secret)}:
            if form:
                width = min(FRAGMENT, len(form))
                prepared.append((width, frozenset(form[i : i + width] for i in range(len(form) - width + 1))))
    return tuple(prepared)


def _flatten(text: str) -> str:
    """``text`` with its escapes decoded and its white space taken out (the escapes first: none
    holds white space, and one that stands for white space becomes nothing)."""
    if "\\" in text or "%" in text or "&" in text:
        text = _ESCAPES.sub(lambda m: _decode_unit(m.group()), text)
    return "".join(text.split())


def _marker(secrets: tuple[str, ...]) -> str:
    """``[redacted]``, unless a secret could be completed by it. Next to a marker are at most 7
    characters of a secret (8 would have been redacted), so a piece of 10 across its edge needs
    "[re" or "ed]" in the secret; then a marker whose every 10 characters hold a space (a key has
    none)."""
    if any("[re" in secret or "ed]" in secret for secret in secrets):
        return " [redacted key] "
    return REDACTED


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every piece of ``FRAGMENT`` or more characters of any of ``secrets`` (the
    whole of a shorter one) replaced by ``[redacted]``, in whatever shape the text carries it: raw,
    escaped (JSON, repr, percent, HTML), split by white space or line breaks, or cut short.

    Run it on the raw text of an answer before anything parses, cuts or escapes it: a cut or an
    escape can leave a piece of a secret that the whole secret no longer matches.
    """
    secrets = tuple(secrets)
    windows = _windows(secrets)
    if not windows or not text:
        return text
    # The text is read two ways, as an escape can be ambiguous once cut or split ("%00\" + line
    # break + "'" is a piece of the secret "%00\'" only if the escapes are left alone): with only
    # its white space taken out, and with its escapes decoded too. Fast path, the common case:
    # neither holds a piece of a secret (C-speed substitution and substring tests).
    readings = ("".join(text.split()), _flatten(text))
    if not any(piece in flat for flat in readings for width, pieces in windows for piece in pieces):
        return text
    spans: list[tuple[int, int]] = []
    for units in (_CHAR, _UNIT):
        chars: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        for match in units.finditer(text):
            unit = match.group()
            decoded = _decode_unit(unit)
            if len(decoded) == 1:
                chars.append(decoded)
                starts.append(match.start())
                ends.append(match.end())
            elif decoded:  # an "&...;" that names no single character: its characters as they are
                for offset, char in enumerate(decoded):
                    chars.append(char)
                    starts.append(match.start() + offset)
                    ends.append(match.start() + offset + 1)
        flat = "".join(chars)
        for width, pieces in windows:
            for i in range(len(flat) - width + 1):
                if flat[i : i + width] in pieces:
                    spans.append((starts[i], ends[i + width - 1]))
    if not spans:
        return text
    spans.sort()
    merged = [spans[0]]
    for start, end in spans[1:]:
        if start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    marker = _marker(secrets)
    out = []
    position = 0
    for start, end in merged:
        out.append(text[position:start])
        out.append(marker)
        position = end
    out.append(text[position:])
    return "".join(out)


def redact_value(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` (a parsed JSON body: dicts, lists, texts) with ``redact`` applied to every text in it."""
    secrets = tuple(secrets)
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, Mapping):
        return {redact_value(k, secrets): redact_value(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v, secrets) for v in value]
    return value


# scheme://user:password@host: the user information up to the last "@" before the path, or, for a
# secret with an unencoded "/" in it (AWS secrets have them), "user:secret...@" up to the first "@"
# (a port followed by a path is not taken for one).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#\s]*@|[^/?#\s@:]*:(?!\d*(?:[/?#\s]|$))[^\s@]*@)")
_PARAMETER = re.compile(r"([?&#;]([^=&#?\s]*)=)([^&#\s]*)")
# Query parameters that carry a credential: presigned URLs (X-Amz-Signature, X-Amz-Credential,
# X-Amz-Security-Token, X-Goog-Signature, Azure SAS sig), tokens and keys of every kind.
_SENSITIVE = re.compile(r"(?i)sig|token|credential|secret|passw|pwd|key|auth|session|private")
_LOCATION_SECRET_MIN = 6  # a shorter user or password would take ordinary words out of messages


def redact_location(location: str) -> str:
    """``location`` (an input or output path or URI, or a message holding some) without its
    credentials: ``s3://KEY:SECRET@bucket/x`` -> ``s3://***@bucket/x``, and the values of query
    parameters that carry one (``X-Amz-Signature=***``, ``sig=***``, ``token=***``, ...)."""
    text = _USERINFO.sub(lambda m: m.group(1) + "***@", location)
    return _PARAMETER.sub(
        lambda m: m.group(1) + "***" if m.group(3) and _SENSITIVE.search(unquote(m.group(2))) else m.group(0), text
    )


def location_secrets(location: str) -> tuple[str, ...]:
    """The credentials ``location`` holds (user, password, sensitive query values; raw and
    percent-decoded), for ``redact`` on a message a library built from it in its own words."""
    found: list[str] = []
    for match in _USERINFO.finditer(location):
        userinfo = match.group(2)[:-1]
        found.extend(userinfo.split(":", 1))
    for match in _PARAMETER.finditer(location):
        if match.group(3) and _SENSITIVE.search(unquote(match.group(2))):
            found.append(match.group(3))
    secrets = {s for raw in found for s in (raw, unquote(raw)) if len(s) >= _LOCATION_SECRET_MIN}
    return tuple(sorted(secrets))


def one_line(value: str | BaseException, limit: int | None = None) -> str:
    """A message or an exception as one line (white space folded), cut at ``limit`` characters."""
    text = " ".join(str(value).split()) or (type(value).__name__ if isinstance(value, BaseException) else "")
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def explain(error: BaseException, base_url: str | None = None) -> str:
    """What went wrong in words a person acts on: who answered what, and what to do. One explanation
    for every front-end (the CLI prints it after ``error:``, the apps show it)."""
    where = f" at {base_url}" if base_url else ""
    tries = ""
    if isinstance(error, APIError):
        tries = f" after {error.attempts} attempt{'s' if error.attempts != 1 else ''}"
    if isinstance(error, AuthenticationError):
        return (
            f'the service answered 401 "{error.message}": it did not accept the API key. Check the key in '
            "$BATCHSUM_API_KEY (it is on the 'My Account' page of the service)"
        )
    if isinstance(error, NotPremiumError):
        return (
            f'the service answered 401 "{error.message}": your plan does not allow this request '
            "(mode 2, 'Advanced' needs a premium plan; or the plan has expired). Check your plan"
        )
    if isinstance(error, InvalidTextError) or isinstance(error, (TextTooShortError, TextTooLongError)):
        reason = getattr(error, "reason", None)
        if isinstance(error, TextTooShortError) or reason is SkipReason.TOO_SHORT:
            return "the text is too short: the service needs at least 10 words"
        if isinstance(error, TextTooLongError) or reason is SkipReason.TOO_LONG:
            return (
                "the text is too long: the service takes at most 5000 words "
                "(--long-texts split, long_texts='split' in Python, summarizes it in parts)"
            )
        return "there is no text to summarize"
    if isinstance(error, UnprocessableEntityError):
        return f'the service refused the request (422 "{error.message}")'
    if isinstance(error, RateLimitError):
        return f"Rate limited: the service kept answering 429 (too many requests){tries}; try again later, or lower rpm"
    if isinstance(error, APITimeoutError):
        return f"the service{where} did not answer in time{tries}; try again, or raise the timeout"
    if isinstance(error, APIConnectionError):
        return (
            f"cannot reach the service{where} ({error.message}){tries}: it is down or unreachable; "
            "check the base URL and the network"
        )
    if isinstance(error, ServerError):
        return (
            f'the service{where} answered {error.status_code} "{error.message}"{tries}: it is down or '
            "unreachable right now; try again in a moment"
        )
    if isinstance(error, APIStatusError):
        return f'the service{where} answered {error.status_code} "{error.message}"{tries}'
    if isinstance(error, APIError):
        return f"{error.message} ({base_url or 'the service'}{tries})"
    return one_line(error) if isinstance(error, BatchsumError) else f"something went wrong: {one_line(error)}"
