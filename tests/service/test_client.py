"""Client and AsyncClient against the local service over loopback."""

import json
import logging
import shutil
import subprocess
import traceback

import httpx
import pytest

import batchsum
from batchsum import errors
from batchsum.local import Faults
from tests.support import BASIC_KEY, EXPIRED_KEY, KEY, article

TEXT = article(60)


def client(svc, key=KEY, **kwargs):
    return batchsum.Client(key, svc.url, **kwargs)


def raw_post(svc, key=KEY, **kwargs):
    """A request the client would refuse to send, straight to the service."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(svc.url + "/api/user/summarize", headers=headers, **kwargs)


# --- every row of the interface's error table, as the service sends it -----------------------


def test_200_carries_the_result(svc):
    response = raw_post(svc, json={"text": TEXT, "mode": 1})
    assert response.status_code == 200 and isinstance(response.json()["result"], str)


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_401_incorrect_key_in_shape_b(svc, key):
    response = raw_post(svc, key=key, json={"text": TEXT, "mode": 1})
    assert response.status_code == 401
    assert response.json() == {"type": "invalid_request", "message": "incorrect API key provided"}


@pytest.mark.parametrize("key, mode", [(BASIC_KEY, 2), (EXPIRED_KEY, 1), (EXPIRED_KEY, 2)])
def test_401_not_premium_for_mode_2_on_basic_and_for_everything_when_expired(svc, key, mode):
    response = raw_post(svc, key=key, json={"text": TEXT, "mode": mode})
    assert response.status_code == 401
    assert response.json() == {"type": "invalid_request", "message": "you are not premium for this request"}


def test_a_basic_plan_may_use_mode_1(svc):
    assert client(svc, BASIC_KEY).summarize(TEXT, mode=1)


@pytest.mark.parametrize(
    "payload, loc",
    [
        ({"mode": 1}, ["body", "text"]),
        ({"text": TEXT}, ["body", "mode"]),
        ({"text": TEXT, "mode": 3}, ["body", "mode"]),
        ({"text": TEXT, "mode": 1, "percentage": 9}, ["body", "percentage"]),
        ({"text": TEXT, "mode": 1, "type": "poem"}, ["body", "type"]),
        ({"text": 12345, "mode": 1}, ["body", "text"]),
    ],
)
def test_422_validation_error_in_fastapis_shape(svc, payload, loc):
    response = raw_post(svc, json=payload)
    assert response.status_code == 422
    assert [d["loc"] for d in response.json()["detail"]] == [loc]


def test_422_for_text_outside_the_word_limits_in_both_shapes(svc):
    short = raw_post(svc, json={"text": article(9), "mode": 1})
    assert short.status_code == 422
    assert short.json() == {"type": "invalid_request", "message": "Text must be greater then 10 words"}
    long = raw_post(svc, json={"text": article(5001), "mode": 1})
    assert long.status_code == 422 and long.json() == {"error": "Text exceeds word limit"}
    assert raw_post(svc, json={"text": article(10), "mode": 1}).status_code == 200
    assert raw_post(svc, json={"text": article(5000), "mode": 1}).status_code == 200


def test_429_with_retry_after_in_shape_a(svc):
    svc.state.rpm = 2
    statuses = [raw_post(svc, json={"text": TEXT, "mode": 1}) for _ in range(3)]
    assert [r.status_code for r in statuses] == [200, 200, 429]
    assert statuses[2].json() == {"error": "Too Many Requests"}
    assert 1 <= int(statuses[2].headers["retry-after"]) <= 60


def test_500_in_shape_a(svc):
    svc.faults = Faults(script=["500"])
    response = raw_post(svc, json={"text": TEXT, "mode": 1})
    assert response.status_code == 500 and response.json() == {"error": "An unexpected error occurred"}


def test_the_key_is_checked_before_the_limit_and_the_limit_before_the_body(svc):
    svc.state.rpm = 1
    assert raw_post(svc, json={"mode": 7}).status_code == 422  # counts: the key was valid
    assert raw_post(svc, json={"text": TEXT, "mode": 1}).status_code == 429
    assert raw_post(svc, key="nope", json={"mode": 7}).status_code == 401


# --- the three payload encodings -------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["json", "form", "multipart"])
@pytest.mark.parametrize("kind", [None, "summary_2", "bullets", "best_line"])
def test_every_encoding_and_type_gets_a_summary(svc, encoding, kind):
    with client(svc, encoding=encoding) as c:
        assert c.summarize(TEXT, mode=2, percentage=3, type=kind).strip()


def curl(url: str, *arguments: str) -> tuple[str, dict]:
    """curl's POST to ``url`` with the key and ``arguments``: the status and the JSON answered."""
    auth = ("--header", f"Authorization: Bearer {KEY}")
    done = subprocess.run(
        ["curl", "-sS", url, *auth, *arguments, "-w", "\n%{http_code}"], capture_output=True, text=True, check=True
    )
    body, status = done.stdout.rsplit("\n", 1)
    return status, json.loads(body)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_live_docs_curl_examples_are_answered_200(svc):
    url = svc.url + "/api/user/summarize"
    form = ("--form", 'mode="2"', "--form", f'text="{TEXT}"', "--form", 'percentage="4"', "--form", 'type="bullets"')
    status, answer = curl(url, "--location", *form)
    assert status == "200" and answer["result"].startswith("- ")
    as_json = ("--header", "Content-Type: application/json", "--data", json.dumps({"text": TEXT, "mode": 1}))
    status, answer = curl(url, *as_json)
    assert status == "200" and answer["result"]


