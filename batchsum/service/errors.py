"""The exception tree, the mapping from an HTTP answer to the exception it means, and what an error
means to a person (``explain``, ``one_line``).

    BatchsumError
    ├── ConfigurationError             no key, a key over plain http to a remote host, a bad base URL
    ├── InputError                     (also a ValueError) a missing column, an unreadable file, ...
    │   ├── BrokenInputError           an input that broke after rows were read: the run stops there
    │   └── OutputError                the output cannot be written (its folder, a remote put): the run stops
    ├── JournalError                   the journal cannot be written or read: the run stops
    ├── RequestCapReached              the request cap (max_requests) was reached: the run stops
    │   └── QuotaSpent                 every key's quota longer than a minute is spent: the run stops
    ├── RunCancelled                   the run was cancelled (``batchsum.duckdb.interrupt``): the run stops
    │   ├── RunInterrupted             a signal (SIGINT) heard while a query or a collect ran: the run stops
    │   └── JobStopped                 the job's driver posted its stop on the key's budget: the run stops
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
FastAPI's ``{"detail"}``, an HTML page, nothing, truncated JSON); ``error_from_response`` reads them
all (with ``read_error_body``, in ``error_body``).

Redaction lives once, in ``redact``, and its names are exported here too. ``redact`` takes secrets
(the API key) out of a text in whole or in part, whatever shape the text gives them (raw, JSON or
percent or HTML escaped, split by white space, cut short); it runs on an answer's raw text before
anything parses, cuts or escapes it, and again on every text made from it. ``redact_location`` takes
credentials (user and password, presigned query parameters) out of an input or output location
before it is shown or stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .contract import SkipReason
from .error_body import read_error_body
from .rate_headers import RateStatement
from .redact import FRAGMENT, REDACTED, location_secrets, redact, redact_location, redact_value

__all__ = [
    "BatchsumError",
    "ConfigurationError",
    "InputError",
    "BrokenInputError",
    "OutputError",
    "JournalError",
    "BudgetError",
    "RequestCapReached",
    "QuotaSpent",
    "RunCancelled",
    "RunInterrupted",
    "JobStopped",
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


class OutputError(InputError):
    """The output cannot be written once the run began (its folder refuses a write or the final
    rename, a remote put fails): the run stops as any stop does; every answer is in the journal, so
    the same command again pays for none of them."""


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


class QuotaSpent(RequestCapReached):
    """Every key of the run has spent a quota longer than a minute (stated by the service, a 429
    asking for longer than ``max_wait``, or configured with ``quota``): the run stops as at the
    request cap (every row gets a record, the unsent ones ``failed`` with ``not_sent``); the same
    run again once a quota resets continues. ``spent``: (key hash, what quota, until: Unix time)."""

    def __init__(self, spent: list[tuple[str, str, float]], remaining: int | None = None) -> None:
        self.spent = spent
        super().__init__(0, remaining)

    @property
    def resets_at(self) -> float:
        """When the first key comes back (Unix time)."""
        return min(until for _, _, until in self.spent)

    def _text(self) -> str:
        import datetime

        def utc(wall: float) -> str:
            return datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

        keys = "; ".join(f"key {key}: its {name} is spent until {utc(until)}" for key, name, until in self.spent)
        left = f"; {self.remaining} rows remain" if self.remaining is not None else ""
        return f"every key's quota is spent ({keys}){left}"


class RunCancelled(BatchsumError):
    """The run was cancelled (``batchsum.duckdb.interrupt(con)``): it stops as any stop does (nothing
    new starts, answers on the wire are awaited and kept in the journal and the answer store), so the
    same query or call again sends only the rest. A run report's cause: ``cancel``."""

    default = (
        "the run was cancelled: nothing new was sent, the answers on the wire were awaited and kept; "
        "the same call again sends only the rest"
    )

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.default)

    def again(self) -> RunCancelled:
        """The same stop as a new exception, for each caller it ends (one object raised in several
        threads at once would share its traceback)."""
        return type(self)(str(self))


class RunInterrupted(RunCancelled):
    """A signal (SIGINT: Ctrl-C, a notebook's stop) was heard while the run's caller waited inside
    native code (a DuckDB query, a Polars collect), and the run stopped as ``RunCancelled`` says.
    A run report's cause: ``signal``."""

    default = (
        "interrupted (SIGINT): nothing new was sent, the answers on the wire were awaited and kept; "
        "the same call again sends only the rest"
    )


class JobStopped(RunCancelled):
    """The job this run is a part of (a Dask, Spark or Ray job: one run id) was stopped by its driver
    (interrupted, or the job cancelled), which posted the stop on the key's budget; the run saw it on
    its next budget call and stopped as ``RunCancelled`` says. A run report's cause: ``job_stop``."""

    default = (
        "the job was stopped by its driver: nothing new was sent, the answers on the wire were awaited "
        "and kept; the same job again sends only the rest"
    )


class BudgetError(BatchsumError):
    """The rate budget cannot be used: an unknown URL scheme, an unreachable Redis, a cache folder
    that cannot be written. Raised before anything is sent; mid-run, a budget out of reach is waited
    for up to ``budget_wait``, then it stops the run (answers kept)."""


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
        # A run's keys refused, every one (401): the last, as lines name it (``key 3f2a9c1b7d0e (keys.txt
        # line 2)``), and how many the run had; None where the key is the one of $BATCHSUM_API_KEY.
        self.key_name: str | None = None
        self.keys = 1


class APIConnectionError(APIError):
    """The connection failed or was dropped before a whole answer arrived. ``reached``: False when
    no connection was made (refused, none within the timeout): the service never saw the request."""

    code = "connection_error"
    reached = True


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


def one_line(value: str | BaseException, limit: int | None = None) -> str:
    """A message or an exception as one line (white space folded), cut at ``limit`` characters."""
    text = " ".join(str(value).split()) or (type(value).__name__ if isinstance(value, BaseException) else "")
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def explain(error: BaseException, base_url: str | None = None) -> str:
    """What went wrong in words a person acts on: who answered what, and what to do. One explanation
    for every front-end (the CLI prints it after ``error:``, the apps show it)."""
    where = f" at {redact_location(base_url)}" if base_url else ""
    tries = ""
    if isinstance(error, APIError):
        tries = f" after {error.attempts} attempt{'s' if error.attempts != 1 else ''}"
    if isinstance(error, (AuthenticationError, NotPremiumError)) and error.key_name is not None:
        every = f"every key of the run was refused ({error.keys}); the last, " if error.keys > 1 else ""
        what = "did not accept the key" if isinstance(error, AuthenticationError) else "its plan does not allow this"
        return (
            f'{every}{error.key_name}: the service answered 401 "{error.message}": it {what}. Check the keys '
            "(each is on the 'My Account' page of its account) and their plans"
        )
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
