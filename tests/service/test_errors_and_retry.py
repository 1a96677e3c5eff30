import email.utils

import httpx
import pytest

from batchsum import errors
from batchsum.service.answer import decode
from batchsum.service.retry import (
    INITIAL_BACKOFF,
    MAX_RETRY_AFTER,
    backoff,
    is_retryable,
    parse_retry_after,
    retry_delay,
)


def make(status, body: bytes, content_type="application/json", retry_after=None):
    return errors.error_from_response(status, {"content-type": content_type}, body, retry_after=retry_after)


def test_401_shape_b_incorrect_key_is_an_authentication_error():
    err = make(401, b'{"type": "invalid_request", "message": "incorrect API key provided"}')
    assert type(err) is errors.AuthenticationError
    assert (err.status_code, err.message, err.type, err.code) == (
        401,
        "incorrect API key provided",
        "invalid_request",
        "invalid_api_key",
    )


def test_401_not_premium_is_its_own_class():
    err = make(401, b'{"type": "invalid_request", "message": "you are not premium for this request"}')
    assert type(err) is errors.NotPremiumError and err.code == "not_premium"


@pytest.mark.parametrize(
    "body, cls",
    [
        (b'{"error": "Text exceeds word limit"}', errors.TextTooLongError),
        (b'{"type": "invalid_request", "message": "Text must be greater then 10 words"}', errors.TextTooShortError),
        (b'{"type": "invalid_request", "message": "Text must be greater than 10 words"}', errors.TextTooShortError),
        (
            b'{"detail": [{"loc": ["body", "mode"], "msg": "Field required", "type": "missing"}]}',
            errors.UnprocessableEntityError,
        ),
        (b'{"detail": "Validation Error"}', errors.UnprocessableEntityError),
    ],
)
def test_422_bodies_tell_short_long_and_validation_apart(body, cls):
    err = make(422, body)
    assert type(err) is cls and err.code == "unprocessable" and err.status_code == 422


def test_fastapi_detail_lists_become_one_readable_line():
    err = make(
        422,
        b'{"detail": [{"loc": ["body", "mode"], "msg": "Field required", "type": "missing"},'
        b' {"loc": ["body", "text"], "msg": "Input should be a valid string"}]}',
    )
    assert err.message == "Validation Error: mode: Field required; text: Input should be a valid string"


def test_429_keeps_retry_after():
    err = make(429, b'{"error": "Too Many Requests"}', retry_after=3.0)
    assert isinstance(err, errors.RateLimitError) and err.retry_after == 3.0 and err.message == "Too Many Requests"


@pytest.mark.parametrize(
    "status, body, content_type, expected",
    [
        (500, b'{"error": "An unexpected error occurred"}', "application/json", "An unexpected error occurred"),
        (
            502,
            b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>",
            "text/html",
            "Bad Gateway (HTML page from the server or a proxy: '502 Bad Gateway')",
        ),
        (503, b"", "", "Service Unavailable (empty body)"),
        (
            500,
            b'{"error": "An unexp',
            "application/json",
            'Internal Server Error (unreadable body: \'{"error": "An unexp\')',
        ),
        (
            504,
            b"<h1>Gateway &amp; Timeout</h1>",
            "",
            "Gateway Timeout (HTML page from the server or a proxy: 'Gateway & Timeout')",
        ),
    ],
)
def test_5xx_bodies_of_every_shape_become_server_errors_with_readable_messages(status, body, content_type, expected):
    err = make(status, body, content_type)
    assert type(err) is errors.ServerError
    assert err.message == expected
    assert is_retryable(err)


def test_an_unexpected_status_is_a_plain_status_error_not_retried():
    err = make(404, b'{"detail": "Not Found"}')
    assert type(err) is errors.APIStatusError and err.message == "Not Found"
    assert not is_retryable(err)


