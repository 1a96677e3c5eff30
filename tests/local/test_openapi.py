"""The local service against its own OpenAPI document (``/openapi.json``), checked with schemathesis:
generated requests in every body encoding, the answers' statuses, shapes and headers as documented."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from batchsum.local import LocalService  # noqa: E402
from tests.conftest import KEY  # noqa: E402


@pytest.fixture(scope="module")
def service():
    with LocalService([KEY, "bs-expired:expired"], rpm=0) as running:
        yield running


def test_every_answer_is_as_documented(service):
    api = schemathesis.openapi.from_url(f"{service.url}/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert {op.label for op in operations} == {"POST /api/user/summarize", "GET /"}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
        def check(case):
            case.call_and_validate(headers={"Authorization": f"Bearer {KEY}"})

        check()


def test_the_document_is_openapi_3_1_and_names_every_error_shape(service):
    import httpx

    document = httpx.get(f"{service.url}/openapi.json").json()
    assert document["openapi"] == "3.1.0"
    answers = document["paths"]["/api/user/summarize"]["post"]["responses"]
    assert set(answers) == {"200", "401", "413", "422", "429", "500"}
    assert document["components"]["schemas"]["HTTPValidationError"]["title"] == "Validation Error"
    assert "/_local/stats" not in document["paths"]
