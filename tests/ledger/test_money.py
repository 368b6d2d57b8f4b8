"""One money formatter for the shop and the back office."""

import pytest
from django.template import Context, Template

from ledger.money import format_money


@pytest.mark.parametrize(
    ("amount", "currency", "text"),
    [
        (94003, "CNY", "¥940.03"),
        (123456789, "USD", "$1,234,567.89"),
        (-150, "EUR", "-€1.50"),
        (0, "CNY", "¥0.00"),
        (5, "CHF", "0.05 CHF"),
        (1234, "JPY", "¥1,234"),
        (None, "CNY", ""),
    ],
)
def test_format_money(amount, currency, text):
    assert format_money(amount, currency) == text


def test_the_template_filter_is_the_same_function():
    template = Template("{% load money %}{{ amount|money:currency }}")
    assert template.render(Context({"amount": 94003, "currency": "CNY"})) == "¥940.03"
