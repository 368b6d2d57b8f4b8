from ledger.exceptions import DomainError


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


class PaymentMethodUnavailable(DomainError):
    status = 422
    code = "payment_method_unavailable"
    title = "Payment method unavailable"
    default_detail = "This payment method is not available yet; pay with balance."