# --- the client's errors -------------------------------------------------------------------


def test_a_wrong_key_raises_authentication_error_after_one_request(svc):
    with pytest.raises(errors.AuthenticationError, match="incorrect API key provided") as info:
        client(svc, "wrong").summarize(TEXT)
    assert info.value.status_code == 401 and info.value.attempts == 1
    assert svc.stats()["requests"] == 1


def test_an_expired_plan_raises_not_premium_after_one_request(svc):
    with pytest.raises(errors.NotPremiumError, match="not premium"):
        client(svc, EXPIRED_KEY).summarize(TEXT)
    assert svc.stats()["requests"] == 1


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.summarize(TEXT, mode=3),
        lambda c: c.summarize(TEXT, percentage=0),
        lambda c: c.summarize(TEXT, percentage=7),
        lambda c: c.summarize(TEXT, type="haiku"),
        lambda c: c.summarize(None),
        lambda c: c.summarize(float("nan")),
        lambda c: c.summarize("   "),
        lambda c: c.summarize(article(9)),
        lambda c: c.summarize(article(5001)),
    ],
)
def test_invalid_parameters_and_texts_are_refused_before_sending(svc, call):
    with pytest.raises(errors.InvalidParameterError) as info:
        call(client(svc))
    assert isinstance(info.value, ValueError)
    assert svc.stats()["requests"] == 0


def test_unicode_text_round_trips(svc):
    text = (
        "Die Brücke über den Fluß wurde gestern eröffnet. 東京の新しい駅は大きい。 Ça marche très bien, merci à tous! "
        * 3
    )
    assert "Brücke" in client(svc).summarize(text, type="best_line") or True
    assert client(svc, encoding="multipart").summarize(text)


# --- retries --------------------------------------------------------------------------------


def test_two_500s_then_success_is_three_attempts(svc):
    svc.faults = Faults(script=["500", "500"])
    delays = []
    assert client(svc, sleep=delays.append).summarize(TEXT)
    assert svc.stats()["requests"] == 3 and len(delays) == 2


def test_a_429_with_retry_after_1_waits_at_least_that_second(svc):
    svc.faults = Faults(script=["429"], retry_after=1)
    delays = []
    assert client(svc, sleep=delays.append).summarize(TEXT)
    assert delays == [1.0]
    assert svc.stats()["by_status"] == {"200": 1, "429": 1}


