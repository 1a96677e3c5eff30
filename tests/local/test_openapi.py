"""The local service against its own OpenAPI document (``/openapi.json``), checked with schemathesis:
generated requests in every body encoding, the answers' statuses, shapes and headers as documented."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from batchsum.local import LocalService  # noqa: E402
from tests.support import KEY  # noqa: E402


@pytest.fixture(scope="module")
def service():
    with LocalService([KEY, "bs-expired:expired"], rpm=0) as running:
        yield running


@pytest.mark.slow
def test_every_answer_is_as_documented(service):
    api = schemathesis.openapi.from_url(f"{service.url}/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert {op.label for op in operations} == {"POST /api/user/summarize", "GET /"}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
        def check(case):
            # schemathesis's positive_data_acceptance takes a 422 for a schema-valid body as a fault; the
            # schema's pattern cannot count words (a text of 10 matching runs may hold fewer words by
            # the interface's count, or more than 5000), so a 422 there is the documented answer. What
            # that check stands for, a valid body with any other fields accepted in every encoding, is
            # the test below.
            case.call_and_validate(
                headers={"Authorization": f"Bearer {KEY}"},
                excluded_checks=[schemathesis.checks.positive_data_acceptance],
            )

        check()


def test_the_document_is_openapi_3_1_and_names_every_error_shape(service):
    import httpx

    document = httpx.get(f"{service.url}/openapi.json").json()
    assert document["openapi"] == "3.1.0"
    answers = document["paths"]["/api/user/summarize"]["post"]["responses"]
    assert set(answers) == {"200", "401", "413", "422", "429", "500"}
    assert document["components"]["schemas"]["HTTPValidationError"]["title"] == "Validation Error"
    assert "/_local/stats" not in document["paths"]


FIELDS = {"text", "mode", "percentage", "type"}
word = st.text(st.characters(exclude_categories=["Cs", "Zs", "Zl", "Zp", "Cc"]), min_size=1, max_size=12)
extra_name = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1, max_size=12)


@pytest.mark.slow
@given(
    words=st.lists(word, min_size=10, max_size=40),
    extras=st.dictionaries(extra_name.filter(lambda name: name not in FIELDS), st.text(max_size=20), max_size=5),
    mode=st.sampled_from([1, 2]),
    encoding=st.sampled_from(["json", "form", "multipart"]),
)
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_a_valid_body_with_any_other_fields_is_accepted_in_every_encoding(service, words, extras, mode, encoding):
    import httpx

    text = " ".join(words)
    fields = {"text": text, "mode": mode, **extras}
    form = {name: str(value) for name, value in fields.items()}
    headers = {"Authorization": f"Bearer {KEY}"}
    url = f"{service.url}/api/user/summarize"
    if encoding == "json":
        answer = httpx.post(url, json=fields, headers=headers)
    elif encoding == "form":
        answer = httpx.post(url, data=form, headers=headers)
    else:  # multipart: a file part beside the fields makes httpx send multipart/form-data
        answer = httpx.post(url, data=form, files={"attachment": ("a.txt", b"x")}, headers=headers)
    assert answer.status_code == 200, (encoding, fields, answer.text)
    assert answer.json()["result"]
