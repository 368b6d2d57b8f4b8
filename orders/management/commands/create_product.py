import json

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from ledger.fields import storable
from orders.fields import MAX_AMOUNT, MAX_STOCK_MOVE
from orders.models import SKU_MAX_LENGTH, Product
from orders.services import product_get_or_create, stock_top_up


def check_name(name: str) -> None:
    """A name the shop can show: what the product's field takes (1 to 255
    characters), and text the database can hold."""
    try:
        Product._meta.get_field("name").clean(name, None)
    except ValidationError as refused:
        raise CommandError(f"--name: {' '.join(refused.messages)}") from None
    if not storable(name) or not name.strip():
        raise CommandError("--name is printable text: no NUL, not only spaces")


class Command(BaseCommand):
    help = (
        "Create (or find) a product; print one JSON line. --stock tops its stock up "
        "to at least N units through a stock movement."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("sku")
        parser.add_argument("--name", required=True)
        parser.add_argument("--price", type=int, required=True, help="minor units")
        parser.add_argument("--currency", default=None)
        parser.add_argument("--stock", type=int, default=None)

    def handle(
        self,
        *args,
        sku: str,
        name: str,
        price: int,
        currency: str | None,
        stock: int | None,
        **_,
    ) -> None:
        # (Nothing around it: an order's `sku` is taken as sent, so a product
        # " TEA" could be listed but never ordered.)
        if (
            not sku
            or len(sku) > SKU_MAX_LENGTH
            or not sku.isprintable()
            or sku != sku.strip()
        ):
            raise CommandError(
                f"a SKU is 1 to {SKU_MAX_LENGTH} printable characters, "
                "with no whitespace around them"
            )
        check_name(name)
        if not 0 < price <= MAX_AMOUNT:
            raise CommandError("--price is a positive number of minor units")
        if stock is not None and not 0 <= stock <= MAX_STOCK_MOVE:
            raise CommandError(f"--stock is 0 to {MAX_STOCK_MOVE} units, not {stock}")
        try:
            with transaction.atomic(durable=True):  # the command is the entry point
                product, _created = product_get_or_create(
                    sku=sku,
                    name=name,
                    price=price,
                    currency=currency or settings.LEDGER_DEFAULT_CURRENCY,
                )
                if stock:
                    stock_top_up(product_id=product.pk, at_least=stock)
                    product.refresh_from_db()
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        line = {
            "sku": product.sku,
            "name": product.name,
            "price": product.price,
            "currency": product.currency,
            "stock": product.stock,
        }
        self.stdout.write(json.dumps(line))
