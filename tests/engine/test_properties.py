"""Property-based tests (hypothesis) where inputs are open-ended: any Python value or unicode text in a
column gives one result per row, in order, never an exception; any body, content type or header sent
to the local service gets an answer of the interface (no 5xx, every error body of a known shape)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import batchsum
from batchsum.engine import summarize_stream
from batchsum.service.contract import count_words
from tests.support import KEY

WORDY = st.lists(
    st.sampled_from("the river council budget school market bridge museum a of".split()), min_size=8, max_size=40
).map(" ".join)


class Weird:
    """An object whose comparison itself fails."""

    def __ne__(self, other: object) -> bool:
        raise RuntimeError("no comparing me")

    __hash__ = object.__hash__


CELLS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.binary(max_size=20),
    st.text(max_size=60),
    WORDY,
    WORDY.map(lambda t: t + " \ud800 tail"),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(float("inf")),
    st.just(Weird()),
)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cells=st.lists(CELLS, max_size=12))
def test_any_values_in_a_column_give_one_result_per_row_in_order_and_never_raise(svc, cells):
    async def go():
        async with batchsum.AsyncClient(KEY, svc.url) as client:
            return [r async for r in summarize_stream(cells, client, rpm=0)]

    results = asyncio.run(go())
    assert len(results) == len(cells)
    for cell, result in zip(cells, results):
        sendable = (
            isinstance(cell, str)
            and 10 <= count_words(cell) <= 5000
            and "\ud800" not in cell
            and not any(0xD800 <= ord(c) <= 0xDFFF for c in cell)
        )
        assert result.status == ("ok" if sendable else "skipped"), (cell, result)
        assert result.message or result.status == "ok"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "text": st.one_of(WORDY, st.text(max_size=40), JSON),
        "mode": st.one_of(st.sampled_from([1, 2, "1", "2"]), JSON),
        "percentage": st.one_of(st.integers(-2, 9), JSON),
        "type": st.one_of(st.sampled_from(["bullets", "best_line"]), JSON),
    },
)


def shape_of(body: object) -> str | None:
    if isinstance(body, dict):
        if set(body) == {"error"} and isinstance(body["error"], str):
            return "A"
        if set(body) == {"type", "message"} and all(isinstance(v, str) for v in body.values()):
            return "B"
        if set(body) == {"detail"} and isinstance(body["detail"], list):
            return "detail"
        if set(body) == {"result"} and isinstance(body["result"], str):
            return "result"
    return None


@pytest.fixture(scope="module")
def http(service):
    with httpx.Client(base_url=service.url, timeout=30) as client:
        yield client


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fields=FIELDS,
    encoding=st.sampled_from(["json", "form", "multipart", "raw"]),
    raw=st.binary(max_size=200),
    key=st.sampled_from([KEY, "wrong", ""]),
)
def test_the_local_service_answers_anything_within_the_interface(http, fields, encoding, raw, key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if encoding == "json":
        response = http.post("/api/user/summarize", json=fields, headers=headers)
    elif encoding == "raw":
        response = http.post(
            "/api/user/summarize", content=raw, headers={**headers, "content-type": "application/json"}
        )
    else:
        as_text = {k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()}
        if encoding == "form":
            response = http.post("/api/user/summarize", data=as_text, headers=headers)
        else:
            response = http.post(
                "/api/user/summarize", files={k: (None, v) for k, v in as_text.items()}, headers=headers
            )
    assert response.status_code in (200, 401, 413, 422), response.text
    shape = shape_of(response.json())
    assert shape is not None, response.text
    assert (shape == "result") == (response.status_code == 200)
    if response.status_code == 401:
        assert shape == "B" and response.json()["type"] == "invalid_request"
