"""The retry policy as pure functions: what to retry, how long the service asked us to wait, backoff.

Constants live here so the client, the engine and the pacer agree on them.
"""

from __future__ import annotations

import email.utils
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

DEFAULT_MAX_RETRIES = 5
DEFAULT_TIMEOUT = 60.0  # seconds; a 5000-word text in mode 2 can take a while
INITIAL_BACKOFF = 0.5  # seconds before the first retry when the service gives no Retry-After
MAX_BACKOFF = 16.0
MAX_RETRY_AFTER = 120.0  # a per-minute limit never needs longer; a larger value is clamped to this

# Statuses other than 429 and 5xx that can succeed when tried again.
_RETRYABLE_STATUSES = frozenset({408, 409})


def is_retryable(error: BaseException) -> bool:
    """True for what can succeed on retry: 429, 5xx, timeouts, dropped connections, garbled answers."""
    if isinstance(error, (RateLimitError, ServerError, APIConnectionError, APIResponseValidationError)):
        return True
    if isinstance(error, APIStatusError):
        return error.status_code in _RETRYABLE_STATUSES
    return False


def parse_retry_after(headers: Mapping[str, str], now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from ``retry-after-ms``, ``Retry-After`` (seconds or HTTP-date) or
    ``X-RateLimit-Reset`` (seconds, or a Unix time), clamped to ``0..MAX_RETRY_AFTER``; None if absent."""
    value: float | None = None
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            value = float(ms) / 1000
        except ValueError:
            pass
    if value is None and (raw := headers.get("retry-after")) is not None:
        try:
            value = float(raw)
        except ValueError:
            parsed = email.utils.parsedate_tz(raw)
            if parsed is not None:
                value = email.utils.mktime_tz(parsed) - now()
    if value is None and (reset := headers.get("x-ratelimit-reset")) is not None:
        try:
            number = float(reset)
        except ValueError:
            number = None
        if number is not None:
            value = number - now() if number > 1e9 else number
    if value is None or value != value:  # absent or NaN
        return None
    return min(max(value, 0.0), MAX_RETRY_AFTER)


def backoff(attempt: int, rand: Callable[[], float] = random.random) -> float:
    """Seconds before retry number ``attempt`` (1 = first retry) when the service named no wait.

    Doubles from INITIAL_BACKOFF up to MAX_BACKOFF, then takes off up to a quarter at random so that
    many senders failing together do not come back together.
    """
    ceiling = min(INITIAL_BACKOFF * 2 ** (attempt - 1), MAX_BACKOFF)
    return ceiling * (1 - 0.25 * rand())


def retry_delay(
    error: APIError, attempt: int, max_retries: int, rand: Callable[[], float] = random.random
) -> float | None:
    """Seconds to wait before trying again after ``attempt`` failed with ``error``; None: give up."""
    if attempt > max_retries or not is_retryable(error):
        return None
    if isinstance(error, RateLimitError) and error.retry_after is not None:
        return error.retry_after
    return backoff(attempt, rand)
