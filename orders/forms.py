from decimal import Decimal

from django import forms
from django.utils.translation import gettext_lazy as _

from .fields import MAX_AMOUNT
from .models import MERCHANT_ORDER_NO_MAX_LENGTH

# Minor units per major unit; the web form takes yuan (or dollars) with two decimals.
MINOR_PER_MAJOR = 100


def major_units(minor: int) -> Decimal:
    """1234 -> Decimal("12.34"): what the form shows for an amount in minor units."""
    return (Decimal(minor) / MINOR_PER_MAJOR).quantize(Decimal("0.01"))


class OrderForm(forms.Form):
    # The one-time form token: a merchant order number issued by a pre-order when the
    # form was shown. Submitting the same form again names the same order.
    token = forms.CharField(
        widget=forms.HiddenInput, max_length=MERCHANT_ORDER_NO_MAX_LENGTH
    )
    amount = forms.DecimalField(
        label=_("Amount"),
        min_value=Decimal("0.01"),
        max_value=Decimal(MAX_AMOUNT) / MINOR_PER_MAJOR,
        max_digits=15,
        decimal_places=2,
        widget=forms.NumberInput(
            attrs={"step": "0.01", "min": "0.01", "inputmode": "decimal"}
        ),
    )
    description = forms.CharField(
        label=_("What is it for?"),
        max_length=255,
        required=False,
        widget=forms.TextInput(attrs={"placeholder": _("e.g. Coffee beans, 1 kg")}),
    )

    def amount_minor_units(self) -> int:
        return int(self.cleaned_data["amount"] * MINOR_PER_MAJOR)
