"""Schema fuzzing: schemathesis against a live gunicorn on PostgreSQL.

Every operation in the served schema gets bounded generated input (valid and
invalid) from an authenticated customer with money: no answer may be a 5xx, every
error must be problem+json with a documented `code`, and every answer must match the
schema (status code, content type, headers, body).

Then the same operations get hostile input the schema cannot describe: JSON nested
thousands deep, lone surrogates in values and in field names, NUL in every path
segment, query parameter and field, integers past 64 bits (tests/ops/
test_hostile_input.py has each class spelled out, and the same property in process).
"""

import json
import uuid
from urllib.parse import quote

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from ledger.openapi import problem_codes  # noqa: E402
from tests.helpers import Customer  # noqa: E402
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


HOSTILE_VALUES = [
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfff",
    2**64 + 1,
    -(2**63) - 1,
    10**40,
]
MUTATIONS = ["deep", "nul_path", "value", "name", "nul_query"]


def mutate(case, mutation: str, value, index: int) -> tuple[str, dict, bytes | None]:
    """(path, query, raw body) of `case` with one class of hostile input in it."""
    params = {k: str(v) for k, v in (case.path_parameters or {}).items()}
    query = dict(case.query or {})
    body = case.body if isinstance(case.body, dict | list) else {}
    if mutation == "nul_path":  # every segment: the whole value, then NUL
        params = {k: f"{v}\x00" for k, v in params.items()}
    elif mutation == "nul_query":
        query = {**{k: f"{v}\x00" for k, v in query.items()}, "x": "\x00"}
    elif mutation == "value" and isinstance(body, dict):
        names = sorted(body) or ["x"]
        body = {**body, names[index % len(names)]: value}
    elif mutation == "name" and isinstance(body, dict):
        body = {**body, value if isinstance(value, str) else "\ud800": 1}
    raw = json.dumps(body).encode()  # ASCII: surrogates and NUL as \u escapes
    if mutation == "deep":
        raw = b'{"a": ' * (1500 + index) + raw + b"}" * (1500 + index)
    path = case.operation.path
    for name, given_value in params.items():
        encoded = quote(given_value.encode("utf-8", "surrogatepass"), safe="")
        path = path.replace("{" + name + "}", encoded)
    return path, query, raw


def test_no_hostile_input_gets_a_5xx_and_every_refusal_is_a_problem(tmp_path):
    customer = Customer("hostile")
    with gunicorn(
        tmp_path, "ledger.settings.test", workers=2, DJANGO_DEBUG="false"
    ) as (url, _master):
        schema = schemathesis.openapi.from_url(f"{url}/api/schema/")
        failures: list[str] = []
        operations = [result.ok() for result in schema.get_all_operations()]

        for operation in operations:

            @given(
                case=operation.as_strategy(),
                mutation=st.sampled_from(MUTATIONS),
                value=st.sampled_from(HOSTILE_VALUES),
                index=st.integers(min_value=0, max_value=7),
            )
            @settings(
                max_examples=15,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            def fuzz(case, mutation, value, index) -> None:
                path, query, raw = mutate(case, mutation, value, index)
                headers = {
                    "Authorization": f"Token {customer.token}",
                    # A valid key, so the body gets as far as the parser.
                    "Idempotency-Key": f"hostile-{uuid.uuid4()}",
                    "Content-Type": "application/json",
                }
                response = httpx.request(
                    case.method,
                    f"{url}{path}",
                    params={k: str(v) for k, v in query.items()},
                    content=raw if case.method != "GET" else None,
                    headers=headers,
                    timeout=30,
                )
                assert response.status_code < 500, (mutation, path, response.text)
                assert_problem(response)

            try:
                fuzz()
            except (Exception, BaseExceptionGroup) as exc:  # collect all, then fail
                failures.append(f"{operation.label}: {exc}")
        assert not failures, "\n\n".join(failures)
