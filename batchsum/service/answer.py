"""An answer of the service: its body read in bounded steps within its size cap, and what it means
(the summary of a 200, or the typed error any other answer means), with the key taken out."""

from __future__ import annotations

import json

import httpx

from . import contract
from .errors import APIError, APIResponseValidationError, error_from_response
from .inflate import BoundedDecoder, DecodeError, UnsupportedEncoding
from .rate_headers import RateStatement, parse_rate_headers
from .redact import redact, redact_value
from .retry import MAX_ANSWER_BYTES, MAX_ERROR_BYTES, retry_wait

__all__ = ["Answer", "check_size", "decode", "scrub", "too_large"]


def _preview(content: bytes, secrets: tuple[str, ...]) -> str:
    """The start of a body, for an error: redacted whole, then cut (a cut first could leave a piece
    of a secret that no longer matches)."""
    return redact(content.decode("utf-8", errors="replace"), secrets)[:200]


def scrub(error: APIError, secrets: tuple[str, ...]) -> APIError:
    """The error with the key taken out of its message, arguments and body (whole or in part)."""
    error.message = redact(error.message, secrets)
    error.args = tuple(redact(a, secrets) if isinstance(a, str) else a for a in error.args)
    if getattr(error, "body", None) is not None:
        error.body = redact_value(error.body, secrets)  # type: ignore[attr-defined]
    return error


def too_large() -> APIResponseValidationError:
    return APIResponseValidationError(
        f"the service answered 200 with more than {MAX_ANSWER_BYTES // 1024 // 1024} MiB; no summary is that long",
        transient=False,
    )


def check_size(status: int, headers: httpx.Headers) -> int:
    """How many bytes of this answer to read; a 200 announcing more than allowed fails at once."""
    if status != 200:
        return MAX_ERROR_BYTES
    length = headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_ANSWER_BYTES:
        raise too_large()
    return MAX_ANSWER_BYTES


def decode(
    status: int, headers: httpx.Headers, content: bytes, secrets: tuple[str, ...]
) -> tuple[str, RateStatement | None]:
    """The summary from a 200, or the typed error any other answer means; with the rate-limit headers.
    ``secrets`` (the key: a service or proxy may echo the Authorization header) are taken out of both."""
    limits = parse_rate_headers(headers)
    try:
        return _decode(status, headers, content, secrets, limits), limits
    except APIError as error:
        error.rate_limit = limits
        raise scrub(error, secrets) from None


def _decode(
    status: int, headers: httpx.Headers, content: bytes, secrets: tuple[str, ...], limits: RateStatement | None
) -> str:
    if status != 200:
        raise error_from_response(status, headers, content, retry_after=retry_wait(limits), secrets=secrets)
    try:
        body = json.loads(content)
    except ValueError:  # cut short or garbled on the way: asking again may succeed
        raise APIResponseValidationError(
            "the service answered 200 with a body that is not JSON", body=_preview(content, secrets)
        ) from None
    result = body.get(contract.FIELD_RESULT) if isinstance(body, dict) else None
    if not isinstance(result, str):
        raise APIResponseValidationError(
            'the service answered 200 without a "result" text',
            body=_preview(content, secrets),
            transient=False,
        )
    return redact(result, secrets)


class Answer:
    """An answer's body as it streams in, decoded in bounded steps (``inflate``) within its size
    cap: a 200 over the cap fails at once (no summary is that long), an error body is cut there (its
    message is near the start). The cap counts decoded bytes, so a small compressed answer that
    inflates hugely costs at most the cap and one step."""

    __slots__ = ("_secrets", "_response", "_limit", "_content", "_decoder", "_done")

    def __init__(self, response: httpx.Response, secrets: tuple[str, ...]) -> None:
        self._secrets = secrets
        self._response = response
        self._limit = check_size(response.status_code, response.headers)
        self._content = bytearray()
        self._done = False
        self._decoder: BoundedDecoder | None = None
        # A response built whole (a mock transport's) was decoded by httpx already: taken as it is.
        encoding = "" if response.is_stream_consumed else response.headers.get("content-encoding", "")
        try:
            self._decoder = BoundedDecoder(encoding)
        except UnsupportedEncoding as exc:
            if response.status_code == 200:
                raise APIResponseValidationError(f"the service answered 200 but {exc}", transient=False) from None
            self._done = True  # an error answer whose words cannot be read: its status still says what it is

    def built_whole(self) -> bool:
        """True when the response was built whole (no raw stream to read): its content is taken."""
        if not self._response.is_stream_consumed:
            return False
        self.full(self._response.content)
        return True

    def full(self, raw: bytes) -> bool:
        """Take a chunk of the raw (still encoded) body; True once no more is wanted."""
        if self._done or self._decoder is None:
            return True
        try:
            for piece in self._decoder.feed(raw):
                self._content += piece
                if len(self._content) > self._limit:
                    if self._response.status_code == 200:
                        raise too_large()
                    self._done = True
                    return True
        except DecodeError as exc:  # cut short or garbled on the way: asking again may succeed
            if self._response.status_code == 200:
                raise APIResponseValidationError(f"the answer could not be decoded ({exc})") from None
            self._done = True  # an error answer: what was decoded is what it says
            return True
        return False

    def decode(self) -> tuple[str, RateStatement | None]:
        response = self._response
        return decode(response.status_code, response.headers, bytes(self._content[: self._limit]), self._secrets)
