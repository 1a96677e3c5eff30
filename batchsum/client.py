"""``Client`` and ``AsyncClient``: one summary per call, every error of the interface typed.

Request building, answer decoding and the retry decision live once, in ``_ClientCore``; the twins
only send and sleep. ``tests/test_client_parity.py`` proves they agree.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import httpx

from . import contract
from ._retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, parse_retry_after, retry_delay
from .errors import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APITimeoutError,
    ConfigurationError,
    InvalidParameterError,
    InvalidTextError,
    RateLimitError,
    error_from_response,
)

__all__ = ["Client", "AsyncClient", "Encoding", "ENV_API_KEY", "ENV_BASE_URL"]

ENV_API_KEY = "BATCHSUM_API_KEY"
ENV_BASE_URL = "BATCHSUM_BASE_URL"

Encoding = Literal["json", "form", "multipart"]
_ENCODINGS = ("json", "form", "multipart")

log = logging.getLogger("batchsum")


def is_loopback(host: str) -> bool:
    """True for localhost and addresses in 127.0.0.0/8 or ::1."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class PreparedRequest:
    """A validated request: the text and the parameters, ready to send as often as needed."""

    text: str
    params: contract.Params

    def fields(self) -> dict[str, Any]:
        return {contract.FIELD_TEXT: self.text, **self.params.fields()}


def validate_params(mode: Any = 1, percentage: Any = contract.PERCENTAGE_DEFAULT, type: Any = None) -> contract.Params:
    """The parameters, normalized; ``InvalidParameterError`` (a ValueError) naming a bad one."""
    try:
        return contract.parse_params(mode, percentage, type)
    except ValueError as exc:
        raise InvalidParameterError(str(exc)) from None


def prepare(text: Any, mode: Any = 1, percentage: Any = contract.PERCENTAGE_DEFAULT, type: Any = None) -> PreparedRequest:
    """Validate a request against the contract. Raises ``InvalidParameterError`` (a ValueError)
    or ``InvalidTextError`` naming the problem; nothing is sent."""
    params = validate_params(mode, percentage, type)
    problem = contract.text_problem(text)
    if problem is not None:
        raise InvalidTextError(*problem)
    return PreparedRequest(text, params)


class AttemptHooks(Protocol):
    """What the batch engine plugs into the retry loop: pace every attempt, share 429 pauses."""

    async def before_attempt(self) -> float: ...

    def after_rate_limit(self, started_at: float, retry_after: float | None) -> None: ...


