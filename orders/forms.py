import re
from collections.abc import Iterable, Mapping
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from ledger.forms import MoneyField, PlainIntegerField, minor_units

from .fields import MAX_AMOUNT, MAX_ITEM_QUANTITY, MAX_ORDER_LINES
from .models import MERCHANT_ORDER_NO_MAX_LENGTH, Product

QUANTITY_FIELD = re.compile(r"quantity_([0-9]{1,19})")
# Each product's price as the form showed it (`price_<id>`, hidden, minor units):
# what the shopper chose at.
PRICE_FIELD = "price_{}"


class OrderForm(forms.Form):
    DRAFT_VALUE_MAX_LENGTH = 255

    # The one-time form token: a merchant order number issued by a pre-order when the
    # form was shown. Submitting the same form again names the same order.
    token = forms.CharField(
        widget=forms.HiddenInput, max_length=MERCHANT_ORDER_NO_MAX_LENGTH
    )
    amount = MoneyField(label=_("Amount"), required=False, max_minor=MAX_AMOUNT)
    description = forms.CharField(
        label=_("What is it for?"),
        max_length=255,
        required=False,
        widget=forms.TextInput(attrs={"placeholder": _("e.g. Coffee beans, 1 kg")}),
    )

    def __init__(
        self, *args: Any, products: Iterable[Product] = (), **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        # One quantity field per product on offer, named by its id (SKUs may hold
        # characters a form field name should not).
        self.products = list(products)
        for product in self.products:
            self.fields[self.quantity_field(product)] = PlainIntegerField(
                label=product.name,
                required=False,
                min_value=0,
                max_value=MAX_ITEM_QUANTITY,
                widget=forms.NumberInput(
                    attrs={"min": "0", "max": str(MAX_ITEM_QUANTITY), "step": "1"}
                ),
            )

    @staticmethod
    def quantity_field(product: Product) -> str:
        return f"quantity_{product.pk}"

    @staticmethod
    def names_quantities(data: Mapping[str, Any]) -> bool:
        """Whether submitted data fills in any product's quantity."""
        return any(
            name.startswith("quantity_") and str(value).strip()
            for name, value in data.items()
        )

    @classmethod
    def draft(cls, data: Mapping[str, Any]) -> dict[str, str]:
        """What was typed into this form, as text to show on it again: its own
        fields only (a product's quantity by its field's name), each cut to a
        field's length, and no more product lines than an order may have."""
        own = [name for name in ("token", "amount", "description") if name in data]
        lines = [name for name in data if QUANTITY_FIELD.fullmatch(name)]
        return {
            name: str(data[name])[: cls.DRAFT_VALUE_MAX_LENGTH]
            for name in own + lines[:MAX_ORDER_LINES]
        }

    def showing(self, products: Iterable[Product]) -> "OrderForm":
        """This form again (its data, initial values and errors) with `products`
        offered, to render."""
        shown = OrderForm(
            self.data if self.is_bound else None,
            initial=self.initial,
            products=products,
        )
        if self.is_bound:
            shown.full_clean()
            for error in self.non_field_errors():
                if error not in shown.non_field_errors():
                    shown.add_error(None, error)
        return shown

    def product_rows(self) -> list[tuple[Product, forms.BoundField]]:
        return [(p, self[self.quantity_field(p)]) for p in self.products]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        self._refuse_a_stale_catalogue()
        chosen = self.items()
        if chosen and cleaned.get("amount") is not None:
            raise forms.ValidationError(
                _("Choose products or enter an amount, not both.")
            )
        if not chosen and cleaned.get("amount") is None and "amount" not in self.errors:
            self.add_error("amount", _("Enter an amount or choose products."))
        return cleaned

    def _refuse_a_stale_catalogue(self) -> None:
        """Refuse a form whose products changed since it was shown: one chosen
        that is no longer on offer (never an order of the rest without it), or
        one whose price is not the price shown (never charged unseen). The form
        comes back showing the catalogue as it is now, its token unused."""
        offered = {str(p.pk) for p in self.products}
        for name, value in self.data.items():
            line = QUANTITY_FIELD.fullmatch(name)
            if line and line.group(1) not in offered and _chosen(value):
                raise forms.ValidationError(
                    _(
                        "A product on this form is no longer offered; nothing was "
                        "ordered. Check the form and place the order again."
                    ),
                    code="stale",
                )
        data = getattr(self, "cleaned_data", {})
        for product in self.products:
            shown = self.data.get(PRICE_FIELD.format(product.pk))
            if (
                data.get(self.quantity_field(product))
                and shown is not None
                and shown != str(product.price)
            ):
                raise forms.ValidationError(
                    _(
                        "The price of %(name)s changed since this form was shown; "
                        "nothing was ordered. Check the new price and place the "
                        "order again."
                    ),
                    code="stale",
                    params={"name": product.name},
                )

    def items(self) -> list[tuple[str, int]]:
        """The (sku, quantity) lines chosen, in the order the products are shown."""
        data = getattr(self, "cleaned_data", {})
        return [
            (product.sku, data[self.quantity_field(product)])
            for product in self.products
            if data.get(self.quantity_field(product))
        ]

    def amount_minor_units(self) -> int:
        return minor_units(self.cleaned_data["amount"])

    def contents(self, currency: str) -> tuple[object, ...]:
        """What this valid form orders, to compare with `order_contents()`."""
        lines = sorted(self.items())
        description = self.cleaned_data["description"]
        if lines:
            return ("items", tuple(lines), description)
        return ("amount", self.amount_minor_units(), currency, description)


def _chosen(value: object) -> bool:
    """Whether a submitted quantity asks for anything (a blank or a zero does not)."""
    text = str(value).strip()
    try:
        return float(text or 0) != 0
    except ValueError:
        return True  # not a number: something was typed
