"""No secret anywhere, whole or in part: the API key echoed by a service in any shape (raw, escaped,
cut, split across lines) never reaches a result, the journal, an exception, a log line or stderr;
credentials inside a location (user and password, presigned query parameters) are never printed
or stored.

Echoed keys come from a mock transport: arbitrary bodies are the point (no server of ours echoes the
Authorization header). Locations go through the real CLI against moto's S3 server and an http
server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import html
import http.server
import io
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import batchsum
from batchsum.cli import main
from batchsum.data.journal import Journal
from batchsum.engine import summarize_stream
from batchsum.errors import (
    FRAGMENT,
    APIError,
    error_from_response,
    location_secrets,
    redact,
    redact_location,
)
from tests.support import article

PIECE = 10  # the promise: no 10 consecutive characters of the key anywhere


def pieces(secret: str, width: int = PIECE) -> set[str]:
    return {secret[i : i + width] for i in range(len(secret) - width + 1)} or {secret}


def leaks(secret: str, *texts: str) -> list[str]:
    """The pieces of ``secret`` found in ``texts``."""
    found = pieces(secret)
    return sorted({p for text in texts for p in found if p in text})


# -- the key echoed by a service ----------------------------------------------------------------------

KEYS = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=PIECE, max_size=64)


@st.composite
def echoes(draw: st.DrawFn, key: str) -> str:
    """The key as a service or proxy might echo it: raw, escaped in one of many ways, cut at any
    length, or split across lines."""
    shape = draw(st.sampled_from(["raw", "json", "unicode", "slash", "percent", "html", "split", "cut", "mixed"]))
    if shape == "raw":
        return key
    if shape == "json":
        return json.dumps(key)[1:-1]
    if shape == "unicode":  # every character, or some, as \\uXXXX
        chosen = draw(st.lists(st.booleans(), min_size=len(key), max_size=len(key)))
        return "".join(f"\\u{ord(c):04x}" if pick else c for c, pick in zip(key, chosen))
    if shape == "slash":
        return json.dumps(key)[1:-1].replace("/", "\\/")
    if shape == "percent":
        return quote(key, safe="")
    if shape == "html":
        return "".join(f"&#{ord(c)};" if i % 2 else html.escape(c) for i, c in enumerate(key))
    if shape == "split":
        at = draw(st.integers(1, len(key) - 1))
        return key[:at] + draw(st.sampled_from(["\n", "\r\n", " ", "\\n", "\t "])) + key[at:]
    if shape == "cut":
        return key[: draw(st.integers(PIECE, len(key)))]
    # a cut of a split of an escape
    text = json.dumps(key)[1:-1]
    at = draw(st.integers(0, len(text)))
    return (text[:at] + "\n" + text[at:])[: draw(st.integers(PIECE, len(text) + 1))]


@st.composite
def answers(draw: st.DrawFn) -> tuple[str, int, dict[str, str], bytes]:
    """A key and an answer that echoes it: every status the client reads, every body shape, padded
    so that the echo lands anywhere (inside or across the 80, 120 and 200 character cuts)."""
    key = draw(KEYS)
    echo = draw(echoes(key))
    pad = "x" * draw(st.integers(0, 260))
    text = f"{pad} Authorization: Bearer {echo} end"
    status, template, content_type = draw(
        st.sampled_from(
            [
                (200, '{"result": "summary; %s"}', "application/json"),
                (200, "%s", "text/plain"),
                (200, '{"summary": "%s"}', "application/json"),
                (401, '{"type": "invalid_request", "message": "incorrect API key provided: %s"}', "application/json"),
                (422, '{"error": {"message": "%s", "type": "invalid"}}', "application/json"),
                (422, '{"detail": [{"loc": ["body", "%s"], "msg": "bad"}]}', "application/json"),
                (429, '{"error": "Too Many Requests for %s"}', "application/json"),
                (500, '["%s"]', "application/json"),
                (502, "<html><title>Bad Gateway %s</title></html>", "text/html"),
                (503, "<html><body><p>%s</p></body></html>", "text/html"),
                (400, "not json: %s", "text/plain"),
            ]
        )
    )
    neutral = f"{pad} Authorization: Bearer  end"  # the same answer without the echo
    return key, status, {"content-type": content_type}, (template % text).encode(), (template % neutral).encode()


def _echoing(status: int, headers: dict[str, str], body: bytes) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, headers=headers, content=body))


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=answers())
def test_no_ten_characters_of_the_key_reach_anything_batchsum_writes_or_prints(answer, caplog, capsys):
    """Through the batch engine into a journal, and through the sync client with a retry logged:
    the journal's files, the results, the exceptions, the logs and stderr hold no piece of the key.

    The same answer without the echo says which pieces batchsum writes whatever the key (a key may
    happen to spell "fingerprint" of the journal's schema, or "ServerError", a class name)."""
    key, status, headers, body, neutral = answer
    caplog.set_level(logging.DEBUG, logger="batchsum")
    own = set(leaks(key, *_outputs(key, status, headers, neutral, caplog, capsys)))
    found = set(leaks(key, *_outputs(key, status, headers, body, caplog, capsys)))
    assert not found - own, (key, body)


def _outputs(key: str, status: int, headers: dict[str, str], body: bytes, caplog: Any, capsys: Any) -> list[str]:
    """Everything batchsum writes or prints for this answer."""
    caplog.clear()
    seen: list[str] = []

    async def batch(folder: str) -> None:
        async with batchsum.AsyncClient(
            key, "https://service.example", transport=_AsyncEcho(status, headers, body), max_retries=0
        ) as client:
            with Journal(Path(folder) / "run.journal.sqlite") as journal:
                try:
                    async for result in summarize_stream(
                        [article(15, seed=i) for i in range(2)], client, rpm=0, store=journal, max_wait=0
                    ):
                        seen.extend([repr(result), json.dumps(result), json.dumps(result, ensure_ascii=False)])
                except APIError as exc:  # a 401 stops the batch
                    seen.extend([str(exc), repr(exc), repr(getattr(exc, "body", None))])

    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(batch(folder))
        for path in Path(folder).iterdir():
            seen.append(path.read_bytes().decode("latin-1"))
    with batchsum.Client(
        key, "https://service.example", transport=_echoing(status, headers, body), max_retries=1, sleep=lambda s: None
    ) as client:
        try:
            seen.append(client.summarize(article(15)))
        except APIError as exc:
            seen.extend([str(exc), repr(exc), exc.message, repr(exc.args), repr(getattr(exc, "body", None))])
    captured = capsys.readouterr()
    seen.extend([caplog.text, captured.out, captured.err])
    return seen


class _AsyncEcho(httpx.AsyncBaseTransport):
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self._answer = (status, headers, body)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        status, headers, body = self._answer
        return httpx.Response(status, headers=headers, content=body)


@given(key=KEYS, data=st.data())
def test_redact_takes_out_every_piece_of_the_key_in_every_shape(key, data):
    echo = data.draw(echoes(key))
    before, after = data.draw(st.text(max_size=30)), data.draw(st.text(max_size=30))
    redacted = redact(before + echo + after, [key])
    flat = "".join(redacted.split())
    assert not leaks(key, redacted, flat, json.dumps(redacted), repr(redacted))


@given(text=st.text(st.characters(codec="ascii"), max_size=200), key=KEYS)
def test_redact_leaves_a_text_without_the_key_as_it_is(text, key):
    if not any(p in "".join(text.split()) for p in pieces(key, FRAGMENT)):
        assert redact(text, [key]) == text


def test_the_error_body_is_redacted_before_it_is_cut():
    key = "sk-live-" + "K" * 40
    body = ("x" * 60 + " Bearer " + key).encode()  # cut at 80 characters: only 11 of the key would be left
    error = error_from_response(400, {}, body, secrets=[key])
    assert "[redacted]" in error.message and not leaks(key, error.message, repr(error.body))


# -- credentials in locations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "location, secrets",
    [
        (
            "s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG+bPxRfiCY@bucket/in.parquet",
            ["AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI"],
        ),
        ("s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI%2FK7MDENG@bucket/in.parquet", ["wJalrXUtnFEMI"]),
        ("https://analyst:hunter2hunter2@data.example/in.csv", ["hunter2hunter2"]),
        ("https://analyst:p@ss@word1234@data.example/in.csv", ["ss@word1234"]),
        (
            "https://bucket.s3.amazonaws.com/in.parquet?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20260101%2Fus-east-1%2Fs3%2Faws4_request"
            "&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
            "&X-Amz-Security-Token=FwoGZXIvYXdzEJr-session-token-value&X-Amz-Signature=0123456789abcdef0123",
            ["AKIAIOSFODNN7EXAMPLE", "FwoGZXIvYXdzEJr", "0123456789abcdef0123"],
        ),
        ("https://acct.blob.core.windows.net/c/in.csv?sv=2024&se=2026&sp=r&sig=abcDEF123%2Bsig%3D", ["abcDEF123"]),
        ("https://storage.googleapis.com/b/in.csv?X-Goog-Signature=f00dfeedf00dfeed", ["f00dfeedf00dfeed"]),
        ("https://data.example/in.csv?token=tok-123456789&download=1", ["tok-123456789"]),
        ("redis://:redispassword@127.0.0.1:6379/0", ["redispassword"]),
        # a path's parameters, each to its segment's end, whatever comes before them
        ("https://api.example.com/v1;jsessionid=ABCDEF123456/summarize", ["ABCDEF123456"]),
        ("https://api.example.com/v1;v=2/x;token=pathtoken99?a=1;sig=querysig99&b=2", ["pathtoken99", "querysig99"]),
    ],
)
def test_redact_location_takes_credentials_out(location, secrets):
    shown = redact_location(location)
    for secret in secrets:
        assert secret not in shown, shown
    assert "***" in shown
    assert redact_location(shown) == shown  # stable: a redacted location stays as it is
    message = f"cannot read {location}: access denied for {secrets[0]}"
    assert secrets[0] not in redact(redact_location(message), location_secrets(location))


