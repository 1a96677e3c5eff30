"""The twins agree: every answer shape maps to the same error, message, status, code and attempts.

A mock transport is right here: the point is arbitrary bodies, including ones no real server of ours
sends (the live service's variants, proxies' pages, transport failures)."""

import httpx
import pytest

import batchsum
from tests.support import article

TEXT = article(40)

ANSWERS = {
    "ok": (200, {"content-type": "application/json"}, b'{"result": "fine"}'),
    "ok-not-json": (200, {"content-type": "application/json"}, b'{"result": "fi'),
    "ok-no-result": (200, {"content-type": "application/json"}, b'{"summary": "x"}'),
    "ok-result-not-text": (200, {"content-type": "application/json"}, b'{"result": 5}'),
    "401-key": (401, {}, b'{"type": "invalid_request", "message": "incorrect API key provided"}'),
    "401-plan": (401, {}, b'{"type": "invalid_request", "message": "you are not premium for this request"}'),
    "422-short-b": (422, {}, b'{"type": "invalid_request", "message": "Text must be greater than 10 words"}'),
    "422-long-a": (422, {}, b'{"error": "Text exceeds word limit"}'),
    "422-fastapi": (422, {}, b'{"detail": [{"loc": ["body", "mode"], "msg": "Field required", "type": "missing"}]}'),
    "422-detail-str": (422, {}, b'{"detail": "Validation Error"}'),
    "429-a": (429, {"retry-after": "2"}, b'{"error": "Too Many Requests"}'),
    "429-b-date": (
        429,
        {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"},
        b'{"type": "rate", "message": "Too Many Requests"}',
    ),
    "429-none": (429, {}, b""),
    "500-a": (500, {}, b'{"error": "An unexpected error occurred"}'),
    "500-truncated": (500, {"content-type": "application/json"}, b'{"error": "An unexp'),
    "502-html": (502, {"content-type": "text/html"}, b"<html><title>502 Bad Gateway</title></html>"),
    "503-empty": (503, {}, b""),
    "404": (404, {}, b'{"detail": "Not Found"}'),
    "connect": httpx.ConnectError("refused"),
    "read-timeout": httpx.ReadTimeout("slow"),
    "dropped": httpx.RemoteProtocolError("peer closed connection without sending complete message body"),
}


def respond(answer):
    def handler(request):
        if isinstance(answer, Exception):
            raise answer
        status, headers, body = answer
        return httpx.Response(status, headers=headers, content=body)

    return handler


def describe(exc):
    return (
        type(exc).__name__,
        str(exc),
        getattr(exc, "status_code", None),
        exc.code,
        exc.attempts,
        getattr(exc, "retry_after", None) is not None,
        getattr(exc, "type", None),
    )


def outcome(call):
    try:
        return ("ok", call())
    except batchsum.BatchsumError as exc:
        return describe(exc)


def run_sync(answer, max_retries):
    delays = []
    with batchsum.Client(
        "k",
        "http://127.0.0.1:9",
        transport=httpx.MockTransport(respond(answer)),
        max_retries=max_retries,
        sleep=delays.append,
    ) as c:
        return outcome(lambda: c.summarize(TEXT)), len(delays)


async def run_async(answer, max_retries):
    delays = []

    async def sleep(seconds):
        delays.append(seconds)

    async with batchsum.AsyncClient(
        "k", "http://127.0.0.1:9", transport=httpx.MockTransport(respond(answer)), max_retries=max_retries, sleep=sleep
    ) as c:
        try:
            result = ("ok", await c.summarize(TEXT))
        except batchsum.BatchsumError as exc:
            result = describe(exc)
        return result, len(delays)


@pytest.mark.parametrize("name", sorted(ANSWERS))
@pytest.mark.parametrize("max_retries", [0, 2])
async def test_sync_and_async_agree_on_every_answer(name, max_retries):
    sync = run_sync(ANSWERS[name], max_retries)
    assert sync == await run_async(ANSWERS[name], max_retries)
    (kind, *_), retries = sync
    if name.startswith(("401", "422", "404")) or name in ("ok", "ok-no-result", "ok-result-not-text"):
        assert retries == 0  # never retried: a well-formed 200 that breaks the contract was paid for
    else:
        assert retries == max_retries


def test_the_expected_classes():
    expected = {
        "ok-not-json": "APIResponseValidationError",
        "401-key": "AuthenticationError",
        "401-plan": "NotPremiumError",
        "422-short-b": "TextTooShortError",
        "422-long-a": "TextTooLongError",
        "422-fastapi": "UnprocessableEntityError",
        "429-none": "RateLimitError",
        "502-html": "ServerError",
        "503-empty": "ServerError",
        "404": "APIStatusError",
        "connect": "APIConnectionError",
        "read-timeout": "APITimeoutError",
        "dropped": "APIConnectionError",
    }
    for name, cls in expected.items():
        assert run_sync(ANSWERS[name], 0)[0][0] == cls, name
