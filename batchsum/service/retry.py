"""The retry policy as pure functions: what to retry, how long the service asked us to wait, backoff.

Constants live here so the client, the engine and the pacer agree on them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping

from .errors import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    RateLimitError,
    ServerError,
)
from .rate_headers import RateStatement, parse_rate_headers

DEFAULT_MAX_RETRIES = 5
DEFAULT_TIMEOUT = 60.0  # seconds; a 5000-word text in mode 2 can take a while
INITIAL_BACKOFF = 0.5  # seconds before the first retry when the service gives no Retry-After
MAX_BACKOFF = 16.0
MAX_RETRY_AFTER = 120.0  # a per-minute limit never needs longer; a larger value is clamped to this
MAX_ANSWER_BYTES = 2 * 1024 * 1024  # a summary of 5000 words is tens of KB; a larger answer fails the row
MAX_ERROR_BYTES = 64 * 1024  # of an error body, only this much is read (the message is near the start)

# Statuses other than 429 and 5xx that can succeed when tried again.
_RETRYABLE_STATUSES = frozenset({408, 409})


def is_retryable(error: BaseException) -> bool:
    """True for what can succeed on retry: 429, 5xx, timeouts, dropped connections, garbled answers."""
    if isinstance(error, (RateLimitError, ServerError, APIConnectionError)):
        return True
    if isinstance(error, APIResponseValidationError):
        return error.transient
    if isinstance(error, APIStatusError):
        return error.status_code in _RETRYABLE_STATUSES
    return False


def retry_wait(limits: RateStatement | None) -> float | None:
    """Seconds the client waits before trying a 429 again: the ``Retry-After`` the service said (as
    ``rate_headers`` read it, the one parser: ``retry-after-ms``, or ``Retry-After`` in seconds or
    an HTTP date), else the reset of the room it states (``X-RateLimit-Reset`` and the like); at most
    ``MAX_RETRY_AFTER``. The raw value stays on the statement, where a quota is told from a pause.

    None when nothing usable was said (absent, garbage, zero, a date in the past): the caller then
    backs off with jitter, never retrying at once (a wait of 0 would turn into a retry storm).
    """
    if limits is None:
        return None
    for value in (limits.retry_after, limits.reset, limits.quota_reset):
        if value is not None and value > 0:
            return min(value, MAX_RETRY_AFTER)
    return None


def parse_retry_after(headers: Mapping[str, str], now: Callable[[], float] = time.time) -> float | None:
    """``retry_wait`` of ``headers`` (``now``, Unix seconds, dates a reset or an HTTP date)."""
    return retry_wait(parse_rate_headers(headers, now))


def backoff(attempt: int, rand: Callable[[], float] = random.random) -> float:
    """Seconds before retry number ``attempt`` (1 = first retry) when the service named no wait.

    Doubles from INITIAL_BACKOFF up to MAX_BACKOFF, then takes off up to a quarter at random so that
    many senders failing together do not come back together.
    """
    ceiling = min(INITIAL_BACKOFF * 2.0 ** (attempt - 1), MAX_BACKOFF)
    return float(ceiling * (1 - 0.25 * rand()))


def retry_delay(
    error: APIError, attempt: int, max_retries: int, rand: Callable[[], float] = random.random
) -> float | None:
    """Seconds to wait before trying again after ``attempt`` failed with ``error``; None: give up."""
    if attempt > max_retries or not is_retryable(error):
        return None
    if isinstance(error, RateLimitError) and error.retry_after is not None:
        return error.retry_after
    return backoff(attempt, rand)
