"""Create the missing shipment of paid orders, once each."""

import json

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from orders.models import MERCHANT_ORDER_NO_MAX_LENGTH, Order
from payments.selectors import paid_orders_without_shipment
from payments.services import shipment_create_for_paid_order


class Command(BaseCommand):
    help = (
        "Create the shipment of paid orders that have none (check_ledger warns of "
        "them), once each: every such order, or those named by --order. Prints one "
        "JSON line per order; exits 1 if a named order is unknown. Safe to run twice."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--order",
            action="append",
            dest="orders",
            metavar="MERCHANT_ORDER_NO",
            help="an order's merchant order number (repeatable); default: every "
            "paid order without a shipment",
        )

    def handle(self, *args, orders: list[str] | None = None, **options) -> None:
        if orders:
            numbers = list(dict.fromkeys(orders))
            sane = [
                no
                for no in numbers
                if 0 < len(no) <= MERCHANT_ORDER_NO_MAX_LENGTH and "\x00" not in no
            ]
            found = dict(
                Order.objects.filter(merchant_order_no__in=sane).values_list(
                    "merchant_order_no", "pk"
                )
            )
            unknown = [no for no in numbers if no not in found]
            if unknown:
                raise CommandError(
                    f"unknown order(s): {', '.join(map(repr, unknown))}", returncode=1
                )
            ids = [found[no] for no in numbers]
        else:
            ids = list(paid_orders_without_shipment().values_list("pk", flat=True))
        for pk in ids:
            with transaction.atomic(durable=True):  # the command is the entry point
                shipment = shipment_create_for_paid_order(order_id=pk)
            order = Order.objects.only("merchant_order_no", "status").get(pk=pk)
            line = {
                "merchant_order_no": order.merchant_order_no,
                "order_status": order.status_name,
                "shipment": getattr(shipment, "pk", None),
                "created": shipment is not None,
            }
            self.stdout.write(json.dumps(line, sort_keys=True))
