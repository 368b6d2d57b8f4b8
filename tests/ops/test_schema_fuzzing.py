"""Schema fuzzing: schemathesis against a live gunicorn on PostgreSQL.

Every operation in the served schema gets bounded generated input (valid and
invalid) from an authenticated customer with money: no answer may be a 5xx, every
error must be problem+json with a documented `code`, and every answer must match the
schema (status code, content type, headers, body).
"""

import json

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from ledger.openapi import problem_codes  # noqa: E402
from tests.idempotency.conftest import Customer  # noqa: E402
from tests.servers import gunicorn  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
MAX_EXAMPLES = 25  # per operation: ~10 operations in well under two minutes
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def assert_problem(response) -> None:
    if response.status_code < 400:
        return
    headers = {k.lower(): v for k, v in response.headers.items()}
    content_type = headers.get("content-type", [""])
    if isinstance(content_type, list):
        content_type = content_type[0]
    media_type = content_type.split(";")[0]
    assert media_type == "application/problem+json", response.text
    body = json.loads(response.text)
    assert body["code"] in problem_codes(), body
    assert body["status"] == response.status_code, body


def test_no_generated_input_gets_a_5xx_and_answers_match_the_schema(tmp_path):
    customer = Customer("fuzzer")
    with gunicorn(
        tmp_path, "ledger.settings.test", workers=2, DJANGO_DEBUG="false"
    ) as (url, _master):
        schema = schemathesis.openapi.from_url(f"{url}/api/schema/")
        headers = {"Authorization": f"Token {customer.token}"}
        failures: list[str] = []
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 8

        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            def fuzz(case) -> None:
                response = case.call(base_url=url, headers=headers, timeout=30)
                case.validate_response(response, checks=CHECKS, headers=headers)
                assert_problem(response)

            try:
                fuzz()
            except (Exception, BaseExceptionGroup) as exc:  # collect all, then fail
                failures.append(f"{operation.label}: {exc}")
        assert not failures, "\n\n".join(failures)
