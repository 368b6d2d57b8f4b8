"""The OpenAPI schema: served, checked in, and documenting the idempotency contract."""

import io
import json
import re

import pytest
import yaml
from django.core.management import call_command
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.generators import EndpointEnumerator

from ledger.apis import CURSOR_PATTERN
from ledger.openapi import idempotency_marker, problem_codes
from tests.servers import ROOT

CHECKED_IN = ROOT / "docs/openapi.yaml"
REGENERATE = (
    ".venv/bin/python manage.py spectacular --file docs/openapi.yaml --validate"
)


def generate() -> str:
    out = io.StringIO()
    call_command("spectacular", validate=True, fail_on_warn=True, stdout=out)
    return out.getvalue()


@pytest.fixture(scope="module")
def schema() -> dict:
    return yaml.safe_load(generate())


def test_checked_in_schema_matches_the_code():
    assert CHECKED_IN.exists(), f"docs/openapi.yaml is missing; run: {REGENERATE}"
    assert generate() == CHECKED_IN.read_text(), (
        f"docs/openapi.yaml is out of date with the code; regenerate it: {REGENERATE}"
    )


def idempotent_operations() -> list[tuple[str, str, dict]]:
    """(path, method, marker) of every view method decorated with @idempotent."""
    found = []
    for path, _regex, method, view in EndpointEnumerator().get_api_endpoints():
        marker = idempotency_marker(view.cls, method)
        if marker is not None:
            found.append((path, method.lower(), marker))
    return found


def test_every_idempotent_operation_documents_the_contract(schema):
    operations = idempotent_operations()
    assert {p for p, _m, _k in operations} >= {
        "/api/v1/orders",
        "/api/v1/orders/{merchant_order_no}/cancel",
        "/api/v1/orders/{merchant_order_no}/pay",
    }
    for path, method, marker in operations:
        operation = schema["paths"][path][method]
        (key,) = [p for p in operation["parameters"] if p["name"] == "Idempotency-Key"]
        assert key["in"] == "header"
        assert key.get("required", False) == (marker["default"] == "required"), path
        responses = operation["responses"]
        assert "Retry-After" in responses["409"]["headers"], path
        success = [c for c in responses if c.startswith("2")]
        assert success and all(
            "Idempotent-Replayed" in responses[c]["headers"] for c in success
        ), path
        for status, code in (
            ("409", "idempotency_key_in_flight"),
            ("422", "idempotency_key_reused"),
        ):
            assert code in responses[status]["description"], (path, status)
        if marker["default"] == "required":
            assert "idempotency_key_missing" in responses["400"]["description"]
        # Prefer: wait=N, and the header that says it was honoured.
        (prefer,) = [p for p in operation["parameters"] if p["name"] == "Prefer"]
        assert prefer["in"] == "header" and not prefer.get("required", False)
        assert all(
            "Preference-Applied" in responses[c]["headers"] for c in [*success, "409"]
        ), path


def test_every_write_documents_the_refusal_of_its_media_type(schema):
    """The contract's form refusals are 400, 413 and 415: each is in the schema."""
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if method in ("post", "put", "patch", "delete"):
                responses = operation["responses"]
                assert "unsupported_media_type" in responses["415"]["description"], (
                    path,
                    method,
                )


def test_every_error_is_a_documented_problem(schema):
    problem = schema["components"]["schemas"]["Problem"]
    assert set(problem["required"]) >= {"type", "title", "status", "detail", "code"}
    code_schema = problem["properties"]["code"]
    enum_ref = code_schema.get("$ref") or code_schema["allOf"][0]["$ref"]
    enum = schema["components"]["schemas"][enum_ref.rsplit("/", 1)[1]]["enum"]
    assert set(enum) == set(problem_codes())
    assert {
        "idempotency_key_missing",
        "idempotency_key_reused",
        "insufficient_funds",
        "validation_error",
    } <= set(enum)
    for path, operations in schema["paths"].items():
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in operations.items():
            errors = {c: r for c, r in operation["responses"].items() if c >= "400"}
            assert errors, (path, method)
            for response in errors.values():
                content = response["content"]["application/problem+json"]
                assert content["schema"]["$ref"] == "#/components/schemas/Problem"


def test_every_api_route_is_in_the_schema(schema):
    def routes(patterns, prefix="") -> list[str]:
        found = []
        for p in patterns:
            if isinstance(p, URLResolver):
                found += routes(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                found.append(prefix + str(p.pattern))
        return found

    api = [r for r in routes(get_resolver().url_patterns) if r.startswith("api/v1/")]
    documented = {p.lstrip("/") for p in schema["paths"]}
    for route in api:
        route = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
        assert route in documented, route


@pytest.mark.django_db
def test_schema_and_docs_pages_answer(client):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    assert yaml.safe_load(schema.content)["openapi"].startswith("3.")
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger" in docs.content.lower()


@pytest.mark.django_db
def test_the_docs_page_needs_no_internet(client):
    """Swagger UI's scripts, styles and icon come from the app itself."""
    page = client.get("/api/docs/").content.decode()
    outside = re.findall(r"""(?:src|href)=["']?(?:https?:)?//[^"' >]+""", page)
    assert not outside, outside
    assert not re.search(r"https?://(?!127\.0\.0\.1|localhost|testserver)", page)
    assets = re.findall(r"""(?:src|href)=["']([^"']+\.(?:js|css|png))""", page)
    assert len(assets) >= 3, page
    for asset in assets:
        assert client.get(asset).status_code == 200, asset


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/schema/", "/api/docs/"])
@pytest.mark.parametrize(
    ("method", "query", "accept", "status", "code"),
    [
        ("get", "?format=bogus", "*/*", 404, "not_found"),
        ("get", "", "application/xml", 406, "not_acceptable"),
        ("post", "", "*/*", 405, "method_not_allowed"),
        ("delete", "", "*/*", 405, "method_not_allowed"),
    ],
)
def test_the_schema_and_docs_pages_refuse_in_problem_json(
    client, path, method, query, accept, status, code
):
    """Their own renderers (YAML, Swagger's page) answer their successes only: an
    error is the API's problem+json, a JSON body as its Content-Type says."""
    response = getattr(client, method)(path + query, HTTP_ACCEPT=accept)
    assert response.status_code == status
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert body["code"] == code
    assert body["status"] == status


def test_every_paged_list_documents_the_parameters_it_refuses(schema):
    """A blank `cursor` and a `page_size` below 1 are a 400 (`CheckedCursor.query`):
    the schema says so, where it documented any string and any integer."""
    lists = 0
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            parameters = {p["name"]: p for p in operation.get("parameters", [])}
            if "cursor" not in parameters:
                continue
            lists += 1
            assert parameters["cursor"]["schema"] == {
                "type": "string",
                "minLength": 1,
                "pattern": CURSOR_PATTERN,
            }, path
            assert parameters["page_size"]["schema"] == {
                "type": "integer",
                "minimum": 1,
            }, path
    assert lists == 3  # orders, entries, products
