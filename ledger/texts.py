"""What a journal entry says, in the reader's language.

An entry stores its text as a kind of text and its parameters (`JournalEntry.params`,
e.g. `{"text": "order_payment", "order": "7301..."}`) beside the English
`description` that the admin, the API and a `grep` read. Pages render the text at
display time, in the language of whoever reads it. Rows written before `params`
existed are recognised from their English description.
"""

import re
from typing import Any

from django.utils import translation
from django.utils.translation import gettext_lazy as _

from .models import JournalEntry

# The texts entries may carry: name -> (the message, the entry kinds it may appear
# on, the English description of rows written before `params`, as a pattern).
TEXTS: dict[str, Any] = {
    "order_payment": (
        _("Order %(order)s"),
        {JournalEntry.Kind.PAYMENT},
        re.compile(r"Order (?P<order>\S+)"),
    ),
    "order_payment_provider": (
        _("Order %(order)s via provider"),
        {JournalEntry.Kind.PAYMENT},
        re.compile(r"Order (?P<order>\S+) via provider"),
    ),
    "order_refund": (
        _("Refund of order %(order)s"),
        {JournalEntry.Kind.REFUND},
        re.compile(r"Refund of order (?P<order>\S+)"),
    ),
    "merchant_sweep": (
        _("Sweep of sub-account %(account)s"),
        {JournalEntry.Kind.TRANSFER},
        re.compile(r"Sweep of sub-account (?P<account>\S+)"),
    ),
    "top_up": (_("Top-up"), {JournalEntry.Kind.DEPOSIT}, re.compile(r"Top-up")),
}


def entry_params(text: str, **params: str) -> dict[str, str]:
    """The `params` of an entry saying `text` (a key of TEXTS) with `params`."""
    message, _kinds, _old = TEXTS[text]
    message % params
    return {"text": text, **params}


def entry_params_of(entry: JournalEntry) -> dict[str, str]:
    """The entry's text and parameters: stored, or read from an older row's English
    description; `{}` for a free text (shown as it was written)."""
    if entry.params.get("text") in TEXTS:
        return entry.params
    for name, (_message, kinds, old) in TEXTS.items():
        match = old.fullmatch(entry.description)
        if entry.kind in kinds and match:
            return {"text": name, **match.groupdict()}
    return {}


def entry_text(entry: JournalEntry) -> str:
    """The entry's text in the active language."""
    params = entry_params_of(entry)
    if not params:
        return entry.description
    message, _kinds, _old = TEXTS[params["text"]]
    try:
        return str(message) % params
    except (KeyError, TypeError, ValueError):  # a stored row missing a parameter
        return entry.description


def entry_english(params: dict[str, str]) -> str:
    """The English description stored beside `params`."""
    with translation.override("en"):
        message, _kinds, _old = TEXTS[params["text"]]
        return str(message) % params