class _ClientCore:
    """Everything the twins share: settings, request building, answer decoding, retry decisions."""

    __slots__ = ("api_key", "base_url", "timeout", "max_retries", "encoding")

    def __init__(
        self,
        api_key: str | None,
        base_url: str | None,
        timeout: float,
        max_retries: int,
        encoding: str,
        environ: Mapping[str, str] | None,
    ) -> None:
        env = os.environ if environ is None else environ
        key = api_key if api_key is not None else env.get(ENV_API_KEY)
        if not key or not key.strip():
            raise ConfigurationError(
                f"no API key: pass api_key=... or set {ENV_API_KEY} "
                "(the key is on the 'My Account' page of the service)"
            )
        url = (base_url or env.get(ENV_BASE_URL) or contract.DEFAULT_BASE_URL).rstrip("/")
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ConfigurationError(f"invalid base URL {url!r}: use https://host[:port]")
        if parsed.scheme == "http" and not is_loopback(parsed.host):
            raise ConfigurationError(
                f"refusing to send the API key over plain http to {parsed.host}: "
                "use https, or http only to a loopback address (127.0.0.1, localhost)"
            )
        if encoding not in _ENCODINGS:
            raise InvalidParameterError(f"invalid encoding {encoding!r}: use one of {', '.join(_ENCODINGS)}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidParameterError(f"invalid max_retries {max_retries!r}: use a whole number >= 0")
        if not timeout or timeout <= 0:
            raise InvalidParameterError(f"invalid timeout {timeout!r}: use a number of seconds > 0")
        self.api_key = key.strip()
        self.base_url = url
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.encoding = encoding

    def http_options(self) -> dict[str, Any]:
        """Keyword arguments for ``httpx.Client`` / ``httpx.AsyncClient``."""
        loopback = is_loopback(httpx.URL(self.base_url).host)
        return {
            "base_url": self.base_url,
            "headers": {"Authorization": f"Bearer {self.api_key}", "Accept": "application/json"},
            "timeout": httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
            "follow_redirects": False,  # a redirect could carry the key elsewhere
            "verify": True,
            "trust_env": not loopback,  # never route loopback traffic through a proxy from the env
        }

    def request_options(self, request: PreparedRequest) -> dict[str, Any]:
        """Path and body of one attempt, in the configured encoding (integers as text in forms)."""
        fields = request.fields()
        options: dict[str, Any] = {"url": contract.SUMMARIZE_PATH}
        if self.encoding == "json":
            options["json"] = fields
        elif self.encoding == "form":
            options["data"] = {k: str(v) for k, v in fields.items()}
        else:
            options["files"] = {k: (None, str(v)) for k, v in fields.items()}
        return options

    def decode(self, response: httpx.Response) -> str:
        """The summary from a 200, or the typed error any other answer means."""
        if response.status_code != 200:
            raise error_from_response(
                response.status_code,
                response.headers,
                response.content,
                retry_after=parse_retry_after(response.headers),
            )
        try:
            body = json.loads(response.content)
        except ValueError:
            raise APIResponseValidationError(
                "the service answered 200 with a body that is not JSON", body=response.text[:200]
            ) from None
        result = body.get(contract.FIELD_RESULT) if isinstance(body, dict) else None
        if not isinstance(result, str):
            raise APIResponseValidationError(
                'the service answered 200 without a "result" text', body=response.text[:200]
            )
        return result

    @staticmethod
    def transport_error(exc: httpx.HTTPError) -> APIError:
        if isinstance(exc, httpx.TimeoutException):
            return APITimeoutError(f"no answer in time ({type(exc).__name__})")
        if isinstance(exc, httpx.DecodingError):
            return APIResponseValidationError(f"the answer could not be decoded ({exc})")
        return APIConnectionError(f"connection failed: {type(exc).__name__}: {exc}")

    def next_delay(self, error: APIError, attempt: int, paced: bool) -> float | None:
        """Seconds to wait before the next attempt, or None to give up and raise ``error``.

        With a pacer, a 429 waits inside the pacer (its pause is shared by every sender), so the
        retry itself need not sleep.
        """
        delay = retry_delay(error, attempt, self.max_retries)
        if delay is not None and paced and isinstance(error, RateLimitError):
            return 0.0
        return delay

    def note_retry(self, error: APIError, attempt: int, delay: float) -> None:
        log.info("attempt %d failed (%s: %s); retrying in %.2fs", attempt, error.code, error.message, delay)

    def describe(self, cls: str) -> str:
        return (
            f"{cls}(base_url={self.base_url!r}, encoding={self.encoding!r}, "
            f"timeout={self.timeout}, max_retries={self.max_retries})"
        )


class Client:
    """Summarize one text per call, synchronously.

    >>> with Client(api_key="...", base_url="http://127.0.0.1:8000") as client:
    ...     client.summarize("a text of at least ten words ...", mode=1, percentage=4)

    ``api_key`` defaults to ``$BATCHSUM_API_KEY``; ``base_url`` to ``$BATCHSUM_BASE_URL`` or
    ``https://www.summarizer.org``. ``encoding`` is "json" (default), "form" or "multipart".
    Transient failures (429, 5xx, timeouts, dropped connections) are retried up to ``max_retries``
    times; 401 and 422 never are. ``environ`` replaces ``os.environ`` (for tests).
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        encoding: Encoding = "json",
        transport: httpx.BaseTransport | None = None,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._core = _ClientCore(api_key, base_url, timeout, max_retries, encoding, environ)
        self._http = httpx.Client(transport=transport, **self._core.http_options())
        self._sleep = sleep

    @property
    def base_url(self) -> str:
        return self._core.base_url

    def summarize(
        self,
        text: str,
        mode: int | contract.Mode = contract.Mode.STANDARD,
        percentage: int = contract.PERCENTAGE_DEFAULT,
        type: str | contract.SummaryType | None = None,
    ) -> str:
        """The summary of ``text``. Raises a ``BatchsumError`` subclass on failure (see ``errors``)."""
        return self.send(prepare(text, mode, percentage, type))

    def send(self, request: PreparedRequest) -> str:
        """Send a prepared request, retrying what can succeed on retry."""
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.post(**self._core.request_options(request))
                return self._core.decode(response)
            except httpx.HTTPError as exc:
                error = self._core.transport_error(exc)
            except APIError as exc:
                error = exc
            error.attempts = attempt
            delay = self._core.next_delay(error, attempt, paced=False)
            if delay is None:
                raise error
            self._core.note_retry(error, attempt, delay)
            self._sleep(delay)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return self._core.describe("Client")


class AsyncClient:
    """Summarize one text per call, asynchronously. Same arguments and errors as ``Client``.

    >>> async with AsyncClient() as client:
    ...     summary = await client.summarize(text)
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        encoding: Encoding = "json",
        transport: httpx.AsyncBaseTransport | None = None,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        max_connections: int = 100,
    ) -> None:
        self._core = _ClientCore(api_key, base_url, timeout, max_retries, encoding, environ)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(transport=transport, limits=limits, **self._core.http_options())
        self._sleep = sleep

    @property
    def base_url(self) -> str:
        return self._core.base_url

    @property
    def max_retries(self) -> int:
        return self._core.max_retries

    async def summarize(
        self,
        text: str,
        mode: int | contract.Mode = contract.Mode.STANDARD,
        percentage: int = contract.PERCENTAGE_DEFAULT,
        type: str | contract.SummaryType | None = None,
    ) -> str:
        """The summary of ``text``. Raises a ``BatchsumError`` subclass on failure (see ``errors``)."""
        summary, _ = await self.send(prepare(text, mode, percentage, type))
        return summary

    async def send(self, request: PreparedRequest, hooks: AttemptHooks | None = None) -> tuple[str, int]:
        """Send a prepared request, retrying what can succeed on retry; (summary, attempts).

        ``hooks`` (the batch engine's pacer) is awaited before every attempt and told of every 429.
        """
        attempt = 0
        while True:
            attempt += 1
            started_at = await hooks.before_attempt() if hooks is not None else 0.0
            try:
                response = await self._http.post(**self._core.request_options(request))
                return self._core.decode(response), attempt
            except httpx.HTTPError as exc:
                error = self._core.transport_error(exc)
            except APIError as exc:
                error = exc
            error.attempts = attempt
            if hooks is not None and isinstance(error, RateLimitError):
                hooks.after_rate_limit(started_at, error.retry_after)
            delay = self._core.next_delay(error, attempt, paced=hooks is not None)
            if delay is None:
                raise error
            self._core.note_retry(error, attempt, delay)
            await self._sleep(delay)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return self._core.describe("AsyncClient")