@pytest.mark.parametrize(
    "location",
    ["/data/in.parquet", "s3://bucket/year=2024/in.parquet", "https://host:8443/path/in.csv?page=2", "in*.csv"],
)
def test_redact_location_keeps_a_location_without_credentials(location):
    assert redact_location(location) == location


SECRET_PART = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789-_.~"), min_size=8, max_size=30)


@given(
    scheme=st.sampled_from(["s3", "gs", "abfs", "http", "https", "redis"]),
    user=SECRET_PART,
    password=SECRET_PART,
    parameter=st.sampled_from(["X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "sig", "token"]),
    value=SECRET_PART,
)
def test_redact_location_for_any_credentials(scheme, user, password, parameter, value):
    location = f"{scheme}://{user}:{password}@host/path/in.parquet?a=1&{parameter}={value}&b=2"
    shown = redact_location(location)
    assert user not in shown and password not in shown and value not in shown
    assert shown.endswith("&b=2") and "/path/in.parquet?a=1&" in shown


# Real locations through the CLI: moto's S3 server and an http server on loopback.

ACCESS = "AKIAEXAMPLEACCESS0001"
SECRET_KEY = "wJalrXUtnFEMIsecretEXAMPLEKEY"
PRESIGNED = "X-Amz-Credential=AKIAPRESIGNED0002&X-Amz-Security-Token=SESSIONTOKEN0003&X-Amz-Signature=SIGNATURE0004"
LOCATION_SECRETS = [ACCESS, SECRET_KEY, "AKIAPRESIGNED0002", "SESSIONTOKEN0003", "SIGNATURE0004", "hunter2secret"]


def run(*argv: str) -> int:
    return main(["summarize", *argv, "--quiet", "--rpm", "0"])


def journal_listing(path: Path) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["journal", str(path)]) == 0
    return out.getvalue()


def assert_no_location_secret(*texts: str) -> None:
    for text in texts:
        for secret in LOCATION_SECRETS:
            assert secret not in text, (secret, text)


def files_text(folder: Path) -> str:
    return "".join(p.read_bytes().decode("latin-1") for p in folder.rglob("*") if p.is_file())


def _frame(n: int = 6) -> pd.DataFrame:
    return pd.DataFrame({"text": [article(15, seed=i) for i in range(n)]})


def test_s3_credentials_in_locations_are_never_printed_or_stored(env, s3, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    with s3.open_output_stream("secretdata/in.parquet") as out:
        pq.write_table(pa.Table.from_pandas(_frame()), out)
    creds = f"{ACCESS}:{SECRET_KEY}"
    journal = tmp_path / "run.journal.sqlite"
    source = f"s3://{creds}@secretdata/in.parquet"
    target = f"s3://{creds}@secretdata/out.parquet"
    assert run(source, "-o", target, "--column", "text", "--journal", str(journal)) == 0
    written = capsys.readouterr()
    assert "wrote s3://***@secretdata/out.parquet" in written.err
    listing = journal_listing(journal)
    assert "output:     s3://***@secretdata/out.parquet" in listing
    # the problems: a missing file, a missing bucket, a presigned-style query pyarrow refuses
    for bad_source, bad_target in [
        (f"s3://{creds}@secretdata/missing.parquet", target),
        (source, f"s3://{creds}@no-such-bucket/out.parquet"),
        (f"s3://{creds}@secretdata/in.parquet?{PRESIGNED}", str(tmp_path / "out2.parquet")),
    ]:
        assert run(bad_source, "-o", bad_target, "--column", "text", "--journal", str(tmp_path / "j2.sqlite")) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "***" in err, err
        assert_no_location_secret(err)
    assert_no_location_secret(
        written.out, written.err, listing, files_text(tmp_path), files_text(Path(os.environ["XDG_CACHE_HOME"]))
    )


@pytest.fixture
def http_files(tmp_path):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # the server's own log is not batchsum's output
            pass

    handler = functools.partial(Quiet, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_http_credentials_and_presigned_queries_are_never_printed_or_stored(env, tmp_path, http_files, capsys):
    pytest.importorskip("aiohttp")
    _frame().to_csv(tmp_path / "in.csv", index=False)
    out = tmp_path / "out" / "summaries.parquet"
    out.parent.mkdir()
    journal = tmp_path / "out" / "run.journal.sqlite"
    source = f"http://reader:hunter2secret@{http_files}/in.csv?{PRESIGNED}&sig=SIGNATURE0004"
    assert run(source, "-o", str(out), "--column", "text", "--journal", str(journal)) == 0
    assert len(pd.read_parquet(out)) == 6
    written = capsys.readouterr()
    missing = f"http://reader:hunter2secret@{http_files}/missing.csv?{PRESIGNED}"
    assert run(missing, "-o", str(tmp_path / "o2.parquet"), "--column", "text") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "***" in err, err
    assert_no_location_secret(written.out, written.err, err, journal_listing(journal), files_text(tmp_path / "out"))


def test_the_journal_stores_a_redacted_output_and_shows_old_ones_redacted(tmp_path):
    with Journal(tmp_path / "j.sqlite") as journal:
        journal.note_output(f"s3://{ACCESS}:{SECRET_KEY}@bucket/out.parquet?{PRESIGNED}")
        assert journal.meta()["output"].startswith("s3://***@bucket/out.parquet?")
    assert_no_location_secret(files_text(tmp_path), journal_listing(tmp_path / "j.sqlite"))


def test_a_budget_url_with_a_password_is_shown_without_it():
    pytest.importorskip("redis")
    from batchsum.pacing.budgets.budget import open_budget

    budget = open_budget("redis://:redispassword1@127.0.0.1:9/0", "id")
    assert "redispassword1" not in budget.where and "***@127.0.0.1:9" in budget.where


@pytest.mark.parametrize("key", ["[redacted]", "ab[redacted]cd-0123", "x-7[re-0123456789", "0123456ed]-abc"])
def test_a_key_that_looks_like_the_marker_is_not_completed_by_it(key):
    for text in (f"a{key}b", f"{key[:9]} {key}", f"{key}{key[3:]}", json.dumps({"m": key})):
        redacted = redact(text, [key])
        assert not leaks(key, redacted, json.dumps(redacted), repr(redacted)), redacted


def test_a_base_url_masks_its_credentials_in_the_services_name_and_every_message_and_refuses_a_user(
    tmp_path, capsys, monkeypatch
):
    """Issue 52, 11: a base URL's path parameter that carries a credential (``/v1;token=...``) is
    masked in the service's name the budget keeps (``limits``, ``top``), and in the message of a service
    that cannot be reached; a user or password in it (which the HTTP client would send instead of the
    key) is a one-line error, before anything is sent."""
    from batchsum.options import RunSpec
    from batchsum.pacing.budgets.budget import open_budget
    from tests.support import KEY

    monkeypatch.setenv("BATCHSUM_API_KEY", KEY)
    url = "http://127.0.0.1:9/v1;token=pathsecret123;v=2"
    spec = RunSpec.from_kwargs(base_url=url, progress=False)
    assert spec.client.service == "http://127.0.0.1:9/v1;token=***;v=2"

    async def remember() -> None:  # what a run keeps of the key at its service: the limit it found
        budget = open_budget("machine", batchsum.Client(KEY, url).identity)
        await budget.remember(
            spec.client.key_hash, spec.client.service, {"limit": json.dumps({"rpm": 600, "how": "found"})}
        )
        await budget.aclose()

    asyncio.run(remember())
    assert main(["limits", "--service", url]) == 0  # the name kept, as ``limits`` and ``top`` show it
    shown = capsys.readouterr().out
    assert "pathsecret123" not in shown and shown.startswith("http://127.0.0.1:9/v1;token=***;v=2  600/min")
    monkeypatch.setenv("BATCHSUM_BASE_URL", url + "?sig=querysecret456")
    assert main(["text", "--max-retries", "0", article(20)]) != 0
    said = capsys.readouterr()
    assert "cannot reach the service at http://127.0.0.1:9/v1;token=***;v=2?sig=***" in said.err, said.err
    assert "pathsecret123" not in said.out + said.err and "querysecret456" not in said.out + said.err
    monkeypatch.setenv("BATCHSUM_BASE_URL", "http://analyst:userpass789@127.0.0.1:9/v1")
    assert main(["text", article(20)]) == 2
    said = capsys.readouterr()
    assert "a user or password in it would be sent instead of the API key" in said.err
    assert "userpass789" not in said.out + said.err and len(said.err.strip().splitlines()) == 1
