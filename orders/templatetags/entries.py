"""Journal entries on the shop's pages: `{{ entry|entry_text }}` is what the entry
says in the reader's language; `{{ entry|entry_order }}` the order it is about."""

import re

from django import template

from ledger.models import JournalEntry
from ledger.texts import entry_params_of, entry_text

register = template.Library()

# What a merchant order number may be on a page's link (`orders.models`' numbers are
# digits; an older row's text might hold anything).
ORDER_NO = re.compile(r"[0-9A-Za-z_-]{1,32}")


@register.filter(name="entry_text")
def entry_text_filter(entry: JournalEntry) -> str:
    return entry_text(entry)


@register.filter
def entry_order(entry: JournalEntry) -> str:
    """The merchant order number the entry is about, or ""."""
    number = entry_params_of(entry).get("order", "")
    return number if ORDER_NO.fullmatch(number) else ""