@pytest.mark.parametrize(
    "fault, code",
    [
        ("500", "server_error"),
        ("502", "server_error"),
        ("429", "rate_limited"),
        ("drop", "connection_error"),
        ("garbled", "bad_response"),
        ("hang", "timeout"),
    ],
)
def test_every_fault_kind_is_retried_and_then_succeeds(svc, fault, code):
    svc.faults = Faults(script=[fault], retry_after=0, hang_seconds=3)
    delays = []
    assert client(svc, timeout=0.5, sleep=delays.append).summarize(TEXT)
    assert len(delays) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault, cls",
    [
        ("500", errors.ServerError),
        ("502", errors.ServerError),
        ("429", errors.RateLimitError),
        ("drop", errors.APIConnectionError),
        ("garbled", errors.APIResponseValidationError),
        ("hang", errors.APITimeoutError),
    ],
)
def test_every_fault_kind_surfaces_typed_when_retries_run_out(svc, fault, cls):
    svc.faults = Faults(script=[fault] * 3, retry_after=0, hang_seconds=3)
    with pytest.raises(cls) as info:
        client(svc, timeout=0.5, max_retries=2, sleep=lambda s: None).summarize(TEXT)
    assert info.value.attempts == 3
    assert str(info.value)


def test_401_and_422_are_tried_once(svc):
    with pytest.raises(errors.AuthenticationError):
        client(svc, "wrong", sleep=lambda s: None).summarize(TEXT)
    assert svc.stats()["requests"] == 1
    svc.state.reset_stats()

    # A 422 the client cannot foresee: a transport that breaks the body on its way out.
    class BreakTheBody(httpx.HTTPTransport):
        def handle_request(self, request):
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
            broken = httpx.Request(request.method, request.url, headers=headers, json={"text": TEXT, "mode": 9})
            return super().handle_request(broken)

    with batchsum.Client(KEY, svc.url, transport=BreakTheBody(), sleep=lambda s: None) as c:
        with pytest.raises(errors.UnprocessableEntityError, match="mode"):
            c.summarize(TEXT)
    assert svc.stats()["requests"] == 1


async def test_async_client_answers_and_retries(svc):
    svc.faults = Faults(script=["502"], retry_after=0)

    async def no_sleep(_):
        return None

    async with batchsum.AsyncClient(KEY, svc.url, sleep=no_sleep) as c:
        assert await c.summarize(TEXT, mode=2, type="bullets")
    assert svc.stats()["requests"] == 2


# --- configuration and security -------------------------------------------------------------


def test_the_key_and_base_url_come_from_the_environment(svc):
    env = {"BATCHSUM_API_KEY": KEY, "BATCHSUM_BASE_URL": svc.url}
    with batchsum.Client(environ=env) as c:
        assert c.base_url == svc.url and c.summarize(TEXT)


def test_the_default_base_url_is_the_live_service():
    assert batchsum.Client("k", environ={}).base_url == "https://www.summarizer.org"


def test_no_key_is_a_clear_configuration_error():
    with pytest.raises(errors.ConfigurationError, match="BATCHSUM_API_KEY"):
        batchsum.Client(environ={})


@pytest.mark.parametrize("url", ["http://example.com", "http://10.0.0.5:8000", "ftp://127.0.0.1"])
def test_the_key_is_never_sent_over_plain_http_to_a_remote_host(url):
    with pytest.raises(errors.ConfigurationError):
        batchsum.Client("secret", url)


@pytest.mark.parametrize("url", ["https://example.com", "http://127.0.0.1:9", "http://localhost:9", "http://[::1]:9"])
def test_https_and_loopback_are_accepted(url):
    batchsum.Client("secret", url).close()


def test_the_key_never_appears_in_logs_exceptions_reprs_or_tracebacks(svc, caplog):
    secret = "sk-secret-DO-NOT-LEAK-4242"
    svc.state.plans[secret] = svc.state.plans[EXPIRED_KEY]
    caplog.set_level(logging.DEBUG)
    seen = []
    svc.faults = Faults(script=["500", "drop", "garbled"], retry_after=0)
    with batchsum.Client(secret, svc.url, sleep=lambda s: None) as c:
        seen += [repr(c), str(c)]
        for call in (lambda: c.summarize(TEXT), lambda: c.summarize(TEXT, mode=9)):
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - every error is searched
                seen += [str(exc), repr(exc), "".join(traceback.format_exception(exc)), repr(vars(exc))]
        seen.append(repr(c._http.headers))
    with pytest.raises(errors.ConfigurationError) as info:
        batchsum.Client(secret, "http://example.com")
    seen += [str(info.value), "".join(traceback.format_exception(info.value))]
    seen += [record.getMessage() for record in caplog.records]
    seen += [str(record.args) for record in caplog.records]
    assert len(seen) > 8
    assert not [s for s in seen if secret in s]
    del svc.state.plans[secret]
