"""``Client`` and ``AsyncClient``: one summary per call, every error of the interface typed.

Request building and the retry decision live once, in ``_ClientCore``, and reading and decoding an
answer once, in ``answer``; the twins only send and sleep. ``tests/service/test_client_parity.py``
proves they agree.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import httpx

from . import contract
from .answer import Answer, scrub
from .errors import (
    REDACTED,
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APITimeoutError,
    InvalidTextError,
    RateLimitError,
)
from .inflate import ACCEPT_ENCODING
from .rate_headers import RateStatement
from .redact import redact_location
from .retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, retry_delay
from .settings import ENV_API_KEY, ENV_BASE_URL, check_params, client_settings, is_loopback

__all__ = ["Client", "AsyncClient", "Encoding", "ENV_API_KEY", "ENV_BASE_URL", "REDACTED"]

MAX_CONNECTIONS = 512  # = pacing.DEFAULT_MAX_IN_FLIGHT (the client sits above the pacer)

Encoding = Literal["json", "form", "multipart"]

log = logging.getLogger("batchsum")


@dataclass(frozen=True)
class PreparedRequest:
    """A validated request: the text and the parameters, ready to send as often as needed."""

    text: str
    params: contract.Params

    def fields(self) -> dict[str, Any]:
        return {contract.FIELD_TEXT: self.text, **self.params.fields()}


def validate_params(mode: Any = 1, percentage: Any = contract.PERCENTAGE_DEFAULT, type: Any = None) -> contract.Params:
    """The parameters, normalized; ``InvalidParameterError`` (a ValueError) naming a bad one."""
    return check_params(mode, percentage, type)


def prepare(
    text: Any, mode: Any = 1, percentage: Any = contract.PERCENTAGE_DEFAULT, type: Any = None
) -> PreparedRequest:
    """Validate a request against the contract. Raises ``InvalidParameterError`` (a ValueError)
    or ``InvalidTextError`` naming the problem; nothing is sent."""
    params = validate_params(mode, percentage, type)
    problem = contract.text_problem(text)
    if problem is not None:
        raise InvalidTextError(*problem)
    return PreparedRequest(text, params)


class AttemptHooks(Protocol):
    """What the batch engine plugs into the retry loop: every attempt waits for its turn, and the
    engine hears how each ended (``error`` None for a summary; a CancelledError when abandoned).
    With hooks, a 429 is answered by the shared pause: it costs no attempt, and ``max_wait``
    (seconds since the request's first 429) bounds how long a request waits them out. ``first_429``
    (the loop's time of that first 429) is kept on the hooks, not in one call: a request that leaves
    ``send`` to be sent again (on another key, or on its own once back from a quota) keeps its patience."""

    max_wait: float
    first_429: float | None

    async def before_attempt(self) -> Any: ...

    def after_attempt(self, ticket: Any, error: BaseException | None, limits: RateStatement | None) -> None: ...


class _ClientCore:
    """Everything the twins share: settings, request building, transport errors, retry decisions."""

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
        settings = client_settings(
            api_key, base_url, timeout=timeout, max_retries=max_retries, encoding=encoding, environ=environ
        )
        assert settings.api_key is not None
        self.api_key = settings.api_key.reveal()
        self.base_url = settings.base_url
        self.timeout = settings.timeout
        self.max_retries = settings.max_retries
        self.encoding = settings.encoding

    def identity(self) -> str:
        return hashlib.sha256(f"batchsum-key\n{self.base_url}\n{self.api_key}".encode()).hexdigest()[:32]

    def http_options(self) -> dict[str, Any]:
        """Keyword arguments for ``httpx.Client`` / ``httpx.AsyncClient``."""
        loopback = is_loopback(httpx.URL(self.base_url).host)
        return {
            "base_url": self.base_url,
            # Only the encodings _inflate decodes in bounded steps: no cause to send anything else.
            "headers": {
                "Authorization": f"Bearer {self.api_key}",
                "Accept": "application/json",
                "Accept-Encoding": ACCEPT_ENCODING,
            },
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

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self.api_key,)

    def transport_error(self, exc: httpx.HTTPError) -> APIError:
        if isinstance(exc, httpx.TimeoutException):
            error: APIError = APITimeoutError(f"no answer in time ({type(exc).__name__})")
        elif isinstance(exc, httpx.DecodingError):
            error = APIResponseValidationError(f"the answer could not be decoded ({exc})")
        else:
            where = redact_location(self.base_url)  # a path's or query's token masked, as in every message
            error = APIConnectionError(f"connection to {where} failed: {type(exc).__name__}: {exc}")
        if isinstance(error, APIConnectionError) and isinstance(
            exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
        ):
            error.reached = False  # no connection was made: the request went nowhere (nothing billed)
        return scrub(error, self.secrets)

    @staticmethod
    def out_of_patience(error: RateLimitError, waited: float, max_wait: float, attempts: int) -> RateLimitError:
        """The row's last 429, after ``max_wait`` seconds of them: it fails as rate_limited."""
        error.message = (
            f"{error.message} (the service still answered 429 after {waited:.0f} s of waiting; "
            f"max_wait is {max_wait:g} s)"
        )
        error.args = (error.message,)
        error.attempts = attempts
        return error

    def out_of_time(self) -> APITimeoutError:
        return APITimeoutError(f"no whole answer within the timeout of {self.timeout:g} s")

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

    @property
    def identity(self) -> str:
        """This key at this service, without revealing the key: names its rate budget and answers."""
        return self._core.identity()

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
                return self._attempt(request)
            except APIError as exc:
                error = exc
            error.attempts = attempt
            delay = self._core.next_delay(error, attempt, paced=False)
            if delay is None:
                raise error
            self._core.note_retry(error, attempt, delay)
            self._sleep(delay)

    def _attempt(self, request: PreparedRequest) -> str:
        """One attempt, its answer read in chunks: at most the size cap, and within the timeout as a
        whole (checked between chunks, so a dripping answer stops within one read of it)."""
        deadline = time.monotonic() + self._core.timeout
        try:
            with self._http.stream("POST", **self._core.request_options(request)) as response:
                body = Answer(response, self._core.secrets)
                for chunk in () if body.built_whole() else response.iter_raw():
                    if time.monotonic() > deadline:
                        raise self._core.out_of_time()
                    if body.full(chunk):
                        break
        except httpx.HTTPError as exc:
            raise self._core.transport_error(exc) from None
        return body.decode()[0]

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
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self._core = _ClientCore(api_key, base_url, timeout, max_retries, encoding, environ)
        # As many connections as the batch engine may keep in flight: a smaller pool would cap the
        # rate at pool / latency (100 connections at 20 s a request is 300/min, whatever the pace).
        self._limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=min(max_connections, 100)
        )
        self._transport = transport
        # Made at the first request: a run the journal answers whole sends none, and spares the TLS
        # context and the connection pool (about a tenth of a second to make and to close).
        self._connections: httpx.AsyncClient | None = None
        self._closed = False
        self._sleep = sleep

    @property
    def _http(self) -> httpx.AsyncClient:
        return self._open()

    def _open(self) -> httpx.AsyncClient:
        """The connection pool, made at the first call."""
        if self._closed:
            raise RuntimeError("Cannot send a request, as the client has been closed.")  # as httpx says
        if self._connections is None:
            self._connections = httpx.AsyncClient(
                transport=self._transport, limits=self._limits, **self._core.http_options()
            )
        return self._connections

    @property
    def base_url(self) -> str:
        return self._core.base_url

    @property
    def identity(self) -> str:
        """This key at this service, without revealing the key: names its rate budget and answers."""
        return self._core.identity()

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

        ``hooks`` (the batch engine's pacer) is awaited before every attempt and told how each ended.
        """
        attempt = 0  # attempts the service answered other than "later" (429 under hooks): what was paid
        self._open()  # the pool made now if not yet: not between the pacer's turn and the request
        while True:
            attempt += 1
            ticket = await hooks.before_attempt() if hooks is not None else None
            try:
                summary, limits = await self._attempt(request)
            except APIError as exc:
                error = exc
            except BaseException as exc:  # cancelled while on the wire: the hooks must hear of it too
                if hooks is not None:
                    hooks.after_attempt(ticket, exc, None)
                raise
            else:
                if hooks is not None:
                    hooks.after_attempt(ticket, None, limits)
                return summary, attempt
            if hooks is not None:
                hooks.after_attempt(ticket, error, error.rate_limit)
                if isinstance(error, RateLimitError):  # "later": the pacer's shared pause answers it
                    attempt -= 1
                    now = asyncio.get_running_loop().time()
                    if hooks.first_429 is None:
                        hooks.first_429 = now
                    if now - hooks.first_429 < hooks.max_wait:
                        continue
                    raise self._core.out_of_patience(error, now - hooks.first_429, hooks.max_wait, attempt)
            error.attempts = attempt
            delay = self._core.next_delay(error, attempt, paced=hooks is not None)
            if delay is None:
                raise error
            self._core.note_retry(error, attempt, delay)
            await self._sleep(delay)

    async def _attempt(self, request: PreparedRequest) -> tuple[str, RateStatement | None]:
        """One attempt within the timeout as a whole (a dripping answer cannot stretch it)."""
        try:
            return await asyncio.wait_for(self._exchange(request), self._core.timeout)
        except asyncio.TimeoutError:
            raise self._core.out_of_time() from None

    async def _exchange(self, request: PreparedRequest) -> tuple[str, RateStatement | None]:
        try:
            async with self._http.stream("POST", **self._core.request_options(request)) as response:
                body = Answer(response, self._core.secrets)
                if not body.built_whole():
                    async for chunk in response.aiter_raw():
                        if body.full(chunk):
                            break
        except httpx.HTTPError as exc:
            raise self._core.transport_error(exc) from None
        return body.decode()

    async def aclose(self) -> None:
        self._closed = True
        if self._connections is not None:
            await self._connections.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return self._core.describe("AsyncClient")
