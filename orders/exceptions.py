from django.urls import reverse

from ledger.exceptions import DomainError


class MerchantOrderNoUnknown(DomainError):
    status = 422
    code = "merchant_order_no_unknown"
    title = "Unknown merchant order number"
    default_detail = (
        "This merchant order number was not issued to you by a pre-order, or it "
        "expired unused; ask for a new one with POST /api/v1/preorders."
    )


class DuplicateOrder(DomainError):
    status = 409
    code = "duplicate_order"
    title = "Duplicate order"

    def __init__(self, *, merchant_order_no: str) -> None:
        self.merchant_order_no = merchant_order_no
        url = reverse("api-order-detail", args=[merchant_order_no])
        super().__init__(
            f"An order with merchant order number {merchant_order_no} already "
            f"exists: {url}",
            order_url=url,
        )


class OrderNotCancellable(DomainError):
    status = 409
    code = "order_not_cancellable"
    title = "Order cannot be cancelled"
    default_detail = "Only an order that is still pending payment can be cancelled."


class OrderAlreadyCancelled(OrderNotCancellable):
    """A cancel of an order already cancelled: a repeat (a second click, the page
    resubmitted), which a page says as such. The API's answer is unchanged (its
    code is `order_not_cancellable`)."""

    default_detail = "This order was already cancelled."


class OrderTransitionNotAllowed(DomainError):
    status = 409
    code = "order_transition_not_allowed"
    title = "Order cannot move to that state"


class OrderAlreadyPaid(DomainError):
    status = 409
    code = "order_already_paid"
    title = "Order already paid"
    default_detail = "This order was already paid; it was not charged again."


class OrderNotPayable(DomainError):
    status = 409
    code = "order_not_payable"
    title = "Order cannot be paid"
    default_detail = "This order was cancelled; it can no longer be paid."


class OrderAuthorized(OrderNotPayable):
    """The order's amount is already held (a manual-capture payment): the same
    `order_not_payable` for the API, but no page may call it cancelled."""


class OutOfStock(DomainError):
    status = 409
    code = "out_of_stock"
    title = "Out of stock"

    def __init__(self, *, sku: str, quantity: int, stock: int) -> None:
        super().__init__(
            f"Only {stock} of {sku} left; {quantity} asked for. Nothing was taken.",
            sku=sku,
        )


class ProductUnknown(DomainError):
    status = 422
    code = "product_unknown"
    title = "Unknown product"

    def __init__(self, *, sku: str) -> None:
        super().__init__(f"There is no product with SKU {sku!r}.", sku=sku)


class ItemsCurrencyMismatch(DomainError):
    status = 422
    code = "items_currency_mismatch"
    title = "Items in different currencies"
    default_detail = (
        "One order is paid in one currency: its products must all be priced in it "
        "(and in the `currency` the request names, if it names one)."
    )


class OrderAmountTooLarge(DomainError):
    status = 422
    code = "order_amount_too_large"
    title = "Order amount too large"
    default_detail = "The items' prices times their quantities add up to too much."
