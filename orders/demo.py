"""The demo products `make run` seeds (registered with `ledger.demo`)."""

from django.conf import settings
from django.db import transaction

from ledger.demo import demo_seeder

from .services import product_get_or_create, stock_top_up

# (sku, name, price in minor units, stock topped up to on every start)
DEMO_PRODUCTS = [
    ("TEA-LONGJING-250G", "Longjing green tea, 250 g", 12_800, 50),
    ("COFFEE-YUNNAN-1KG", "Yunnan coffee beans, 1 kg", 16_800, 20),
    ("MUG-CELADON", "Celadon mug", 4_500, 5),
]


@demo_seeder("products")
def demo_products_seed() -> list[dict]:
    shown = []
    with transaction.atomic():
        for sku, name, price, stock in DEMO_PRODUCTS:
            product, _ = product_get_or_create(
                sku=sku,
                name=name,
                price=price,
                currency=settings.LEDGER_DEFAULT_CURRENCY,
            )
            stock_top_up(product_id=product.pk, at_least=stock)
            product.refresh_from_db()
            shown.append({"sku": product.sku, "stock": product.stock})
    return shown