def test_local_parameter_errors_are_value_errors_too():
    assert issubclass(errors.InvalidParameterError, ValueError)
    assert issubclass(errors.InvalidParameterError, errors.BatchsumError)


def test_retry_after_in_seconds_http_date_ms_and_reset():
    assert parse_retry_after({"retry-after": "1"}) == 1.0
    assert parse_retry_after({"retry-after": "2.5"}) == 2.5  # a fraction, as some servers (and ours) send it
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 5, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=lambda: now) == 5.0
    assert parse_retry_after({"x-ratelimit-reset": "7"}) == 7.0
    assert parse_retry_after({"x-ratelimit-reset": str(now + 4)}, now=lambda: now) == 4.0


def test_retry_after_is_capped_and_never_negative_and_garbage_is_ignored():
    assert parse_retry_after({"retry-after": "100000"}) == MAX_RETRY_AFTER
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


RAW_RETRY_AFTERS = ["1", "2.5", "1e5", "1e308", "100000", "86400", " 7 ", "0", "-3", "soon", "2678401"]


@pytest.mark.parametrize("raw", RAW_RETRY_AFTERS)
def test_one_parser_reads_retry_after_for_the_client_and_for_the_quota_decision(raw):
    """The client's wait is the statement's raw ``Retry-After`` (what tells a quota from a pause),
    clamped; a value one reads and the other ignores would make a pause of what is no quota."""
    with pytest.raises(errors.RateLimitError) as refused:
        decode(429, httpx.Headers({"retry-after": raw}), b'{"error": "Too Many Requests"}', ())
    said = refused.value.rate_limit.retry_after if refused.value.rate_limit is not None else None
    assert refused.value.retry_after == (None if said is None else min(said, MAX_RETRY_AFTER))
    assert parse_retry_after({"retry-after": raw}) == refused.value.retry_after


@pytest.mark.parametrize(
    "value",
    [
        "-3",
        "0",
        "0.0",
        "-0",
        "nan",
        "inf",
        "-inf",
        "",
        "  ",
        "1,5",
        "1e308",
        "2.",
        ".5",
        "0.0000001",  # finer than a millisecond: no wait of nothing
        "Tue, 01 Jan 2019 00:00:00 GMT",
    ],
)
def test_an_unusable_retry_after_means_back_off_never_a_wait_of_zero(value):
    assert parse_retry_after({"retry-after": value}) is None
    error = errors.RateLimitError(
        "Too Many Requests", status_code=429, retry_after=parse_retry_after({"retry-after": value})
    )
    delays = [retry_delay(error, 1, 5, rand=lambda r=r: r) for r in (0.0, 0.5, 0.999)]
    assert all(d is not None and d >= INITIAL_BACKOFF * 0.75 for d in delays)
    assert len(set(delays)) == 3  # jittered


def test_a_past_reset_or_zero_ms_falls_through_to_the_next_header():
    assert parse_retry_after({"retry-after-ms": "0", "retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25


def test_backoff_doubles_with_at_most_a_quarter_of_jitter_off():
    assert backoff(1, rand=lambda: 0.0) == 0.5
    assert backoff(2, rand=lambda: 0.0) == 1.0
    assert backoff(3, rand=lambda: 0.999) == pytest.approx(2 * 0.75, rel=1e-3)
    assert backoff(50, rand=lambda: 0.0) == 16.0


def test_retry_delay_gives_up_on_401_422_and_after_max_retries():
    auth = make(401, b'{"type":"invalid_request","message":"incorrect API key provided"}')
    assert retry_delay(auth, 1, 5) is None
    assert retry_delay(make(422, b'{"error":"Text exceeds word limit"}'), 1, 5) is None
    limited = make(429, b"", retry_after=1.0)
    assert retry_delay(limited, 1, 5) == 1.0
    assert retry_delay(limited, 6, 5) is None
    assert retry_delay(errors.APITimeoutError("t"), 1, 5, rand=lambda: 0) == 0.5
