"""`{{ amount|money:currency }}`: minor units shown as a price, e.g. ¥1,234.50."""

from django import template

from ledger.money import format_money

register = template.Library()


@register.filter
def money(amount: int | None, currency: str = "CNY") -> str:
    return format_money(amount, currency)
