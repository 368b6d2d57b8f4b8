"""What the README says about the API, held against the API itself.

The README's curl examples run as pasted against `make run` (tests/ops/readme.py,
from tests/ops/test_make_run.py); these check what running them cannot: which writes
need a key, the shape of the numbers and headers the comments show, the callback
secret the example names.
"""

import re

import pytest
import yaml

from ledger.management.commands.serve import DEVELOPMENT_SECRET
from tests.helpers import assert_problem, customer, new_key, place_order
from tests.servers import ROOT

README = (ROOT / "README.md").read_text()
SCHEMA = yaml.safe_load((ROOT / "docs/openapi.yaml").read_text())
WRITES = ("post", "put", "patch", "delete")


def writes_without_a_key() -> set[str]:
    """Every API write whose schema does not require an Idempotency-Key."""
    found = set()
    for path, operations in SCHEMA["paths"].items():
        for method, operation in operations.items():
            if method not in WRITES or not path.startswith("/api/v1/"):
                continue
            required = {
                p["name"] for p in operation.get("parameters", []) if p.get("required")
            }
            if "Idempotency-Key" not in required:
                found.add(f"{method.upper()} {path}")
    return found


def test_the_writes_that_need_no_key_are_the_ones_the_readme_names():
    (row,) = [line for line in README.splitlines() if line.startswith("| no key")]
    named = set(re.findall(r"`((?:POST|PUT|PATCH|DELETE) /api/v1/[^`]+)`", row))
    assert named == writes_without_a_key(), row


@pytest.mark.django_db
def test_every_other_write_refuses_a_request_without_a_key():
    user, client, _wallet = customer("reader", balance=5000)
    order = place_order(user)
    values = {"merchant_order_no": order.merchant_order_no, "payment_id": "1"}
    checked = 0
    for path, operations in SCHEMA["paths"].items():
        for method in set(operations) & set(WRITES):
            if f"{method.upper()} {path}" in writes_without_a_key():
                continue
            url = re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)
            answer = getattr(client, method)(url, {}, format="json")
            assert_problem(answer, 400, "idempotency_key_missing")
            checked += 1
    assert checked >= 4


@pytest.mark.django_db
def test_the_order_example_shows_a_real_number_and_location():
    _user, client, _wallet = customer("reader")
    number = client.post("/api/v1/preorders").json()["merchant_order_no"]
    shown = re.findall(r"e\.g\. (\d+)", README) + re.findall(
        r"Location: \S+/api/v1/orders/(\d+)", README
    )
    assert shown and all(len(n) == len(number) for n in shown), (shown, number)

    answer = client.post(
        "/api/v1/orders",
        {"merchant_order_no": number, "amount": 1999, "currency": "CNY"},
        format="json",
        headers={"Idempotency-Key": new_key()},
    )
    assert answer.status_code == 201, answer.content
    (said,) = re.findall(r"^# 201, Location: (\S+)$", README, re.M)
    readme_origin = "http://127.0.0.1:8000"
    assert said == f"{readme_origin}/api/v1/orders/{shown[0]}"
    assert answer["Location"] == f"http://testserver/api/v1/orders/{number}"


def test_the_callback_example_names_the_secret_make_run_prints(settings):
    (block,) = [
        body
        for body in re.findall(r"^```sh\n(.*?)^```", README, re.S | re.M)
        if "/api/v1/payments/callback" in body
    ]
    (secret,) = re.findall(r"^PAYMENT_PROVIDER_SECRET=(\S+)", block, re.M)
    assert secret == DEVELOPMENT_SECRET
    assert "Callback secret" in README and DEVELOPMENT_SECRET in README
